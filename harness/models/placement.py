"""Where a run's models go: GPUs, weight memory, the speculator beside the engine, and the
engine's share of each GPU.

The paper ran Llama-3.1-70B-Instruct and Llama-3.1-405B-Instruct-FP8 with tensor
parallelism 8, and the unquantized Llama-3.1-8B-Instruct speculator on the same GPUs.
vLLM by default takes 90 % of every GPU it runs on, so a speculator put beside it needs
room planned for it: its bf16 weights, and the memory of its own prefill over the whole
prompt (its KV cache and the captured keys SpecPrefill scores). :func:`place` computes that
room from the checkpoint's architecture (``conf/model/arch/*.json``: the checkpoint's own
``config.json``, transcribed) and sets the engine's ``gpu_memory_utilization`` so both fit
on the GPU that hosts the speculator (the first one). Quantization is the checkpoint's
own (its ``quantization_config``), never forced: the FP8 405B declares ``fbgemm_fp8``, and
vLLM refuses an override that disagrees with it.

Memory figures are estimates (weights exactly from the architecture; the speculator's
prefill from its KV cache, the keys it hands to scoring and one layer's activations), and
every figure is printed by the dry run and recorded in the rows.

The engine's share must hold what vLLM 0.32 checks before it serves: the weights, the peak
of its profile run, and the KV cache of one sequence of ``max_model_len`` tokens.
``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``) takes the KV
cache's memory as ``gpu_memory_utilization x total`` minus the weights, the profile run's
peak (``GPUModelRunner.profile_run``: one forward over ``max_num_batched_tokens`` tokens,
then the sampler over ``max_num_seqs`` rows of logits), the non-torch memory and the CUDA
graphs' estimate; ``check_enough_kv_cache_memory`` (``vllm/v1/core/kv_cache_utils.py``)
then refuses to start unless that holds ``max_model_len`` tokens of every layer's KV cache
(whole pages of 16 tokens, one page held back as the pool's null block), per GPU: the KV
heads split over the tensor-parallel ranks (replicated when there are fewer heads than
ranks), the layers over the pipeline stages. :func:`place` counts the same terms
(:func:`kv_cache_bytes`, :func:`engine_activation_bytes`) and, when the model's window does
not fit, lowers the engine's ``max_model_len`` to the run's longest sequence, or refuses with
the numbers: a 405B download is not started for an engine that cannot start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.models.catalog import BYTES_PER_PARAM, ModelConfig, parse_speculator
from harness.models.replicas import replica_config

ARCH_DIR = Path(__file__).resolve().parents[2] / "conf" / "model" / "arch"
#: GPU memory kept free on the speculator's GPU beyond what is planned (CUDA context,
#: allocator fragmentation, the sampler's buffers).
RESERVE_GIB = 3.0
#: vLLM's own default share; never plan more than it.
MAX_UTILIZATION = 0.90
#: Quantization methods whose linear weights take one byte each.
FP8_METHODS = ("fbgemm_fp8", "fp8")
#: Tokens per page of vLLM's KV cache (``CacheConfig.block_size`` on CUDA attention backends).
#: vLLM sizes a sequence's cache in whole pages and holds one page back (the null block).
KV_BLOCK_TOKENS = 16
#: vLLM's profile run, by GPU size (``EngineArgs.get_batch_defaults``, the offline ``LLM``
#: class): (smallest GPU in GiB, max_num_batched_tokens, max_num_seqs). 16384 / 1024 on GPUs
#: of 70 GiB and more (H100, H200, B200; an A100 80 GB gets 8192 / 256 by its name, which a
#: plan without the GPU cannot see, so the larger batch is planned), 8192 / 256 below.
PROFILE_BATCH = ((70.0, 16384, 1024), (0.0, 8192, 256))
#: Bytes per logit of the profile run's sampler pass: the logits in bf16, their float32 copy,
#: and the top-k/top-p sort (float32 values and int64 indices).
SAMPLER_BYTES_PER_LOGIT = 18
#: Engine memory no formula here counts, per GPU: the CUDA graphs (vLLM 0.32 estimates them
#: and takes them from the KV cache, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``), NCCL and
#: custom all-reduce buffers, cuBLAS workspaces. A round allowance, not measured here (no GPU
#: was available when it was set): check it against the engine's "Available KV cache memory" log.
ENGINE_OVERHEAD_GIB = 2.0
#: Tokens added to a run's longest prompt plus answer before it becomes the engine's window:
#: the chat template wrapped around a prompt truncated to ``max_input_length`` (LongBench)
#: and rounding; a lowered ``max_model_len`` is never tighter than the run needs.
WINDOW_MARGIN = 256
#: GiB per GPU the model's whole window must leave to spare before the engine keeps it for a
#: run that needs less: the activations are an estimate, and a run's own window (lowered)
#: costs it nothing, while an engine that refuses to start costs the download and the load.
WINDOW_SLACK_GIB = 2.0


def architecture(name: str | None) -> dict[str, Any] | None:
    """A checkpoint's transcribed ``config.json`` (``conf/model/arch/<name>.json``), or None."""
    if name is None:
        return None
    path = ARCH_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in ARCH_DIR.glob("*.json"))
        raise ValueError(f"architecture {name!r}: no {path.name} in conf/model/arch; allowed: {known}")
    return dict(json.loads(path.read_text()))


def model_architecture(model: ModelConfig, speculator: bool = False) -> dict[str, Any] | None:
    """The architecture a model config runs: its checkpoint's, or for a replica
    (``source: replica`` / ``speculator: replica``) the checkpoint's with the replica's sizes."""

    arch = architecture(model.speculator_architecture if speculator else model.architecture)
    replica = (
        (parse_speculator(model.speculator) or ("", ""))[0] == "replica" if speculator else model.source == "replica"
    )
    if arch is not None and replica:
        return replica_config(arch, model.speculator_shape if speculator else model.shape)
    return arch


def quantization(arch: dict[str, Any] | None) -> str | None:
    """The checkpoint's own quantization method (``quantization_config.quant_method``)."""
    q = (arch or {}).get("quantization_config")
    return str(q["quant_method"]) if q else None


def _kept_full(arch: dict[str, Any], module: str) -> bool:
    """Whether a quantized checkpoint keeps ``module`` (a full module path) unquantized."""
    return module in ((arch.get("quantization_config") or {}).get("modules_to_not_convert") or [])


def weight_bytes(arch: dict[str, Any], dtype: str) -> int:
    """The bytes of a checkpoint's weights: embeddings, every layer's attention and MLP
    projections and norms, the final norm and the LM head (unless tied). With an FP8
    quantization a projection takes one byte per weight unless the checkpoint lists it in
    ``modules_to_not_convert``; embeddings, norms and the LM head stay in ``dtype``."""
    d, inter, v = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    heads, kv = arch["num_attention_heads"], arch["num_key_value_heads"]
    hd = arch.get("head_dim") or d // heads
    full = BYTES_PER_PARAM[dtype]
    quantized = quantization(arch) in FP8_METHODS
    total = v * d * full + d * full  # embeddings, final norm
    if not arch.get("tie_word_embeddings", False):
        total += v * d * full
    sizes = {
        "self_attn.q_proj": d * heads * hd,
        "self_attn.k_proj": d * kv * hd,
        "self_attn.v_proj": d * kv * hd,
        "self_attn.o_proj": heads * hd * d,
        "mlp.gate_proj": d * inter,
        "mlp.up_proj": d * inter,
        "mlp.down_proj": inter * d,
    }
    for i in range(arch["num_hidden_layers"]):
        for name, n in sizes.items():
            one = quantized and not _kept_full(arch, f"model.layers.{i}.{name}")
            total += n * (1 if one else full)
        total += 2 * d * full  # the two norms
    return total


@dataclass(frozen=True)
class PrefillMemory:
    """A speculator's own prefill of a prompt, in bytes: its KV cache (spread with its
    layers), the copy of the prompt's keys it hands to scoring (gathered on the first GPU),
    and the activations of one forward over a chunk of ``chunk`` tokens (hidden states and
    the gated MLP's intermediates)."""

    kv_cache: int
    keys: int
    activations: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.keys + self.activations


def speculator_prefill_bytes(arch: dict[str, Any], n: int, chunk: int | None = None) -> PrefillMemory:
    """:class:`PrefillMemory` of a bf16 speculator over ``n`` prompt tokens, prefilled
    ``chunk`` tokens at a time (None: one forward)."""
    b = 2
    d, inter, heads, kv = (
        arch[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    )
    hd = arch.get("head_dim") or d // heads
    layers = arch["num_hidden_layers"]
    c = min(n, chunk or n)
    return PrefillMemory(
        kv_cache=2 * layers * kv * hd * n * b,
        keys=layers * kv * hd * n * b,
        activations=c * (4 * d + 3 * inter) * b,
    )


GIB = 2**30


def _kv_shape(arch: dict[str, Any]) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of an architecture."""
    hd = arch.get("head_dim") or arch["hidden_size"] // arch["num_attention_heads"]
    return int(arch["num_hidden_layers"]), int(arch["num_key_value_heads"]), int(hd)


def kv_bytes_per_page(
    arch: dict[str, Any], tensor_parallel: int = 1, pipeline_parallel: int = 1, dtype_bytes: int = 2
) -> int:
    """Bytes of one KV-cache page (:data:`KV_BLOCK_TOKENS` tokens) on one GPU of a vLLM engine:
    keys and values of the layers of one pipeline stage, the KV heads of one tensor-parallel
    rank (``max(1, heads // tp)``, vLLM's ``ModelConfig.get_num_kv_heads``: replicated when a
    model has fewer KV heads than ranks), ``dtype_bytes`` each (the KV-cache dtype: the
    compute dtype unless a ``kv_cache_dtype`` is set)."""
    layers, kv, hd = _kv_shape(arch)
    stage_layers = -(-layers // pipeline_parallel)
    return KV_BLOCK_TOKENS * stage_layers * max(1, kv // tensor_parallel) * hd * 2 * dtype_bytes


def kv_cache_bytes(
    arch: dict[str, Any], tokens: int, tensor_parallel: int = 1, pipeline_parallel: int = 1, dtype_bytes: int = 2
) -> int:
    """Bytes per GPU a vLLM engine must have for the KV cache of one sequence of ``tokens``
    tokens before it starts (``check_enough_kv_cache_memory``): whole pages, plus the null
    page its block pool holds back."""
    pages = -(-tokens // KV_BLOCK_TOKENS) + 1
    return pages * kv_bytes_per_page(arch, tensor_parallel, pipeline_parallel, dtype_bytes)


def engine_activation_bytes(arch: dict[str, Any], tensor_parallel: int, gpu_gib: float, dtype_bytes: int = 2) -> int:
    """An estimate of what a vLLM engine takes per GPU beyond its weights and KV cache: the
    peak of its profile run (``GPUModelRunner.profile_run``), whose forward pushes
    ``max_num_batched_tokens`` tokens (:data:`PROFILE_BATCH`) through the model, one layer's
    activations at a time (the hidden state, residual, normed input and attention output at
    full width on every rank; the gated MLP's two projections and their product split over
    the ranks, as :func:`speculator_prefill_bytes` counts them), and whose sampler pass holds
    ``max_num_seqs`` rows of logits over the whole vocabulary (:data:`SAMPLER_BYTES_PER_LOGIT`);
    the two are summed (they do not overlap: the sum covers the hidden states kept between
    them and the allocator's caching), plus :data:`ENGINE_OVERHEAD_GIB`. Bytes."""
    tokens, seqs = next((t, n) for floor, t, n in PROFILE_BATCH if gpu_gib >= floor)
    d, inter = int(arch["hidden_size"]), int(arch["intermediate_size"])
    forward = tokens * dtype_bytes * (4 * d + 3 * -(-inter // tensor_parallel))
    sampler = seqs * int(arch.get("vocab_size") or 0) * SAMPLER_BYTES_PER_LOGIT
    return int(forward + sampler + ENGINE_OVERHEAD_GIB * GIB)


@dataclass(frozen=True)
class Placement:
    """What a run needs and where it goes. Memory in GiB (per GPU where the name says so),
    lengths in tokens."""

    backend: str
    gpus: int
    nodes: int
    gpu_gib: float  # per GPU: detected, or the model config's gpu_memory_gib when none is visible
    gpu_detected: bool
    quantization: str | None  # the checkpoint's own, None when unquantized
    base_weights_gib: float
    base_per_gpu_gib: float
    speculator: str | None
    speculator_weights_gib: float
    speculator_prefill_gib: float  # at run_tokens
    speculator_gpus: int  # GPUs its layers are spread over (the engine's, beside it), 1 = the first only
    speculator_gpu0_gib: float  # what it takes on the first GPU (its share, the gathered keys, a chunk's activations)
    gpu_memory_utilization: float | None  # the engine's share of each GPU (vLLM on GPUs)
    #: The context window the run gives its engine (vLLM's max_model_len): the model's
    #: max_context, or run_tokens where the whole window's KV cache does not fit.
    max_model_len: int
    max_model_len_lowered_from: int | None  # the model's max_context when max_model_len was lowered
    run_tokens: int  # the run's longest sequence (prompt + answer + margin), at most max_context
    kv_cache_dtype: str  # the engine's KV-cache dtype (the compute dtype: no kv_cache_dtype is configured)
    kv_cache_per_gpu_gib: float  # one max_model_len sequence, what vLLM checks at start (0: not planned)
    engine_activations_gib: float  # per GPU: profile-run peak and overheads, an estimate (0: not planned)

    @property
    def engine_gib(self) -> float | None:
        """The engine's share of each GPU, GiB (None: no GPU plan)."""
        return None if self.gpu_memory_utilization is None else self.gpu_memory_utilization * self.gpu_gib

    def lines(self) -> list[str]:
        """The placement for a dry run, a few lines: GPUs and weights, what the engine holds
        per GPU, the speculator beside it, and a lowered window."""
        where = f"{self.gpus} GPU(s)" + (f" on {self.nodes} nodes" if self.nodes > 1 else "")
        gpu = f"{self.gpu_gib:.0f} GiB each, {'detected' if self.gpu_detected else 'assumed'}"
        cpu = self.gpu_memory_utilization is None and not self.gpu_detected  # a CPU run: nothing planned on GPUs
        out = [
            (f"runs on the CPU (no GPU visible, {self.gpus} rank(s))" if cpu else f"needs {where} ({gpu})")
            + f"; quantization {self.quantization or 'none'} (the checkpoint's own); "
            f"base weights {self.base_weights_gib:.1f} GiB ({self.base_per_gpu_gib:.1f} per {'rank' if cpu else 'GPU'})"
        ]
        engine = self.engine_gib
        if engine is not None and self.kv_cache_per_gpu_gib:
            total = self.base_per_gpu_gib + self.kv_cache_per_gpu_gib + self.engine_activations_gib
            out.append(
                f"per GPU: weights {self.base_per_gpu_gib:.1f} + KV cache {self.kv_cache_per_gpu_gib:.1f} "
                f"(max_model_len {self.max_model_len}, {self.kv_cache_dtype}) + activations "
                f"~{self.engine_activations_gib:.1f} (estimate) = {total:.1f} of the engine's {engine:.1f} GiB "
                f"(vLLM gpu_memory_utilization {self.gpu_memory_utilization:.2f})"
            )
        elif self.gpu_memory_utilization is not None:
            out.append(f"vLLM gpu_memory_utilization {self.gpu_memory_utilization:.2f}")
        if self.speculator and (self.speculator_weights_gib or self.speculator_prefill_gib):  # not an early exit
            where = "GPU 0" if self.speculator_gpus == 1 else f"its layers spread over the {self.speculator_gpus} GPUs"
            where = "the CPU" if cpu else where
            reserve = f" (+ {RESERVE_GIB:.0f} GiB kept free)" if engine is not None else ""
            holds = f"{self.speculator_gpu0_gib:.1f} GiB {'in memory' if cpu else 'on GPU 0'}"
            out.append(
                f"speculator {self.speculator} (bf16) on {where}: "
                f"{self.speculator_weights_gib:.1f} GiB weights + {self.speculator_prefill_gib:.1f} GiB prefill at "
                f"{self.run_tokens} tokens, {holds}{reserve}"
            )
        if self.max_model_len_lowered_from is not None:
            out.append(
                f"max_model_len lowered from {self.max_model_len_lowered_from} to {self.max_model_len} (the run's "
                f"longest prompt + answer + {WINDOW_MARGIN} tokens): the whole window's KV cache does not fit per GPU "
                f"with {WINDOW_SLACK_GIB:.0f} GiB to spare"
            )
        return out

    def describe(self) -> str:
        """:meth:`lines` as one line."""
        return "; ".join(self.lines())


#: The SmolLM2 tokenizer's vocabulary, which a random model's shape gets unless it sets one.
RANDOM_VOCAB = 49152


def engine_shape(model: ModelConfig) -> dict[str, Any] | None:
    """The base's shape for the engine's memory: its architecture, or a random model's
    ``shape`` (vocabulary from its tokenizer); None when neither says enough."""
    arch = model_architecture(model)
    if arch is not None:
        return arch
    need = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    if all(k in model.shape for k in need):
        return {"vocab_size": RANDOM_VOCAB, **model.shape}
    return None


def place(model: ModelConfig, backend: str, needs_speculator: bool, run_tokens: int | None = None) -> Placement:
    """The placement of ``model`` on ``backend``, loading nothing. ``run_tokens``: the run's
    longest sequence, prompt + answer (:func:`harness.config.longest_sequence`; None: the
    model's whole window); the speculator's prefill is planned at it.

    On GPUs (vLLM; a paper checkpoint or a multi-GPU engine is planned on the model config's
    ``gpu_memory_gib`` where none is visible) the engine's share of each GPU leaves room for
    the speculator on the first, and must hold the weights, the activations and the KV cache
    of one ``max_model_len`` sequence (the module doc: vLLM refuses to start otherwise). When
    the model's window does not fit with :data:`WINDOW_SLACK_GIB` to spare, ``max_model_len``
    is lowered to ``run_tokens`` (only then: the engine's KV pool is its share of the GPU
    whatever the window, so a shorter window buys nothing where the whole one fits, and a
    run's window stays the model's unless memory says otherwise).

    Refuses what cannot fit: a multi-GPU model on the transformers backend (one device), a
    speculator that leaves the engine too little of its GPU for the weights, and a run whose
    longest sequence does not fit (with the numbers and what to change)."""
    gpus = model.tensor_parallel * model.pipeline_parallel
    if backend == "transformers" and (model.tensor_parallel > 1 or model.pipeline_parallel > 1 or model.nodes > 1):
        raise ValueError(
            f"model {model.name!r} needs {gpus} GPUs (tensor_parallel={model.tensor_parallel}, "
            f"pipeline_parallel={model.pipeline_parallel}): the transformers backend runs a model on one device; "
            f"use backend=vllm (this model's default)"
        )
    window = model.max_context
    need = min(window, run_tokens) if run_tokens else window
    arch = model_architecture(model)
    compute = "bfloat16" if model.dtype not in BYTES_PER_PARAM else model.dtype
    base = weight_bytes(arch, compute) / GIB if arch else model.params_b * 1e9 * BYTES_PER_PARAM[compute] / GIB
    # A speculator's layers are spread over the engine's GPUs where this process sees them all
    # (harness.models.loading.spread_map); across nodes it stays whole on the head node's first GPU.
    spread = gpus if backend == "vllm" and gpus > 1 and model.nodes == 1 else 1
    spec = _Speculator(model, model.speculator if needs_speculator else None, spread)
    spec_w, spec_p, gpu0 = spec.memory(need)
    detected = torch.cuda.is_available()
    gpu_gib = (torch.cuda.get_device_properties(0).total_memory / GIB) if detected else model.gpu_memory_gib
    engine_window = _Window(util=None, max_len=window, lowered=None, kv_gib=0.0, act_gib=0.0)
    paper_checkpoint = model.source == "hub" and arch is not None
    if backend == "vllm" and (detected or gpus > 1 or paper_checkpoint):
        engine = _Engine(model, spec, gpu_gib, detected, per_gpu=base / gpus, kv_bytes=BYTES_PER_PARAM[compute])
        engine_window = engine.window(need)
    return Placement(
        backend=backend,
        gpus=gpus if backend == "vllm" else 1,
        nodes=model.nodes,
        gpu_gib=float(gpu_gib),
        gpu_detected=detected,
        quantization=quantization(arch),
        base_weights_gib=base,
        base_per_gpu_gib=base / (gpus if backend == "vllm" else 1),
        speculator=spec.name,
        speculator_weights_gib=spec_w,
        speculator_prefill_gib=spec_p,
        speculator_gpus=spread,
        speculator_gpu0_gib=gpu0,
        gpu_memory_utilization=engine_window.util,
        max_model_len=engine_window.max_len,
        max_model_len_lowered_from=engine_window.lowered,
        run_tokens=need,
        kv_cache_dtype=compute,
        kv_cache_per_gpu_gib=engine_window.kv_gib,
        engine_activations_gib=engine_window.act_gib,
    )


@dataclass(frozen=True)
class _Speculator:
    """The speculator a placement plans for (``name`` None: none), its layers spread over
    ``spread`` GPUs."""

    model: ModelConfig
    name: str | None
    spread: int

    def memory(self, n: int) -> tuple[float, float, float]:
        """(weights, prefill at ``n`` tokens, what it takes on GPU 0), GiB."""
        arch = model_architecture(self.model, speculator=True)
        kind = (parse_speculator(self.name) or ("", ""))[0]
        if self.name is None or (arch is None and kind == "self_layers"):
            return 0.0, 0.0, 0.0
        if arch is None:
            w = self.model.speculator_params_b * 1e9 * 2 / GIB
            return w, 0.0, w
        w = weight_bytes(arch, "bfloat16") / GIB  # the speculator is never quantized
        mem = speculator_prefill_bytes(arch, n, self.model.speculator_chunk)
        return w, mem.total / GIB, (w + mem.kv_cache / GIB) / self.spread + (mem.keys + mem.activations) / GIB


@dataclass(frozen=True)
class _Window:
    """The engine's window and what it reserves: its share of each GPU (None off vLLM's
    GPUs), ``max_model_len`` (``lowered``: the model's window it was lowered from), the KV
    cache of one sequence and the activations, GiB per GPU."""

    util: float | None
    max_len: int
    lowered: int | None
    kv_gib: float
    act_gib: float


@dataclass(frozen=True)
class _Engine:
    """A vLLM engine on ``gpu_gib`` GPUs beside the speculator: ``per_gpu`` GiB of weights
    per GPU, the KV cache at ``kv_bytes`` per value (vLLM's "auto": the compute dtype)."""

    model: ModelConfig
    spec: _Speculator
    gpu_gib: float
    detected: bool
    per_gpu: float
    kv_bytes: int

    def share(self, n: int) -> float:
        """The engine's share of each GPU beside the speculator prefilling ``n`` tokens."""
        return min(MAX_UTILIZATION, (self.gpu_gib - self.spec.memory(n)[2] - RESERVE_GIB) / self.gpu_gib)

    def kv(self, n: int) -> float:
        """The KV cache of one ``n``-token sequence, GiB per GPU."""
        shape = engine_shape(self.model)
        assert shape is not None
        m = self.model
        return kv_cache_bytes(shape, n, m.tensor_parallel, m.pipeline_parallel, self.kv_bytes) / GIB

    def window(self, need: int) -> _Window:
        """The engine's share and window for runs up to ``need`` tokens; refuses (one
        message with the numbers) where the weights or the run's sequence do not fit."""
        m, window = self.model, self.model.max_context
        gpus = m.tensor_parallel * m.pipeline_parallel
        util = self.share(need)
        engine = util * self.gpu_gib
        spec_w, spec_p, gpu0 = self.spec.memory(need)
        if engine < self.per_gpu * 1.05:
            raise ValueError(
                f"model {m.name!r}: beside the speculator ({gpu0:.1f} GiB on GPU 0 of {spec_w:.1f} GiB weights + "
                f"{spec_p:.1f} GiB prefill at {need} tokens) the engine keeps {engine:.1f} of "
                f"{self.gpu_gib:.0f} GiB on GPU 0, less than its {self.per_gpu:.1f} GiB of weights per GPU; shorten the "
                f"prompts (length, model.max_input_length), prefill the speculator in chunks (speculator_chunk) or use "
                f"larger GPUs"
            )
        shape = engine_shape(m)
        if shape is None:
            return _Window(util, window, None, 0.0, 0.0)
        act = engine_activation_bytes(shape, m.tensor_parallel, self.gpu_gib, self.kv_bytes) / GIB
        room = engine - self.per_gpu - act  # for the KV cache, per GPU
        if self.kv(window) + (WINDOW_SLACK_GIB if need < window else 0.0) <= room:
            return _Window(util, window, None, self.kv(window), act)
        if self.kv(need) <= room:
            return _Window(util, need, window, self.kv(need), act)
        raise ValueError(
            _no_room(
                m,
                gpus,
                self.gpu_gib,
                self.detected,
                self.per_gpu,
                act,
                self.kv(need),
                self.kv(window),
                need,
                engine,
                util,
                gpu0,
                self.longest_fitting(need, act),
            )
        )

    def longest_fitting(self, need: int, act: float) -> int:
        """The longest run that fits (its speculator shrinks with it), in whole KV blocks."""
        lo, hi = 0, need
        while hi - lo > KV_BLOCK_TOKENS:
            mid = (lo + hi) // 2
            fits = self.kv(mid) <= self.share(mid) * self.gpu_gib - self.per_gpu - act
            lo, hi = (mid, hi) if fits else (lo, mid)
        return lo - lo % KV_BLOCK_TOKENS


def _no_room(
    model: ModelConfig,
    gpus: int,
    gpu_gib: float,
    detected: bool,
    weights: float,
    act: float,
    kv_need: float,
    kv_window: float,
    need: int,
    engine: float,
    util: float,
    gpu0: float,
    fits: int,
) -> str:
    """The refusal of a run whose longest sequence's KV cache does not fit beside the rest (GiB per GPU)."""
    total = weights + act + kv_need
    larger = math.ceil(max(total / MAX_UTILIZATION, total + gpu0 + RESERVE_GIB))
    beside = f", beside the speculator's {gpu0:.1f} GiB on GPU 0 and {RESERVE_GIB:.0f} GiB kept free" if gpu0 else ""
    fit = f"the longest sequence that fits is {fits} tokens" if fits else "no sequence fits"
    return (
        f"model {model.name!r} on {gpus} x {gpu_gib:.0f} GiB GPUs ({'detected' if detected else 'assumed'}): vLLM "
        f"needs per GPU {weights:.1f} GiB weights + ~{act:.1f} activations (estimate) + {kv_need:.1f} KV cache for "
        f"the run's longest sequence ({need} tokens, prompt + answer; {kv_window:.1f} for the model's window of "
        f"{model.max_context}) = {total:.1f} GiB, and its share is {engine:.1f} GiB (gpu_memory_utilization "
        f"{util:.2f}{beside}): it would refuse to start. {fit[0].upper() + fit[1:]}: shorten the prompts "
        f"(length, model.max_input_length), or use GPUs of at least {larger} GiB (model.gpu_memory_gib plans "
        f"a size where none is visible)"
    )


#: Decoder layers of the packaged checkpoints whose config is not transcribed in conf/model/arch
#: (SmolLM2-135M-Instruct's config.json: num_hidden_layers 30).
PACKAGED_LAYERS = {"smollm2_gguf": 30}


def layer_count(model: ModelConfig) -> int | None:
    """The base model's decoder layers, from its config alone (nothing loaded): the random
    shape, the transcribed architecture, or the packaged checkpoint's; None where only the
    checkpoint knows (a hub model without ``architecture:``)."""
    if model.shape.get("num_hidden_layers"):
        return int(model.shape["num_hidden_layers"])
    arch = model_architecture(model)
    if arch is not None and arch.get("num_hidden_layers"):
        return int(arch["num_hidden_layers"])
    return PACKAGED_LAYERS.get(model.source)
