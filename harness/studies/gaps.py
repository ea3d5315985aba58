"""The gaps a selection leaves in the original positions, sample by sample.

A method that keeps K of a prompt's N tokens at their original positions (SpecPrefill's
choice) leaves N - K positions empty, in gaps between runs of neighbouring kept tokens.
``method.max_gap`` caps each gap and ``method.position_mode=even_gaps`` evens them out
(:mod:`specprefill.plan`); this plans the method's selections for one eval config (the
speculator only: the base model generates nothing) and writes, per sample, how many runs the
kept tokens form, the longest gap, the positions left empty at the original positions and under
each cap, and the gap ``even_gaps`` gives each. Where the folder holds the rows of that run,
each selection's ``kept_hash`` is checked against its row, so the profile describes the
tokens those rows prefilled.

    python -m harness.studies.gaps <folder> model=qwen2.5-coder-1.5b benchmark=ruler length=4096 \\
        keep_tokens=512 'tasks=[vt]' limit=30 method=specprefill method.chunk_size=null

writes ``<folder>/gaps.csv`` (one row per sample) and ``<folder>/gaps.md`` (min / median / max, and
each treatment's span with the share of it left empty); ``--no-run`` re-renders the table from the CSV;
``--name gaps_1024`` writes ``gaps_1024.csv`` / ``.md`` instead (one profile per budget in a folder).
``python -m harness.studies.gaps <folder> --figure`` draws ``<folder>/gaps.png`` from the folder's
rows instead: each position treatment of the same selection (re-numbered, each ``max_gap`` and
``gap_scale``, the original positions, ``even_gaps``, ``spread``) and full prefill, minus the original positions,
paired by sample (:func:`harness.studies.paired_scores`), with 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from harness.rendering.tables import md_table
from harness.studies import require_file_name

#: The caps whose empty positions are counted (``method.max_gap``).
CAPS = (4, 16, 64, 128, 256)
#: The scales whose empty positions are counted (``method.gap_scale``).
SCALES = (0.4,)


def profile(
    kept: torch.Tensor, n: int, caps: tuple[int, ...] = CAPS, scales: tuple[float, ...] = SCALES
) -> dict[str, Any]:
    """The gap structure of ``kept`` (sorted indices into a prompt of ``n`` tokens): ``runs``
    (maximal runs of neighbouring kept tokens), ``gaps`` (stretches of empty positions: before
    the first run, between runs, after the last), ``longest_gap`` (empty positions in the
    longest), ``empty`` (N - K, the original positions'), ``empty_<G>`` (empty positions left
    when each gap is capped at G positions: :func:`specprefill.plan.capped_positions`),
    ``empty_scale_<f>`` (left when each gap is scaled by f: :func:`specprefill.plan.scaled_positions`) and
    ``even_gap`` (the empty positions per gap under ``even_gaps``, the mean); ``gap_sizes``: each
    gap's empty positions in prompt order, space-separated."""
    from specprefill.plan import capped_positions, position_steps, scaled_positions

    empty = position_steps(kept, n) - 1
    gaps = int((empty > 0).sum())
    out: dict[str, Any] = {
        "n": n,
        "k": int(kept.numel()),
        "runs": int((empty[1:-1] > 0).sum()) + 1,
        "gaps": gaps,
        "longest_gap": int(empty.max()),
        "empty": n - int(kept.numel()),
    }
    for cap in caps:
        out[f"empty_{cap}"] = capped_positions(kept, n, cap)[1] - int(kept.numel())
    for scale in scales:
        out[f"empty_scale_{scale:g}"] = scaled_positions(kept, n, scale)[1] - int(kept.numel())
    out["even_gap"] = round(out["empty"] / gaps, 1) if gaps else 0.0
    out["gap_sizes"] = " ".join(str(int(e)) for e in empty[empty > 0])
    return out


def selections(overrides: list[str]) -> tuple[Path, list[dict[str, Any]]]:
    """Plan the method's selection for every sample of the eval config ``overrides`` (as the
    command line composes it); return the run folder it names and one profile per sample, with
    its task, sample id and ``kept_hash``."""
    from hydra import compose, initialize_config_dir

    from harness.config import CONF
    from harness.diagnostics import kept_hash
    from harness.jobs.eval import EvalConfig, prepare
    from harness.prompts import sample_prompt
    from harness.store import RunStore

    scratch = tempfile.mkdtemp()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"out={scratch}"])
    job = prepare(EvalConfig.from_hydra(cfg))
    rows = []
    with job.session(RunStore(job.folder)) as s:
        for sample in tqdm(s.samples, desc="selections", unit="sample"):
            prompt, _ = sample_prompt(sample, s.tok)
            plan = job.method.plan(prompt, s.backend)
            if plan.kept_indices is None:
                raise ValueError(f"method {job.method.name!r} keeps no prompt tokens (a rewrite); allowed: a selection")
            rows.append(
                {
                    "task": sample.task,
                    "sample_id": sample.sample_id,
                    "kept_hash": kept_hash(plan.kept_indices),
                    **profile(plan.kept_indices, prompt.n),
                }
            )
    return job.folder.relative_to(scratch), rows


def check_against_rows(folder: Path, run: Path, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``same_as_row``: whether each selection's ``kept_hash`` is its row's in the
    folder's copy of the run (``<folder>/<run>``); None where the folder has no such row."""
    from harness.analysis.folder import analyze

    where = folder / run
    rows = analyze(where).ok("eval") if (where / "config.yaml").is_file() else pd.DataFrame()
    if rows.empty:
        return df.assign(same_as_row=None)
    theirs = {(str(t), str(i)): h for t, i, h in zip(rows["task"], rows["sample_id"], rows["kept_hash"], strict=True)}
    same = [theirs.get((str(t), str(i))) for t, i in zip(df["task"], df["sample_id"], strict=True)]
    return df.assign(same_as_row=[None if h is None else h == k for h, k in zip(same, df["kept_hash"], strict=True)])


def _treatments() -> list[tuple[str, str]]:
    """The treatments whose share of the span left empty :func:`render` tabulates: (column, label)."""
    return [
        ("empty", "original positions"),
        *((f"empty_{c}", f"`max_gap={c}`") for c in CAPS),
        *((f"empty_scale_{f:g}", f"`gap_scale={f:g}`") for f in SCALES),
    ]


def shares(df: pd.DataFrame) -> pd.DataFrame:
    """Per sample and treatment, the span (the positions up to the first generated token: K plus
    the empty ones) and the share of it left empty, ``empty / (K + empty)``: ``span_<col>`` and
    ``share_<col>`` for each empty-count column of :func:`profile` (``even_gaps`` and ``spread``
    leave the original positions' share)."""
    out = {}
    for col, _ in _treatments():
        if col in df:
            span = df["k"] + df[col]
            out[f"span_{col}"], out[f"share_{col}"] = span, df[col] / span
    return pd.DataFrame(out, index=df.index)


def render(df: pd.DataFrame, run: Path | str) -> str:
    cols = ["runs", "gaps", "longest_gap", "empty", *(f"empty_{c}" for c in CAPS)]
    cols += [*(f"empty_scale_{f:g}" for f in SCALES), "even_gap"]
    body = [[c, f"{df[c].min():g}", f"{df[c].median():g}", f"{df[c].max():g}"] for c in cols if c in df]
    sh = shares(df)
    spans = [
        [label, f"{sh[f'span_{c}'].median():g}", *(f"{sh[f'share_{c}'].agg(a):.3f}" for a in ("min", "median", "max"))]
        for c, label in _treatments()
        if f"span_{c}" in sh
    ]
    checked = df["same_as_row"].dropna()
    check = (
        f"{int(checked.sum())} of {len(df)} selections are the rows' (`kept_hash`)"
        if len(checked)
        else "no rows of this run in the folder to check the selections against"
    )
    return (
        f"# The gaps the selection leaves (`{run}`, {len(df)} samples)\n\n"
        f"{check}. `empty`: positions left empty at the original positions (N - K); `empty_<G>`: with every "
        "gap capped at G positions (`method.max_gap`); `empty_scale_<f>`: with every gap scaled by f "
        "(`method.gap_scale`); `even_gap`: empty positions per gap under "
        "`position_mode=even_gaps`. Written by `python -m harness.studies.gaps`.\n\n"
        + md_table(pd.DataFrame(body, columns=["measure", "min", "median", "max"]))
        + "\n\nThe span (K plus the empty positions: the first generated token's position) and the share of it "
        "left empty, per sample (`even_gaps` and `spread` leave the original positions' share):\n\n"
        + md_table(pd.DataFrame(spans, columns=["positions", "span (median)", "empty share min", "median", "max"]))
        + "\n"
    )


def treatment(method: str, options: str) -> str:
    """A row's position treatment, as the figure names it: ``full prefill``, ``max_gap=G``,
    ``gap_scale=f``, ``original`` (neither), ``contiguous``, ``even_gaps`` or ``spread``."""
    if method == "full":
        return "full prefill"
    opts = json.loads(options) if isinstance(options, str) else dict(options or {})
    if opts.get("max_gap") is not None:
        return f"max_gap={opts['max_gap']}"
    if opts.get("gap_scale") is not None:
        return f"gap_scale={opts['gap_scale']}"
    return str(opts.get("position_mode", "original"))


def treatments(rows: pd.DataFrame) -> pd.DataFrame:
    """Every treatment of ``rows`` (one model, benchmark, length and selection) minus the original
    positions, paired by sample over all tasks: ``treatment``, ``difference``, ``lo``, ``hi``, ``n``,
    ``wins``, ``losses``, ``line_mean``, ``base_mean``; in the figure's order (re-numbered, the caps
    from the smallest, the scales from the smallest, the original positions, the others)."""
    from harness.studies import ALL, paired_scores

    rows = rows.assign(treatment=[treatment(m, o) for m, o in zip(rows["method"], rows["method_options"], strict=True)])
    base = rows[rows["treatment"] == "original"]
    if base.empty:
        raise ValueError("no rows at the original positions without max_gap; allowed: a folder holding that line")

    def by(prefix: str) -> list[str]:
        return sorted((t for t in set(rows["treatment"]) if t.startswith(prefix)), key=lambda t: float(t.split("=")[1]))

    order = ["contiguous", *by("max_gap="), *by("gap_scale="), "original", "even_gaps", "spread", "full prefill"]
    out = [
        {"treatment": t, **paired_scores(rows[rows["treatment"] == t], base, ALL, means=True)}
        for t in order
        if t in set(rows["treatment"])
    ]
    return pd.DataFrame(out)


def figure(folder: Path) -> Path:
    """``<folder>/gaps.png``: :func:`treatments` of the folder's eval rows, with a value below the
    axis written beside it (``spread``: the model no longer reads the prompt)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from harness.analysis.folder import analyze

    d = treatments(analyze(folder).ok("eval"))
    x = np.arange(len(d))
    v, lo, hi = (d[c].to_numpy(dtype=float) for c in ("difference", "lo", "hi"))
    floor = min(-10.0, float(np.nanmin(np.where(v > -40, lo, 0.0))) - 5)
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    shown = v >= floor
    ax.errorbar(x[shown], v[shown], yerr=np.vstack([v - lo, hi - v])[:, shown], fmt="o", capsize=3, color="C0")
    for i in np.flatnonzero(~shown):
        ax.annotate(f"{v[i]:+.1f}\n(off the scale)", (x[i], floor), ha="center", va="bottom", fontsize=8, color="C3")
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_ylim(floor, max(5.0, float(np.nanmax(hi)) + 5))
    names = {"contiguous": "re-numbered\n(max_gap=1)", "original": "original\n(as they are)"}
    ticks = [names.get(t, t.replace("=", "\n")) for t in d["treatment"]]
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_ylabel("score - original positions, points\n(paired by sample, 95 % interval)")
    ax.set_title(f"The same kept tokens at other positions (n = {int(d['n'].max())} samples)")
    fig.tight_layout()
    path = folder / "gaps.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where gaps.md / gaps.csv go (and the run's rows, if there)")
    ap.add_argument("overrides", nargs="*", help="the eval config, as make eval takes it")
    ap.add_argument("--figure", action="store_true", help="draw gaps.png from the folder's rows instead")
    ap.add_argument(
        "--no-run",
        action="store_true",
        help="re-render <name>.md from <name>.csv, planning nothing (after the tool's tables change)",
    )
    ap.add_argument(
        "--name",
        default="gaps",
        help="the files' name: <name>.md / <name>.csv (one per budget or config in a folder); default gaps",
    )
    args = ap.parse_intermixed_args(argv)  # options before, between or after the overrides
    require_file_name(ap, "--name", args.name)
    if args.folder.exists() and not args.folder.is_dir():
        raise SystemExit(f"folder={str(args.folder)!r} is a file; allowed: a folder")
    if args.figure:
        try:
            print(figure(args.folder))
        except ValueError as e:
            raise SystemExit(f"{args.folder}: {e}") from None
        return 0
    if args.no_run:
        csv = args.folder / f"{args.name}.csv"
        if not csv.is_file():
            raise SystemExit(f"{csv}: no such profile; allowed: a folder where the tool wrote {args.name}.csv")
        df = pd.read_csv(csv)
        if "run" not in df:
            raise SystemExit(f"{csv}: written before profiles named their run (column run); plan it again")
        text = render(df, str(df["run"].iloc[0]))
        (args.folder / f"{args.name}.md").write_text(text)
        print(text)
        return 0
    if not args.overrides:
        raise SystemExit("no eval config given; allowed: the overrides of make eval, --figure or --no-run")
    run, rows = selections(args.overrides)
    df = check_against_rows(args.folder, run, pd.DataFrame(rows)).assign(run=str(run))
    mismatch = df["same_as_row"].eq(False)  # None: no row to check
    if mismatch.any():
        bad = df.loc[mismatch, "sample_id"].tolist()
        raise SystemExit(f"samples {bad}: the selection is not the one the rows of {run} prefilled (kept_hash)")
    args.folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.folder / f"{args.name}.csv", index=False)
    text = render(df, run)
    (args.folder / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
