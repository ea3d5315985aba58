"""SpecPC (baselines/specpc.py) against independent statements of the authors' algorithm
(furiosa-ai/draft-based-approx-llm, draft_approx_llm/specpc/, commit d79e404): the scores
from the draft's own attention weights (eager attention, ``output_attentions``), the
selection from a hand-worked example."""

from __future__ import annotations

import pytest
import torch

from baselines.specpc import specpc_scores, specpc_select
from harness.config import method_conf
from harness.registry import build_method
from specprefill.backends.transformers import attention_layers
from specprefill.backends.transformers.capture import capture_window
from specprefill.plan import Prompt


def test_selection_keeps_the_window_and_the_spikes_neighbourhood():
    """n=200, window 8, pool and neighbours 5, capacity 17, one spike at 100: pooled, the
    spike covers 98..102; their neighbourhoods are 96..104 (9 tokens), the window 192..199
    (8): 17, the capacity, so nothing else."""
    scores = torch.zeros(200)
    scores[100] = 1.0
    kept = specpc_select(scores, 17, 8, kernel=5, pool="max", neighbors=5).tolist()
    assert kept == [*range(96, 105), *range(192, 200)]
    # a smaller capacity cuts the neighbourhood, nearest offsets first (0, -1, +1, -2, +2: ties
    # negative first), the window always whole; unpooled, the spike alone is the top score
    kept = specpc_select(scores, 11, 8, kernel=5, pool=None, neighbors=5).tolist()
    assert kept == [99, 100, 101, *range(192, 200)]
    assert specpc_select(scores, 12, 8, kernel=5, pool=None, neighbors=5).tolist()[:4] == [98, 99, 100, 101]
    assert specpc_select(scores, 500, 8, kernel=5).tolist() == list(range(200))  # capacity >= n: every token
    with pytest.raises(ValueError, match="window_size=300 is longer than the prompt"):
        specpc_select(scores, 17, 300)


def eager_weights(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention probabilities ``[1, H, n, n]`` for ``ids`` in one plain forward,
    from the eager attention's own output (transformers' output_attentions recorder mixes
    two models of one class in a process)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    weights: list[torch.Tensor] = []
    hooks = [a.register_forward_hook(lambda m, i, o: weights.append(o[1])) for a in attention_layers(model)]
    for c in configs.values():
        c._attn_implementation = "eager"
    try:
        with torch.inference_mode():
            model(input_ids=ids[None])
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]
        for h in hooks:
            h.remove()
    assert len(weights) == model.config.num_hidden_layers and all(w is not None for w in weights)
    return weights


def _by_hand(model, ids: torch.Tensor, window: int, start: int) -> torch.Tensor:
    """The authors' score from the model's own attention weights (eager attention): the
    last ``window`` rows of each layer's softmax from ``start`` on, weighted linspace(0, 1)
    over the rows, max over heads and rows, then over layers."""
    per_layer = []
    for attn in eager_weights(model, ids)[start:]:
        a = attn[0, :, -window:, :].float()  # [H, w, N]: causal over the window already
        a = a * torch.linspace(0, 1, window)[None, :, None]
        per_layer.append(a.amax(dim=(0, 1)))
    return torch.stack(per_layer).amax(0)


@pytest.mark.parametrize("chunk", [None, 7])
def test_scores_are_the_drafts_window_attention(backend, chunk):
    """From the window capture (chunked or not) the scores equal those computed from the
    draft's attention weights themselves; on a deeper model (the tiny base), from a later
    layer on too."""
    backend.prefill_chunk = chunk
    try:
        ids = torch.randint(0, 1000, (40,))
        cap = backend.speculate_window(ids, 8)
    finally:
        backend.prefill_chunk = None
    assert cap.queries.shape[2] == 8 and cap.keys.shape[2] == 40
    got = specpc_scores(cap.queries, cap.keys, starting_layer=0)
    assert torch.allclose(got.float(), _by_hand(backend.speculator, ids, 8, 0), atol=1e-6)
    layers = backend.speculator.config.num_hidden_layers
    with pytest.raises(ValueError, match=rf"starting_layer_index={layers}: the draft has {layers} layer"):
        specpc_scores(cap.queries, cap.keys, starting_layer=layers)
    with torch.inference_mode():  # as the backend captures
        base, _ = capture_window(backend.base, ids, 8, backend.device, chunk)
    assert base.queries.shape[0] >= 2  # a model with layers to skip
    for start in (0, 1):
        got = specpc_scores(base.queries, base.keys, starting_layer=start)
        assert torch.allclose(got.float(), _by_hand(backend.base, ids, 8, start), atol=1e-6)


def test_the_method_keeps_its_token_budget_at_contiguous_positions(backend):
    ids = torch.randint(0, 1000, (300,))
    prompt = Prompt(input_ids=ids)
    m = build_method("specpc", {"keep_rate": 0.3, "max_capacity_prompt": 100, "window_size": 16,
                                "kernel_size": 8, "neighbor_tokens": 8, "starting_layer_index": 0})  # fmt: skip
    plan = m.plan(prompt, backend)
    assert plan.k == 100 and plan.kept_indices is not None
    assert plan.kept_indices[-16:].tolist() == list(range(284, 300))  # the window, whole
    assert plan.position_ids.tolist() == list(range(100)) and plan.next_position == 100
    assert plan.draft_ids is not None and plan.draft_ids.shape == (1,)  # lookahead 1: the prefill's token
    by_keep = build_method("specpc", {"keep_rate": 0.2, "starting_layer_index": 0, "window_size": 16})
    assert by_keep.plan(prompt, backend).k == 60  # ceil(300 * 0.2)
    with pytest.raises(ValueError, match="lookahead_tokens=0"):
        build_method("specpc", {"lookahead_tokens": 0})


def _by_hand_lookahead(model, ids: torch.Tensor, tokens: list[int], window: int, start: int, reduction: str):
    """The authors' attention store over ``generate`` from the model's own weights (eager
    attention, one forward over the prompt and the tokens fed back): the prefill's window
    rows weighted over the window and reduced over heads and rows; each decode step's row
    (the token fed back) reduced over heads, unweighted; all cut to the prompt's keys and
    reduced over layers, then steps."""
    n = int(ids.shape[0])
    fed = torch.cat([ids, torch.tensor(tokens[:-1], dtype=torch.int64)])
    red = (lambda t, dim: t.amax(dim=dim)) if reduction == "max" else (lambda t, dim: t.sum(dim=dim))
    steps: list[list[torch.Tensor]] = [[] for _ in range(len(tokens))]
    for attn in eager_weights(model, fed)[start:]:
        a = attn[0].float()  # [H, S, S]
        pre = a[:, n - window : n, :n] * torch.linspace(0, 1, window)[None, :, None]
        steps[0].append(red(pre, (0, 1)))
        for t in range(1, len(tokens)):  # the query of the t-th token fed back, at position n + t - 1
            steps[t].append(red(a[:, n + t - 1, :n], 0))
    return red(torch.stack([red(torch.stack(layers), 0) for layers in steps]), 0)


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_the_drafts_look_ahead_adds_its_decode_steps(backend, reduction):
    """With a look-ahead of several tokens (SpecKV-PC's SpecPC), the draft's tokens are
    ``generate``'s greedy ones, and each decode step's attention to the prompt joins the
    window's (on the tiny base: two layers)."""
    ids = torch.randint(0, 1000, (40,))
    model = backend.base
    never = model.config.vocab_size - 1  # an EOS greedy decoding does not reach here
    with torch.inference_mode():
        cap, _ = capture_window(model, ids, 8, backend.device, None, draft=6, eos_ids=[never])
        ref = model.generate(ids[None], max_new_tokens=6, do_sample=False, eos_token_id=never, pad_token_id=0)
    assert cap.lookahead_ids == ref[0, 40:].tolist() and len(cap.lookahead_ids) == 6
    assert cap.queries.shape[2] == 8 + 5 and cap.keys.shape[2] == 40 + 5
    for start in (0, 1):
        got = specpc_scores(cap.queries, cap.keys, start, reduction=reduction, window=8)
        want = _by_hand_lookahead(model, ids, cap.lookahead_ids, 8, start, reduction)
        assert torch.allclose(got.float(), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got.float(), _by_hand_lookahead(model, ids, cap.lookahead_ids[:1], 8, 1, reduction))
    # the method: generate's default of 20 tokens where lookahead_tokens is null, the tokens in the plan
    prompt = Prompt(input_ids=torch.randint(0, 1000, (300,)))
    m = build_method("specpc", {"max_capacity_prompt": 100, "window_size": 16, "starting_layer_index": 0,
                                "lookahead_tokens": None})  # fmt: skip
    plan = m.plan(prompt, backend)
    assert plan.draft_ids is not None and plan.draft_ids.shape == (20,) and plan.k == 100


def test_a_draft_layer_the_draft_lacks_is_refused_before_anything_loads():
    """SpecPC's starting layer (8, theirs) on the tiny model's one-layer draft: one line at
    config time naming the option and the draft's layers, alone and as SpecKV-PC's first part
    (not a failed row per sample); a draft deep enough, or layer 0, passes."""
    from harness.config import ConfigError, check_model_fits
    from harness.models.catalog import model_config

    tiny = model_config("tiny-random")
    for name, fix in (("specpc", "starting_layer_index"), ("speckvpc", "method.first_options")):
        m = build_method(*method_conf(name, 0.3, 1))  # conf/method/<name>.yaml (speckvpc: a compose)
        with pytest.raises(ConfigError, match=r"starting_layer_index=8: the draft of model 'tiny-random' has 1 layer"):
            check_model_fits(tiny, [m], 1024)
        with pytest.raises(ConfigError, match=fix):
            check_model_fits(tiny, [m], 1024)
    check_model_fits(tiny, [build_method("specpc", {"starting_layer_index": 0})], 1024)
    m = build_method("specpc", {})
    m.check_model("m", 28, 32768, 2048, draft_layers=24)  # Qwen2.5-0.5B: 24 layers
    with pytest.raises(ValueError, match=r"allowed: 0 \.\. 23"):
        build_method("specpc", {"starting_layer_index": 24}).check_model("m", 28, 32768, 2048, draft_layers=24)
