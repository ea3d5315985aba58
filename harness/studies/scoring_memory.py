"""Benchmark: SpecPrefill scoring memory grows linearly in the prompt length N.

Scoring uses only the L look-ahead query rows against the N prompt keys, one layer at a
time: its extra memory is O(heads * L * N), never N x N. Each N runs in a fresh process
(peak RSS is monotone, so process isolation gives clean numbers): load the tiny random
model, prefill the speculator with query capture and save the capture; then,
in a second fresh process, load the capture and score and select: the peak RSS
above the loaded inputs is the scoring's own memory. For contrast we print what the
N x N attention matrices would take (what ``output_attentions=True`` materialises).

    python -m harness.studies.scoring_memory  [--lengths 4096 16384 65536] [--out results/reference/scoring_memory.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.models.catalog import model_config
from harness.models.loading import load
from harness.studies import write_reference
from specprefill.backends.transformers import TransformersBackend
from specprefill.core import select_tokens, token_importance


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _tiny(n: int) -> Any:

    return model_config("tiny-random", max_context=n + 64, speculator="self_layers:2")


def child_speculate(n: int, lookahead: int, path: Path) -> dict[str, float]:
    """Speculator prefill + look-ahead with query capture; saves the capture for scoring."""
    import torch

    lm = load(_tiny(n))
    be = TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    ids = torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(0))
    before = _rss_mib()
    t0 = time.perf_counter()
    cap = be.speculate(ids, lookahead)
    dt = time.perf_counter() - t0
    torch.save({"queries": cap.queries, "keys": cap.keys}, path)
    return {"speculator_extra_peak_mib": _rss_mib() - before, "speculator_s": dt}


def child_score(path: Path) -> dict[str, float]:
    """Scoring and selection alone, in a fresh process: its peak RSS above the loaded inputs."""
    import torch

    cap = torch.load(path, mmap=True)
    q, k = cap["queries"].clone(), cap["keys"].clone()
    before = _rss_mib()
    t0 = time.perf_counter()
    imp = token_importance(q, k, 13)
    kept = select_tokens(imp, 0.1, 32)
    dt = time.perf_counter() - t0
    layers, heads, lookahead, _ = q.shape
    n = k.shape[2]
    return {
        "n": n,
        "lookahead": lookahead,
        "scoring_extra_peak_mib": _rss_mib() - before,
        "scoring_inputs_mib": (q.numel() + k.numel()) * 4 / 2**20,
        "nxn_attention_would_need_mib": layers * heads * n * n * 4 / 2**20,
        "scoring_s": dt,
        "kept": int(kept.numel()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("results/reference/scoring_memory.json"))
    ap.add_argument("--child-speculate", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-score", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--capture", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_speculate:
        print(json.dumps(child_speculate(a.child_speculate, a.lookahead, a.capture)))
        return
    if a.child_score:
        print(json.dumps(child_score(a.capture)))
        return

    def sub(*args: str) -> dict[str, float]:
        out = subprocess.run(
            [sys.executable, "-m", "harness.studies.scoring_memory", *args], capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.lengths:
            cap = str(Path(tmp) / f"cap{n}.pt")
            row = sub("--child-speculate", str(n), "--lookahead", str(a.lookahead), "--capture", cap)
            row.update(sub("--child-score", "--capture", cap))
            rows.append(row)
            print(
                f"N={n:>6}: scoring peak +{row['scoring_extra_peak_mib']:6.1f} MiB over its inputs "
                f"({row['scoring_inputs_mib']:5.1f} MiB); N x N attention would need "
                f"{row['nxn_attention_would_need_mib']:9.0f} MiB; speculator {row['speculator_s']:.2f}s "
                f"(+{row['speculator_extra_peak_mib']:.0f} MiB), scoring {row['scoring_s']:.3f}s",
                flush=True,
            )
    write_reference(a.out, "scoring_memory", rows, model="tiny-random (2 layers, 4 heads, fp32)")


if __name__ == "__main__":
    main()
