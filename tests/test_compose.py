"""``compose`` (baselines/compose.py): a prompt-side method, then a KV press during the base's
prefill of what it kept. The plan is the first method's own (its speculator never runs under
the press); the cache is the press's on that plan alone; both parts' costs and options reach
the rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from baselines.kv_presses import question_end
from harness.benchmarks import ruler
from harness.config import ConfigError, check_in_model, method_spec
from harness.jobs.eval import EvalConfig, execute, prepare
from harness.parquet import read_parquet
from harness.prompts import sample_prompt
from harness.registry import build_method
from specprefill.plan import Prompt

CONF = str(Path(__file__).resolve().parents[1] / "conf")


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
    with pytest.raises(ValueError, match="then='truncate' is not a KV-side method"):
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
    rows = read_parquet(execute(prepare(EvalConfig.from_hydra(cfg))) / "rows.parquet")
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


def test_speckv_pc_is_speckv_over_specpcs_tokens_with_specpcs_draft(backend, prompt, monkeypatch):
    """SpecKV-PC (their speckvpc.py): SpecPC keeps k tokens and its draft writes T; SpecKV
    then runs on those k tokens as its prompt (contiguous positions, as SpecPC's generate
    numbers them) with SpecPC's T tokens as its draft, drafting nothing itself. So the cache
    and the first token's logits are SpecKV alone's on a prompt of the kept tokens whose draft
    is SpecPC's; the budget is then_keep_rate of the kept tokens."""
    first = {"window_size": 16, "kernel_size": 8, "neighbor_tokens": 8, "starting_layer_index": 0,
             "lookahead_tokens": 4}  # fmt: skip
    then = {"window_size": 8, "kernel_size": 7}  # no lookahead_tokens: SpecPC's draft is SpecKV's
    parts = {"first": "specpc", "then": "speckv", "keep_tokens": 200, "then_keep_rate": 0.25, "first_options": first}
    with pytest.raises(ValueError, match=r"then_options.lookahead_tokens=99: SpecKV reuses SpecPC's draft"):
        build_method("compose", {**parts, "then_options": {**then, "lookahead_tokens": 99}})  # would not be read
    m = build_method("compose", {**parts, "then_options": then})
    alone = build_method("specpc", {**first, "keep_tokens": 200}).plan(prompt, backend)
    draft = alone.draft_ids
    assert draft is not None and draft.shape == (4,)
    cache = DynamicCache(config=backend.base.config)
    drafted = backend.draft
    monkeypatch.setattr(backend, "draft", lambda *a: pytest.fail("SpecKV-PC drafted a second time"))
    with m.applied(backend), torch.inference_mode():
        plan = m.plan(prompt, backend)
        out = backend.prefill_into(plan, cache)
    k = 200
    assert torch.equal(plan.kept_indices, alone.kept_indices) and plan.kept == k
    assert torch.equal(plan.input_ids, torch.cat([alone.input_ids, draft, alone.input_ids[-1:]]))
    assert plan.position_ids.tolist() == [*range(k), *range(k, k + 4), k - 1] and plan.next_position == k
    assert plan.prefix == k + 4 and plan.timings["speculator_s"] > 0
    assert cache.get_seq_length() == 50 + 1  # ceil(200 * 0.25) entries, then the last kept token again

    monkeypatch.setattr(backend, "draft", lambda ids, n: draft.tolist())  # SpecKV alone, given SpecPC's draft
    by_hand = DynamicCache(config=backend.base.config)
    speckv = build_method("speckv", {**then, "keep_rate": 0.25})
    with speckv.applied(backend), torch.inference_mode():
        ref_plan = speckv.plan(Prompt(input_ids=alone.input_ids, answer_tokens=4), backend)
        ref = backend.prefill_into(ref_plan, by_hand)
    monkeypatch.setattr(backend, "draft", drafted)
    assert torch.equal(ref_plan.input_ids, plan.input_ids) and torch.equal(ref_plan.position_ids, plan.position_ids)
    for a, b in zip(cache.layers, by_hand.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert torch.allclose(out.logits[0, -1], ref.logits[0, -1])
    assert not hasattr(backend.base, "_speckv_turn") and not hasattr(backend.base, "_compose_stack")


def test_the_speckvpc_preset_is_the_authors_setting():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=tiny-random", "method=speckvpc", "keep_tokens=2048"])
    name, opts = method_spec(dict(cfg.method))
    m = build_method(name, opts)
    assert (m.first, m.then, m.keep_tokens, m.then_keep_rate) == ("specpc", "speckv", 2048, 0.25)
    pc, kv = m.first_method(), m.then_method()
    assert (pc.window_size, pc.kernel_size, pc.neighbor_tokens, pc.lookahead_tokens, pc.starting_layer_index) == (
        64, 32, 32, None, 8)  # fmt: skip
    assert (kv.window_size, kv.kernel_size, kv.capacity(2048)) == (32, 7, 512)  # their cmax 512 of 2048
    # SpecKV prefills what SpecPC keeps: a 16K prompt passes its 4096-token dense limit only if kept whole
    m.check_model("m", 24, 32768, 16384)
