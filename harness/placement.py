"""Where a run's models go: GPUs, weight memory, the speculator beside the engine, and the
engine's share of each GPU.

The paper ran Llama-3.1-70B-Instruct and Llama-3.1-405B-Instruct-FP8 with tensor
parallelism 8, and the unquantized Llama-3.1-8B-Instruct speculator on the same GPUs.
vLLM by default takes 90 % of every GPU it runs on, so a speculator put beside it needs
room planned for it: its bf16 weights, and the memory of its own prefill over the whole
prompt (its KV cache and the captured keys SpecPrefill scores). :func:`plan` computes that
room from the checkpoint's architecture (``conf/model/arch/*.json``: the checkpoint's own
``config.json``, transcribed) and sets the engine's ``gpu_memory_utilization`` so both fit
on the GPU that hosts the speculator (the first one). Quantization is the checkpoint's
own (its ``quantization_config``), never forced: the FP8 405B declares ``fbgemm_fp8``, and
vLLM refuses an override that disagrees with it.

Memory figures are estimates (weights exactly from the architecture; the speculator's
prefill from its KV cache, the keys it hands to scoring and one layer's activations), and
every figure is printed by the dry run and recorded in the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.models import BYTES_PER_PARAM, ModelConfig, parse_speculator

ARCH_DIR = Path(__file__).resolve().parents[1] / "conf" / "model" / "arch"
#: GPU memory kept free on the speculator's GPU beyond what is planned (CUDA context,
#: allocator fragmentation, the sampler's buffers).
RESERVE_GIB = 3.0
#: vLLM's own default share; never plan more than it.
MAX_UTILIZATION = 0.90
#: Quantization methods whose linear weights take one byte each.
FP8_METHODS = ("fbgemm_fp8", "fp8")


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
    from harness.replicas import replica_config

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
    d, inter, heads, kv = (arch[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads"))  # fmt: skip
    hd = arch.get("head_dim") or d // heads
    layers = arch["num_hidden_layers"]
    c = min(n, chunk or n)
    return PrefillMemory(
        kv_cache=2 * layers * kv * hd * n * b,
        keys=layers * kv * hd * n * b,
        activations=c * (4 * d + 3 * inter) * b,
    )


GIB = 2**30


@dataclass(frozen=True)
class Placement:
    """What a run needs and where it goes. Memory in GiB."""

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
    speculator_prefill_gib: float  # at the model's max_context
    speculator_gpus: int  # GPUs its layers are spread over (the engine's, beside it), 1 = the first only
    speculator_gpu0_gib: float  # what it takes on the first GPU (its share, the gathered keys, a chunk's activations)
    gpu_memory_utilization: float | None  # the engine's share of each GPU (vLLM on GPUs)

    def describe(self) -> str:
        where = f"{self.gpus} GPU(s)" + (f" on {self.nodes} nodes" if self.nodes > 1 else "")
        gpu = f"{self.gpu_gib:.0f} GiB each, {'detected' if self.gpu_detected else 'assumed'}"
        line = (
            f"needs {where} ({gpu}); quantization {self.quantization or 'none'} (the checkpoint's own); "
            f"base weights {self.base_weights_gib:.1f} GiB ({self.base_per_gpu_gib:.1f} per GPU)"
        )
        if self.speculator:
            where = "GPU 0" if self.speculator_gpus == 1 else f"its layers spread over the {self.speculator_gpus} GPUs"
            line += (
                f"; speculator {self.speculator} (bf16) on {where}: {self.speculator_weights_gib:.1f} GiB weights + "
                f"{self.speculator_prefill_gib:.1f} GiB prefill at max_context, {self.speculator_gpu0_gib:.1f} GiB on GPU 0"
            )
        if self.gpu_memory_utilization is not None:
            line += f"; vLLM gpu_memory_utilization {self.gpu_memory_utilization:.2f}"
        return line


def plan(model: ModelConfig, backend: str, needs_speculator: bool) -> Placement:
    """The placement of ``model`` on ``backend``, loading nothing. Refuses what cannot fit:
    a multi-GPU model on the transformers backend (one device), or a speculator that
    leaves the engine too little of its GPU."""
    gpus = model.tensor_parallel * model.pipeline_parallel
    if backend == "transformers" and (model.tensor_parallel > 1 or model.pipeline_parallel > 1 or model.nodes > 1):
        raise ValueError(
            f"model {model.name!r} needs {gpus} GPUs (tensor_parallel={model.tensor_parallel}, "
            f"pipeline_parallel={model.pipeline_parallel}): the transformers backend runs a model on one device; "
            f"use backend=vllm (this model's default)"
        )
    arch = model_architecture(model)
    compute = "bfloat16" if model.dtype not in BYTES_PER_PARAM else model.dtype
    base = weight_bytes(arch, compute) / GIB if arch else model.params_b * 1e9 * BYTES_PER_PARAM[compute] / GIB
    spec_name = model.speculator if needs_speculator else None
    spec_arch = model_architecture(model, speculator=True)
    spread = gpus if backend == "vllm" and gpus > 1 else 1
    spec_w = spec_p = gpu0 = 0.0
    if spec_name is not None:
        kind = (parse_speculator(spec_name) or ("", ""))[0]
        if spec_arch is not None:
            spec_w = weight_bytes(spec_arch, "bfloat16") / GIB  # the speculator is never quantized
            mem = speculator_prefill_bytes(spec_arch, model.max_context, model.speculator_chunk)
            spec_p = mem.total / GIB
            gpu0 = (spec_w + mem.kv_cache / GIB) / spread + (mem.keys + mem.activations) / GIB
        elif kind != "self_layers":
            spec_w = gpu0 = model.speculator_params_b * 1e9 * 2 / GIB
    detected = torch.cuda.is_available()
    gpu_gib = (torch.cuda.get_device_properties(0).total_memory / GIB) if detected else model.gpu_memory_gib
    util = None
    if backend == "vllm" and (detected or gpus > 1):
        util = min(MAX_UTILIZATION, (gpu_gib - gpu0 - RESERVE_GIB) / gpu_gib)
        per_gpu = base / gpus
        if util * gpu_gib < per_gpu * 1.05:
            raise ValueError(
                f"model {model.name!r}: beside the speculator ({gpu0:.1f} GiB on GPU 0 of {spec_w:.1f} GiB weights + "
                f"{spec_p:.1f} GiB prefill at {model.max_context} tokens) the engine keeps {util * gpu_gib:.1f} of "
                f"{gpu_gib:.0f} GiB on GPU 0, less than its {per_gpu:.1f} GiB of weights per GPU; lower max_context, "
                f"prefill the speculator in chunks (speculator_chunk) or use larger GPUs"
            )
    return Placement(
        backend=backend,
        gpus=gpus if backend == "vllm" else 1,
        nodes=model.nodes,
        gpu_gib=float(gpu_gib),
        gpu_detected=detected,
        quantization=quantization(arch),
        base_weights_gib=base,
        base_per_gpu_gib=base / (gpus if backend == "vllm" else 1),
        speculator=spec_name,
        speculator_weights_gib=spec_w,
        speculator_prefill_gib=spec_p,
        speculator_gpus=spread,
        speculator_gpu0_gib=gpu0,
        gpu_memory_utilization=util,
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
