"""SpecKV (baselines/speckv.py) against independent statements of the authors' algorithm
(furiosa-ai/draft-based-approx-llm, draft_approx_llm/speckv/, commit d79e404): the draft's
answer from a cache-free greedy loop; each layer's kept keys from the target's own attention
weights (eager attention) over the prompt and the draft, pooled by a written-out loop; the
first token's logits from a cache built by hand from those keys."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from baselines.speckv import speckv_indices
from harness.registry import build_method
from specprefill.plan import Prompt
from tests.test_specpc import eager_weights

W, C, KERNEL = 8, 40, 7  # window_size, max_capacity_prompt, kernel_size of the tests' method


def method(**options):
    return build_method("speckv", {"window_size": W, "max_capacity_prompt": C, "kernel_size": KERNEL, **options})


def test_selection_on_a_hand_worked_example():
    """One KV head, two query heads: head 0 looks at key 3, head 1 at key 6 (d = 2). Max over
    the group finds both; pooled over 3, each spike covers its neighbours."""
    keys = torch.zeros(1, 1, 12, 2)
    keys[0, 0, 3] = torch.tensor([10.0, 0.0])
    keys[0, 0, 6] = torch.tensor([0.0, 9.0])
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])[None, :, None, :].expand(1, 2, 2, 2).contiguous()
    top = speckv_indices(queries, keys, window=2, keep=2, kernel=1)[0, 0].tolist()
    assert sorted(top) == [3, 6] and top[0] == 3  # in order of score: key 3's spike is the larger
    assert sorted(speckv_indices(queries, keys, window=2, keep=6, kernel=3)[0, 0].tolist()) == [2, 3, 4, 5, 6, 7]
    # the window's own keys (10, 11) are never chosen: they are kept whole after the chosen ones
    assert speckv_indices(queries, keys, window=2, keep=100, kernel=1).shape[-1] == 10


def test_the_draft_is_the_speculators_greedy_answer_up_to_its_eos(backend, monkeypatch):
    ids = torch.randint(0, 1000, (30,))
    seq = ids.clone()
    with torch.inference_mode():
        for _ in range(6):  # cache-free greedy decoding
            nxt = backend.speculator(input_ids=seq[None]).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt[None]])
    by_hand = seq[30:].tolist()
    before = backend.method_flops
    assert backend.draft(ids, 6) == by_hand and backend.method_flops > before
    monkeypatch.setattr(backend.speculator.generation_config, "eos_token_id", by_hand[2])
    assert backend.draft(ids, 6) == by_hand[: by_hand.index(by_hand[2]) + 1]  # the EOS written, nothing after


def _kept_rows(cache_keys: torch.Tensor, full_keys: torch.Tensor) -> list[int]:
    """The positions of ``full_keys`` ``[S, d]`` that the rows of ``cache_keys`` ``[k, d]`` are."""
    dist = torch.cdist(cache_keys.float(), full_keys.float(), compute_mode="donot_use_mm_for_euclid_dist")
    assert float(dist.min(1).values.max()) < 1e-4, "a cache row that is no key of the full prefill"
    return dist.argmin(1).tolist()


def test_each_layer_keeps_the_keys_the_targets_own_attention_chooses(backend):
    """Prompt 120 tokens, draft 5: W = 8 + 5 + 1 = 14 queries score the 111 keys before them;
    per layer and KV head the cache keeps the top C - window_size = 32 of them by the pooled
    score (ties at the cut: any of them), then the window's first 8 entries, then the prompt's
    last token, prefilled again at position 119."""
    n, lookahead = 120, 5
    m = method(lookahead_tokens=lookahead)
    prompt = Prompt(input_ids=torch.randint(0, 1000, (n,)))
    cache = DynamicCache(config=backend.base.config)
    with m.applied(backend), torch.inference_mode():
        plan = m.plan(prompt, backend)
        out = backend.prefill_into(plan, cache)
    s, w = n + lookahead, W + lookahead + 1
    assert plan.prefix == s and plan.k == s + 1 and plan.next_position == n
    assert plan.position_ids[-1] == n - 1 and torch.equal(plan.input_ids[-1:], prompt.input_ids[-1:])
    assert plan.timings["speculator_s"] > 0

    full_ids = plan.input_ids[:s]
    full = DynamicCache(config=backend.base.config)
    with torch.inference_mode():
        backend.base(input_ids=full_ids[None], past_key_values=full, use_cache=True)
    weights = eager_weights(backend.base, full_ids)
    group = backend.base.config.num_attention_heads // backend.base.config.num_key_value_heads
    chosen: list[list[list[int]]] = []
    for layer, attn in enumerate(weights):
        keys = cache.layers[layer].keys[0]
        assert keys.shape[1] == C + 1
        per_head = []
        for h in range(keys.shape[0]):
            a = attn[0, h * group : (h + 1) * group, s - w :, : s - w].float()  # [G, W, S - W]
            score = a.amax(dim=(0, 1))
            pooled = torch.stack([score[max(0, j - KERNEL // 2) : j + KERNEL // 2 + 1].max() for j in range(s - w)])
            rows = _kept_rows(keys[h, :C], full.layers[layer].keys[0, h])
            picked, window = rows[: C - W], rows[C - W :]
            assert window == list(range(s - w, s - w + W))  # the window's first entries, in order
            cut = pooled.sort(descending=True).values[C - W - 1]
            assert len(set(picked)) == C - W and all(float(pooled[j]) >= float(cut) - 1e-6 for j in picked)
            assert {j for j in range(s - w) if float(pooled[j]) > float(cut) + 1e-6} <= set(picked)
            per_head.append(rows)
        chosen.append(per_head)
        if layer == 0:  # the re-prefilled last token: the prompt's last, at its own position (layer 0's key)
            assert _kept_rows(keys[:, C], full.layers[0].keys[0, :, n - 1 : n][:, 0]) == list(range(keys.shape[0]))

    # the first token's logits from a cache built by hand from those keys and values
    by_hand = DynamicCache(config=backend.base.config)
    for layer, per_head in enumerate(chosen):
        idx = torch.tensor(per_head)[None, :, :, None].expand(1, -1, -1, full.layers[layer].keys.shape[-1])
        by_hand.update(full.layers[layer].keys.gather(2, idx), full.layers[layer].values.gather(2, idx), layer)
    with torch.inference_mode():
        ref = backend.base(
            input_ids=prompt.input_ids[-1:][None],
            position_ids=torch.tensor([[n - 1]]),
            attention_mask=torch.ones(1, C + 1, dtype=torch.long),
            past_key_values=by_hand,
        ).logits[0, -1]
    assert torch.allclose(out.logits[0, -1], ref, atol=1e-4)


def test_a_prompt_within_the_budget_is_generated_whole(backend):
    m = method(lookahead_tokens=3)
    prompt = Prompt(input_ids=torch.randint(0, 1000, (C,)))
    with m.applied(backend):
        plan = m.plan(prompt, backend)
        gen = backend.generate(plan, 2)
    assert torch.equal(plan.input_ids, prompt.input_ids) and plan.prefix is None and gen.kv_tokens == C
    assert plan.timings["speculator_s"] > 0  # the draft ran, as in theirs


def test_the_budget_follows_keep_and_the_answer_length(backend):
    prompt = Prompt(input_ids=torch.randint(0, 1000, (200,)), answer_tokens=4)
    m = build_method("speckv", {"keep_rate": 0.3, "window_size": W})
    with m.applied(backend):
        gen = backend.generate(m.plan(prompt, backend), 3)
    assert gen.kv_tokens == 60 + 1  # after the prefill: ceil(200 * 0.3), then the prompt's last token again


def test_refusals(backend):
    prompt = Prompt(input_ids=torch.randint(0, 1000, (200,)))
    with method().applied(backend), pytest.raises(ValueError, match="lookahead_tokens=null drafts the task"):
        method().plan(prompt, backend)
    with pytest.raises(RuntimeError, match=r"outside SpecKV\.applied"):
        method(lookahead_tokens=2).plan(prompt, backend)
    with pytest.raises(ValueError, match=r"max_capacity_prompt=8; allowed: window_size \(8\) <"):
        method(max_capacity_prompt=8)
    with pytest.raises(ValueError, match="keeps 20 entries of a 200-token prompt"):
        m = build_method("speckv", {"keep_rate": 0.1, "lookahead_tokens": 2})
        with m.applied(backend):
            m.plan(prompt, backend)
    with pytest.raises(ValueError, match=r"longest prompt of 5000 tokens passes .* = 4096.* sparse_prefill=false"):
        method().check_model("m", 2, 8192, 5000)
    method(sparse_prefill=False).check_model("m", 2, 8192, 5000)
    with pytest.raises(ValueError, match="prefill_window_size=100; allowed: a multiple of 64"):
        method(prefill_window_size=100)
