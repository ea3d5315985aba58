"""Cross-check: our KV presses against kvpress's own pipeline, same press, model and samples.

Runs ``make eval`` with each press on RULER 4K, ``limit`` samples per task, and the same
samples through kvpress's ``KVPressTextGenerationPipeline``
(``pipeline("kv-press-text-generation")(context, question=..., answer_prefix=..., press=...)``,
which applies the chat template, compresses the context and answers greedily), both on the
same loaded model, both scored with RULER's official metric, in one of kvpress's two
settings (``--setting``):

* ``agnostic``: ours with ``method.query_aware=false``; kvpress's pipeline with the question
  as ``question=`` (the context compressed, the question, chat tail and answer prefix whole);
* ``aware``: ours with ``method.query_aware=true`` (the default); kvpress's pipeline with
  the question inside the context and ``question=""`` (kvpress's query-aware evaluation:
  context and question compressed, the chat tail and answer prefix whole).

The table gives, per press and keep, each side's mean score with its 95 % bootstrap
interval, the paired difference (the same samples on both sides, resampled together) and
the fraction of identical answers; ``rows.csv`` holds both sides' answers per sample, so
every count can be recomputed.

    python -m harness.studies.kvpress_crosscheck [--limit 10] [--keeps 0.5] [--setting agnostic|aware]
        [--presses knorm,snapkv,streaming_llm] [--out results/kvpress-crosscheck]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from baselines.kv_presses import attention_patched
from harness.analysis.folder import analyze
from harness.analysis.quality import Point, macro_mean, paired_difference
from harness.analysis.stats import Estimate
from harness.benchmarks.base import BenchmarkConfig
from harness.benchmarks.samples import benchmark_samples
from harness.models.catalog import model_config
from harness.models.loading import load
from harness.registry import build_benchmark, build_method
from harness.studies import require_runs, run_job
from specprefill.backends.transformers import cache_positions_restored

TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "qa_1")


SETTINGS = {"agnostic": False, "aware": True}


def run_ours(out: Path, model: str, presses: list[str], keeps: list[float], limit: int, setting: str) -> None:
    keep = ",".join(f"{k:g}" for k in keeps)
    for name in presses:  # one command per press: each takes its own query_aware option
        cmd = [
            sys.executable,
            "-m",
            "harness.jobs.eval",
            f"model={model}",
            f"method={name}",
            f"keep={keep}",
            f"method.query_aware={str(SETTINGS[setting]).lower()}",
            f"limit={limit}",
            "length=4096",
            f"tasks=[{','.join(TASKS)}]",
            f"out={out}",
        ]
        run_job(cmd)


def run_theirs(model: str, presses: list[str], keeps: list[float], limit: int, setting: str) -> pd.DataFrame:
    """Every sample through kvpress's pipeline with each press, on our loaded model."""
    import kvpress  # type: ignore[import-untyped]  # noqa: F401  (deferred: registers its pipeline, patches attention)
    from transformers import pipeline

    cfg = model_config(model)
    lm = load(cfg)
    bench = build_benchmark(BenchmarkConfig(name="ruler", length=4096, tasks=TASKS, limit=limit))
    _, samples = benchmark_samples(cfg, bench)
    pipe: Any = pipeline("kv-press-text-generation", model=lm.base, tokenizer=lm.tokenizer)  # type: ignore[call-overload]
    aware = SETTINGS[setting]
    out = []
    for name in presses:
        for keep in keeps:
            press = build_method(name, {"keep_rate": keep, "query_aware": aware}).press()  # type: ignore[attr-defined]
            for s in tqdm(samples, desc=f"kvpress pipeline {name} keep {keep:g}", unit="sample"):
                # the question inside the context (query-aware) or after it (question=)
                context = s.instruction + s.context + (s.question if aware else "")
                with cache_positions_restored(lm.base), attention_patched():  # kvpress's pipeline as kvpress runs it
                    answer = pipe(
                        context,
                        question="" if aware else s.question,
                        answer_prefix=s.answer_prefix,
                        press=press,
                        max_new_tokens=s.max_new_tokens,
                    )["answer"]
                out.append(
                    {
                        "method": name,
                        "keep_rate": keep,
                        "task": s.task,
                        "sample_id": s.sample_id,
                        "prediction": str(answer),
                        "score": bench.score(s, str(answer)),
                    }
                )
    return pd.DataFrame(out)


def fmt(e: Estimate) -> str:
    return f"{e.value:.1f} [{e.lo:.1f}, {e.hi:.1f}]"


def paired_rows(ours: pd.DataFrame, theirs: pd.DataFrame) -> pd.DataFrame:
    """Both sides per sample (press, keep, task, sample): answers and scores."""
    o = ours[["method", "keep_rate", "task", "sample_id", "prediction", "score"]].copy()
    o["keep_rate"] = o["keep_rate"].astype(float).round(6)
    t = theirs.copy()
    t["keep_rate"] = t["keep_rate"].astype(float).round(6)
    m = t.merge(o, on=["method", "keep_rate", "task", "sample_id"], suffixes=("_kvpress", "_ours"))
    m["same_answer"] = m["prediction_kvpress"].astype(str).str.strip() == m["prediction_ours"].astype(str).str.strip()
    return m.sort_values(["method", "keep_rate", "task", "sample_id"]).reset_index(drop=True)


def table(pairs: pd.DataFrame) -> str:
    """Per press and keep: each side's macro mean score over the tasks, and kvpress's minus
    ours, paired (the analysis layer's estimators), with the share of identical answers."""
    lines = [
        "| press | keep | n | ours | kvpress pipeline | kvpress − ours (paired) | same answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, keep), m in pairs.groupby(["method", "keep_rate"]):
        o = m.rename(columns={"score_ours": "score"})
        t = m.rename(columns={"score_kvpress": "score"})
        if m.empty:
            continue
        parts = [sorted({str(x) for x in m["task"]})]  # over tasks, as RULER's ALL
        mine, other = Point(o[["task", "sample_id", "score"]]), Point(t[["task", "sample_id", "score"]])
        diff, _, _ = paired_difference(other, mine, "score", parts)
        lines.append(
            f"| {name} | {float(keep):g} | {len(m)} | {fmt(macro_mean(mine, 'score', parts))} | "
            f"{fmt(macro_mean(other, 'score', parts))} | {fmt(diff)} | "
            f"{int(m['same_answer'].sum())} of {len(m)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.5])
    ap.add_argument("--setting", choices=list(SETTINGS), default="agnostic")
    ap.add_argument("--presses", default="knorm,snapkv,streaming_llm")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("results/kvpress-crosscheck"))
    ap.add_argument("--no-run", action="store_true", help="only tabulate what a run left under --out")
    a = ap.parse_args()
    presses = a.presses.split(",")
    if a.no_run:  # the table again from what a run left under --out
        require_runs(ap, a.out / "ours")
        if not (a.out / "kvpress_pipeline.csv").is_file():
            ap.error(f"--no-run: no {a.out / 'kvpress_pipeline.csv'}; allowed: the --out of a run of this study")
        theirs = pd.read_csv(a.out / "kvpress_pipeline.csv", keep_default_na=False)
    else:
        run_ours(a.out / "ours", a.model, presses, a.keeps, a.limit, a.setting)
        theirs = run_theirs(a.model, presses, a.keeps, a.limit, a.setting)
        a.out.mkdir(parents=True, exist_ok=True)
        theirs.to_csv(a.out / "kvpress_pipeline.csv", index=False)
    if "keep_rate" not in theirs:  # a file from before several keeps: its one keep
        theirs["keep_rate"] = a.keeps[0]
    ours = analyze(a.out / "ours").ok("eval")
    pairs = paired_rows(ours, theirs)
    pairs.to_csv(a.out / "rows.csv", index=False)
    text = table(pairs)
    (a.out / "crosscheck.md").write_text(text + "\n")
    meta = {"keeps": a.keeps, "limit": a.limit, "model": a.model, "setting": a.setting}
    (a.out / "crosscheck.json").write_text(json.dumps(meta) + "\n")
    print(text)


if __name__ == "__main__":
    main()
