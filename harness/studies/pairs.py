"""Paired differences between the lines of one results folder.

A line is what the summary calls a method: a method with its options and budget (the
``method`` column of ``summary.md``, e.g. ``specpc (neighbor_tokens=8, pool_type=None) (256
tokens)``). Every line is set against one base line on the samples both ran, per task and over
all the tasks both ran (weighted equally), for each measure: the difference with its 95 %
interval (:func:`harness.studies.paired_scores`, the analysis layer's paired bootstrap), the
samples paired, and how many the line won and lost. Rows of different models, benchmarks or
lengths are never paired (their sample ids name different prompts): each setup is its own
table.

    python -m harness.studies.pairs results/reference/selection_grain_qwen_cpu --base "chunk_size=32, keep_tokens=256, lookahead=1"
    make pairs out=results/x base=full samples=15-44

writes ``pairs.md`` and ``pairs.csv`` into the folder (``--name`` for another file name). A
base given as part of a label is taken in each setup where exactly one label holds it (setups
where none does are left out); where two do, or none anywhere, the error lists the labels.
A method run at several keep rates (``make eval keep=0.1,0.3``) is one line per keep, named
``<label> (keep 0.1)`` (:func:`harness.analysis.rows.keep_lines`). ``--samples 15-44`` (or ``15-``: from 15 on) pairs only
the samples with those ids, both ends included: a check on samples a choice was not made on
(held out), named in each table's heading.

``--speed`` pairs the lines of a folder's latency rows instead (``make latency`` or a study's
side-by-side timing job, e.g. ``<folder>/latency``): at each grid point, every line timed in a
job with the base, the base's TTFT over the line's paired by iteration in the runs that timed
both (:func:`harness.analysis.speed.between_lines`: the speedup's own estimator with the base in
the reference's place; above 1 the line is faster), beside the FLOP model's ratio for it; lines
timed only in other jobs get none (a ratio across jobs is not a side-by-side one). It writes
``speed_pairs.md`` and ``.csv`` by default.

    make pairs out=results/reference/draft_family_qwen_cpu/latency base="specprefill (512" speed=true
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.analysis.folder import analyze
from harness.analysis.rows import keep_lines
from harness.analysis.speed import LINE_SETUP, between_lines, line_names
from harness.rendering.tables import difference, md_table, natural_key, with_ci
from harness.studies import (
    ALL,
    PAIRED_SETUP,
    in_samples,
    labelled,
    paired_scores,
    require_file_name,
    require_runs,
    require_samples,
    require_values,
    setup_title,
)

#: What each pair compares, where the rows have it: the score (0-100), the share of the
#: evidence's tokens kept, the share of its pieces kept whole, the share of the prompt after its
#: context (the question) kept, the share of the prompt kept.
MEASURES = ("score", "needle_kept", "needle_whole", "question_kept", "kept_fraction")
COLUMNS = [*PAIRED_SETUP, "line", "base", "task", "measure", "n", "line_mean", "base_mean", "difference", "lo", "hi",
           "wins", "losses"]  # fmt: skip


def pick(wanted: str, labels: list[str]) -> str:
    """The label ``wanted`` names: itself, or the one label that contains it; else a
    ValueError listing the labels."""
    if wanted in labels:
        return wanted
    hits = [lab for lab in labels if wanted in lab]
    if len(hits) == 1:
        return hits[0]
    what = "no line of the folder holds it" if not hits else f"{len(hits)} lines hold it"
    raise ValueError(f"--base {wanted!r}: {what}; allowed: one of its lines, or part of exactly one: {labels}")


def pairs(
    rows: pd.DataFrame, base: str, measures: tuple[str, ...] = MEASURES, samples: tuple[int, int | None] | None = None
) -> pd.DataFrame:
    """Every line of ``rows`` (ok eval rows, normalized: a ``label`` column) against ``base``
    (a label, or part of one: :func:`pick`, in each setup that holds it: one setup's base may
    differ from another's in what ``base`` leaves out, e.g. its budget), per setup, over all
    tasks and per task, for each of ``measures`` the rows have, on the samples whose ids lie in
    ``samples`` (both ends included; None: all); :data:`COLUMNS`."""
    rows = labelled(rows)
    rows = rows.assign(label=keep_lines(rows, PAIRED_SETUP))
    setups = dict(list(rows.groupby(PAIRED_SETUP, sort=True)))
    labels = {k: sorted(g["label"].unique()) for k, g in setups.items()}
    bases = {k: pick(base, labs) for k, labs in labels.items() if any(base in lab for lab in labs)}
    if not bases:
        pick(base, sorted(rows["label"].unique()))  # no line holds it: refused, listing the lines
    if samples is not None:
        setups = {k: in_samples(g, samples) for k, g in setups.items()}
    out = []
    for setup, g in setups.items():
        if setup not in bases:
            continue
        base = bases[setup]
        b = g[g["label"] == base]
        if b.empty:
            continue
        for line in sorted(set(g["label"]) - {base}, key=natural_key):
            c = g[g["label"] == line]
            tasks = sorted(set(c["task"]) & set(b["task"]))
            for scope in [ALL, *tasks] if len(tasks) > 1 else tasks:
                for m in measures:
                    if m not in c or m not in b:
                        continue
                    p = paired_scores(c, b, scope, m, means=True)
                    if p["n"] == 0 or pd.isna(p["difference"]):
                        continue
                    out.append({**dict(zip(PAIRED_SETUP, setup, strict=True)), "line": line, "base": base, "task": scope,
                                "measure": m, **p})  # fmt: skip
    return pd.DataFrame(out).reindex(columns=COLUMNS)


def markdown(df: pd.DataFrame, samples: str | None = None) -> str:
    """One table per setup: each line and task, each measure's line mean and its paired
    difference from the base, and the score's wins and losses; ``samples`` (the ``--samples``
    text) named in each heading."""
    if df.empty:
        return "No line shares samples with the base.\n"
    parts = []
    for setup, g in df.groupby(PAIRED_SETUP, sort=True):
        measures = [m for m in MEASURES if m in set(g["measure"])]
        head = ["line", "task", "n", *(h for m in measures for h in (m, f"{m} - base"))]
        cells = []
        for (line, task), t in g.groupby(["line", "task"], sort=False):
            by = t.set_index("measure")
            row = [line, task, str(int(by["n"].max()))]
            for m in measures:
                if m not in by.index:
                    row += ["-", "-"]
                    continue
                r, points = by.loc[m], 1.0 if m == "score" else 100.0  # a share's difference in points
                row += [f"{r['line_mean']:{'.1f' if m == 'score' else '.2f'}}",
                        difference(r["difference"] * points, r["lo"] * points, r["hi"] * points)]  # fmt: skip
            if "score" in by.index:
                won, lost = int(by.loc["score", "wins"]), int(by.loc["score", "losses"])
                row[head.index("score - base")] += f"; {won} won, {lost} lost"
            cells.append(row)
        base = g["base"].iloc[0]
        title = setup_title(setup, samples)
        parts.append(f"### {title}: each line against `{base}`\n\n" + md_table(pd.DataFrame(cells, columns=head)))
    note = ("Differences: the line minus the base on the samples both ran (`n`), 95 % paired bootstrap interval, "
            "`(within noise)` where it holds 0; the score in points (0-100), the shares (needle kept, needle whole, "
            "question kept, kept fraction) in percentage points. `ALL`: the mean over the tasks both ran, each weighted equally.")  # fmt: skip
    return "\n".join(parts) + "\n" + note + "\n"


def speed_markdown(df: pd.DataFrame) -> str:
    """One table per grid point: each line against the base timed side by side
    (:func:`harness.analysis.speed.between_lines`), ``(within noise)`` where the interval holds 1."""
    if df.empty:
        return "No line was timed in a job with the base.\n"
    parts = []
    for setup, g in df.groupby(LINE_SETUP, sort=True, dropna=False):
        s = dict(zip(LINE_SETUP, setup, strict=True))
        cells = []
        for r in g.sort_values("line", key=lambda c: c.map(natural_key)).itertuples(index=False):
            null = "" if pd.isna(r.speedup_lo) or r.speedup_lo > 1 or r.speedup_hi < 1 else " (within noise)"
            cells.append([r.line, r.runs, r.pairs, f"{r.base_ttft_median_s:.3f}", f"{r.line_ttft_median_s:.3f}",
                          with_ci(r.speedup, r.speedup_lo, r.speedup_hi, "{:.2f}x") + null,
                          "-" if pd.isna(r.ideal_ratio) else f"{r.ideal_ratio:.2f}x"])  # fmt: skip
        head = ["line", "runs", "pairs", "base TTFT (s, median)", "line TTFT (s, median)", "base TTFT / line's",
                "FLOP ideal"]  # fmt: skip
        title = (f"model {s['model']}, {s['backend']}, {s['dtype']}, {s['prompt_source']} prompts, batch "
                 f"{int(s['batch'])} x {int(s['length'])} tokens")  # fmt: skip
        parts.append(
            f"### {title}: each line against `{g['base'].iloc[0]}`, side by side\n\n"
            + md_table(pd.DataFrame(cells, columns=head))
        )
    note = ("Base TTFT / line's: the base's TTFT over the line's, paired by iteration in the runs (jobs) that timed "
            "both, the median over the pairs with its 95 % bootstrap interval over pairs (the median run's where "
            "several timed both), `(within noise)` where it holds 1; above 1 the line is faster. FLOP ideal: the "
            "line's ideal speedup over the base's. Lines timed only in other jobs are not listed.")  # fmt: skip
    return "\n".join(parts) + "\n" + note + "\n"


def speed_main(ap: argparse.ArgumentParser, folder: Path, base: str, name: str) -> str:
    """``--speed``: the folder's latency lines against ``base``; returns the markdown written."""
    rows = analyze(folder).of_kind("latency")
    names = line_names(rows) if not rows.empty else []
    if not names:
        ap.error(f"{folder}: no latency rows that ran (--speed reads a latency job's folder, e.g. <study>/latency)")
    try:
        line = pick(base, names)
    except ValueError as e:
        ap.error(str(e))
    df = between_lines(rows, line)
    df.to_csv(folder / f"{name}.csv", index=False)
    text = speed_markdown(df)
    (folder / f"{name}.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a results folder (make eval's out=)")
    ap.add_argument("--base", required=True, help="the line every other is set against: a label, or part of one")
    ap.add_argument("--measures", nargs="+", default=list(MEASURES), help=f"of {list(MEASURES)}")
    ap.add_argument("--name", help="the files written: <folder>/<name>.md and .csv (a file name; default pairs, "
                    "speed_pairs with --speed)")  # fmt: skip
    ap.add_argument("--samples", help="only the samples with these ids: FIRST-LAST or FIRST- (e.g. 15-44)")
    ap.add_argument("--speed", action="store_true", help="pair the folder's latency lines' TTFTs, side by side")
    a = ap.parse_args(argv)
    require_values(ap, "--measures", a.measures, lambda m: m in MEASURES, str(list(MEASURES)))
    name = a.name if a.name is not None else ("speed_pairs" if a.speed else "pairs")
    require_file_name(ap, "--name", name)
    samples = require_samples(ap, a.samples)
    require_runs(ap, a.folder, flag="folder", allowed="a results folder holding a run's rows (make eval's out=)")
    if a.speed:
        if a.samples is not None:
            ap.error(
                f"--samples {a.samples!r} with --speed: latency rows have no sample ids; allowed: one or the other"
            )
        print(speed_main(ap, a.folder, a.base, name))
        return
    rows = analyze(a.folder).ok("eval")
    if rows.empty:
        ap.error(f"{a.folder}: no eval rows that ran")
    try:
        df = pairs(rows, a.base, tuple(a.measures), samples)
    except ValueError as e:
        ap.error(str(e))
    df.to_csv(a.folder / f"{name}.csv", index=False)
    text = markdown(df, a.samples)
    (a.folder / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
