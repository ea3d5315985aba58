"""The Method contract, for every registered method and every conf/method preset (built from
the registry and conf/, not a hand-written list): a valid plan within its budget,
batched planning equal to one at a time, options recorded, and a method that cannot run
here says so with :class:`Unsupported`."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from harness.benchmarks import ruler
from harness.config import CONF, method_conf
from harness.prompts import sample_prompt
from harness.registry import build_method, method_names
from specprefill.plan import LATER_OPTIONS, SCOPES, Unsupported
from tests.test_llmlingua import classifier, small_lm  # noqa: F401  (fixtures: tiny compressor models)

PRESETS = sorted(p.stem for p in (Path(CONF) / "method").glob("*.yaml"))


def test_every_registered_method_has_a_preset():
    names = {method_conf(stem, 0.3, 1)[0] for stem in PRESETS}
    assert set(method_names()) - {"needs_gpu_probe"} <= names, "a method without conf/method/<name>.yaml"


@pytest.fixture(scope="module")
def prompt(smollm2_info, smollm2_tokenizer):
    s = ruler.generate("qa_1", 2048, 1, smollm2_info.fmt, smollm2_info.count)[0]
    return dataclasses.replace(sample_prompt(s, smollm2_tokenizer)[0], answer_tokens=4)  # as the eval job sets it


def offline(stem: str, lm: str, clf: str) -> dict:
    """What the preset needs to run here: local compressor models, a layer the 2-layer
    test model has."""
    return {
        "llmlingua": {"model_path": lm, "dtype": "float32"},
        "longllmlingua": {"model_path": lm, "dtype": "float32"},
        "llmlingua2": {"model_path": clf, "dtype": "float32"},
        "gemfilter": {"filter_layer": 1},
        "specpc": {"starting_layer_index": 0},
        "speckvpc": {
            "first_options": {**method_conf("speckvpc", 0.3, 1)[1]["first_options"], "starting_layer_index": 0}
        },
    }.get(stem, {})


@pytest.mark.parametrize("stem", PRESETS)
def test_every_preset_plans_within_its_budget(stem, backend, prompt, small_lm, classifier):  # noqa: F811
    name, options = method_conf(stem, 0.3, 1)
    given = {**options, **offline(stem, small_lm, classifier)}
    method = build_method(name, given)
    recorded = method.options()
    later = {k for k, v in given.items() if k in LATER_OPTIONS and v == LATER_OPTIONS[k]}  # left out at defaults
    assert method.scope in SCOPES and set(given) - later <= set(recorded) and not later & set(recorded)
    assert all(
        recorded[k] == v for k, v in given.items() if v != "auto" and k not in later
    )  # `auto` dtypes are recorded resolved
    try:
        with method.applied(backend):  # as the runners plan: inside the method's hook
            plan = method.plan(prompt, backend)
    except Unsupported as e:
        assert not torch.cuda.is_available() and "CUDA" in str(e)  # MInference on a CPU machine
        return
    n, k = prompt.n, plan.k
    if method.compresses_cache and getattr(method, "parts", ()):  # compose: the first part's plan, pressed after
        kept = plan.kept_indices
        assert kept is not None and plan.kept <= n and bool((kept[1:] > kept[:-1]).all())
        assert torch.equal(plan.input_ids[: plan.kept], prompt.input_ids[kept])
        if method.options()["then"] == "speckv":  # SpecKV-PC: SpecPC's contiguous positions, then its draft
            assert plan.next_position == plan.kept and plan.prefix == k - 1 and k > plan.kept
        else:
            assert k == plan.kept and plan.next_position == n
        return
    if method.compresses_cache:  # a KV method prefills every token (SpecKV: then its draft); its budget is the cache's
        assert k >= n and torch.equal(plan.input_ids[:n], prompt.input_ids) and plan.next_position == n
        assert torch.equal(plan.position_ids[:n], torch.arange(n))
        return
    assert plan.input_ids.dtype == plan.position_ids.dtype == torch.int64 and plan.position_ids.shape == (k,)
    assert k >= 1 and plan.next_position >= int(plan.position_ids.max()) + 1
    assert all(v >= 0 for v in plan.timings.values())
    keep = float(method.options().get("keep_rate", 1.0))
    slack = (32 / n) if method.options().get("chunk_size") else 0.02
    assert k / n <= keep + slack, (stem, k / n)
    if plan.kept_indices is not None:
        kept = plan.kept_indices
        assert bool((kept[1:] > kept[:-1]).all()) and int(kept[0]) >= 0 and int(kept[-1]) < n
        assert torch.equal(plan.input_ids, prompt.input_ids[kept])
        if method.options().get("position_mode", "original") == "original":
            assert torch.equal(plan.position_ids, kept) and plan.next_position == n
        if method.identity:
            assert k == n
    else:  # a rewritten text keeps the question and instruction whole
        text = backend.tokenizer.decode(plan.input_ids)
        assert prompt.question.strip() in text and method.scope != "prompt"
    if method.identity:
        assert math.isclose(keep, 1.0) and k == n
    batch = method.plan_batch([prompt, prompt], backend)
    for b in batch:
        assert torch.equal(b.input_ids, plan.input_ids) and torch.equal(b.position_ids, plan.position_ids)


@pytest.mark.parametrize(
    "stem", [s for s in PRESETS if "keep_tokens" in (Path(CONF) / "method" / f"{s}.yaml").read_text()]
)
def test_a_token_budget_is_the_methods_budget(stem, backend, prompt, small_lm, classifier):  # noqa: F811
    """``keep_tokens=300`` on a ~2K prompt: the methods that keep prompt tokens keep 300 (chunks
    of 32 round up to whole chunks; a rewritten text within 2 % of the prompt of it), the KV
    methods leave 300 entries in the cache (SpecKV: then the prompt's last token again)."""
    name, options = method_conf(stem, 0.3, 1, 300)
    assert options["keep_tokens"] == 300
    method = build_method(name, {**options, **offline(stem, small_lm, classifier)})
    try:
        with method.applied(backend):
            plan = method.plan(prompt, backend)
            if method.compresses_cache:
                backend.prefill([plan])
    except Unsupported:
        assert not torch.cuda.is_available()
        return
    if getattr(method, "parts", ()):  # compose: the first part keeps 300 (whole chunks), the press half of them
        assert 300 <= plan.k < 332 and backend.last_kv[0] < plan.k, (stem, plan.k, backend.last_kv)
    elif method.compresses_cache:
        held = backend.last_kv[0]
        expected = 301 if name == "speckv" else 300
        assert held == expected or (name == "kvzip" and held == prompt.n), (stem, held)
    elif plan.kept_indices is not None:
        chunk = method.options().get("chunk_size")
        assert (300 <= plan.k < 300 + chunk) if chunk else plan.k == 300, (stem, plan.k)
    else:
        assert plan.k <= 300 + 0.02 * prompt.n, (stem, plan.k)  # as a keep rate: the compressor's own rounding
