"""``make gpu-check``: what the first machine with a GPU must show, in one command.

Runs on a bare machine with PyTorch, transformers, numpy and pandas and nothing else of
ours installed (no Hydra, no benchmark data, no model hub): random-weight models built in
place, random token prompts, and the harness's own measurement code
(:mod:`harness.timing`, the path ``make latency`` times with). Four parts, each recorded
even if another fails:

1. **Parity on the device**: SpecPrefill at keep 1.0 equals full prefill token for token
   (greedy, 16 tokens) and in its first logits, on a random Llama-3.1-8B-shaped base.
2. **The TTFT grid**: that base (32 layers, hidden 4096, GQA 32/8, vocabulary 128256)
   with a Llama-3.2-1B-shaped speculator, full prefill against SpecPrefill at keep 0.1
   and 0.3 (chunks of 32, pool 13, L=1) at 8K, 32K and 128K tokens (batch 1) and 4x32K,
   with the ideal speedup of the FLOPs model and efficiency = measured / ideal.
3. **Scoring memory**: peak device memory of SpecPrefill's scoring (token importance and
   selection) beyond its inputs at 32K and 128K tokens: linear in N, never N x N.

4. **The vLLM part** (:mod:`harness.studies.gpu_check_vllm`), where ``vllm`` imports: the
   engine on every visible GPU with the SpecPrefill position canary, keep 1.0 against full
   prefill, vLLM's first-token log-probabilities against transformers' at the same kept
   positions, one interleaved TTFT point. Skipped, with the reason, where vLLM is absent.

The report begins with what ran and what was skipped, and why, and the library versions.
It writes ``results/reference/gpu_<device>.md`` (or ``$OUT/gpu_check.md`` when ``OUT``
is set, as on the device tool), rewritten after every part, so a run cut off by the
machine's time limit keeps every part that finished. ``GPU_CHECK_CPU=1`` runs the same
script at small sizes on the CPU (CI runs it), so the script is tested before any GPU is
lent. ``GPU_CHECK_QUICK=1`` (or ``--quick``) is the check that fits one short call on a
machine lent for minutes: 8K and 32K only (no 128K point, no batch of four), five timed
pairs, scoring memory at 32K, about 4 minutes on one H100/H200 by the FLOP model
(docs/backends.md gives the command for a machine without ``make``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # runnable as a plain script on a machine without the package installed

from harness.studies import gpu_check_vllm  # noqa: E402
from harness.studies.gpu_check_parts import IdTokenizer, Parts, ids_below, latency_grid, random_llama  # noqa: E402
from specprefill import FullPrefill, Prompt, SpecPrefill  # noqa: E402
from specprefill.backends.transformers import TransformersBackend  # noqa: E402
from specprefill.core import select_tokens, token_importance  # noqa: E402

#: Llama-3.1-8B and Llama-3.2-1B shapes (conf/model/arch), random weights.
BASE_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=128256)  # fmt: skip
SPEC_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1000)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    base: dict[str, Any]
    speculator: dict[str, Any]
    dtype: torch.dtype
    grid: tuple[tuple[int, int], ...]  # (batch, length)
    warmup: int
    iters: int
    parity_length: int
    memory_lengths: tuple[int, ...]


GPU = Sizes(
    base=BASE_8B,
    speculator=SPEC_1B,
    dtype=torch.bfloat16,
    grid=((1, 8192), (1, 32768), (1, 131072), (4, 32768)),
    warmup=1,
    iters=2,
    parity_length=4096,
    memory_lengths=(32768, 131072),
)
CPU = Sizes(
    base=TINY,
    speculator={**TINY, "num_hidden_layers": 1},
    dtype=torch.float32,
    grid=((1, 256), (1, 512), (2, 256)),
    warmup=0,
    iters=1,
    parity_length=128,
    memory_lengths=(1024, 4096),
)
#: ``GPU_CHECK_QUICK=1``: one short call (see the module doc).
GPU_QUICK = dataclasses.replace(GPU, grid=((1, 8192), (1, 32768)), iters=5, memory_lengths=(32768,))
CPU_QUICK = dataclasses.replace(CPU, grid=((1, 256),), iters=5, memory_lengths=(1024,))
KEEPS = (0.1, 0.3)


def versions() -> str:
    """The libraries this machine ran with, one line."""
    import platform

    import numpy
    import transformers

    libs = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": numpy.__version__, "pandas": pd.__version__}  # fmt: skip
    if torch.version.cuda:
        libs["CUDA"] = str(torch.version.cuda)
    try:
        import vllm

        libs["vllm"] = vllm.__version__
    except ImportError:
        libs["vllm"] = "absent"
    return ", ".join(f"{k} {v}" for k, v in libs.items())


def parity(backend: TransformersBackend, n: int) -> str:
    ids = torch.randint(0, ids_below(backend), (n,), generator=torch.Generator().manual_seed(1))
    prompt = Prompt(ids)
    full = backend.generate(FullPrefill().plan(prompt, backend), 16)
    spec = backend.generate(
        SpecPrefill(keep_rate=1.0, lookahead=1, chunk_size=32, pool_kernel=13).plan(prompt, backend), 16
    )
    same_tokens = full.token_ids == spec.token_ids
    assert full.first_logits is not None and spec.first_logits is not None
    diff = float((full.first_logits - spec.first_logits).abs().max())
    verdict = "PASS" if same_tokens and diff == 0.0 else "FAIL"
    return (
        f"{verdict}: {n}-token prompt, keep 1.0 vs full prefill: 16 greedy tokens "
        f"{'equal' if same_tokens else f'differ ({full.token_ids} vs {spec.token_ids})'}, "
        f"first logits max |diff| {diff:.3g}\n"
    )


def grid(backend: TransformersBackend, cfg: Sizes) -> tuple[str, pd.DataFrame]:
    return latency_grid(backend, cfg.grid, KEEPS, cfg.warmup, cfg.iters, "random 8B + 1B")


def scoring_memory(backend: TransformersBackend, lengths: tuple[int, ...], device: torch.device) -> str:
    lines = ["| N | scoring peak beyond inputs (MiB) | inputs (MiB) | N x N attention would need (MiB) | seconds |",
             "|---|---|---|---|---|"]  # fmt: skip
    for n in lengths:
        cap = backend.speculate(
            torch.randint(0, ids_below(backend), (n,), generator=torch.Generator().manual_seed(n)), 1
        )
        q, k = cap.queries, cap.keys
        del cap
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        kept = select_tokens(token_importance(q, k, 13), 0.1, 32)
        if device.type == "cuda":
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        else:
            peak = float("nan")  # CPU mode: RSS is not per-call; harness.studies.scoring_memory measures it
        dt = time.perf_counter() - t0
        layers, heads = q.shape[0], q.shape[1]
        inputs = (q.numel() * q.element_size() + k.numel() * k.element_size()) / 2**20
        lines.append(f"| {n} | {peak:.1f} | {inputs:.1f} | {layers * heads * n * n * 4 / 2**20:.0f} | {dt:.3f} |")
        assert int(kept.numel()) > 0
        del q, k
    return "\n".join(lines) + "\n"


def transformers_parts(parts: Parts, cfg: Sizes, device: torch.device, cpu_mode: bool) -> None:
    """Parts 1-3, on the transformers backend."""
    t0 = time.perf_counter()
    base = random_llama(cfg.base, cfg.dtype, device, 0)
    spec = random_llama(cfg.speculator, cfg.dtype, device, 1)
    backend = TransformersBackend(base, IdTokenizer(), spec, prefill_chunk=None if cpu_mode else 32768)
    parts.out.append(f"Models built in {time.perf_counter() - t0:.0f} s.\n\n")
    parts.section("Parity: keep 1.0 equals full prefill", lambda: parity(backend, cfg.parity_length))
    parts.section("TTFT grid (medians of timed iterations; speedup side by side)", lambda: grid(backend, cfg)[0])
    parts.section(
        "Scoring memory (speculator capture, then importance + selection)",
        lambda: scoring_memory(backend, cfg.memory_lengths, device),
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    unknown = [a for a in args if a != "--quick"]
    if unknown:
        raise SystemExit(f"gpu-check: unknown argument(s) {unknown}; allowed: --quick (or GPU_CHECK_QUICK=1)")
    quick = "--quick" in args or os.environ.get("GPU_CHECK_QUICK") == "1"
    cpu_mode = os.environ.get("GPU_CHECK_CPU") == "1"
    if not cpu_mode and not torch.cuda.is_available():
        raise SystemExit("gpu-check: no CUDA device here; GPU_CHECK_CPU=1 runs it at small sizes on the CPU")
    cfg = (CPU_QUICK if quick else CPU) if cpu_mode else (GPU_QUICK if quick else GPU)
    device = torch.device("cpu" if cpu_mode else "cuda")
    name = "cpu" if cpu_mode else torch.cuda.get_device_name(0).replace(" ", "_").lower()
    target = (
        Path(os.environ["OUT"]) / "gpu_check.md"
        if os.environ.get("OUT")
        else (ROOT / "results" / "reference" / f"gpu_{name}{'_quick' if quick else ''}.md")
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = ("quick, " if quick else "") + ("CPU mode (GPU_CHECK_CPU=1): small sizes, for CI" if cpu_mode else "")
    out = [
        f"# gpu-check on {name}\n\n",
        f"{mode if cpu_mode else ('quick mode; ' if quick else '') + torch.cuda.get_device_name(0)}; {versions()}; "
        f"random weights, {str(cfg.dtype).split('.')[-1]}; written by `make gpu-check` "
        f"(harness/studies/gpu_check.py{' --quick' if quick else ''}).\n\n",
    ]

    def flush() -> None:
        target.write_text("".join(out))

    parts = Parts(out, [], [], flush=flush)
    print(out[1], flush=True)
    transformers_parts(parts, cfg, device, cpu_mode)
    if device.type == "cuda":  # its models are gone: hand their memory back before vLLM measures what is free
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    vllm_md, ran, skipped = gpu_check_vllm.run(cpu_mode, device)
    out.append(vllm_md)
    summary = ["## What ran\n\n", *(f"- ran: {t}\n" for t in parts.ran + ran)]
    summary += [f"- skipped: {t}\n" for t in skipped]
    out.insert(2, "".join(summary) + "\n")
    print("".join(summary), flush=True)
    target.write_text("".join(out))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
