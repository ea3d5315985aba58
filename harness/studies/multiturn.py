"""Study: multi-turn SpecPrefill over a shared context. How much of turn 1's quality does each
policy keep on turns 2-4, at what TTFT?

The multi-turn benchmark (:mod:`harness.benchmarks.multiturn`: RULER's niah_multikey_1 at
``--length``, four needles with different keys, one key asked per turn), ``--limit``
conversations, one ``make eval`` job per keep running every policy (:mod:`specprefill.multiturn`)
turn by turn (``method=full also=[...]``):

* ``full``: full prefill with a prefix cache (turn k prefills only its new tokens), the reference;
* ``specprefill``: re-selected from scratch every turn (the speculator reads the whole
  conversation, the base prefills ``keep`` of it in a fresh cache);
* ``specprefill_frozen``: turn 1's selection frozen, later turns appended whole;
* ``specprefill_revival``: KV revival (the speculator re-scores the whole conversation from
  its own cache; the base prefills the newly selected earlier tokens at their original
  positions, then the new turn).

Per policy and turn: score and retention (paired with full prefill's same turn of the same
conversation) with 95 % intervals, the needle kept (the turn's own needle among the tokens
the base holds), TTFT of the turn, tokens prefilled and revived, the KV held; a figure of
score, TTFT and KV by turn. The policies run turn by turn in one job, in an order turned over
from turn to turn, so each turn's TTFT ratio to full prefill is side by side (the summary's
``speedup_timing``; rows from an older sweep, one run per policy, read "between runs").

    python -m harness.studies.multiturn [--model qwen2.5-coder-1.5b] [--length 2048] [--limit 30]
        [--keeps 0.1] [--out results/multiturn] [--no-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from harness.analysis.quality import summarize
from harness.rendering import plots
from harness.store import read_rows

METHODS = ["full", "specprefill", "specprefill_frozen", "specprefill_revival"]
POLICY = {
    "full": "prefix cache (full prefill)",
    "specprefill": "re-select every turn",
    "specprefill_frozen": "turn 1 frozen",
    "specprefill_revival": "KV revival",
}


def run_sweep(out: Path, model: str, length: int, limit: int, keeps: list[float]) -> None:
    """One job per keep: full prefill and every policy turn by turn on the same conversations."""
    keep = ",".join(f"{k:g}" for k in keeps)
    subprocess.run([sys.executable, "-m", "harness.jobs.eval", f"model={model}", "benchmark=multiturn",
                    f"length={length}", f"limit={limit}", f"method={METHODS[0]}", f"also=[{','.join(METHODS[1:])}]",
                    f"keep={keep}", f"out={out}"], check=True)  # fmt: skip


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (method, keep, turn): the summary's per-turn measures."""
    s = plots.turn_points(summarize(rows))
    df = pd.DataFrame({
        "method": s["method_name"], "keep": s["keep_rate"].astype(float), "turn": s["turn"], "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "needle_kept", "ttft_s", "speculator_s", "prefilled_tokens", "revived_tokens",
                             "kv_fraction", "speedup", "speedup_lo", "speedup_hi", "speedup_timing")},
    })  # fmt: skip
    order = {m: i for i, m in enumerate(METHODS)}
    df["_m"] = df["method"].map(order)
    return df.sort_values(["turn", "_m", "keep"]).drop(columns="_m").reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:
    def ci(v: float, lo: float, hi: float, f: str = ".1f") -> str:
        return "-" if pd.isna(v) else f"{v:{f}} [{lo:{f}}, {hi:{f}}]"

    def num(v: float, f: str) -> str:
        return "-" if pd.isna(v) else f"{v:{f}}"

    head = ("| turn | policy | keep | n | score | retention vs full, same turn | needle kept | TTFT s | "
            "speedup vs full, same turn | prefilled | revived | KV held |")  # fmt: skip
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in df.itertuples():
        full = r.method == "full"
        lines.append(
            f"| {r.turn} | {POLICY.get(str(r.method), r.method)} | {'-' if full else f'{r.keep:g}'} | {r.n} | "
            f"{ci(r.score, r.score_lo, r.score_hi)} | {'1' if full else ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | "
            f"{num(r.needle_kept, '.2f')} | {num(r.ttft_s, '.2f')} | "
            f"{'1.00x' if full else ci(r.speedup, r.speedup_lo, r.speedup_hi, '.2f')} | {num(r.prefilled_tokens, '.0f')} | "
            f"{num(r.revived_tokens, '.0f')} | {num(r.kv_fraction, '.2f')} |"
        )  # fmt: skip
    timing = sorted({str(t) for t in df.get("speedup_timing", pd.Series(dtype=str)).dropna()} - {""})
    lines += ["", f"Speedups: {' and '.join(timing) if timing else 'none'} (side by side: the policies ran turn by turn "
              "in one job, in an order turned over every turn; between runs: one run per policy, minutes apart)."]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a conf/model name (its speculator is used)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--limit", type=int, default=30, help="conversations (4 turns each)")
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1])
    ap.add_argument("--out", type=Path, default=Path("results/multiturn"))
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    a = ap.parse_args(argv)
    if not a.no_run:
        run_sweep(a.out, a.model, a.length, a.limit, a.keeps)
    rows = read_rows(sorted({p.parent for p in a.out.rglob("rows.parquet")}))
    rows = rows[rows["kind"] == "eval"]
    df = table(rows)
    df.to_csv(a.out / "multiturn.csv", index=False)
    text = markdown(df)
    (a.out / "multiturn.md").write_text(text + "\n")
    plots.by_turn(summarize(rows), a.out / "multiturn_by_turn.png")
    print(text)


if __name__ == "__main__":
    main()
