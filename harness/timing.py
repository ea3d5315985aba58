"""One measurement of TTFT: a method plans a batch of prompts, the backend prefills the plans.

Kept free of Hydra and the benchmarks so that it runs wherever PyTorch and transformers
do (``make gpu-check`` on a bare GPU machine); :mod:`harness.jobs.latency` drives it over a
grid with the store around it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from specprefill.flops import Shape, causal_pairs, prefill_flops
from specprefill.plan import Backend, Method, Plan, Prompt


def flops(base: Shape, prompts: Sequence[Prompt], plans: Sequence[Plan], overhead: int) -> tuple[int, float]:
    """(reference FLOPs, method FLOPs) of one batch: full prefill of every prompt, against
    the method's own model calls plus the base prefill of each plan (NaN for text rewrites)."""
    full = sum(prefill_flops(base, p.n, causal_pairs(p.n)) for p in prompts)
    if any(p.kept_indices is None for p in plans):
        return full, math.nan
    return full, float(overhead + sum(prefill_flops(base, p.k, causal_pairs(p.k)) for p in plans))


def measure(method: Method, prompts: list[Prompt], backend: Backend, decode_tokens: int = 0) -> dict[str, Any]:
    """Plan ``prompts`` with ``method`` and prefill the plans: the measured fields of a row.

    Both run inside ``method.applied(backend)`` (a method acting inside the model patches
    it for this turn only, untimed, and leaves it as it found it), so methods measured in
    turn on one backend (a latency job's reference and method) never see each other's patch."""
    with method.applied(backend):
        backend.method_flops = 0
        t0 = time.perf_counter()
        plans = method.plan_batch(prompts, backend)
        method_s = time.perf_counter() - t0
        overhead = backend.method_flops
        # decode_tokens > 0: the backend also decodes that many tokens after the timed prefill,
        # timed apart (``last_decode_s``), outside TTFT
        base_s = backend.prefill(plans, decode_tokens) if decode_tokens else backend.prefill(plans)
        kv = getattr(backend, "last_kv", None)  # set by each prefill of a backend that measures its cache
    parts: dict[str, float] = {}
    for p in plans:
        for k, v in p.timings.items():
            parts[k] = parts.get(k, 0.0) + float(v)
    f_full, f_method = flops(Shape.of(backend.base_config), prompts, plans, overhead)
    mean_n = sum(p.n for p in prompts) / len(prompts)
    mean_k = sum(p.k for p in plans) / len(plans)
    return {
        "prompt_tokens": mean_n,
        "kept_tokens": mean_k,
        "kept_fraction": mean_k / mean_n,
        "ttft_s": method_s + base_s,
        "method_s": method_s,
        "speculator_s": parts.get("speculator_s"),
        "selection_s": parts.get("selection_s"),
        "method_timings": json.dumps(parts, sort_keys=True),
        "base_prefill_s": base_s,
        "flops_full": float(f_full),
        "flops_method": f_method,
        "ideal_speedup": f_full / f_method if f_method == f_method else math.nan,
        # the KV cache after the prefill (a press's eviction included), where the backend measures it
        "kv_tokens": kv[0] if kv else None,
        "kv_bytes": kv[1] if kv else None,
        # decoding after the prefill (latency grids with decode_tokens > 0): the batch's seconds
        "decode_tokens": decode_tokens or None,
        "decode_s": getattr(backend, "last_decode_s", None) if decode_tokens else None,
    }
