"""What both parts of ``make gpu-check`` use (:mod:`harness.studies.gpu_check`, the
transformers part; :mod:`harness.studies.gpu_check_vllm`, the vLLM part): random Llamas
built in place, a tokenizer that spells ids, the section runner that records each part
even if another fails, and the interleaved latency grid. Needs only PyTorch,
transformers, numpy and pandas (the GPU machine has nothing else of ours)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from harness.analysis.folder import analyze_rows
from harness.analysis.rows import AA_METHOD
from harness.prompts import random_prompts
from harness.rendering.tables import energy_line, md_table
from harness.timing import measure, point_order
from specprefill import FullPrefill, SpecPrefill
from specprefill.plan import Method


class IdTokenizer:
    """The backend decodes generated text; random models have no vocabulary to spell it in."""

    eos_token_id = None

    def __len__(self) -> int:
        return 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def random_llama(shape: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int) -> Any:
    """A random Llama of ``shape`` with Llama-3.1's rope scaling, built on the device in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }
    cfg = LlamaConfig(**shape, max_position_embeddings=131072, rope_parameters=rope)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.config._attn_implementation = "sdpa"
    return model.eval()


def ids_below(backend: Any) -> int:
    """Token ids the random prompts draw from: any real vocabulary's first 32000, or the model's."""
    return min(32000, int(backend.base_config.vocab_size))


@dataclass
class Parts:
    """A report's sections (``out``: markdown) and, for its summary, the parts that ran
    (``prefix`` + title, FAILED where they did) and were skipped (with why)."""

    out: list[str]
    ran: list[str]
    skipped: list[str]
    prefix: str = ""
    #: Called after every section (the report so far written to its file, so a run cut off
    #: by a machine's time limit keeps every part that finished).
    flush: Callable[[], None] | None = None

    def section(self, title: str, fn: Callable[[], str]) -> None:
        print(f"== {self.prefix}{title}", flush=True)
        t0 = time.perf_counter()
        try:
            body = fn()
            self.ran.append(self.prefix + title + (" (FAILED)" if "FAIL" in body else ""))
        except Exception as e:
            body = "FAILED\n\n```\n" + traceback.format_exc()[-3000:] + "```\n"
            self.ran.append(f"{self.prefix}{title} (FAILED: {type(e).__name__})")
        self.out.append(f"## {self.prefix}{title} ({time.perf_counter() - t0:.0f} s)\n\n{body}\n")
        print(self.out[-1], flush=True)
        if self.flush is not None:
            self.flush()


def latency_grid(
    backend: Any, points: Sequence[tuple[int, int]], keeps: Sequence[float], warmup: int, iters: int, model: str
) -> tuple[str, pd.DataFrame]:
    """Full prefill, its A/A copy and SpecPrefill at each keep (chunks of 32, pool 13, L=1)
    on the same fresh random prompts at every ``(batch, length)`` point, in the order
    :func:`harness.timing.iteration_order` turns over every iteration, timed through
    :func:`harness.timing.measure` (the protocol and path ``make latency`` times);
    the speedups are :func:`harness.analysis.speed.summarize_latency`'s. Returns the markdown table
    and the rows; a point that fails (out of memory) is recorded and the grid goes on."""

    full = FullPrefill()
    methods: list[tuple[str, Method]] = [(full.name, full), (AA_METHOD, full)]
    methods += [
        (m.name, m) for m in (SpecPrefill(keep_rate=k, lookahead=1, chunk_size=32, pool_kernel=13) for k in keeps)
    ]
    rows = []
    for batch, length in points:
        gen = torch.Generator().manual_seed(batch * 7919 + length)
        for it in range(warmup + iters):
            prompts = random_prompts(batch, length, ids_below(backend), gen)
            for slot, j in enumerate(point_order(it, len(methods), warmup, iters)):
                name, m = methods[j]
                t0 = time.perf_counter()
                row: dict[str, Any] = {
                    "method": name,
                    "keep_rate": m.options().get("keep_rate"),
                    "batch": batch,
                    "length": length,
                    "iteration": it,
                    "warmup": it < warmup,
                    "order": slot,
                }
                try:
                    row.update(measure(m, prompts, backend), status="ok")
                except Exception as e:  # out of memory at one point: recorded, the grid goes on
                    row.update(status="failed", error=f"{type(e).__name__}: {e}")
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                row["wall_s"] = time.perf_counter() - t0
                rows.append(row)
            print(f"  {batch}x{length} iteration {it} done", flush=True)
    df = pd.DataFrame(rows)
    common = {
        "run_id": "gpu-check",
        "model": model,
        "backend": getattr(backend, "name", "transformers"),
        "prompt_source": "random",
        "reference_method": "full",
        "method_options": "{}",
        "config_hash": "gpu-check",
        "dtype": "x",
    }
    df = df.assign(**common)
    s = analyze_rows(None, df.assign(kind="latency")).latency
    cols = [
        "batch",
        "length",
        "method",
        "keep_rate",
        "n",
        "failed",
        "ttft_median_s",
        "method_median_s",
        "base_prefill_median_s",
        "kept_fraction",
        "speedup",
        "ideal_speedup",
        "efficiency",
        "energy_j_per_request",
        "energy_ratio",
        "flags",
    ]
    table = s[cols].astype(object).map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)
    failed = df[df["status"] != "ok"]
    notes = "".join(f"- {r['batch']}x{r['length']} {r['method']}: {r['error']}\n" for _, r in failed.iterrows())
    # joules per prefill (energy_j_per_request: over the TTFT window, NVML's counter on a GPU)
    energy = energy_line(s)
    return md_table(table) + (energy + "\n" if energy else "") + (f"\nFailed points:\n{notes}" if notes else ""), df
