"""Both backends behind the one typed Backend protocol; timings never silently stand in for
each other (vLLM without engine timestamps records NaN and says so)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from specprefill.backends import vllm as vb
from specprefill.backends.transformers import TransformersBackend
from specprefill.plan import Backend, Generation, Prompt, full_plan


def _members(cls: type) -> set[str]:
    return {m for m in dir(cls) if not m.startswith("_")}


def test_both_backends_implement_every_member_of_the_protocol():
    wanted = {m for m in Backend.__dict__ if not m.startswith("_")} | set(Backend.__annotations__)
    for cls in (TransformersBackend, vb.VLLMBackend):
        missing = wanted - _members(cls) - {"tokenizer", "method_flops"}  # instance attributes
        assert not missing, (cls.__name__, missing)


def test_engine_times_come_from_the_engine_or_are_missing_never_the_whole_call():
    m = SimpleNamespace(scheduled_ts=10.0, first_token_ts=10.5, last_token_ts=12.0)
    assert vb.engine_times(m) == (0.5, 1.5, "engine")
    for missing in (None, SimpleNamespace(scheduled_ts=0.0, first_token_ts=0.0, last_token_ts=0.0)):
        pre, dec, source = vb.engine_times(missing)
        assert math.isnan(pre) and math.isnan(dec) and source == "none"


def test_vllm_generate_records_the_timing_source(monkeypatch):
    out = SimpleNamespace(
        metrics=None,
        outputs=[SimpleNamespace(token_ids=[5, 6], text="ab", finish_reason="length", stop_reason=None)],
    )
    backend = object.__new__(vb.VLLMBackend)
    backend.llm = SimpleNamespace(generate=lambda prompts, params, use_tqdm: [out])
    gen = backend.generate(full_plan(Prompt(torch.arange(4))), 2)
    assert isinstance(gen, Generation) and gen.timing_source == "none" and math.isnan(gen.prefill_s)
    assert gen.token_ids == [5, 6] and gen.text == "ab"
