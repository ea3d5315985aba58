"""Cross-check: our RULER against lm-evaluation-harness's RULER, same model, full prefill.

Runs (or reads, when their rows exist) ``make eval`` on RULER 4K (niah_single_1,
niah_single_2, niah_multikey_1, qa_1) and ``make lm-eval`` on lm-eval's tasks of the same
names (``ruler_qa_squad`` for qa_1), ``limit`` documents each, and writes the table: per
task, each side's n, mean score with its 95 % bootstrap interval, mean prompt tokens, and
the difference with an unpaired bootstrap interval (the two generators draw different
haystacks and needles, so documents do not pair). lm-eval's QA metric averages over the
references where RULER's official ``string_match_part`` takes any one; the table also
re-scores lm-eval's own QA answers with RULER's rule, so a gap from the metric and a gap
from the model's answers can be told apart.

    python -m harness.studies.lm_eval_crosscheck [--limit 20] [--out results/lm-eval-crosscheck]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.analysis.folder import analyze
from harness.analysis.stats import Estimate, estimate, mean_draws, task_seed
from harness.studies import require_runs, run_job

#: our task -> lm-eval's task of the same data
TASKS = {
    "niah_single_1": "niah_single_1",
    "niah_single_2": "niah_single_2",
    "niah_multikey_1": "niah_multikey_1",
    "qa_1": "ruler_qa_squad",
}


def run_both(out: Path, limit: int, model: str) -> None:
    common = [f"model={model}", "method=full", "keep=1", f"limit={limit}", "length=4096"]
    ours = [sys.executable, "-m", "harness.jobs.eval", *common, f"tasks=[{','.join(TASKS)}]", f"out={out / 'ours'}"]
    theirs = [
        sys.executable,
        "-m",
        "harness.jobs.lm_eval",
        *common,
        f"tasks=[{','.join(TASKS.values())}]",
        f"out={out / 'lm-eval'}",
    ]
    for cmd in (ours, theirs):
        run_job(cmd)


def rows(root: Path) -> pd.DataFrame:
    """The ok full-prefill rows under ``root`` (:func:`harness.analysis.folder.analyze`)."""
    df = analyze(root).rows
    return df[(df["status"] == "ok") & (df["method"] == "full")]


def ruler_part(prediction: str, references: list[str]) -> float:
    """RULER's official ``string_match_part`` of one answer: 100 if any reference is in it."""
    return 100.0 * max(float(r.lower() in prediction.lower()) for r in references)


def lm_eval_references(root: Path) -> dict[tuple[str, int], list[str]]:
    """Each lm-eval document's list of references (its ``outputs``), from lm-eval's log."""
    refs = {}
    for path in root.rglob("lm_eval_samples.jsonl"):
        for line in path.read_text().splitlines():
            d = json.loads(line)
            refs[(d["task"], int(d["doc_id"]))] = [str(x) for x in d["doc"]["outputs"]]
    return refs


def fmt(e: Estimate) -> str:
    return f"{e.value:.1f} [{e.lo:.1f}, {e.hi:.1f}]"


def table(ours: pd.DataFrame, theirs: pd.DataFrame, refs: dict[tuple[str, int], list[str]]) -> str:
    lines = [
        "| task (ours / lm-eval) | n | ours | prompt tokens | n | lm-eval | prompt tokens | lm-eval − ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    extra = []
    for mine, other in TASKS.items():
        a = ours[ours["task"] == mine]["score"].to_numpy(float)
        t = theirs[theirs["task"] == other]
        b = t["score"].to_numpy(float)
        if a.size == 0 or b.size == 0:
            continue
        da, db = mean_draws(a, task_seed(mine)), mean_draws(b, task_seed(other) + 1)
        ea, eb = estimate(float(a.mean()), da, a.size), estimate(float(b.mean()), db, b.size)
        diff = estimate(float(b.mean() - a.mean()), db - da, min(a.size, b.size))
        pa = ours[ours["task"] == mine]["prompt_tokens"].mean()
        pb = t["prompt_tokens"].mean()
        lines.append(
            f"| {mine} / {other} | {a.size} | {fmt(ea)} | {pa:.0f} | {b.size} | {fmt(eb)} | {pb:.0f} | {fmt(diff)} |"
        )
        if mine.startswith("qa"):
            rescored = np.array(
                [
                    ruler_part(str(p), refs[(other, int(i))])
                    for p, i in zip(t["prediction"], t["sample_id"], strict=True)
                ]
            )
            er = estimate(float(rescored.mean()), mean_draws(rescored, task_seed(other) + 2), rescored.size)
            dr = estimate(float(rescored.mean() - a.mean()), mean_draws(rescored, task_seed(other) + 2) - da, a.size)
            extra.append(
                f"| {mine} / {other}, lm-eval's answers scored by RULER's rule (any reference) | | | | "
                f"{rescored.size} | {fmt(er)} | | {fmt(dr)} |"
            )
    return "\n".join(lines + extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("results/lm-eval-crosscheck"))
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    a = ap.parse_args()
    if a.no_run:
        require_runs(ap, a.out / "ours", a.out / "lm-eval")
    else:
        run_both(a.out, a.limit, a.model)
    text = table(rows(a.out / "ours"), rows(a.out / "lm-eval"), lm_eval_references(a.out / "lm-eval"))
    (a.out / "crosscheck.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
