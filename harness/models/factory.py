"""The backend factory: a model config and a backend name in, a ready :class:`Backend` out."""

from __future__ import annotations

import dataclasses

from hydra.errors import CompactHydraException

from harness.models.catalog import ModelConfig, check_backend
from harness.models.loading import LoadedModel, load, speculator_config, tokenizer_id, vllm_engine_args
from harness.models.placement import Placement, place
from specprefill.backends import vllm as vllm_backend
from specprefill.backends.transformers import TransformersBackend
from specprefill.plan import Backend


def make_backend(
    model: ModelConfig, backend: str, needs_speculator: bool = True, placement: Placement | None = None
) -> Backend:
    """``transformers``: base and speculator in this process. ``vllm``: the base on a vLLM
    engine, taking the share of each GPU the placement planned, the speculator (loaded only
    if a method needs it) on transformers beside it, on the first GPU."""
    check_backend(backend)
    placement = placement or place(model, backend, needs_speculator)
    if backend == "transformers":
        lm = load(model)
        tb = TransformersBackend(
            lm.base,
            lm.tokenizer,
            lm.speculator,
            prefill_chunk=model.speculator_chunk,
            speculator_tokenizer=lm.speculator_tokenizer,
        )
        if lm.speculator_tokenizer is not None:  # rows name the checkpoint's tokenizer, not a cache folder
            tb.speculator_tokenizer_id = tokenizer_id(speculator_config(model))
        return tb

    if not needs_speculator:
        model = dataclasses.replace(model, speculator=None)
    lm, spec = speculator_backend(model)
    args = vllm_engine_args(model, placement.gpu_memory_utilization, placement.max_model_len)
    try:
        return vllm_backend.VLLMBackend(tokenizer=lm.tokenizer, speculator_backend=spec, **args)
    except vllm_backend.PositionHookInactive as e:  # one line, before any sample runs (its own check)
        raise EngineRefused(str(e)) from e


def speculator_backend(model: ModelConfig) -> tuple[LoadedModel, TransformersBackend | None]:
    """The tokenizer and speculator of ``model`` without its base (the base runs in a vLLM
    engine), and a transformers backend over the speculator (None without one) that
    prefills it ``model.speculator_chunk`` tokens at a time, as placement planned its
    memory. The vLLM backend and the serving front both take it from here."""
    lm = load(model, with_base=False)
    if lm.speculator is None:
        return lm, None
    if lm.speculator_tokenizer is not None:  # the engine's prompts are the base's ids; nothing maps them
        raise ValueError(
            f"speculator={model.speculator!r} has another tokenizer than model {model.name!r}: a speculator from "
            f"another family runs on backend=transformers only; allowed here: a speculator with the base's tokenizer"
        )
    return lm, TransformersBackend(lm.speculator, lm.tokenizer, lm.speculator, prefill_chunk=model.speculator_chunk)


class EngineRefused(CompactHydraException, RuntimeError):
    """An engine that started but would give wrong rows (vLLM's position canary failed):
    Hydra prints the one-line reason and the run stops before any sample."""
