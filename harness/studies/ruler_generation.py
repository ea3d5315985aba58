"""Benchmark: time to generate RULER (13 tasks x 100 samples) at 4K, 32K and 128K.

Uses the SmolLM2 tokenizer and chat format and bypasses the parquet cache, so it times
the generator itself (haystack-size bisection, sample construction, token counting).

    python -m harness.studies.ruler_generation [--lengths 4096 32768 131072] [--samples 100]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tqdm.auto import tqdm

from harness.benchmarks import ruler
from harness.models.loading import smollm2_dir
from harness.studies import write_reference
from harness.types import PromptFormat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 32768, 131072])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--tasks", nargs="+", default=None)
    ap.add_argument("--out", type=Path, default=Path("results/reference/ruler_generation.json"))
    a = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    fmt = PromptFormat.from_tokenizer(tok, chat=True)

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=False).input_ids)

    t0 = time.perf_counter()
    ruler.essay_sentences()
    for d in ("squad", "hotpotqa"):
        ruler.qa_data(d)
    setup_s = time.perf_counter() - t0
    rows = []
    tasks = a.tasks or list(ruler.TASKS)
    for length in a.lengths:
        for task in tqdm(tasks, desc=f"RULER {length}"):
            t = time.perf_counter()
            samples = ruler.generate(task, length, a.samples, fmt, count)
            dt = time.perf_counter() - t
            lens = [count(s.prompt) for s in samples[:5]]
            rows.append(
                {
                    "length": length,
                    "task": task,
                    "samples": len(samples),
                    "seconds": round(dt, 2),
                    "first_prompt_tokens": lens,
                }
            )
        total = sum(r["seconds"] for r in rows if r["length"] == length)
        print(f"length {length}: {len(tasks)} tasks x {a.samples} samples in {total:.1f}s", flush=True)
    write_reference(
        a.out, "ruler_generation", rows, tokenizer="SmolLM2-135M-Instruct (chat)", one_time_setup_s=round(setup_s, 2)
    )


if __name__ == "__main__":
    main()
