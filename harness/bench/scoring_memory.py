"""Benchmark: SpecPrefill scoring memory grows linearly in the prompt length N.

Scoring uses only the L look-ahead query rows against the N prompt keys, one layer at a
time: its extra memory is O(heads * L * N), never N x N. Each N runs in a fresh process
(peak RSS is monotone, so process isolation gives clean numbers): load the tiny random
model, prefill the speculator with query capture (peak 1), then score and select
(peak 2). The scoring's own cost is peak 2 - peak 1. For contrast we print what the
N x N attention matrices would take (what ``output_attentions=True`` materialises).

    python -m harness.bench.scoring_memory  [--lengths 4096 16384 65536] [--out results/reference/scoring_memory.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(n: int, lookahead: int) -> dict[str, float]:
    import torch

    from harness.models import ModelConfig, load
    from specprefill.backends.transformers import TransformersBackend
    from specprefill.core import select_tokens, token_importance

    cfg = ModelConfig(
        name="tiny-random",
        source="random_llama",
        dtype="float32",
        max_context=n + 64,
        speculator="self_layers:2",
        params_b=0.004,
        weights="random",
        shape=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
    )
    lm = load(cfg)
    be = TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    ids = torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(0))
    before = _rss_mib()
    t0 = time.perf_counter()
    cap = be.speculate(ids, lookahead)
    t1 = time.perf_counter()
    after_prefill = _rss_mib()
    imp = token_importance(cap.queries, cap.keys, 13)
    kept = select_tokens(imp, 0.1, 32)
    t2 = time.perf_counter()
    after_scoring = _rss_mib()
    layers, heads = cap.queries.shape[:2]
    return {
        "n": n,
        "lookahead": lookahead,
        "rss_before_mib": before,
        "rss_peak_after_speculator_mib": after_prefill,
        "rss_peak_after_scoring_mib": after_scoring,
        "scoring_extra_mib": after_scoring - after_prefill,
        "scoring_tensor_mib": heads * lookahead * n * 4 * 3 / 2**20,  # attn, pooled, running max
        "nxn_attention_would_need_mib": layers * heads * n * n * 4 / 2**20,
        "speculator_s": t1 - t0,
        "scoring_s": t2 - t1,
        "kept": int(kept.numel()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("results/reference/scoring_memory.json"))
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.lookahead)))
        return
    rows = []
    for n in a.lengths:
        out = subprocess.run(
            [sys.executable, "-m", "harness.bench.scoring_memory", "--child", str(n), "--lookahead", str(a.lookahead)],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"N={n:>6}: scoring extra peak {row['scoring_extra_mib']:7.1f} MiB (tensors {row['scoring_tensor_mib']:6.1f} MiB), "
            f"N x N would need {row['nxn_attention_would_need_mib']:9.0f} MiB; speculator {row['speculator_s']:.2f}s, "
            f"scoring {row['scoring_s']:.3f}s",
            flush=True,
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    from harness.run import hardware, versions

    a.out.write_text(
        json.dumps(
            {
                "benchmark": "scoring_memory",
                "model": "tiny-random (2 layers, 4 heads, fp32)",
                "hardware": hardware(),
                "versions": versions(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
