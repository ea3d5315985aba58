"""The transformers backend against direct model forwards.

These pin what ``specprefill/backends/transformers/`` relies on in transformers==5.19:
if an upgrade changes query computation, cache layout or masking, they fail.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from specprefill import FullPrefill, Prompt, SpecPrefill
from specprefill.backends.transformers import TESTED_TRANSFORMERS, TransformersBackend, early_exit_view
from specprefill.core import token_importance
from specprefill.plan import Plan, capped_positions, even_gap_positions, scaled_positions, spread_positions
from tests.conftest import CharTokenizer


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(seed))


def test_pinned_transformers_version():
    assert importlib.metadata.version("transformers") == TESTED_TRANSFORMERS


def _eager_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """Attention probabilities of a plain eager forward: [layers, heads, T, T]."""
    model.config._attn_implementation = "eager"
    try:
        out = model(input_ids=ids.unsqueeze(0), output_attentions=True)
    finally:
        model.config._attn_implementation = "sdpa"
    return torch.stack([a[0] for a in out.attentions])


@torch.no_grad()
def test_captured_queries_and_keys_reproduce_the_models_own_attention(tiny_llama):
    """softmax(q k^T / sqrt d) from our captured post-RoPE q and cached keys equals the
    model's eager attention row of the last prompt token, at every layer and head."""
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    ids = _ids(40)
    cap = be.speculate(ids, lookahead=1)
    assert cap.queries.shape == (3, 4, 1, 16) and cap.keys.shape == (3, 2, 40, 16)
    probs = _eager_probs(tiny_llama, ids)[:, :, -1, :]  # [layers, heads, N]
    q = cap.queries[:, :, 0]  # [layers, heads, d]
    k = cap.keys.repeat_interleave(2, dim=1)  # [layers, heads, N, d]
    mine = torch.softmax(torch.einsum("lhd,lhnd->lhn", q, k) / 4.0, dim=-1)
    torch.testing.assert_close(mine, probs, rtol=1e-4, atol=1e-5)
    # max over layers x heads of this row is exactly the importance at L=1
    torch.testing.assert_close(
        token_importance(cap.queries, cap.keys), probs.flatten(0, 1).amax(0), rtol=1e-4, atol=1e-5
    )


@torch.no_grad()
def test_lookahead_queries_score_prompt_keys_only(tiny_llama):
    """Look-ahead token j's captured query equals the model's query at position N+j;
    its importance row is its attention renormalised over the N prompt keys (it does not
    attend to other look-ahead tokens)."""
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    n, L = 30, 4
    ids = _ids(n, 1)
    cap = be.speculate(ids, lookahead=L)
    assert cap.queries.shape[2] == L and cap.keys.shape[2] == n and len(cap.lookahead_ids) == L - 1
    # The look-ahead tokens are the greedy continuation.
    full = torch.cat([ids, torch.tensor(cap.lookahead_ids)])
    logits = tiny_llama(input_ids=full.unsqueeze(0)).logits[0]
    assert cap.lookahead_ids == logits[n - 1 : n + L - 2].argmax(-1).tolist()
    probs = _eager_probs(tiny_llama, full)  # [layers, heads, T, T]
    k = cap.keys.repeat_interleave(2, dim=1)
    for j in range(L):
        row = probs[:, :, n - 1 + j, :n]
        expected = row / row.sum(-1, keepdim=True)
        got = torch.softmax(torch.einsum("lhd,lhnd->lhn", cap.queries[:, :, j], k) / 4.0, dim=-1)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_keep_rate_one_equals_full_prefill(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer(), early_exit_view(tiny_llama, 2))
    prompt = Prompt(_ids(50, 2))
    full = be.generate(FullPrefill().plan(prompt, be), max_new_tokens=12)
    for kwargs in ({}, {"chunk_size": 8, "pool_kernel": 3, "lookahead": 1}):
        plan = SpecPrefill(keep_rate=1.0, **kwargs).plan(prompt, be)
        assert plan.k == 50 and plan.position_ids.tolist() == list(range(50))
        spec = be.generate(plan, max_new_tokens=12)
        assert spec.token_ids == full.token_ids
        torch.testing.assert_close(spec.first_logits, full.first_logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_sparse_prefill_equals_direct_forward_with_position_ids(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer())
    ids = _ids(60, 3)
    kept = torch.tensor([0, 3, 4, 10, 11, 12, 30, 31, 45, 59])
    plan = Plan(input_ids=ids[kept], position_ids=kept, next_position=60, kept_indices=kept)
    gen = be.generate(plan, max_new_tokens=6)
    direct = tiny_llama(
        input_ids=ids[kept].unsqueeze(0),
        position_ids=kept.unsqueeze(0),
        attention_mask=torch.ones(1, 10, dtype=torch.long),
    ).logits[0, -1]
    torch.testing.assert_close(gen.first_logits, direct, rtol=1e-5, atol=1e-5)
    # Original positions matter: re-numbering 0..K-1 changes the logits.
    contiguous = tiny_llama(input_ids=ids[kept].unsqueeze(0)).logits[0, -1]
    assert not torch.allclose(direct, contiguous, atol=1e-4)
    # Decoding continues at N, N+1, ...: each generated token equals a no-cache forward
    # over kept + generated tokens at positions (kept, 60, 61, ...).
    toks = gen.token_ids
    for t in range(1, len(toks)):
        seq = torch.cat([ids[kept], torch.tensor(toks[:t])])
        pos = torch.cat([kept, torch.arange(60, 60 + t)])
        ref = tiny_llama(
            input_ids=seq.unsqueeze(0),
            position_ids=pos.unsqueeze(0),
            attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        ).logits[0, -1]
        assert int(ref.argmax()) == toks[t]


def _tiny_qwen2():
    """A small random Qwen2 (the positions studies' architecture: biased q/k/v, GQA 4:2)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=None, bos_token_id=None,
                      pad_token_id=None)  # fmt: skip
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    return model


@torch.no_grad()
def _masked_whole_prompt(model, ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Logits of the whole sequence at positions 0..N-1, each query seeing only the earlier
    tokens marked in ``keys`` (and itself): an additive 4-D mask, no gaps in the positions."""
    n = len(ids)
    pos = torch.arange(n)
    allow = ((pos[None, :] <= pos[:, None]) & keys[None, :]) | torch.eye(n, dtype=torch.bool)
    mask = torch.zeros(1, 1, n, n).masked_fill(~allow, torch.finfo(torch.float32).min)
    return model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), attention_mask=mask).logits[0]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.no_grad()
def test_original_positions_are_the_whole_prompt_with_the_dropped_tokens_masked(tiny_llama, arch):
    """What SpecPrefill's original positions mean, checked against a computation that shares
    none of the backend's path (no gapped position ids, no cache): the whole prompt at its own
    positions with the dropped tokens hidden from every query. The first token's logits, the
    greedy tokens after it and their log-probability (decoding from N) all agree, on Llama and
    on Qwen2 (the positions studies' base). So a score lost at original positions against
    re-numbered ones is the model's answer to the gaps, not a bug of this backend."""
    model = tiny_llama if arch == "llama" else _tiny_qwen2()
    be = TransformersBackend(model, CharTokenizer())
    ids = _ids(60, 3)
    kept = torch.tensor([0, 3, 4, 10, 11, 12, 30, 31, 45, 59])
    plan = Plan(input_ids=ids[kept], position_ids=kept, next_position=60, kept_indices=kept)
    seen: list[torch.Tensor] = []  # the last logits of every base forward: the prefill's, then each decode step's
    hook = model.register_forward_hook(lambda _m, _a, out: seen.append(out.logits[0, -1].float().clone()))
    try:
        gen = be.generate(plan, max_new_tokens=6)
    finally:
        hook.remove()
    keys = torch.zeros(60, dtype=torch.bool)
    keys[kept] = True
    ref = _masked_whole_prompt(model, ids, keys)
    torch.testing.assert_close(gen.first_logits, ref[59], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(
        ref[59], _masked_whole_prompt(model, ids, torch.ones(60, dtype=torch.bool))[59], atol=1e-3
    )
    new = torch.tensor(gen.token_ids)
    seq = torch.cat([ids, new[:-1]])
    ref = _masked_whole_prompt(model, seq, torch.cat([keys, torch.ones(len(new) - 1, dtype=torch.bool)]))
    assert len(seen) == len(new) and ref[59:].argmax(-1).tolist() == gen.token_ids
    torch.testing.assert_close(torch.stack(seen), ref[59:], rtol=1e-5, atol=1e-5)  # each decode step at N, N+1, ...
    logp = torch.log_softmax(ref[59:].double(), -1).gather(1, new.unsqueeze(1)).sum().item()
    assert be.score(plan, gen.token_ids)[0] == pytest.approx(logp, abs=1e-4)


@torch.no_grad()
def test_upstream_treats_gapped_positions_without_mask_as_packed_sequences(tiny_llama):
    """Why the backend always passes an attention mask: without one (and without a
    cache), transformers 5.19 reads gaps in position_ids as packed-sequence borders."""
    ids = _ids(12, 4)
    pos = torch.tensor([[0, 1, 2, 7, 8, 9, 20, 21, 22, 23, 40, 41]])
    masked = tiny_llama(
        input_ids=ids.unsqueeze(0), position_ids=pos, attention_mask=torch.ones(1, 12, dtype=torch.long)
    ).logits
    unmasked = tiny_llama(input_ids=ids.unsqueeze(0), position_ids=pos, use_cache=False).logits
    assert not torch.allclose(masked[0, -1], unmasked[0, -1], atol=1e-4)


@torch.no_grad()
def test_early_exit_view_shares_weights_and_stops_after_m_layers(tiny_llama):
    view = early_exit_view(tiny_llama, 2)
    assert view.model.layers[0] is tiny_llama.model.layers[0] and len(view.model.layers) == 2
    assert tiny_llama.config.num_hidden_layers == 3 and len(tiny_llama.model.layers) == 3
    ids = _ids(20, 5).unsqueeze(0)
    h = tiny_llama.model(input_ids=ids, output_hidden_states=True).hidden_states[2]  # after layer 2
    expected = tiny_llama.lm_head(tiny_llama.model.norm(h))
    torch.testing.assert_close(view(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="self_layers:4"):
        early_exit_view(tiny_llama, 4)


def test_method_options_are_validated():
    for bad, match in (
        (dict(keep_rate=1.5), "keep_rate=1.5"),
        (dict(keep_rate=0.0), "keep_rate=0.0"),
        (dict(lookahead=0), "lookahead=0"),
        (dict(pool_kernel=4), r"pool_kernel=4; allowed: .*odd"),
        (dict(position_mode="shifted"), "position_mode='shifted'"),
        (dict(force_keep_last=-1), "force_keep_last=-1"),
        (dict(max_gap=0), r"max_gap=0; allowed: null or an int >= 1"),
        (dict(random_fill=0), r"random_fill=0; allowed: null or an int >= 1"),
        (
            dict(max_gap=8, position_mode="contiguous"),
            r"max_gap=8 with position_mode='contiguous'.*allowed: max_gap=null",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            SpecPrefill(**bad)


@torch.no_grad()
def test_contiguous_position_mode(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    prompt = Prompt(_ids(40, 6))
    plan = SpecPrefill(keep_rate=0.25, position_mode="contiguous", lookahead=1).plan(prompt, be)
    assert plan.k == 10 and plan.position_ids.tolist() == list(range(10)) and plan.next_position == 10
    orig = SpecPrefill(keep_rate=0.25, lookahead=1).plan(prompt, be)
    assert orig.kept_indices is not None and plan.kept_indices is not None
    assert orig.kept_indices.tolist() == plan.kept_indices.tolist()
    assert orig.position_ids.tolist() == orig.kept_indices.tolist() and orig.next_position == 40


def test_capped_positions_shorten_only_the_gaps_longer_than_max_gap():
    kept = torch.tensor([0, 1, 2, 10, 11, 50, 99])  # a prompt of 100 tokens
    expected = {  # written out by hand: every step to the next kept token (and to index 100) capped at max_gap
        1: ([0, 1, 2, 3, 4, 5, 6], 7),
        2: ([0, 1, 2, 4, 5, 7, 9], 10),
        4: ([0, 1, 2, 6, 7, 11, 15], 16),
        8: ([0, 1, 2, 10, 11, 19, 27], 28),
        39: ([0, 1, 2, 10, 11, 50, 89], 90),
        100: ([0, 1, 2, 10, 11, 50, 99], 100),
    }
    for gap, (positions, nxt) in expected.items():
        got, got_next = capped_positions(kept, 100, gap)
        assert (got.tolist(), got_next) == (positions, nxt), gap
    # the step into the first kept token is capped too, and the one after the last
    assert capped_positions(torch.tensor([5, 6, 30]), 40, 4)[0].tolist() == [3, 4, 8]
    assert capped_positions(torch.tensor([5, 6, 30]), 40, 4)[1] == 12
    assert capped_positions(torch.tensor([], dtype=torch.int64), 40, 4)[1] == 3
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=r"max_gap=.*allowed: int >= 1"):
            capped_positions(kept, 100, bad)  # type: ignore[arg-type]


@torch.no_grad()
def test_max_gap_keeps_the_selection_and_caps_its_positions(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    prompt = Prompt(_ids(40, 6))
    orig = SpecPrefill(keep_rate=0.25, lookahead=1).plan(prompt, be)
    assert orig.kept_indices is not None
    kept = orig.kept_indices.tolist()
    for gap in (1, 3, 40):
        plan = SpecPrefill(keep_rate=0.25, lookahead=1, max_gap=gap).plan(prompt, be)
        assert plan.kept_indices is not None and plan.kept_indices.tolist() == kept  # the same tokens
        steps = [b - a for a, b in zip([-1, *kept], [*kept, 40], strict=True)]
        positions = [sum(min(s, gap) for s in steps[: i + 1]) - 1 for i in range(len(kept))]
        assert plan.position_ids.tolist() == positions and plan.next_position == positions[-1] + min(steps[-1], gap)
    one = SpecPrefill(keep_rate=0.25, lookahead=1, max_gap=1).plan(prompt, be)
    assert one.position_ids.tolist() == list(range(10)) and one.next_position == 10  # re-numbered 0..K-1
    wide = SpecPrefill(keep_rate=0.25, lookahead=1, max_gap=40).plan(prompt, be)
    assert wide.position_ids.tolist() == kept and wide.next_position == 40  # the original positions
    assert SpecPrefill(max_gap=None).options() == SpecPrefill().options() and "max_gap" not in SpecPrefill().options()
    assert SpecPrefill(max_gap=4).options()["max_gap"] == 4


def test_random_fill_adds_tokens_not_selected_by_hand():
    from specprefill.core import random_fill

    kept = torch.tensor([0, 1, 2, 7])
    got = random_fill(kept, 10, 3)
    assert got.tolist() == sorted(got.tolist()) and len(got) == 7 and set(kept.tolist()) <= set(got.tolist())
    assert set(got.tolist()) - set(kept.tolist()) <= {3, 4, 5, 6, 8, 9}
    assert torch.equal(got, random_fill(kept, 10, 3)) and not torch.equal(got, random_fill(kept, 10, 3, seed=1))
    assert random_fill(kept, 10, 99).tolist() == list(range(10))  # fewer left than asked: all of them
    assert torch.equal(random_fill(kept, 10, 0), kept)
    with pytest.raises(ValueError, match=r"random_fill=-1; allowed: null or an int >= 1"):
        random_fill(kept, 10, -1)


def test_random_fill_keeps_the_selection_and_adds_m_tokens_at_their_own_positions(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    prompt = Prompt(_ids(40, 6))
    orig = SpecPrefill(keep_rate=0.25, lookahead=1).plan(prompt, be)
    filled = SpecPrefill(keep_rate=0.25, lookahead=1, random_fill=6).plan(prompt, be)
    assert orig.kept_indices is not None and filled.kept_indices is not None
    assert filled.k == 16 and set(orig.kept_indices.tolist()) < set(filled.kept_indices.tolist())
    assert filled.position_ids.tolist() == filled.kept_indices.tolist() and filled.next_position == 40
    cont = SpecPrefill(keep_rate=0.25, lookahead=1, random_fill=6, position_mode="contiguous").plan(prompt, be)
    assert cont.kept_indices is not None and cont.kept_indices.tolist() == filled.kept_indices.tolist()
    assert cont.position_ids.tolist() == list(range(16))
    assert "random_fill" not in SpecPrefill().options() and SpecPrefill(random_fill=6).options()["random_fill"] == 6


def test_spread_positions_keep_the_span_and_even_out_the_gaps():
    # floor(i * 100 / 7), written out: 100 / 7 = 14.29
    assert spread_positions(7, 100).tolist() == [0, 14, 28, 42, 57, 71, 85]
    assert spread_positions(3, 3).tolist() == [0, 1, 2] and spread_positions(1, 10).tolist() == [0]
    with pytest.raises(ValueError, match=r"k=5 kept tokens of a prompt of n=4; allowed: k <= n"):
        spread_positions(5, 4)


def test_scaled_positions_shrink_every_gap_in_proportion():
    kept = torch.tensor([0, 1, 2, 10, 11, 50, 99])  # gaps of 7, 38 and 48 empty positions in a prompt of 100
    # halved, rounded half up: 4 (3.5), 19, 24; no gap after 99
    got, nxt = scaled_positions(kept, 100, 0.5)
    assert got.tolist() == [0, 1, 2, 7, 8, 28, 53] and nxt == 54
    # 5 -> 2, 23 -> 9, and the 9 after the last kept token -> 4 (3.6)
    got, nxt = scaled_positions(torch.tensor([5, 6, 30]), 40, 0.4)
    assert got.tolist() == [2, 3, 13] and nxt == 18
    got, nxt = scaled_positions(torch.tensor([0, 2, 4]), 5, 0.01)  # a gap of one stays one: no runs merge
    assert got.tolist() == [0, 2, 4] and nxt == 5
    got, nxt = scaled_positions(kept, 100, 1.0)
    assert got.tolist() == kept.tolist() and nxt == 100  # the original positions
    for bad in (0, 0.0, 1.5, -0.2, True):
        with pytest.raises(ValueError, match=r"gap_scale=.*allowed: a number in \(0, 1\]"):
            scaled_positions(kept, 100, bad)


def test_even_gap_positions_keep_the_runs_and_share_the_empty_positions_evenly():
    # runs [0, 1, 2], [10, 11], [50], [99] of a prompt of 100: 93 empty positions over the gaps
    # before 10, 50 and 99 (none before 0 or after 99), 31 each
    assert even_gap_positions(torch.tensor([0, 1, 2, 10, 11, 50, 99]), 100).tolist() == [0, 1, 2, 34, 35, 67, 99]
    # gaps before 5 (5 empty), before 30 (23) and after 30 (9): 37 = 13 + 12 + 12, the first gets the extra one
    assert even_gap_positions(torch.tensor([5, 6, 30]), 40).tolist() == [13, 14, 27]
    assert even_gap_positions(torch.tensor([0, 1, 2]), 3).tolist() == [0, 1, 2]  # no gap: the original positions


@torch.no_grad()
def test_spread_position_mode_keeps_the_selection(tiny_llama):
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    prompt = Prompt(_ids(40, 6))
    orig = SpecPrefill(keep_rate=0.25, lookahead=1).plan(prompt, be)
    plan = SpecPrefill(keep_rate=0.25, lookahead=1, position_mode="spread").plan(prompt, be)
    assert orig.kept_indices is not None and plan.kept_indices is not None
    assert plan.kept_indices.tolist() == orig.kept_indices.tolist()  # the same tokens
    assert plan.position_ids.tolist() == [0, 4, 8, 12, 16, 20, 24, 28, 32, 36] and plan.next_position == 40
    even = SpecPrefill(keep_rate=0.25, lookahead=1, position_mode="even_gaps").plan(prompt, be)
    assert even.kept_indices is not None and even.kept_indices.tolist() == orig.kept_indices.tolist()
    assert even.position_ids.tolist() == even_gap_positions(orig.kept_indices, 40).tolist() and even.next_position == 40
    with pytest.raises(ValueError, match=r"max_gap=4 with position_mode='spread'"):
        SpecPrefill(position_mode="spread", max_gap=4)
    scaled = SpecPrefill(keep_rate=0.25, lookahead=1, gap_scale=0.5).plan(prompt, be)
    assert scaled.kept_indices is not None and scaled.kept_indices.tolist() == orig.kept_indices.tolist()
    want, nxt = scaled_positions(orig.kept_indices, 40, 0.5)
    assert scaled.position_ids.tolist() == want.tolist() and scaled.next_position == nxt
    for bad in (dict(gap_scale=0.5, max_gap=8), dict(gap_scale=0.5, position_mode="contiguous")):
        with pytest.raises(ValueError, match=r"gap_scale=0.5 with .*allowed: gap_scale=null"):
            SpecPrefill(**bad)  # type: ignore[arg-type]
    assert "gap_scale" not in SpecPrefill().options() and SpecPrefill(gap_scale=0.5).options()["gap_scale"] == 0.5


def test_chunked_speculator_prefill_captures_what_one_forward_captures(tiny_llama):
    """A long prompt prefilled 7 tokens at a time into the speculator's cache gives the same
    queries, keys and look-ahead tokens as one forward (within float error)."""
    ids = _ids(40, seed=3)
    whole = TransformersBackend(tiny_llama, None, tiny_llama).speculate(ids, 3)
    chunked = TransformersBackend(tiny_llama, None, tiny_llama, prefill_chunk=7).speculate(ids, 3)
    assert chunked.queries.shape == whole.queries.shape and chunked.keys.shape == whole.keys.shape
    torch.testing.assert_close(chunked.queries, whole.queries, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunked.keys, whole.keys, rtol=1e-4, atol=1e-5)
    assert chunked.lookahead_ids == whole.lookahead_ids


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk", [None, 7])
def test_unequal_length_batch_captures_what_each_prompt_alone_captures(tiny_llama, attn, chunk):
    """Prompts of 23, 40 and 31 tokens in one padded batch (chunked: chunks end inside one row's
    padding and another's tokens) give each prompt the queries, keys [layers, kv_heads, n_i, d]
    and look-ahead tokens of one forward of it alone: padding neither leaks in nor goes NaN."""
    prompts = [_ids(23, seed=11), _ids(40, seed=12), _ids(31, seed=13)]
    tiny_llama.config._attn_implementation = attn
    try:
        batch = TransformersBackend(tiny_llama, None, tiny_llama, prefill_chunk=chunk).speculate_batch(prompts, 3)
        alone = [TransformersBackend(tiny_llama, None, tiny_llama).speculate(ids, 3) for ids in prompts]
    finally:
        tiny_llama.config._attn_implementation = "sdpa"
    for ids, cap, one in zip(prompts, batch, alone, strict=True):
        assert cap.keys.shape == (3, 2, ids.shape[0], 16) and cap.queries.shape == (3, 4, 3, 16)
        torch.testing.assert_close(cap.queries, one.queries, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cap.keys, one.keys, rtol=1e-4, atol=1e-5)
        assert cap.lookahead_ids == one.lookahead_ids and len(cap.lookahead_ids) == 2


def test_a_one_token_prompt_batches_with_longer_ones(tiny_llama):
    """A 1-token prompt (nothing to prefill before its last token) in a batch of 1, 6 and 2 tokens."""
    be = TransformersBackend(tiny_llama, None, tiny_llama)
    prompts = [_ids(1, seed=21), _ids(6, seed=22), _ids(2, seed=23)]
    for ids, cap in zip(prompts, be.speculate_batch(prompts, 2), strict=True):
        one = be.speculate(ids, 2)
        assert cap.keys.shape == (3, 2, ids.shape[0], 16)
        torch.testing.assert_close(cap.queries, one.queries, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cap.keys, one.keys, rtol=1e-4, atol=1e-5)
        assert cap.lookahead_ids == one.lookahead_ids


def test_specprefill_plans_unequal_prompts_in_one_speculator_forward(tiny_llama, monkeypatch):
    """plan_batch of prompts of 48, 96 and 70 tokens: one batched capture, each plan the one
    it gets alone, timings its share, FLOPs counted on each prompt's own length."""
    from specprefill.flops import Shape, speculator_flops

    be = TransformersBackend(tiny_llama, None, tiny_llama)
    m = SpecPrefill(keep_rate=0.3, lookahead=2, chunk_size=8, pool_kernel=3)
    prompts = [Prompt(_ids(n, seed=n)) for n in (48, 96, 70)]
    calls: list[int] = []
    capture = be._capture_batch

    def counted(model, input_ids, lookahead):
        calls.append(len(input_ids))
        return capture(model, input_ids, lookahead)

    monkeypatch.setattr(be, "_capture_batch", counted)
    be.method_flops = 0
    batch = m.plan_batch(prompts, be)
    assert calls == [3]
    assert be.method_flops == sum(speculator_flops(Shape.of(tiny_llama.config), p.n, 2) for p in prompts)
    for p, b in zip(prompts, batch, strict=True):
        one = m.plan(p, be)
        assert one.kept_indices is not None and b.kept_indices is not None
        assert torch.equal(one.kept_indices, b.kept_indices) and b.next_position == p.n
        assert set(b.timings) == {"speculator_s", "selection_s"}
    assert len({b.timings["speculator_s"] for b in batch}) == 1  # an equal share of the one forward


@torch.no_grad()
def test_score_of_a_full_plan_is_the_plain_forwards_log_probability(tiny_llama):
    """lm-eval's loglikelihood on a full plan: the summed log-probability of the
    continuation under one ordinary forward of prompt + continuation (no position ids)."""
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    ids, cont = _ids(30, seed=1), _ids(5, seed=2)
    plan = FullPrefill().plan(Prompt(input_ids=ids), be)
    total, greedy, seconds = be.score(plan, cont.tolist())
    logits = tiny_llama(input_ids=torch.cat([ids, cont]).unsqueeze(0)).logits[0].float()
    logp = torch.log_softmax(logits[29:34], -1)
    assert total == pytest.approx(float(logp.gather(1, cont.unsqueeze(1)).sum()), abs=1e-4)
    assert greedy == bool((logp.argmax(-1) == cont).all()) and seconds > 0


@torch.no_grad()
def test_score_follows_generation_after_a_kept_plan(tiny_llama):
    """After a SpecPrefill plan (kept tokens at their original positions), the tokens
    greedy generation produces are, scored as a continuation, greedy (the continuation
    sits where generation puts it: next_position onwards), and their log-probability
    equals the sum of the generation's per-step log-probabilities."""
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    plan = SpecPrefill(keep_rate=0.3, chunk_size=None, pool_kernel=None).plan(Prompt(input_ids=_ids(60, seed=3)), be)
    assert plan.k < 60 and plan.next_position == 60
    be.eos_ids = set()
    gen = be.generate(plan, 6)
    total, greedy, _ = be.score(plan, gen.token_ids)
    assert greedy
    # the first token's log-probability from the generation's own first logits
    first = torch.log_softmax(gen.first_logits, -1)[gen.token_ids[0]]
    one, _, _ = be.score(plan, gen.token_ids[:1])
    assert one == pytest.approx(float(first), abs=1e-4) and total < one
    # the continuation at positions 60, 61, ... (after the original prompt), not after the kept count
    pos = plan.position_ids.tolist() + [60 + j for j in range(len(gen.token_ids) - 1)]
    ids = torch.cat([plan.input_ids, torch.tensor(gen.token_ids[:-1])])
    logits = tiny_llama(input_ids=ids.unsqueeze(0), position_ids=torch.tensor([pos])).logits[0, plan.k - 1 :].float()
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids).unsqueeze(1)).sum()
    assert total == pytest.approx(float(want), abs=1e-4)


def _truncated(model, layers: int, final_norm: bool = True):
    """An independent copy of ``model`` cut after ``layers`` layers (optionally without its
    final norm): what the early-exit view must behave like."""
    import copy

    m = copy.deepcopy(model)
    m.model.layers = m.model.layers[:layers]
    m.config.num_hidden_layers = layers
    if not final_norm:
        m.model.norm = torch.nn.Identity()
    return m


def _greedy(model, ids: torch.Tensor, steps: int) -> list[int]:
    """Greedy decoding by full recomputation (no cache, default positions)."""
    seq = ids.tolist()
    for _ in range(steps):
        seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


@torch.no_grad()
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_early_exit_lookahead_follows_the_truncated_models_own_greedy_tokens(tiny_llama, depth):
    """Look-ahead with an early-exit speculator (``self_layers:M``) is the reference's
    procedure run on the first M layers: the L-1 look-ahead tokens are the greedy tokens of
    those layers + the final norm + the LM head, at every depth; their queries are captured
    from the same M layers."""
    import copy

    base = copy.deepcopy(tiny_llama)
    torch.manual_seed(depth)
    base.model.norm.weight.copy_(torch.rand_like(base.model.norm.weight) * 2 + 0.1)  # a norm that matters
    be = TransformersBackend(base, CharTokenizer(), early_exit_view(base, depth))
    ids = _ids(50, seed=depth)
    cap = be.speculate(ids, lookahead=5)
    assert cap.lookahead_ids == _greedy(_truncated(base, depth), ids, 4)
    assert cap.queries.shape[:3] == (depth, 4, 5)


@torch.no_grad()
def test_the_final_norm_matters_only_through_the_lookahead_tokens(tiny_llama):
    """The final norm sits after the last captured layer: with look-ahead 1 (the default)
    the captured queries and keys are the same with or without it; with look-ahead > 1 it
    decides the look-ahead tokens (a non-uniform norm changes the greedy tokens here)."""
    import copy

    base = copy.deepcopy(tiny_llama)
    torch.manual_seed(7)
    base.model.norm.weight.copy_(torch.rand_like(base.model.norm.weight) * 2 + 0.1)
    ids = _ids(50, seed=11)
    with_norm = TransformersBackend(base, CharTokenizer(), _truncated(base, 2))
    without = TransformersBackend(base, CharTokenizer(), _truncated(base, 2, final_norm=False))
    a, b = with_norm.speculate(ids, lookahead=1), without.speculate(ids, lookahead=1)
    torch.testing.assert_close(a.queries, b.queries)
    torch.testing.assert_close(a.keys, b.keys)
    la, lb = with_norm.speculate(ids, lookahead=6), without.speculate(ids, lookahead=6)
    assert la.lookahead_ids != lb.lookahead_ids
    assert la.lookahead_ids == _greedy(_truncated(base, 2), ids, 5)
