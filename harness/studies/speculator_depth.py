"""Sweep: how deep must an early-exit speculator be? SmolLM2-135M scoring its own prompt.

Offline there is one real model, so SpecPrefill's speculator on CPU is the base's own first
M layers (``self_layers:M``: those layers, the final norm and the LM head, sharing the
base's weights). This runs full prefill once and SpecPrefill for every depth M x keep rate
on RULER 4K's NIAH tasks (one ``make eval`` sweep, validated up front), then one ``make
latency`` job per depth x keep (SpecPrefill and full prefill interleaved on the same
4K-token prompts), and writes per point: score and retention with 95 % intervals (paired
with full prefill on the same samples), needle kept, the speculator's mean seconds, the
eval run's TTFT and speedup, the interleaved speedup with its interval (the one the
choice of depth reads: the eval run's ratios drift with the machine), the ideal speedup
from FLOPs and the efficiency speedup / ideal; and the Pareto plot (retention vs
interleaved speedup, one series per depth). ``self_layers:30`` is the oracle: the whole
base scores the prompt (a quality ceiling, no speedup possible).

    python -m harness.studies.speculator_depth [--limit 5] [--depths 4 8 12 16 20 24 30]
        [--keeps 0.1 0.3] [--iters 10] [--out results/speculator-depth] [--no-latency] [--no-run]
        [--quality-from results/reference/speculator_depth_smollm2_cpu.csv]

``--quality-from`` re-times a committed table: its quality columns (score, retention, needle
kept, the eval run's TTFTs) are read from that CSV, as committed, and only the latency jobs
run (their interleaved columns replaced); the eval rows need not be on this machine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.models.catalog import early_exit_layers
from harness.rendering import plots
from harness.rendering.tables import ci
from harness.studies import require_runs, require_values, run_job

TASKS = ["niah_single_1", "niah_single_2", "niah_multikey_1"]
MODEL, LENGTH = "smollm2-135m", 4096
#: The model's layers: ``self_layers:LAYERS`` is the oracle (the base scores itself).
LAYERS = 30
#: The interleaved columns :func:`latency_speedups` gives (and a re-time replaces), each
#: from its latency summary column (:func:`harness.analysis.speed.summarize_latency`).
LATENCY_COLUMNS = {
    "lat_n": "n", "lat_speedup": "speedup", "lat_speedup_lo": "speedup_lo", "lat_speedup_hi": "speedup_hi",
    "lat_ideal": "ideal_speedup", "lat_efficiency": "efficiency", "lat_aa": "aa_speedup",
    "lat_aa_lo": "aa_speedup_lo", "lat_aa_hi": "aa_speedup_hi", "lat_check": "flags",
}  # fmt: skip
#: What ``--quality-from`` needs of a committed table besides its speed.
QUALITY_COLUMNS = ["method", "depth", "keep", "n", "score", "retention", "needle_kept", "ttft_s", "speedup"]


def run_sweep(out: Path, limit: int, depths: list[int], keeps: list[float]) -> None:
    common = [sys.executable, "-m", "harness.jobs.eval", f"model={MODEL}", f"length={LENGTH}", f"limit={limit}",
              f"tasks=[{','.join(TASKS)}]", f"out={out}"]  # fmt: skip
    run_job([*common, "method=full", "keep=1"])
    speculators = ",".join(f"self_layers:{m}" for m in depths)
    keep = ",".join(f"{k:g}" for k in keeps)
    run_job([*common, "method=specprefill", f"model.speculator={speculators}", f"keep={keep}"])


def run_latency(out: Path, depths: list[int], keeps: list[float], iters: int) -> None:
    """The speedups, measured where drift cannot skew them: ``make latency`` interleaves
    SpecPrefill and full prefill iteration by iteration on the same 4K-token prompts, one
    job per depth x keep, each with its own full prefill beside it. (The eval sweep runs
    full prefill once, first, then each depth minutes later: on a shared machine whose
    speed drifts by 20 % over minutes, its ratios drift with it.)"""
    speculators = ",".join(f"self_layers:{m}" for m in depths)
    keep = ",".join(f"{k:g}" for k in keeps)
    run_job([sys.executable, "-m", "harness.jobs.latency", f"model={MODEL}", f"grid=[[1,{LENGTH}]]", "warmup=1",
                    f"iters={iters}", "method=specprefill", f"keep={keep}", f"model.speculator={speculators}",
                    "decode_tokens=0", f"out={out}"])  # fmt: skip


def latency_speedups(a: Analysis, column: str = "depth", key: Callable[[Any], Any] = early_exit_layers) -> pd.DataFrame:
    """Per (depth, keep): the latency summary's interleaved TTFT speedup over full prefill
    with its 95 % interval (:func:`harness.analysis.speed.summarize_latency`), the ideal
    speedup from FLOPs and the efficiency. ``column``/``key``: what names a speculator's
    line (the depth of ``self_layers:M``; the family study keys by the speculator itself)."""
    s = a.latency
    s = s[~s["is_reference"].astype(bool)]
    out = pd.DataFrame({column: s["speculator"].map(key), "keep": s["keep_rate"].astype(float),
                        **{name: s[source] for name, source in LATENCY_COLUMNS.items()}})  # fmt: skip
    out["lat_n"] = out["lat_n"].astype(int)
    out["lat_check"] = out["lat_check"].fillna("").replace("", "ok")
    return out.reset_index(drop=True)


def table(a: Analysis, latency: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per (depth, keep) and the full prefill reference: the quality summary's
    ``ALL`` row (:func:`harness.analysis.quality.summarize`); with ``latency``
    (:func:`latency_speedups`), each line's interleaved speedup beside it."""
    s = a.summary
    s = s[s["task"] == "ALL"]
    ref = s["method_name"] == s["reference"]
    df = pd.DataFrame({
        "method": s["method_name"], "depth": [None if r else early_exit_layers(x) for r, x in zip(ref, s["speculator"],
                                                                                             strict=True)],
        "keep": s["keep_rate"].astype(float), "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "needle_kept", "speculator_s", "ttft_s", "ttft_ratio", "speedup", "ideal_speedup",
                             "efficiency")},
    })  # fmt: skip
    if latency is not None and not latency.empty:
        df = df.merge(latency, on=["depth", "keep"], how="left")
    df["_keep"] = df["keep"].where(df["method"] != "full", -1.0)  # the reference first
    return df.sort_values(["_keep", "depth"]).drop(columns="_keep").reset_index(drop=True)


def retimed(committed: pd.DataFrame, latency: pd.DataFrame) -> pd.DataFrame:
    """A committed table (:func:`table`'s CSV) with its interleaved columns replaced by
    ``latency`` (:func:`latency_speedups` of new latency rows); its quality columns as they
    were. A (depth, keep) the new rows lack keeps no old number: its columns are empty."""
    quality = committed.drop(columns=[c for c in LATENCY_COLUMNS if c in committed])
    if latency.empty:
        raise ValueError("--quality-from: no latency rows to re-time the table with")
    return quality.merge(latency, on=["depth", "keep"], how="left")


def summary_of(df: pd.DataFrame, model: str = MODEL, length: int = LENGTH) -> pd.DataFrame:
    """:func:`table`'s lines as the ``ALL`` lines of a quality summary, for the Pareto plot
    where only the table is at hand (:func:`retimed`): one series per depth, the interleaved
    speedup and its interval on x, the FLOP ideal beside it."""
    spec = df[df["method"] == "specprefill"]
    return pd.DataFrame({
        "task": "ALL", "model": model, "benchmark": "ruler", "length": length, "reference": "full",
        "method_name": "specprefill", "method": [f"self_layers:{int(d)}" for d in spec["depth"]],
        "speculator": [f"self_layers:{int(d)}" for d in spec["depth"]], "keep_rate": spec["keep"].to_numpy(),
        "n": spec["n"].to_numpy(), "score": spec["score"].to_numpy(), "retention": spec["retention"].to_numpy(),
        "retention_lo": spec["retention_lo"].to_numpy(), "retention_hi": spec["retention_hi"].to_numpy(),
        "speedup": spec["lat_speedup"].to_numpy(), "speedup_lo": spec["lat_speedup_lo"].to_numpy(),
        "speedup_hi": spec["lat_speedup_hi"].to_numpy(), "ideal_speedup": spec["lat_ideal"].to_numpy(),
    })  # fmt: skip


def speedup_used(df: pd.DataFrame) -> str:
    """The speedup the choice reads: the interleaved one where it was measured."""
    return "lat_speedup" if "lat_speedup" in df and df["lat_speedup"].notna().any() else "speedup"


def choose(df: pd.DataFrame, keep: float = 0.1, min_speedup: float = 1.3) -> pd.Series | None:
    """The depth with the best retention among those with a real speedup (> ``min_speedup``)
    at ``keep`` (the interleaved speedup where measured, else the eval run's); ties go to
    the faster one."""
    col = speedup_used(df)
    c = df[(df["method"] == "specprefill") & (df["keep"] == keep) & (df[col] > min_speedup)]
    if c.empty:
        return None
    return c.sort_values(["retention", col], ascending=False).iloc[0]


def markdown(df: pd.DataFrame) -> str:

    lat = "lat_speedup" in df
    head = "| speculator | keep | n | score | retention | needle kept | speculator s | TTFT s | speedup (eval run) |"
    check = "lat_check" in df and df["lat_check"].notna().any()  # rows of the paired protocol say their check
    head += " speedup (interleaved) | ideal | efficiency |" if lat else " ideal | efficiency |"
    head += " A/A | check |" if check else ""
    lines = [head, "|---" * head.count(" | ") + "|---|"]
    for r in df.itertuples():
        name = (
            "full prefill"
            if r.method == "full"
            else f"self_layers:{int(r.depth)}" + (" (oracle)" if r.depth == LAYERS else "")
        )
        line = (
            f"| {name} | {r.keep:g} | {r.n} | {ci(r.score, r.score_lo, r.score_hi)} | "
            f"{ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | {r.needle_kept:.2f} | "
            f"{'-' if pd.isna(r.speculator_s) else f'{r.speculator_s:.2f}'} | {r.ttft_s:.2f} | {r.speedup:.2f}x |"
        )
        if lat:  # the interleaved speedup, and ideal / efficiency from FLOPs (latency rows)
            full = r.method == "full"
            if not full and pd.isna(r.lat_speedup):  # not timed side by side (a re-time that skipped it)
                line += " - | - | - |"
            else:
                sp = "1.00x" if full else ci(r.lat_speedup, r.lat_speedup_lo, r.lat_speedup_hi, ".2f")
                ideal, eff = (1.0, 1.0) if full else (r.lat_ideal, r.lat_efficiency)
                line += f" {sp} | {ideal:.2f}x | {eff:.2f} |"
            if check:
                aa = "-" if full or pd.isna(r.lat_aa) else ci(r.lat_aa, r.lat_aa_lo, r.lat_aa_hi, ".2f")
                line += f" {aa} | {'-' if full or pd.isna(r.lat_check) else r.lat_check} |"
        else:
            line += f" {r.ideal_speedup:.2f}x | {r.efficiency:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 8, 12, 16, 20, 24, 30])
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--out", type=Path, default=Path("results/speculator-depth"))
    ap.add_argument("--iters", type=int, default=10, help="timed pairs per latency point (the protocol's default)")
    ap.add_argument("--no-latency", action="store_true", help="speedups from the eval run only")
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    ap.add_argument("--quality-from", type=Path, help="re-time this committed table: its quality columns as they "
                    "are, only the latency jobs run (their columns replaced)")  # fmt: skip
    a = ap.parse_args()
    require_values(ap, "--depths", a.depths, lambda m: 1 <= m <= LAYERS, f"1 to {LAYERS} ({MODEL}'s layers)")
    require_values(ap, "--keeps", a.keeps, lambda k: 0 < k <= 1, "a fraction in (0, 1]")
    require_values(ap, "--limit", [a.limit], lambda n: n >= 1, "1 or more samples a task")
    require_values(ap, "--iters", [a.iters], lambda n: n >= 1, "1 or more timed pairs (5 or more for an interval)")
    if a.no_run:
        require_runs(ap, a.out)
    committed = None
    if a.quality_from is not None:
        if not a.quality_from.is_file():
            ap.error(f"--quality-from {a.quality_from}: no such file (a table this study wrote, speculator_depth.csv)")
        committed = pd.read_csv(a.quality_from)
        if missing := [c for c in QUALITY_COLUMNS if c not in committed]:
            ap.error(f"--quality-from {a.quality_from}: not a depth table (no {', '.join(missing)}; "
                     "speculator_depth.csv has them)")  # fmt: skip
    if a.quality_from is not None and a.no_latency:
        ap.error("--quality-from re-times a table: it needs the latency jobs (drop --no-latency)")
    if not a.no_run:
        if a.quality_from is None:
            run_sweep(a.out, a.limit, a.depths, a.keeps)
        if not a.no_latency:
            run_latency(a.out / "latency", a.depths, a.keeps, a.iters)

    found = analyze(a.out)
    if committed is not None:
        if found.of_kind("latency").empty:
            ap.error(f"--quality-from: no latency rows under {a.out} to re-time the table with")
        df = retimed(committed, latency_speedups(found))
    else:
        df = table(found, latency_speedups(found) if not found.of_kind("latency").empty else None)
    df.to_csv(a.out / "speculator_depth.csv", index=False)
    text = markdown(df)
    col = speedup_used(df)
    best = choose(df)
    if best is not None:
        how = "interleaved" if col == "lat_speedup" else "eval run"
        text += (
            f"\n\nChosen (best retention with speedup ({how}) > 1.3x at keep 0.1): self_layers:{int(best['depth'])}, "
            f"retention {best['retention']:.2f}, speedup {best[col]:.2f}x."
        )
    (a.out / "speculator_depth.md").write_text(text + "\n")
    if committed is not None:
        plots.pareto(summary_of(df), a.out / "speculator_depth_pareto.png")
        print(text)
        return
    summary = found.summary
    if col == "lat_speedup":  # the Pareto's x: the interleaved speedup and its interval
        summary = with_latency_speedups(summary, df)
    plots.pareto(summary, a.out / "speculator_depth_pareto.png")
    print(text)


def with_latency_speedups(
    summary: pd.DataFrame, df: pd.DataFrame, column: str = "depth", key: Callable[[Any], Any] = early_exit_layers
) -> pd.DataFrame:
    """The summary's overall SpecPrefill lines with the interleaved speedup (and its
    interval) in place of the eval run's and the latency rows' ideal speedup (FLOPs), for
    the Pareto plot: the figure draws the latency summary's numbers, it computes none.
    ``df``'s lines are named by ``column``, a summary line's by ``key`` of its speculator."""
    lat = df[df["method"] == "specprefill"].set_index([column, "keep"])
    summary = summary.copy()
    for i, r in summary[(summary["task"] == "ALL") & (summary["method_name"] == "specprefill")].iterrows():
        point = (key(r["speculator"]), float(r["keep_rate"]))
        if point in lat.index:
            x = lat.loc[point]
            summary.loc[i, ["speedup", "speedup_lo", "speedup_hi", "ideal_speedup"]] = [
                x["lat_speedup"], x["lat_speedup_lo"], x["lat_speedup_hi"], x["lat_ideal"]
            ]  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
