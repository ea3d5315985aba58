"""Summary tables and plots, read only from the results store.

``python -m harness.report results/default`` rewrites ``summary.md``/``summary.csv``
in that folder and ``plots/<folder name>/score_vs_keep.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from harness.store import read_results

GROUP = ["model", "benchmark", "length", "task", "method", "keep_rate"]
# One sweep point: a row of the per-task pivot.
POINT = ["model", "benchmark", "length", "method", "keep_rate"]


CONFIG = [*POINT, "_bopts", "_run", "_base"]
# Run-level fields that tell apart runs sharing a method and keep rate; a method is
# compared with the full prefill run that shares them.
RUN_KEYS = ("dtype", "backend")


def label_variants(df: pd.DataFrame) -> pd.Series:
    """The method column of the summary: the method name, plus the options that tell
    apart runs which would otherwise share a row (same method and keep rate, different
    look-ahead, pooling, truncation, output cap, ...)."""
    labels = df["method"].astype(str).copy()
    for _, g in df.groupby(POINT, dropna=False):
        runs = g.drop_duplicates("config_hash")
        if len(runs) < 2:
            continue
        opts = {
            h: {
                **json.loads(r["method_options"] or "{}"),
                **json.loads(r["benchmark_options"] or "{}"),
                **{k: r.get(k) for k in RUN_KEYS},
            }
            for h, r in zip(runs["config_hash"], runs.to_dict("records"), strict=True)
        }
        differ = sorted({k for o in opts.values() for k in o if len({json.dumps(x.get(k)) for x in opts.values()}) > 1})
        for h, o in opts.items():
            desc = ", ".join(f"{k}={o.get(k)}" for k in differ if k != "keep_rate")
            labels[g.index[g["config_hash"] == h]] = f"{g['method'].iloc[0]} ({desc})"
    return labels


MIXED = "<more than one machine>"

MEASURES = ["score", "kept_fraction", "needle_kept", "ttft_s", "ttft_ratio"]


def _macro(rows: pd.DataFrame, by: list[str], label: pd.Series | str) -> pd.DataFrame:
    """Macro means of task-level rows within ``by`` (counts are summed)."""
    rows = rows.assign(_label=label)
    means = {m: (m, "mean") for m in MEASURES}
    out = (
        rows.groupby([*by, "_label"], dropna=False)
        .agg(n=("n", "sum"), failed=("failed", "sum"), unsupported=("unsupported", "sum"), **means)
        .reset_index()
        .rename(columns={"_label": "task"})
    )
    return out


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """task x method x keep: score, kept fraction, TTFT and its ratio to full prefill.

    ``ttft_ratio`` = mean TTFT of the method / mean TTFT of full prefill on the same
    model, benchmark, length and task (< 1 is faster); ``speedup`` is its inverse. A
    ratio is only formed side by side: where the rows record their ``hardware`` (a sweep
    resumed on another machine), a group whose rows ran on more than one machine, or on
    another machine than full prefill's, gets no ratio (NaN) rather than a cross-machine one.
    Aggregate rows, all macro means of the per-task rows: ``[category] <name>`` per
    benchmark category (LongBench), ``ALL`` (the mean over categories where the
    benchmark has them, as LongBench's "Avg", else over tasks), and for LongBench-E
    ``<task> @<bucket>`` and ``ALL @<bucket>`` per length bucket."""
    cols = [
        *GROUP,
        "n",
        "failed",
        "unsupported",
        "score",
        "kept_fraction",
        "needle_kept",
        "ttft_s",
        "ttft_ratio",
        "speedup",
    ]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.reset_index(drop=True)
    df["keep_rate"] = df["keep_rate"].astype(float).fillna(1.0)
    for c in ("category", "bucket", "hardware", *RUN_KEYS):  # optional columns ("" where absent)
        df[c] = df[c].fillna("") if c in df else ""
    df["_base"] = df["method"]
    df["_bopts"] = df["benchmark_options"].fillna("")
    df["_run"] = df[list(RUN_KEYS)].astype(str).agg("|".join, axis=1)
    df["method"] = label_variants(df)

    def per(keys: list[str]) -> pd.DataFrame:
        ok = df[df["status"] == "ok"]
        agg = ok.groupby(keys, dropna=False).agg(
            n=("score", "size"),
            score=("score", "mean"),
            kept_fraction=("kept_fraction", "mean"),
            needle_kept=("needle_kept", "mean"),
            ttft_s=("ttft_s", "mean"),
            hardware=("hardware", lambda h: h.iloc[0] if h.nunique() == 1 else MIXED),
        )
        # Runs with no ok row (a method unsupported on this hardware) still get their row.
        bad = df[df["status"] != "ok"].assign(
            failed=lambda d: (d["status"] == "failed").astype(int),
            unsupported=lambda d: (d["status"] == "unsupported").astype(int),
        )
        counts = bad.groupby(keys, dropna=False)[["failed", "unsupported"]].sum()
        agg = agg.join(counts, how="outer").fillna({"failed": 0, "unsupported": 0, "n": 0}).reset_index()
        base = ["model", "benchmark", "length", "_bopts", "_run", *[k for k in keys if k in ("task", "bucket")]]
        full_rows = agg[agg["_base"] == "full"].set_index(base)
        at = pd.MultiIndex.from_frame(agg[base])
        full_ttft = full_rows["ttft_s"].reindex(at).to_numpy()
        full_hw = full_rows["hardware"].reindex(at).to_numpy()
        hw = agg["hardware"].to_numpy()
        same = (hw == full_hw) & (hw != MIXED)
        agg["ttft_ratio"] = pd.Series(agg["ttft_s"].to_numpy() / full_ttft, index=agg.index).where(same)
        return agg

    tasks = per([*GROUP, "_bopts", "_run", "_base", "category"])
    parts = [tasks]
    has_cat = tasks["category"] != ""
    if has_cat.any():
        cats = _macro(tasks[has_cat], CONFIG, "[category] " + tasks.loc[has_cat, "category"])
        parts.append(cats)
        overall = _macro(cats, CONFIG, "ALL")
        if (~has_cat).any():  # benchmarks without categories in the same folder
            parts.append(_macro(tasks[~has_cat], CONFIG, "ALL"))
    else:
        overall = _macro(tasks, CONFIG, "ALL")
    parts.append(overall)
    if (df["bucket"] != "").any():
        b = per([*GROUP, "_bopts", "_run", "_base", "bucket"])
        b = b[b["bucket"] != ""]
        parts.append(b.assign(task=b["task"] + " @" + b["bucket"]))
        parts.append(_macro(b, [*CONFIG, "bucket"], "ALL @" + b["bucket"]).drop(columns="bucket"))
    out = pd.concat(parts, ignore_index=True)
    out["speedup"] = 1.0 / out["ttft_ratio"]
    for c in ("n", "failed", "unsupported"):
        out[c] = out[c].astype(int)
    out = out[cols]
    return out.sort_values(["model", "benchmark", "length", "task", "method", "keep_rate"]).reset_index(drop=True)


def md_table(df: pd.DataFrame) -> str:
    """``df``'s cells, as they are (``str``), as a markdown table."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def to_markdown(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "(no results)\n"
    s = summary.copy()
    unpaired = summary["ttft_s"].notna() & summary["ttft_ratio"].isna()
    for c, fmt in (
        ("score", "{:.1f}"),
        ("kept_fraction", "{:.3f}"),
        ("needle_kept", "{:.2f}"),
        ("ttft_s", "{:.2f}"),
        ("ttft_ratio", "{:.2f}"),
        ("speedup", "{:.2f}x"),
        ("keep_rate", "{:g}"),
    ):
        s[c] = s[c].map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    lines = [md_table(s).rstrip("\n")]
    if unpaired.any():
        lines += [
            "",
            "TTFT ratio `-` with a TTFT: no full-prefill rows for that task with the same dtype and backend "
            "ran on the same machine (the rows' `hardware`), so no side-by-side ratio exists.",
        ]
    return "\n".join(lines) + "\n"


def score_by_task(summary: pd.DataFrame) -> pd.DataFrame:
    """The score column of ``summary`` pivoted: one row per model, benchmark, length,
    method and keep rate; one column per task, then the category means, then ``ALL``
    (length-bucket rows are left to the long table). A cell reads ``-`` where the point
    has no score for that task, and carries ``(n=K)`` where it averages fewer samples
    than the fullest point in its column (a partial or failing run)."""
    s = summary[~summary["task"].str.contains(" @", regex=False)]
    if s.empty:
        return pd.DataFrame(columns=POINT)
    names = set(s["task"])
    tasks = sorted(t for t in names if t != "ALL" and not t.startswith("["))
    order = [*tasks, *sorted(t for t in names if t.startswith("[")), *(["ALL"] if "ALL" in names else [])]
    most = s.groupby(["model", "benchmark", "length", "task"])["n"].transform("max")

    def cell(score: float, n: int, top: int) -> str:
        if pd.isna(score):
            return "-"
        return f"{score:.1f}" + (f" (n={n})" if n < top else "")

    s = s.assign(_cell=[cell(a, b, c) for a, b, c in zip(s["score"], s["n"], most, strict=True)])
    wide = s.pivot_table(index=POINT, columns="task", values="_cell", aggfunc="first")
    wide = wide.reindex(columns=order).fillna("-").reset_index()
    wide.columns.name = None
    return wide


def by_task_markdown(summary: pd.DataFrame) -> str:
    """``score_by_task`` as a markdown table; empty where there is one task or none."""
    wide = score_by_task(summary)
    if len([c for c in wide.columns if c not in (*POINT, "ALL")]) < 2:
        return ""
    wide["keep_rate"] = wide["keep_rate"].map(lambda v: "-" if pd.isna(v) else f"{v:g}")
    return md_table(wide)


def plot_score_vs_keep(summary: pd.DataFrame, path: Path) -> Path | None:
    """Score vs keep rate, one line per task (full prefill plotted at keep 1.0)."""
    if summary.empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary[~summary["task"].str.startswith(("ALL", "["))]
    s = s[~s["task"].str.contains(" @", regex=False)]
    groups = list(s.groupby(["model", "benchmark", "length"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, ((model, bench, length), g) in zip(axes[0], groups, strict=True):
        full = g[g["method"] == "full"].set_index("task")["score"]
        for method, gm in g[g["method"] != "full"].groupby("method"):
            for task, gt in gm.groupby("task"):
                gt = gt.sort_values("keep_rate")
                xs, ys = list(gt["keep_rate"]), list(gt["score"])
                if task in full.index:
                    xs, ys = [*xs, 1.0], [*ys, float(full[task])]
                ax.plot(xs, ys, marker="o", label=f"{task}" + ("" if method == "specprefill" else f" ({method})"))
        if g["method"].nunique() == 1 and (g["method"] == "full").all():
            ax.scatter([1.0] * len(full), full.to_numpy(), label="full prefill")
        ax.set_xlabel("keep rate (fraction of prompt tokens prefilled; full prefill at 1.0)")
        ax.set_ylabel("score (0-100)")
        ax.set_title(f"{model} · {bench} {length}")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(out: Path, plots_root: Path = Path("plots")) -> pd.DataFrame:
    """Rewrite the summary table (md, csv) of ``out`` and its plot; print the table."""
    out = Path(out)
    summary = summarize(read_results(out))
    out.mkdir(parents=True, exist_ok=True)
    md = to_markdown(summary)
    wide = by_task_markdown(summary)
    if wide:
        md += "\nScore per task (`(n=K)`: fewer samples than the fullest point for that task):\n\n" + wide
    (out / "summary.md").write_text(md)
    summary.to_csv(out / "summary.csv", index=False)
    plot = plot_score_vs_keep(summary, plots_root / out.name / "score_vs_keep.png")
    print(f"\nSummary of {out} (also {out / 'summary.md'}{f', plot {plot}' if plot else ''}):\n")
    print(md)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path, help="results folder (the out= of a run)")
    ap.add_argument("--plots", type=Path, default=Path("plots"))
    a = ap.parse_args()
    write_all(a.out, a.plots)


if __name__ == "__main__":
    main()
