"""The backend factory: a model config and a backend name in, a ready :class:`Backend` out."""

from __future__ import annotations

import dataclasses

from harness.config import check_backend
from harness.models import ModelConfig, load
from harness.placement import Placement
from harness.placement import plan as place
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
        return TransformersBackend(lm.base, lm.tokenizer, lm.speculator, prefill_chunk=model.speculator_chunk)
    from harness.models import vllm_engine_args
    from specprefill.backends.vllm import VLLMBackend

    if not needs_speculator:
        model = dataclasses.replace(model, speculator=None)
    lm = load(model, with_base=False)
    spec = None
    if lm.speculator is not None:
        spec = TransformersBackend(lm.speculator, lm.tokenizer, lm.speculator, prefill_chunk=model.speculator_chunk)
    args = vllm_engine_args(model, placement.gpu_memory_utilization)
    return VLLMBackend(tokenizer=lm.tokenizer, speculator_backend=spec, **args)
