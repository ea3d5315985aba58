"""The backend factory: a model config and a backend name in, a ready :class:`Backend` out."""

from __future__ import annotations

import dataclasses

from harness.config import check_backend
from harness.models import ModelConfig, load
from specprefill.backends.transformers import TransformersBackend
from specprefill.plan import Backend


def make_backend(model: ModelConfig, backend: str, needs_speculator: bool = True) -> Backend:
    """``transformers``: base and speculator in this process. ``vllm``: the base on a vLLM
    engine, the speculator (loaded only if a method needs it) on transformers beside it."""
    check_backend(backend)
    if backend == "transformers":
        lm = load(model)
        return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    from harness.models import vllm_engine_args
    from specprefill.backends.vllm import VLLMBackend

    if not needs_speculator:
        model = dataclasses.replace(model, speculator=None)
    lm = load(model, with_base=False)
    spec = TransformersBackend(lm.speculator, lm.tokenizer, lm.speculator) if lm.speculator is not None else None
    return VLLMBackend(tokenizer=lm.tokenizer, speculator_backend=spec, **vllm_engine_args(model))
