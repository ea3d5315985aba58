"""``compose`` (baselines/compose.py): a prompt-side method, then a KV press during the base's
prefill of what it kept. The plan is the first method's own (its speculator never runs under
the press); the cache is the press's on that plan alone; both parts' costs and options reach
the rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from baselines.kv_presses import question_end
from harness.benchmarks import ruler
from harness.config import ConfigError, check_in_model, method_spec
from harness.jobs.eval import EvalConfig, execute, prepare
from harness.models.catalog import model_config
from harness.models.loading import load
from harness.prompts import sample_prompt
from harness.registry import build_method
from specprefill.backends.transformers import TransformersBackend

CONF = str(Path(__file__).resolve().parents[1] / "conf")


@pytest.fixture(scope="module")
def backend(smollm2_tokenizer):
    lm = load(model_config("tiny-random", max_context=8192))
    return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)


@pytest.fixture(scope="module")
def prompt(smollm2_info, smollm2_tokenizer):
    s = ruler.generate("qa_1", 1024, 1, smollm2_info.fmt, smollm2_info.count)[0]
    return sample_prompt(s, smollm2_tokenizer)[0]


def test_the_plan_is_the_first_methods_and_the_cache_the_presss_on_it(backend, prompt):
    first = {"lookahead": 1, "pool_kernel": 13, "chunk_size": 32}
    m = build_method("compose", {"first": "specprefill", "then": "knorm", "keep_rate": 0.5, "then_keep_rate": 0.4,
                                 "first_options": first})  # fmt: skip
    assert m.needs_speculator  # the first method's
    cache = DynamicCache(config=backend.base.config)
    with m.applied(backend), torch.inference_mode():
        plan = m.plan(prompt, backend)
        backend.prefill_into(plan, cache)
    alone = build_method("specprefill", {"keep_rate": 0.5, **first}).plan(prompt, backend)
    # the speculator (the base's own first layer) ran with no press on: the same selection as alone
    assert torch.equal(plan.kept_indices, alone.kept_indices) and plan.timings["speculator_s"] > 0
    end = question_end(prompt, backend.tokenizer)
    before = int((alone.kept_indices < end).sum())  # kept tokens up to the question's end: pressed
    assert plan.prefix == (before if before < plan.k else None)
    pressed = plan.prefix or plan.k

    press = build_method("knorm", {"keep_rate": 0.4})  # the press alone on the same plan
    by_hand = DynamicCache(config=backend.base.config)
    with press.applied(backend), torch.inference_mode():
        backend.prefill_into(dataclasses.replace(alone, prefix=plan.prefix), by_hand)
    # kvpress keeps int(p * (1 - 0.6)) of the pressed part; the tail stays whole
    assert cache.get_seq_length() == by_hand.get_seq_length() == int(pressed * 0.4) + plan.k - pressed
    for a, b in zip(cache.layers, by_hand.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert not hasattr(backend.base, "_compose_stack") and not hasattr(backend.base, "_kvpress_applied")


def test_refusals():
    with pytest.raises(ValueError, match="first='snapkv' does not keep prompt tokens"):
        build_method("compose", {"first": "snapkv"})
    with pytest.raises(ValueError, match="then='truncate' is not a KV press"):
        build_method("compose", {"first": "truncate", "then": "truncate"})
    with pytest.raises(ValueError, match="allowed: query_aware true, compress_tail false"):
        build_method("compose", {"first": "truncate", "then_options": {"query_aware": False}})
    with pytest.raises(ConfigError, match=r"method 'compose' acts inside the base model.*backend=transformers"):
        check_in_model([build_method("compose", {"first": "truncate"})], "vllm")


def test_parts_get_their_presets():
    name, opts = method_spec({"name": "compose", "first": "specprefill", "then": "snapkv", "keep_rate": 0.2,
                              "keep_tokens": None, "then_keep_rate": 0.5, "first_options": None,
                              "then_options": None}, lookahead=1)  # fmt: skip
    assert name == "compose" and opts["first_options"] == {
        "lookahead": 1, "pool_kernel": 13, "chunk_size": 32, "position_mode": "original", "force_keep_first": 0,
        "force_keep_last": 0,
    }  # fmt: skip
    assert opts["then_options"] == {"query_aware": True, "compress_tail": False, "window_size": 64, "kernel_size": 5}


def test_rows_show_both_parts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "method=compose", "method.first=truncate", "method.then=snapkv", "keep=0.5",
            "benchmark=ruler", "tasks=[niah_single_1]", "length=1024", "limit=2", "max_new=2", f"out={tmp_path}"])  # fmt: skip
    rows = pd.read_parquet(execute(prepare(EvalConfig.from_hydra(cfg))) / "rows.parquet")
    assert set(rows["status"]) == {"ok"} and (rows["method"] == "compose").all()
    opts = rows["method_options"].map(json.loads)
    assert all(o["first"] == "truncate" and o["then"] == "snapkv" and o["then_keep_rate"] == 0.5 for o in opts)
    assert all(o["then_options"]["window_size"] == 64 for o in opts)  # the press's preset, recorded
    # the first method's budget in the prefill, the press's in the cache
    assert (rows["kept_tokens"] < rows["prompt_tokens"] * 0.5 + 1).all() and (
        rows["kv_tokens"] < rows["kept_tokens"]
    ).all()


def test_the_tail_after_the_question_stays_whole(backend, prompt):
    """Truncation keeps the prompt's end: the kept tokens up to the question's end are pressed,
    the chat tail and answer prefix after it prefilled whole, as the press alone does."""
    m = build_method("compose", {"first": "truncate", "then": "knorm", "keep_rate": 0.5, "then_keep_rate": 0.5})
    with m.applied(backend):
        plan = m.plan(prompt, backend)
        gen = backend.generate(plan, 1)
    end = question_end(prompt, backend.tokenizer)
    assert plan.prefix == int((plan.kept_indices < end).sum()) and 0 < plan.prefix < plan.k
    assert gen.kv_tokens == int(plan.prefix * 0.5) + plan.k - plan.prefix
