"""Summary tables and plots, read only from the results store (every kind of row).

``python -m harness.report results/default`` rewrites, in that folder, ``summary.md``
(one section per kind of row present: quality, latency, serving) with ``summary.csv``
(quality), ``latency_summary.csv`` and ``qps_summary.csv``, the figures under
``<folder>/plots/`` (:mod:`harness.plots`) and ``report.html``, one self-contained page of
all of it (:mod:`harness.html_report`). Nothing here knows a method by name: ratios are taken against
each row's ``reference_method`` (the config's ``reference``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.intervals import intervals
from harness.stats import ratio_of_medians_ci
from harness.store import read_results, run_folders

#: The interval columns of the quality summary (harness.intervals), 95 %.
INTERVALS = ["score_lo", "score_hi", "retention", "retention_lo", "retention_hi", "ttft_ratio_lo", "ttft_ratio_hi"]

GROUP = ["model", "benchmark", "length", "task", "method", "keep_rate"]
# One sweep point: a row of the per-task pivot.
POINT = ["model", "benchmark", "length", "method", "keep_rate"]


CONFIG = [*POINT, "_bopts", "_run", "_base", "_ref"]
# Run-level fields that tell apart runs sharing a method and keep rate; a method is
# compared with the full prefill run that shares them.
RUN_KEYS = ("dtype", "backend")


def _options(v: Any) -> dict[str, Any]:
    """A stored options column as a dict: ``{}`` where the row's kind has no such column
    (a folder mixing eval and latency rows leaves it NaN on the other kind's rows)."""
    return json.loads(v) if isinstance(v, str) and v else {}


def label_variants(df: pd.DataFrame, point: list[str] = POINT) -> pd.Series:
    """The method column of the summary: the method name, plus the options that tell
    apart runs which would otherwise share a row (same method and keep rate, different
    look-ahead, pooling, truncation, output cap, speculator, ...)."""
    labels = df["method"].astype(str).copy()
    for _, g in df.groupby(point, dropna=False):
        runs = g.drop_duplicates("config_hash")
        if len(runs) < 2:
            continue
        opts = {
            h: {
                **_options(r.get("method_options")),
                **_options(r.get("benchmark_options")),
                **{k: r.get(k) for k in (*RUN_KEYS, "speculator")},
            }
            for h, r in zip(runs["config_hash"], runs.to_dict("records"), strict=True)
        }
        differ = sorted({k for o in opts.values() for k in o if len({json.dumps(x.get(k)) for x in opts.values()}) > 1})
        for h, o in opts.items():
            desc = ", ".join(f"{k}={o.get(k)}" for k in differ if k != "keep_rate")
            if desc:
                labels[g.index[g["config_hash"] == h]] = f"{g['method'].iloc[0]} ({desc})"
    return labels


MIXED = "<more than one machine>"

MEASURES = ["score", "kept_fraction", "needle_kept", "ttft_s", "ttft_ratio"]


def _mean_if_complete(x: pd.Series) -> float:
    """The mean, or NaN when any part is missing: a task a method failed entirely must
    not silently drop out of its category or ``ALL`` mean."""
    return float("nan") if x.isna().any() else float(x.mean())


def _macro(rows: pd.DataFrame, by: list[str], label: pd.Series | str) -> pd.DataFrame:
    """Macro means of task-level rows within ``by`` (counts are summed). Score and TTFT
    means are NaN when a part has none; a part with fewer samples shows in ``n``."""
    rows = rows.assign(_label=label)
    means: dict[str, Any] = {m: (m, "mean") for m in MEASURES}
    means.update(score=("score", _mean_if_complete), ttft_s=("ttft_s", _mean_if_complete))
    means["ttft_ratio"] = ("ttft_ratio", _mean_if_complete)
    out = (
        rows.groupby([*by, "_label"], dropna=False)
        .agg(n=("n", "sum"), failed=("failed", "sum"), unsupported=("unsupported", "sum"), **means)
        .reset_index()
        .rename(columns={"_label": "task"})
    )
    return out


def labelled(rows: pd.DataFrame) -> pd.DataFrame:
    """Eval rows as the summary groups them: keep rate 1.0 for the reference, optional
    columns ``""`` where absent, the method's own name in ``_base`` and ``method`` the label
    that tells variants apart (:func:`label_variants`)."""
    df = rows.reset_index(drop=True).copy()
    df["keep_rate"] = df["keep_rate"].astype(float).fillna(1.0)
    for c in ("category", "bucket", "hardware", *RUN_KEYS):  # optional columns ("" where absent)
        df[c] = df[c].fillna("") if c in df else ""
    df["_base"] = df["method"]
    df["method"] = label_variants(df)
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Quality rows: task x method x keep: score, kept fraction, TTFT and its ratio to the
    reference method (full prefill unless the config said otherwise).

    ``ttft_ratio`` = mean TTFT of the method / mean TTFT of the reference on the same
    model, benchmark, length and task (< 1 is faster); ``speedup`` is its inverse. A
    ratio is only formed side by side: where the rows record their ``hardware`` (a sweep
    resumed on another machine), a group whose rows ran on more than one machine, or on
    another machine than the reference's, gets no ratio (NaN) rather than a cross-machine one.
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
        return pd.DataFrame(columns=[*cols, *INTERVALS, "method_name", "reference"])
    df = labelled(df)
    df["_ref"] = df["reference_method"].astype(str)
    df["_bopts"] = df["benchmark_options"].fillna("")
    df["_run"] = df[list(RUN_KEYS)].astype(str).agg("|".join, axis=1)

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
        base = ["model", "benchmark", "length", "_bopts", "_run", "_ref", *[k for k in keys if k in ("task", "bucket")]]
        full_rows = agg[agg["_base"] == agg["_ref"]].set_index(base)
        at = pd.MultiIndex.from_frame(agg[base])
        full_ttft = full_rows["ttft_s"].reindex(at).to_numpy()
        full_hw = full_rows["hardware"].reindex(at).to_numpy()
        hw = agg["hardware"].to_numpy()
        same = (hw == full_hw) & (hw != MIXED)
        agg["ttft_ratio"] = pd.Series(agg["ttft_s"].to_numpy() / full_ttft, index=agg.index).where(same)
        return agg

    tasks = per([*GROUP, "_bopts", "_run", "_base", "_ref", "category"])
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
        b = per([*GROUP, "_bopts", "_run", "_base", "_ref", "bucket"])
        b = b[b["bucket"] != ""]
        parts.append(b.assign(task=b["task"] + " @" + b["bucket"]))
        parts.append(_macro(b, [*CONFIG, "bucket"], "ALL @" + b["bucket"]).drop(columns="bucket"))
    out = pd.concat(parts, ignore_index=True)
    out["speedup"] = 1.0 / out["ttft_ratio"]
    for c in ("n", "failed", "unsupported"):
        out[c] = out[c].astype(int)
    out = intervals(df, out)
    out = out[[*cols, *INTERVALS, "_base", "_ref"]].rename(columns={"_base": "method_name", "_ref": "reference"})
    return out.sort_values(["model", "benchmark", "length", "task", "method", "keep_rate"]).reset_index(drop=True)


def md_table(df: pd.DataFrame) -> str:
    """``df``'s cells, as they are (``str``), as a markdown table."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _with_ci(v: float, lo: float, hi: float, fmt: str) -> str:
    if pd.isna(v):
        return "-"
    return fmt.format(v) + ("" if pd.isna(lo) else f" [{fmt.format(lo)}, {fmt.format(hi)}]")


def format_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's cells as text: score, retention and TTFT ratio as ``value [lo, hi]``
    (95 % intervals), the other measures rounded, ``-`` where a value is missing."""
    s = summary.drop(columns=["method_name", "reference"], errors="ignore").copy()
    s["score"] = [_with_ci(*r, "{:.1f}") for r in zip(s["score"], s["score_lo"], s["score_hi"], strict=True)]
    s["retention"] = [
        _with_ci(*r, "{:.2f}") for r in zip(s["retention"], s["retention_lo"], s["retention_hi"], strict=True)
    ]
    s["ttft_ratio"] = [
        _with_ci(*r, "{:.2f}") for r in zip(s["ttft_ratio"], s["ttft_ratio_lo"], s["ttft_ratio_hi"], strict=True)
    ]
    s = s.drop(columns=[c for c in INTERVALS if c != "retention"])
    for c, fmt in (
        ("kept_fraction", "{:.3f}"),
        ("needle_kept", "{:.2f}"),
        ("ttft_s", "{:.2f}"),
        ("speedup", "{:.2f}x"),
        ("keep_rate", "{:g}"),
    ):
        s[c] = s[c].map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    return s


#: What the summary's intervals are, under every rendering of it.
INTERVAL_NOTE = ("Score, retention (score / the reference's, same samples) and TTFT ratio: "
                 "value [95 % bootstrap interval over samples, seeded].")  # fmt: skip
UNPAIRED_NOTE = (
    "TTFT ratio `-` with a TTFT: no rows of the reference method for that task with the same dtype and "
    "backend ran on the same machine (the rows' `hardware`), so no side-by-side ratio exists."
)


def unpaired(summary: pd.DataFrame) -> bool:
    """Whether some row has a TTFT but no side-by-side ratio to its reference."""
    return bool((summary["ttft_s"].notna() & summary["ttft_ratio"].isna()).any())


def to_markdown(summary: pd.DataFrame) -> str:
    """The summary as markdown: score, retention and TTFT ratio with their 95 % intervals
    (``value [lo, hi]``), and ``n``."""
    if summary.empty:
        return "(no results)\n"
    lines = [md_table(format_summary(summary)).rstrip("\n"), "", INTERVAL_NOTE]
    if unpaired(summary):
        lines += ["", UNPAIRED_NOTE]
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


# --------------------------------------------------------------------------- latency

LATENCY_POINT = ["model", "backend", "prompt_source", "batch", "length", "method", "keep_rate"]


def _stats(x: pd.Series) -> dict[str, float]:
    a = x.to_numpy(dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def summarize_latency(rows: pd.DataFrame) -> pd.DataFrame:
    """Latency rows: per grid point, method and keep: TTFT median/p90/p99 over the timed
    iterations, the method's own cost, and the speedup = median TTFT of the reference /
    median TTFT of the method *in the same run* (measured side by side on the same
    prompts) with its 95 % bootstrap interval (each side's timed iterations resampled;
    with several runs at a point, the median run's), the ideal speedup (FLOPs) and
    efficiency = speedup / ideal. The reference's own line pools its rows of every run at
    that point."""
    cols = [*LATENCY_POINT, "n", "failed", "ttft_median_s", "ttft_p90_s", "ttft_p99_s", "method_median_s",
            "base_prefill_median_s", "kept_fraction", "speedup", "speedup_lo", "speedup_hi", "ideal_speedup",
            "efficiency", "reference", "is_reference"]  # fmt: skip
    if rows.empty:
        return pd.DataFrame(columns=cols)
    df = rows.reset_index(drop=True)
    df["keep_rate"] = df["keep_rate"].astype(float).fillna(1.0)
    df[["batch", "length"]] = df[["batch", "length"]].astype(int)  # float where a folder mixes kinds
    df["_is_ref"] = df["method"] == df["reference_method"]
    df["method"] = label_variants(df, ["model", "backend", "prompt_source", "method", "keep_rate"])
    timed = df[~df["warmup"].astype(bool)]
    ok = timed[timed["status"] == "ok"]
    point = ["run_id", "batch", "length"]
    ref_med = ok[ok["_is_ref"]].groupby(point)["ttft_s"].median().rename("_ref_median")
    out = []
    for key, g in timed.groupby([*LATENCY_POINT, "_is_ref"], dropna=False, sort=True):
        good = g[g["status"] == "ok"]
        item = dict(zip([*LATENCY_POINT, "_is_ref"], key, strict=True))
        entry: dict[str, Any] = {k: item[k] for k in LATENCY_POINT}
        entry.update(
            n=len(good),
            failed=int((g["status"] != "ok").sum()),
            reference=g["reference_method"].iloc[0],
            is_reference=bool(item["_is_ref"]),
        )
        if good.empty:
            out.append(entry)
            continue
        st = _stats(good["ttft_s"])
        per_run = good.groupby(point)["ttft_s"].median().to_frame("_median").join(ref_med, how="left")
        speedup = float(np.nan) if item["_is_ref"] else float((per_run["_ref_median"] / per_run["_median"]).median())
        lo = hi = float(np.nan)
        if not item["_is_ref"]:
            ests = []
            for (run, b, n), gr in good.groupby(point):
                ref = ok[ok["_is_ref"] & (ok["run_id"] == run) & (ok["batch"] == b) & (ok["length"] == n)]
                if not ref.empty:
                    ests.append(ratio_of_medians_ci(ref["ttft_s"].to_numpy(), gr["ttft_s"].to_numpy()))
            if ests:
                mid = sorted(ests, key=lambda e: e.value)[len(ests) // 2]
                lo, hi = mid.lo, mid.hi
        ideal = float(good["ideal_speedup"].median())
        entry.update(
            ttft_median_s=st["median"],
            ttft_p90_s=st["p90"],
            ttft_p99_s=st["p99"],
            method_median_s=float(good["method_s"].median()),
            base_prefill_median_s=float(good["base_prefill_s"].median()),
            kept_fraction=float(good["kept_fraction"].mean()),
            speedup=1.0 if item["_is_ref"] else speedup,
            speedup_lo=lo,
            speedup_hi=hi,
            ideal_speedup=1.0 if item["_is_ref"] else ideal,
            efficiency=1.0 if item["_is_ref"] else speedup / ideal,
        )
        out.append(entry)
    return pd.DataFrame(out).reindex(columns=cols)


# --------------------------------------------------------------------------- serving (qps)


def _pct(a: pd.Series, q: float) -> float:
    a = a.dropna()
    return float(np.percentile(a.to_numpy(dtype=float), q)) if len(a) else float("nan")


def point_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Latency percentiles, timeouts and score of one request rate's request rows."""
    ok = rows[rows["status"] == "ok"]
    kept = rows["kept_tokens"].astype(float) / rows["prompt_tokens"].astype(float)
    out: dict[str, Any] = {
        "requests": len(rows),
        "completed": len(ok),
        "failed": int((rows["status"] != "ok").sum()),
        "timeouts": int(rows["timed_out"].sum()),
        "score": float(ok["score"].mean()) if len(ok) else float("nan"),
        "kept_fraction": float(kept.mean()),
        "kept_missing": int(rows["kept_tokens"].isna().sum()),
        **{f"ttft_p{q}_s": _pct(ok["ttft_s"], q) for q in (50, 90, 99)},
        **{f"tpot_p{q}_s": _pct(ok["tpot_s"], q) for q in (50, 90, 99)},
        **{f"e2e_p{q}_s": _pct(ok["e2e_s"], q) for q in (50, 90, 99)},
        "speculator_median_s": _pct(rows["speculator_s"], 50),
    }
    return out


QPS_POINT = ["model", "method", "keep_rate", "benchmark", "length", "arrival", "hardware", "dtype", "run_id"]


def summarize_qps_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run and request rate: percentiles, timeouts, score, verdicts."""
    per = []
    for key, g in rows.groupby([*QPS_POINT, "rate"], dropna=False, sort=True):
        first = g.iloc[0]
        per.append({
            **dict(zip([*QPS_POINT, "rate"], key, strict=True)), **point_stats(g),
            "request_throughput": first["request_throughput"],
            **{k: bool(first[k]) for k in ("pass_timeout_rule", "pass_ttft_slo", "passed")},
        })  # fmt: skip
    return pd.DataFrame(per)


def summarize_qps(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per serving run: the max QPS (highest passing rate) under both SLOs and
    each alone, the score and TTFT p90 at it, and the ratio to the reference method's max
    QPS on the same model, benchmark, length, arrival process, machine and dtype."""
    if rows.empty:
        return pd.DataFrame()
    rates = summarize_qps_rates(rows)
    out = []
    for key, pts in rates.groupby(QPS_POINT, dropna=False, sort=True):
        best: dict[str, Any] = dict(zip(QPS_POINT, key, strict=True))

        def highest(col: str, pts: pd.DataFrame = pts) -> float:
            ok = pts[pts[col]]["rate"]
            return float(ok.max()) if len(ok) else 0.0

        best.update(max_qps=highest("passed"), max_qps_timeout_rule=highest("pass_timeout_rule"),
                    max_qps_ttft_slo=highest("pass_ttft_slo"), rates_tested=len(pts))  # fmt: skip
        # The highest rate tried passed: the search ran out of points, the true max is higher.
        best["max_qps_censored"] = bool(pts.loc[pts["rate"].idxmax(), "passed"])
        at = pts[pts["rate"] == best["max_qps"]]
        best["score_at_max_qps"] = float(at["score"].iloc[0]) if len(at) else float("nan")
        best["ttft_p90_at_max_qps_s"] = float(at["ttft_p90_s"].iloc[0]) if len(at) else float("nan")
        run = rows[rows["run_id"] == best["run_id"]]
        best["score_all_rates"] = float(run["score"].mean())
        best["reference"] = run["reference_method"].iloc[0]
        out.append(best)
    df = pd.DataFrame(out)
    keys = ["model", "benchmark", "length", "arrival", "hardware", "dtype"]
    ref = df[df["method"] == df["reference"]][[*keys, "max_qps", "max_qps_censored"]].rename(
        columns={"max_qps": "_ref", "max_qps_censored": "_ref_censored"}
    )
    ref = ref.drop_duplicates(keys, keep="last")
    df = df.merge(ref, on=keys, how="left")
    df["qps_ratio_to_reference"] = (df["max_qps"] / df["_ref"].where(df["_ref"] > 0)).astype(float)
    # A ratio over a censored reference is unknown (both could be anything above); over an
    # exact one, a censored method's ratio is a lower bound.
    df["qps_ratio_bound"] = np.select(
        [df["_ref"].isna(), df["_ref_censored"].astype("boolean").fillna(False).astype(bool), df["max_qps_censored"]],
        ["", "unknown", "lower bound"],
        "exact",
    )
    df.loc[df["qps_ratio_bound"] == "unknown", "qps_ratio_to_reference"] = np.nan
    own = (df["method"] == df["reference"]) & (df["_ref"] > 0)
    df.loc[own, ["qps_ratio_to_reference", "qps_ratio_bound"]] = [1.0, "exact"]
    out = df.drop(columns=["_ref", "_ref_censored"]).sort_values([*keys, "method", "keep_rate"])
    return out.reset_index(drop=True)


def _md(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no results)\n"
    return md_table(df.astype(object).map(lambda v: f"{v:.3f}" if isinstance(v, float) else v))


@dataclass
class Report:
    """Everything one results folder's pages are made of (summaries, figures, rows)."""

    out: Path
    rows: pd.DataFrame
    summary: pd.DataFrame
    latency: pd.DataFrame
    qps: pd.DataFrame
    qps_rates: pd.DataFrame
    figures: list[tuple[str, Path]] = field(default_factory=list)  # (title, png)


def run_configs(out: Path) -> dict[str, dict[str, Any]]:
    """Each run folder's ``config.yaml`` under ``out``, by run id (the folder's name)."""
    from omegaconf import OmegaConf

    configs: dict[str, dict[str, Any]] = {}
    for folder in run_folders(out):
        try:
            cfg = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
        except Exception:  # an unreadable config must not cost the report; the rows still show
            cfg = {}
        configs[folder.name] = {str(k): v for k, v in cfg.items()} if isinstance(cfg, dict) else {}
    return configs


def build(out: Path, plots_dir: Path | None = None) -> Report:
    """Summaries and figures of ``out``; figures go to ``plots_dir`` (``<out>/plots``)."""
    from harness import plots

    out = Path(out)
    rows = read_results(out)
    figs = Path(plots_dir) if plots_dir is not None else out / "plots"
    ev = rows[rows["kind"] == "eval"]
    summary = summarize(ev)
    lat = summarize_latency(rows[rows["kind"] == "latency"])
    qrows = rows[rows["kind"] == "qps"]
    qps = summarize_qps(qrows)
    rates = summarize_qps_rates(qrows) if not qrows.empty else pd.DataFrame()
    if not rates.empty:
        slo = {k: (c.get("qps") or {}).get("ttft_p90_slo_s") for k, c in run_configs(out).items()}
        rates["slo_s"] = rates["run_id"].map(slo).astype(float)
    report = Report(out, rows, summary, lat, qps, rates)
    drawn: list[tuple[str, Path | None]] = []
    if not summary.empty:
        drawn += [
            ("Quality vs speed: retention vs measured TTFT speedup", plots.pareto(summary, figs / "pareto.png")),
            ("Score vs keep rate", plots.score_vs_keep(summary, figs / "score_vs_keep.png")),
            ("Needle tokens kept vs keep rate", plots.needle_vs_keep(summary, figs / "needle_vs_keep.png")),
            ("Score vs context length", plots.score_vs_length(summary, figs / "score_vs_length.png")),
            ("NIAH: score by needle depth and context length",
             plots.needle_heatmap(labelled(ev), figs / "needle_heatmap.png")),
        ]  # fmt: skip
    if not lat.empty:
        drawn += [
            ("TTFT speedup vs keep rate", plots.latency_vs_keep(lat, figs / "latency.png")),
            ("TTFT over the batch x length grid", plots.latency_grid(lat, figs / "latency_grid.png")),
        ]
    if not rates.empty:
        drawn.append(("Serving: TTFT p90 vs request rate", plots.qps_curves(rates, figs / "qps.png")))
    report.figures = [(t, p) for t, p in drawn if p is not None]
    return report


#: The committed depth sweep of the early-exit speculator (``make speculator-depth``): its
#: table, and the numbers the summary quotes from it.
DEPTH_SWEEP = "results/reference/speculator_depth_smollm2_cpu.md"
DEPTH_SWEEP_CSV = "results/reference/speculator_depth_smollm2_cpu.csv"
DEPTH_SWEEP_MODEL = "smollm2-135m"


def _depth_numbers(specs: list[str], csv: Path) -> str:
    """What the committed sweep measured at keep 0.1 for these depths and for the oracle."""
    if not csv.exists():
        return ""
    d = pd.read_csv(csv)
    d = d[(d["method"] == "specprefill") & (d["keep"] == 0.1)]
    if d.empty:
        return ""
    d = d.set_index(d["depth"].map(lambda m: f"self_layers:{int(m)}"))
    col = "lat_speedup" if "lat_speedup" in d and d["lat_speedup"].notna().any() else "speedup"
    top = f"self_layers:{int(d['depth'].max())}"
    parts = []
    for spec in dict.fromkeys([*specs, top]):  # these depths, then the oracle
        if spec in d.index:
            r = d.loc[spec]
            oracle = " (the oracle: all layers)" if spec == top else ""
            parts.append(f"{spec}{oracle} keeps {r['retention']:.2f} of full prefill's score at {r[col]:.2f}x")
    return f" At keep 0.1 it measured: {'; '.join(parts)}." if parts else ""


def speculator_note(rows: pd.DataFrame, csv: Path | None = None) -> str | None:
    """A line under the quality table when SpecPrefill ran with an early-exit speculator
    (``self_layers:M``, the offline stand-in for the paper's separate small model): where
    its loss at low keep rates comes from, where the depth sweep is and, for the sweep's
    model, what it measured for these depths and for the oracle."""
    from harness.plots import natural_key

    if rows.empty or "speculator" not in rows:
        return None
    ev = rows[(rows["kind"] == "eval") & (rows["method"] == "specprefill")]
    specs = sorted({str(s) for s in ev["speculator"].dropna() if str(s).startswith("self_layers:")}, key=natural_key)
    if not specs:
        return None
    numbers = ""
    if set(ev["model"].dropna().astype(str)) == {DEPTH_SWEEP_MODEL}:
        numbers = _depth_numbers(specs, csv or Path(__file__).resolve().parents[1] / DEPTH_SWEEP_CSV)
    return (
        f"SpecPrefill's speculator here is the base model's own first layers ({', '.join(specs)}: an early "
        f"exit, the offline stand-in for the paper's separate small speculator). At low keep rates most of "
        f"its loss comes from that weak scorer, not from the method: `{DEPTH_SWEEP}` measures every depth up "
        f"to the oracle (all layers: full prefill's quality, no speedup).{numbers}\n"
    )


def write_all(out: Path, plots_dir: Path | None = None, html: bool = True) -> pd.DataFrame:
    """Rewrite ``out``'s summaries (one section per kind of row present), its figures (under
    ``<out>/plots/``) and ``report.html``; print the summaries. Returns the quality summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    r = build(out, plots_dir)
    sections = []
    if not r.summary.empty:
        md = to_markdown(r.summary)
        wide = by_task_markdown(r.summary)
        if wide:
            md += "\nScore per task (`(n=K)`: fewer samples than the fullest point for that task):\n\n" + wide
        if note := speculator_note(r.rows):
            md += "\n" + note
        sections.append("## Quality\n\n" + md)
        r.summary.to_csv(out / "summary.csv", index=False)
    if not r.latency.empty:
        sections.append(
            "## Latency (TTFT; speedups side by side in one run, medians of timed iterations)\n\n" + _md(r.latency)
        )
        r.latency.to_csv(out / "latency_summary.csv", index=False)
    if not r.qps.empty:
        sections.append("## Serving (max QPS under the SLOs)\n\n" + _md(r.qps.drop(columns=["run_id"])))
        r.qps.to_csv(out / "qps_summary.csv", index=False)
        r.qps_rates.to_csv(out / "qps_rates.csv", index=False)
    text = "\n".join(sections) if sections else "(no results)\n"
    (out / "summary.md").write_text(text)
    written = [str(p) for _, p in r.figures]
    if html:
        from harness.html_report import write_html

        written.insert(0, str(write_html(r)))
    print(f"\nSummary of {out} (also {out / 'summary.md'}{'; ' + ', '.join(written) if written else ''}):\n")
    print(text)
    return r.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path, help="results folder (the out= of a run)")
    ap.add_argument("--plots", type=Path, default=None, help="folder of the figures (default: <out>/plots)")
    ap.add_argument("--no-html", action="store_true", help="skip report.html")
    a = ap.parse_args()
    problem = report_problem(a.out, a.plots)
    if problem:
        sys.exit(problem)  # one line on stderr, exit status 1
    write_all(a.out, a.plots, html=not a.no_html)


def report_problem(out: Path, plots: Path | None = None) -> str | None:
    """Why ``make report out=...`` cannot report ``out`` (one line), or None: it must be an
    existing results folder (a typo must not become an empty report in a new folder), and
    its figures folder must not be a file."""
    if not out.exists():
        return f"out={str(out)!r} does not exist; allowed: a results folder (the out= of a run)"
    if not out.is_dir():
        return f"out={str(out)!r} is a file; allowed: a results folder (the out= of a run)"
    figs = plots if plots is not None else out / "plots"
    if figs.exists() and not figs.is_dir():
        return f"{figs} is a file where the report's figures go; allowed: move it away or delete it"
    return None


if __name__ == "__main__":
    main()
