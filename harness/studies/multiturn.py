"""Study: multi-turn SpecPrefill over a shared context. How much of turn 1's quality does each
policy keep on turns 2-4, at what TTFT?

The multi-turn benchmark (:mod:`harness.benchmarks.shared_context`: RULER's niah_multikey_1 at
``--length``, four needles with different keys, one key asked per turn), ``--limit``
conversations, one ``make eval`` job per keep running every policy (:mod:`specprefill.conversation`)
turn by turn (``method=full also=[...]``):

* ``full``: full prefill with a prefix cache (turn k prefills only its new tokens), the reference;
* ``specprefill``: re-selected from scratch every turn (the speculator reads the whole
  conversation, the base prefills ``keep`` of it in a fresh cache);
* ``specprefill_frozen``: turn 1's selection frozen, later turns appended whole;
* ``specprefill_revival``: KV revival (the speculator re-scores the whole conversation from
  its own cache; the base prefills the newly selected earlier tokens at their original
  positions, then the new turn).

The later turns ask their keys in an order drawn per conversation (the benchmark's
``key_order: shuffled``), so a turn's needle is as likely early as late in the context.

Per policy and turn: score and retention (paired with full prefill's same turn of the same
conversation) with 95 % intervals, the needle kept (the turn's own needle among the tokens
the base holds), TTFT of the turn, tokens prefilled and revived, the KV held in tokens and
the KV memory against full prefill's (both caches: KV revival keeps the speculator's cache of
the whole conversation); turns 2.. by the asked needle's depth (:func:`by_depth`); policy
against policy by paired score differences per turn and over turns 2.. (:func:`differences`);
every interval resamples whole conversations; a figure of score, TTFT and KV memory by turn. The policies run turn by turn in one job, in an order turned over
from turn to turn, so each turn's TTFT ratio to full prefill is side by side (the summary's
``speedup_timing``; rows from an older sweep, one run per policy, read "between runs").

    python -m harness.studies.multiturn [--model qwen2.5-coder-1.5b] [--length 2048] [--limit 30]
        [--keeps 0.1] [--out results/multiturn] [--no-run]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.analysis.quality import Point, paired_difference, unit_mean
from harness.rendering import plots
from harness.rendering.tables import ci, difference, num
from harness.studies import run_job

METHODS = ["full", "specprefill", "specprefill_frozen", "specprefill_revival"]
POLICY = {
    "full": "prefix cache (full prefill)",
    "specprefill": "re-select every turn",
    "specprefill_frozen": "turn 1 frozen",
    "specprefill_revival": "KV revival",
}


def run_sweep(out: Path, model: str, length: int, limit: int, keeps: list[float], dry_run: bool = False) -> None:
    """One job per keep: full prefill and every policy turn by turn on the same conversations
    (``dry_run``: the jobs' plans, nothing loaded)."""
    keep = ",".join(f"{k:g}" for k in keeps)
    run_job([sys.executable, "-m", "harness.jobs.eval", f"model={model}", "benchmark=multiturn",
             f"length={length}", f"limit={limit}", f"method={METHODS[0]}", f"also=[{','.join(METHODS[1:])}]",
             f"keep={keep}", f"out={out}", *(["dry_run=true"] if dry_run else [])])  # fmt: skip


def table(a: Analysis) -> pd.DataFrame:
    """One line per (method, keep, turn): the summary's per-turn measures."""
    s = plots.turn_points(a.summary)
    df = pd.DataFrame({
        "method": s["method_name"], "keep": s["keep_rate"].astype(float), "turn": s["turn"], "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "needle_kept", "ttft_s", "speculator_s", "prefilled_tokens", "revived_tokens",
                             "kv_fraction", "kv_memory_ratio", "kv_memory_ratio_lo", "kv_memory_ratio_hi",
                             "speculator_kv_mib", "speedup", "speedup_lo", "speedup_hi", "speedup_timing")},
    })  # fmt: skip
    order = {m: i for i, m in enumerate(METHODS)}
    df["_m"] = df["method"].map(order)
    return df.sort_values(["turn", "_m", "keep"]).drop(columns="_m").reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:
    head = ("| turn | policy | keep | n | score | retention vs full, same turn | needle kept | TTFT s | "
            "speedup vs full, same turn | prefilled | revived | KV held (tokens) | KV memory vs full (both caches) |")  # fmt: skip
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in df.itertuples():
        full = r.method == "full"
        lines.append(
            f"| {r.turn} | {POLICY.get(str(r.method), r.method)} | {'-' if full else f'{r.keep:g}'} | {r.n} | "
            f"{ci(r.score, r.score_lo, r.score_hi)} | {'1' if full else ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | "
            f"{num(r.needle_kept, '.2f')} | {num(r.ttft_s, '.2f')} | "
            f"{'1.00x' if full else ci(r.speedup, r.speedup_lo, r.speedup_hi, '.2f')} | {num(r.prefilled_tokens, '.0f')} | "
            f"{num(r.revived_tokens, '.0f')} | {num(r.kv_fraction, '.2f')} | "
            f"{'1' if full else ci(r.kv_memory_ratio, r.kv_memory_ratio_lo, r.kv_memory_ratio_hi, '.2f')} |"
        )  # fmt: skip
    timing = sorted({str(t) for t in df.get("speedup_timing", pd.Series(dtype=str)).dropna()} - {""})
    lines += ["", f"Speedups: {' and '.join(timing) if timing else 'none'} (side by side: the policies ran turn by turn "
              "in one job, in an order turned over every turn; between runs: one run per policy, minutes apart). "
              "KV held: the base's cache after the turn's prefill over the conversation, in tokens; KV memory vs "
              "full: the bytes held (the base's cache plus KV revival's speculator cache of the whole conversation) "
              "over full prefill's on the same turn. Intervals: 95 % bootstrap over conversations."]  # fmt: skip
    return "\n".join(lines)


#: Needle depth bins (the asked needle's position in the context, 0 = its start).
DEPTHS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0001))


def by_depth(a: Analysis) -> pd.DataFrame:
    """Turns 2.. pooled, by the asked needle's depth in the context: per policy, keep and
    depth bin, the score and the needle kept with 95 % intervals over conversations (a
    conversation's turns in one bin resampled together,
    :func:`harness.analysis.quality.unit_mean`)."""
    d = a.ok("eval")
    d = d[pd.to_numeric(d.get("turn"), errors="coerce") > 1]
    d = d.assign(depth=pd.to_numeric(d["needle_depth"], errors="coerce")).dropna(subset=["depth"])
    out = []
    for (method, keep), g in d.groupby(["method", "keep_rate"]):
        for lo, hi in DEPTHS:
            b = g[(g["depth"] >= lo) & (g["depth"] < hi)]
            if b.empty:
                continue
            row: dict[str, object] = {"method": method, "keep": float(keep), "depth": f"{lo:.2f}-{min(hi, 1.0):.2f}",
                                      "turns": len(b), "conversations": b["sample_id"].nunique()}  # fmt: skip
            for col in ("score", "needle_kept"):
                v = pd.to_numeric(b[col], errors="coerce").to_numpy(dtype=float)
                e = unit_mean(v, b["sample_id"].astype(int).tolist(), "by-depth")
                row.update({col: e.value, f"{col}_lo": e.lo, f"{col}_hi": e.hi})
            out.append(row)
    df = pd.DataFrame(out)
    if df.empty:
        return df
    order = {m: i for i, m in enumerate(METHODS)}
    return df.sort_values(["keep", "method", "depth"], key=lambda c: c.map(order) if c.name == "method" else c)


#: The policy comparisons the study reports (candidate, baseline).
PAIRS = [("specprefill_revival", "specprefill"), ("specprefill_frozen", "specprefill"),
         ("specprefill_revival", "specprefill_frozen")]  # fmt: skip


def differences(a: Analysis) -> pd.DataFrame:
    """Policy against policy at the same keep, paired by conversation: the score difference
    (candidate - baseline; :func:`harness.analysis.quality.paired_difference`) per turn and
    over turns 2.. (whole conversations resampled), with the conversations the candidate
    won and lost."""
    d = a.ok("eval")
    d = d[d["task"].str.contains("/turn", regex=False)]
    tasks = sorted(set(d["task"]), key=lambda t: int(t.rsplit("/turn", 1)[1]))
    later = [t for t in tasks if not t.endswith("/turn1")]
    out = []
    for keep in sorted(set(d.loc[~d["is_reference"], "keep_rate"])):
        for cand, base in PAIRS:
            c = d[(d["method"] == cand) & np.isclose(d["keep_rate"], keep)]
            b = d[(d["method"] == base) & np.isclose(d["keep_rate"], keep)]
            if c.empty or b.empty:
                continue
            pc, pb = Point(c), Point(b)
            m = c.set_index(["task", "sample_id"])["score"].astype(float)
            n = b.set_index(["task", "sample_id"])["score"].astype(float)
            for name, parts in [*((t.rsplit("/", 1)[1], [[t]]) for t in tasks), ("turns 2+", [later])]:
                diff, _, _ = paired_difference(pc, pb, "score", parts)
                names = [t for group in parts for t in group]
                both = m[m.index.get_level_values(0).isin(names)].to_frame("c").join(n.rename("b"), how="inner")
                out.append({"keep": float(keep), "candidate": cand, "baseline": base, "turn": name,
                            "difference": diff.value, "lo": diff.lo, "hi": diff.hi,
                            "n": int(both.index.get_level_values(1).nunique()),
                            "wins": int((both["c"] > both["b"]).sum()), "losses": int((both["c"] < both["b"]).sum())})  # fmt: skip
    return pd.DataFrame(out)


def depth_markdown(df: pd.DataFrame) -> str:
    lines = [
        "| policy | keep | needle depth | turns (conversations) | score | needle kept |",
        "|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        keep = "-" if r.method == "full" else f"{r.keep:g}"
        lines.append(f"| {POLICY.get(str(r.method), r.method)} | {keep} | {r.depth} | {r.turns} ({r.conversations}) | "
                     f"{ci(r.score, r.score_lo, r.score_hi, '.1f')} | {ci(r.needle_kept, r.needle_kept_lo, r.needle_kept_hi, '.2f')} |")  # fmt: skip
    lines += ["", "Turns 2 and later, by the asked needle's depth in the context (0 = its start); 95 % bootstrap "
              "intervals over conversations."]  # fmt: skip
    return "\n".join(lines)


def differences_markdown(df: pd.DataFrame) -> str:
    lines = [
        "| keep | policy | against | turn | score difference [95 %] | conversations | wins / losses |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        lines.append(f"| {r.keep:g} | {POLICY[r.candidate]} | {POLICY[r.baseline]} | {r.turn} | "
                     f"{difference(r.difference, r.lo, r.hi)} | {r.n} | {r.wins} / {r.losses} |")  # fmt: skip
    lines += ["", "Score difference (0-100 points), the policy minus the one it is compared with, paired by "
              "conversation; over turns 2+ the mean over turns with whole conversations resampled. Wins / losses: "
              "conversation-turns where the policy scored higher / lower."]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a conf/model name (its speculator is used)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--limit", type=int, default=30, help="conversations (4 turns each)")
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1])
    ap.add_argument("--out", type=Path, default=Path("results/multiturn"))
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    ap.add_argument(
        "--dry-run", action="store_true", help="print the jobs' plans (what loads, whether it can run here)"
    )
    a = ap.parse_args(argv)
    if a.dry_run:
        run_sweep(a.out, a.model, a.length, a.limit, a.keeps, dry_run=True)
        return
    if not a.no_run:
        run_sweep(a.out, a.model, a.length, a.limit, a.keeps)
    found = analyze(a.out)
    df = table(found)
    df.to_csv(a.out / "multiturn.csv", index=False)
    depth, diff = by_depth(found), differences(found)
    depth.to_csv(a.out / "multiturn_by_depth.csv", index=False)
    diff.to_csv(a.out / "multiturn_differences.csv", index=False)
    text = "\n\n".join([markdown(df), "## By needle depth", depth_markdown(depth),
                         "## Policy against policy", differences_markdown(diff)])  # fmt: skip
    (a.out / "multiturn.md").write_text(text + "\n")
    plots.by_turn(found.summary, a.out / "multiturn_by_turn.png")
    print(text)


if __name__ == "__main__":
    main()
