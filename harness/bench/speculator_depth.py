"""Sweep: how deep must an early-exit speculator be? SmolLM2-135M scoring its own prompt.

Offline there is one real model, so SpecPrefill's speculator on CPU is the base's own first
M layers (``self_layers:M``: those layers, the final norm and the LM head, sharing the
base's weights). This runs full prefill once and SpecPrefill for every depth M x keep rate
on RULER 4K's NIAH tasks (one ``make eval`` sweep, validated up front), then writes per
point: score and retention with 95 % intervals (paired with full prefill on the same
samples), needle kept, the speculator's mean seconds, TTFT ratio and speedup (side by
side, same run), the ideal speedup 1 / kept fraction and the efficiency speedup / ideal;
and the Pareto plot (retention vs speedup, one series per depth). ``self_layers:30`` is
the oracle: the whole base scores the prompt (a quality ceiling, no speedup possible).

    python -m harness.bench.speculator_depth [--limit 5] [--depths 4 8 12 16 20 24 30]
        [--keeps 0.1 0.3] [--out results/speculator-depth] [--no-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

TASKS = ["niah_single_1", "niah_single_2", "niah_multikey_1"]


def run_sweep(out: Path, limit: int, depths: list[int], keeps: list[float]) -> None:
    common = [sys.executable, "-m", "harness.run", "model=smollm2-135m", "length=4096", f"limit={limit}",
              f"tasks=[{','.join(TASKS)}]", f"out={out}"]  # fmt: skip
    subprocess.run([*common, "method=full", "keep=1"], check=True)
    speculators = ",".join(f"self_layers:{m}" for m in depths)
    keep = ",".join(f"{k:g}" for k in keeps)
    subprocess.run([*common, "method=specprefill", f"model.speculator={speculators}", f"keep={keep}"], check=True)


def depth_of(speculator: object) -> int | None:
    s = str(speculator or "")
    return int(s.split(":")[1]) if s.startswith("self_layers:") else None


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (depth, keep) and the full prefill reference, from the eval rows."""
    from harness.report import labelled, summarize

    summary = summarize(rows)
    overall = summary[summary["task"] == "ALL"].set_index(["method", "keep_rate"])
    lab = labelled(rows[rows["status"] == "ok"])
    out = []
    for (method, keep), g in lab.groupby(["method", "keep_rate"]):
        s = overall.loc[(method, keep)]
        depth = depth_of(g["speculator"].iloc[0]) if g["_base"].iloc[0] != "full" else None
        speedup = s["speedup"]
        ideal = 1.0 / s["kept_fraction"] if s["kept_fraction"] else float("nan")
        out.append({
            "method": g["_base"].iloc[0], "depth": depth, "keep": float(keep),
            "n": int(s["n"]), "score": s["score"], "score_lo": s["score_lo"], "score_hi": s["score_hi"],
            "retention": s["retention"], "retention_lo": s["retention_lo"], "retention_hi": s["retention_hi"],
            "needle_kept": s["needle_kept"], "speculator_s": g["speculator_s"].mean(),
            "ttft_s": s["ttft_s"], "ttft_ratio": s["ttft_ratio"], "speedup": speedup,
            "ideal_speedup": ideal, "efficiency": speedup / ideal if ideal == ideal else float("nan"),
        })  # fmt: skip
    df = pd.DataFrame(out)
    df["_keep"] = df["keep"].where(df["method"] != "full", -1.0)  # the reference first
    return df.sort_values(["_keep", "depth"]).drop(columns="_keep").reset_index(drop=True)


def choose(df: pd.DataFrame, keep: float = 0.1, min_speedup: float = 1.3) -> pd.Series | None:
    """The depth with the best retention among those with a real speedup (> ``min_speedup``)
    at ``keep``; ties go to the faster one."""
    c = df[(df["method"] == "specprefill") & (df["keep"] == keep) & (df["speedup"] > min_speedup)]
    if c.empty:
        return None
    return c.sort_values(["retention", "speedup"], ascending=False).iloc[0]


def markdown(df: pd.DataFrame) -> str:
    def ci(v: float, lo: float, hi: float, f: str = ".1f") -> str:
        return "-" if pd.isna(v) else f"{v:{f}} [{lo:{f}}, {hi:{f}}]"

    lines = [
        "| speculator | keep | n | score | retention | needle kept | speculator s | TTFT s | speedup | ideal | efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        name = (
            "full prefill"
            if r.method == "full"
            else f"self_layers:{int(r.depth)}" + (" (oracle)" if r.depth == 30 else "")
        )
        lines.append(
            f"| {name} | {r.keep:g} | {r.n} | {ci(r.score, r.score_lo, r.score_hi)} | "
            f"{ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | {r.needle_kept:.2f} | "
            f"{'-' if pd.isna(r.speculator_s) else f'{r.speculator_s:.2f}'} | {r.ttft_s:.2f} | "
            f"{r.speedup:.2f}x | {r.ideal_speedup:.2f}x | {r.efficiency:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 8, 12, 16, 20, 24, 30])
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--out", type=Path, default=Path("results/speculator-depth"))
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    a = ap.parse_args()
    if not a.no_run:
        run_sweep(a.out, a.limit, a.depths, a.keeps)
    from harness import plots, report
    from harness.store import read_rows

    rows = read_rows(sorted({p.parent for p in a.out.rglob("rows.parquet")}))
    rows = rows[rows["kind"] == "eval"]
    df = table(rows)
    df.to_csv(a.out / "speculator_depth.csv", index=False)
    text = markdown(df)
    best = choose(df)
    if best is not None:
        text += (
            f"\n\nChosen (best retention with speedup > 1.3x at keep 0.1): self_layers:{int(best['depth'])}, "
            f"retention {best['retention']:.2f}, speedup {best['speedup']:.2f}x."
        )
    (a.out / "speculator_depth.md").write_text(text + "\n")
    plots.pareto(report.summarize(rows), a.out / "speculator_depth_pareto.png")
    print(text)


if __name__ == "__main__":
    main()
