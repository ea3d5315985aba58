"""kvpress's presses as methods, on the pinned transformers: the contract their hooks rely
on, the budget, query-aware and query-agnostic prefills, and rows from `make eval`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from baselines.kv_presses import Knorm, SnapKV, kvpress_module, question_end, question_start
from harness.registry import build_method
from specprefill.backends.transformers import TransformersBackend, cache_size
from specprefill.plan import Prompt, full_plan


class CharTokenizer:
    """Characters as tokens (a-z), with offsets: enough for question_start on hand-made text."""

    eos_token_id = None

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids = [ord(c) - 97 for c in text]
        out = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i) for i in ids)


@pytest.fixture
def backend(tiny_llama):
    return TransformersBackend(tiny_llama, CharTokenizer())


def _prompt(n: int, seed: int = 0) -> Prompt:
    return Prompt(torch.randint(0, 26, (n,), generator=torch.Generator().manual_seed(seed)))


def _full_cache(backend, prompt) -> DynamicCache:
    cache = DynamicCache(config=backend.base.config)
    with torch.inference_mode():
        backend.prefill_into(full_plan(prompt), cache)
    return cache


def test_knorm_keeps_the_keys_its_score_chooses_on_the_pinned_transformers(backend):
    """The contract test: under KnormPress (score = -||k||), every layer and head of the
    compressed cache holds exactly the full cache's keys and values at the int(N * keep)
    positions of smallest key norm, computed here from an uncompressed prefill. It fails
    when a transformers upgrade moves what kvpress's hooks read or write (the cache layout,
    the hook's keyword arguments, `cache_position`)."""
    prompt = _prompt(101)
    full = _full_cache(backend, prompt)
    m = Knorm(keep_rate=0.5)
    cache = DynamicCache(config=backend.base.config)
    with m.applied(backend), torch.inference_mode():
        backend.prefill_into(m.plan(prompt, backend), cache)
    kept = int(101 * 0.5)
    assert cache_size(cache)[0] == kept
    for layer, ref in zip(cache.layers, full.layers, strict=True):
        idx = (-ref.keys.norm(dim=-1)).topk(kept, dim=-1).indices.sort(dim=-1).values  # [1, heads, kept]
        for h in range(ref.keys.shape[1]):
            want = {tuple(r.tolist()) for r in ref.keys[0, h, idx[0, h]]}
            got = {tuple(r.tolist()) for r in layer.keys[0, h]}
            assert got == want
            wv = {tuple(r.tolist()) for r in ref.values[0, h, idx[0, h]]}
            assert {tuple(r.tolist()) for r in layer.values[0, h]} == wv


def test_without_cache_position_kvpress_hooks_fail_on_this_transformers(backend):
    """Why cache_positions_restored exists: transformers 5.3+ no longer passes
    `cache_position` to attention layers and kvpress 0.5.5 reads it. When this stops raising
    (a kvpress or transformers release that agrees again), the shim can go."""
    import kvpress

    with kvpress.KnormPress(compression_ratio=0.5)(backend.base), pytest.raises(KeyError, match="cache_position"):
        backend.prefill_into(full_plan(_prompt(40)), DynamicCache(config=backend.base.config))


def test_every_press_leaves_keep_of_the_cache_and_generates(backend):
    prompt = _prompt(120, seed=1)
    for name in ("snapkv", "knorm", "streaming_llm", "tova", "expected_attention", "keydiff", "random_kv"):
        m = build_method(name, {"keep_rate": 0.25, "window_size": 16} if name == "snapkv" else {"keep_rate": 0.25})
        assert m.compression_ratio == 0.75 and m.acts_in_model
        with m.applied(backend):
            gen = backend.generate(m.plan(prompt, backend), max_new_tokens=4)
        assert gen.kv_tokens == 30 and len(gen.token_ids) == 4, name
        per_token = 2 * 3 * 2 * 16 * 4  # keys and values, 3 layers, 2 kv heads, head_dim 16, fp32
        assert gen.kv_bytes == 30 * per_token, name
    assert not hasattr(backend.base, "_kvpress_applied")  # every hook and mark gone after the turn
    full = backend.generate(full_plan(prompt), max_new_tokens=4)
    assert full.kv_tokens == 120  # no press: the whole prompt


def test_query_aware_settings_split_the_prompt_as_kvpress_pipeline_does(backend):
    """As kvpress's pipeline lays out a prompt: query_aware=false compresses the context and
    prefills the question, the chat tail and the answer prefix whole at their own positions
    (question=); query_aware=true compresses the context and the question and prefills the
    tail and answer prefix whole (the question inside the context, kvpress's query-aware
    evaluation); compress_tail=true puts the whole prompt through the press."""
    head, instruction, context, question, tail = "ab", "cd", "efghijklmnopqrstuvwxyz" * 4, "whatq", "zz"
    text = head + instruction + context + question + tail
    ids = torch.tensor(CharTokenizer()(text)["input_ids"])
    prompt = Prompt(ids, instruction, context, question, head=head, tail=tail)
    assert question_start(prompt, CharTokenizer()) == len(head + instruction + context)
    m = Knorm(keep_rate=0.5, query_aware=False)
    with m.applied(backend):
        plan = m.plan(prompt, backend)
        gen = backend.generate(plan, max_new_tokens=2)
    before = len(head + instruction + context)
    assert plan.prefix == before
    assert gen.kv_tokens == int(before * 0.5) + len(question + tail)
    aware = Knorm(keep_rate=0.5)
    upto = len(head + instruction + context + question)
    assert question_end(prompt, CharTokenizer()) == upto
    with aware.applied(backend):
        assert aware.plan(prompt, backend).prefix == upto
        assert backend.generate(aware.plan(prompt, backend), max_new_tokens=2).kv_tokens == int(upto * 0.5) + len(tail)
    whole = Knorm(keep_rate=0.5, compress_tail=True)
    with whole.applied(backend):
        assert whole.plan(prompt, backend).prefix is None
        assert backend.generate(whole.plan(prompt, backend), max_new_tokens=2).kv_tokens == int(len(text) * 0.5)
    assert question_start(Prompt(ids), CharTokenizer()) is None  # no text parts: nothing to split
    assert question_end(Prompt(ids), CharTokenizer()) is None
    with pytest.raises(ValueError, match=r"compress_tail=true with query_aware=false.*allowed"):
        Knorm(keep_rate=0.5, query_aware=False, compress_tail=True)


def test_a_press_plans_only_inside_its_hook(backend):
    with pytest.raises(RuntimeError, match=r"outside Knorm.applied"):
        Knorm(keep_rate=0.5).plan(_prompt(10), backend)
    with pytest.raises(ValueError, match="keep_rate=0"):
        build_method("snapkv", {"keep_rate": 0.0})
    with pytest.raises(ValueError, match="query_aware='no'"):
        SnapKV(keep_rate=0.5, query_aware="no")  # type: ignore[arg-type]


def test_make_eval_with_a_press_writes_kv_and_decode_columns(tmp_path, monkeypatch):
    from harness.jobs import eval as run
    from harness.store import read_results

    monkeypatch.chdir(tmp_path)
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    from hydra import compose, initialize_config_dir

    def one(*extra: str):
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose(
                config_name="config",
                overrides=["model=tiny-random", "method=snapkv", "keep=0.1", "limit=1", "tasks=[niah_single_1]",
                           "length=1024", f"out={tmp_path / str(len(extra))}", *extra],
            )  # fmt: skip
        run.execute(run.prepare(run.EvalConfig.from_hydra(cfg)))
        return read_results(tmp_path / str(len(extra))).iloc[0]

    row = one()
    assert row["status"] == "ok" and row["method"] == "snapkv"
    # query-aware as kvpress: context and question compressed, the chat tail and answer prefix (a few
    # dozen tokens) kept whole
    assert int(row["prompt_tokens"] * 0.1) < row["kv_tokens"] < int(row["prompt_tokens"] * 0.1) + 64
    assert row["kv_bytes"] > 0 and row["decode_s"] > 0 and row["output_tokens"] > 0
    # every token prefilled, each head keeping its own entries: no token-level diagnostic (a press's plan
    # names the whole prompt, which would read as the needle kept whole)
    assert row[["needle_kept", "distractor_kept", "needle_whole", "question_kept", "kept_hash"]].isna().all()
    whole = one("method.compress_tail=true")
    assert whole["kv_tokens"] == int(whole["prompt_tokens"] * 0.1)


def _cost_rows():
    """Two tasks, a reference and a press, with hand-picked costs (4 samples each)."""
    import pandas as pd

    rows = []
    for task in ("a", "b"):
        for i in range(4):
            common = {"kind": "eval", "status": "ok", "model": "m", "benchmark": "ruler", "length": 4096, "task": task,
                      "sample_id": i, "category": "", "bucket": "", "reference_method": "full", "hardware": "h",
                      "dtype": "float32", "backend": "transformers", "speculator": "", "method_options": "{}",
                      "benchmark_options": "{}", "prompt_tokens": 100, "max_new_tokens": 10}  # fmt: skip
            rows.append({**common, "method": "full", "keep_rate": None, "score": 100.0, "ttft_s": 2.0,
                         "decode_s": 1.0, "output_tokens": 5, "kv_tokens": 100, "kv_bytes": 2**20})  # fmt: skip
            rows.append({**common, "method": "knorm", "keep_rate": 0.25, "score": 50.0 if task == "a" else 100.0,
                         "ttft_s": 2.5, "decode_s": 0.5 if task == "a" else 1.0, "output_tokens": 10,
                         "kv_tokens": 25, "kv_bytes": 2**18})  # fmt: skip
    return pd.DataFrame(rows)


def test_cost_measures_are_ratios_of_macro_means_worked_by_hand(tmp_path):
    from harness.analysis.quality import summarize
    from harness.rendering.plots import pareto_costs
    from harness.rendering.tables import to_markdown

    s = summarize(_cost_rows()).set_index(["task", "method"])
    press, full = s.loc[("ALL", "knorm")], s.loc[("ALL", "full")]
    assert press["kv_fraction"] == pytest.approx(0.25) and full["kv_fraction"] == pytest.approx(1.0)
    assert press["kv_mib"] == pytest.approx(0.25) and full["kv_mib"] == pytest.approx(1.0)
    # decode per token: macro mean of decode_s (0.5, 1.0 -> 0.75) over that of output_tokens (10)
    assert press["decode_s_per_token"] == pytest.approx(0.075) and full["decode_s_per_token"] == pytest.approx(0.2)
    # e2e at the 10-token budget: full 2 + 10 * 0.2 = 4; knorm a: 2.5 + 10 * 0.05 = 3, b: 2.5 + 10 * 0.1 = 3.5
    assert press["e2e_s"] == pytest.approx(3.25) and press["e2e_speedup"] == pytest.approx(4 / 3.25)
    assert press["e2e_speedup_lo"] <= press["e2e_speedup"] <= press["e2e_speedup_hi"]
    assert press["speedup"] == pytest.approx(2 / 2.5)  # a press never shortens the prefill
    md = to_markdown(summarize(_cost_rows()))
    assert "| kv_fraction | kv_mib | decode_s_per_token | e2e_speedup |" in md and "0.250 | 0.2 | 0.0750 |" in md
    assert pareto_costs(summarize(_cost_rows()), tmp_path / "c.png") == tmp_path / "c.png"
    no_kv = _cost_rows().drop(columns=["kv_tokens", "kv_bytes"])
    assert pareto_costs(summarize(no_kv), tmp_path / "d.png") is None
    assert "kv_fraction" not in to_markdown(summarize(no_kv))  # older rows: the columns stay out


def test_latency_prefill_times_a_two_part_plan_one_prompt_at_a_time(backend):
    from dataclasses import replace

    m = Knorm(keep_rate=0.5)
    plan = replace(full_plan(_prompt(60)), prefix=40)
    with m.applied(backend):
        backend.prefill([plan])  # context under the press, then the rest: runs
        with pytest.raises(ValueError, match="one prompt at a time; got a batch of 2; allowed: batch 1"):
            backend.prefill([plan, plan])


def test_latency_rows_record_the_cache_a_press_leaves(backend):
    """A latency row's ``kv_tokens``/``kv_bytes``: what the prefill left in the cache, worked
    out by hand from the model's shape (layers x keys and values x KV heads x head size)."""
    from harness.timing import measure

    cfg = backend.base.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = (
        cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head * next(backend.base.parameters()).element_size()
    )
    prompts = [_prompt(60)]
    full = measure(build_method("full", {}), prompts, backend)
    knorm = measure(Knorm(keep_rate=0.5), prompts, backend)
    assert (full["kv_tokens"], full["kv_bytes"]) == (60, 60 * per_token)
    assert (knorm["kv_tokens"], knorm["kv_bytes"]) == (30, 30 * per_token)
    assert knorm["kept_fraction"] == 1.0  # a press prefills the whole prompt


def test_decode_after_a_latency_prefill_is_what_generate_decodes(backend):
    """``prefill(plans, decode_tokens=n)`` decodes the tokens ``generate`` would (greedy, no
    early stop on this EOS-less model): for a left-padded batch of two lengths, each row's
    own tokens (the padding mask and positions carried into decoding), and after a KV press
    the tokens decoded from the compressed cache."""
    from dataclasses import replace

    plans = [full_plan(_prompt(50, seed=1)), full_plan(_prompt(37, seed=2))]
    seen = []
    hook = backend.base.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(kw["position_ids"].tolist()) if kw["input_ids"].shape[1] == 1 else None,
        with_kwargs=True,
    )
    try:
        backend.prefill(plans, decode_tokens=6)
    finally:
        hook.remove()
    assert seen == [[[50 + s], [37 + s]] for s in range(6)]  # each row at its own next position
    assert backend.last_decoded is not None and backend.last_decoded.shape == (2, 6)
    for row, plan in zip(backend.last_decoded.tolist(), plans, strict=True):
        assert row == backend.generate(plan, 6).token_ids
    press = Knorm(keep_rate=0.5)
    plan = replace(full_plan(_prompt(60)), prefix=40)  # query-agnostic: context pressed, then the rest
    with press.applied(backend):
        backend.prefill([plan], decode_tokens=5)
        assert backend.last_kv is not None and backend.last_kv[0] == 40  # 20 of the context + 20
        assert backend.last_decoded.tolist()[0] == backend.generate(plan, 5).token_ids
    with press.applied(backend), pytest.raises(ValueError, match="prompts of different lengths"):
        backend.prefill([full_plan(_prompt(50)), full_plan(_prompt(37))], decode_tokens=2)


def test_a_reference_timed_beside_a_press_runs_transformers_own_attention(backend, monkeypatch):
    """``import kvpress`` wraps transformers' attention functions for the whole process;
    here the wrapper is on inside a press's own turn only, so the reference timed in the
    same latency iteration (or evaluated in the same process) calls exactly the function it
    calls alone. Breaking :func:`baselines.kv_presses.kvpress_module`'s undo (or
    :func:`attention_patched`) fails this test."""
    import kvpress  # noqa: F401  (the plain import: kvpress's patch lands process-wide)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from harness.timing import measure

    impl = backend.base.config._attn_implementation
    own = type(ALL_ATTENTION_FUNCTIONS)._global_mapping[impl]  # transformers' own function
    seen: dict[str, object] = {}

    def spy(name):
        real = backend.prefill

        def prefill(plans, *a):
            seen[name] = ALL_ATTENTION_FUNCTIONS[impl]
            return real(plans, *a)

        return prefill

    prompts = [_prompt(64)]
    for name in ("knorm", "full", "knorm", "full"):  # a press, the reference, and again
        monkeypatch.setattr(backend, "prefill", spy(name))
        measure(build_method(name, {"keep_rate": 0.5} if name == "knorm" else {}), prompts, backend)
        monkeypatch.undo()
        assert (seen[name] is own) == (name == "full"), name
    assert getattr(seen["knorm"], "__module__", "") == "kvpress.attention_patch"
    assert ALL_ATTENTION_FUNCTIONS[impl] is own  # and nothing left behind


# --------------------------------------------------------------------------- kept indices at the source


def _eager(tiny_llama):
    """A copy of the tiny model in eager attention (its attention weights are what SnapKV and
    TOVA read in the press's hook)."""
    import copy

    m = copy.deepcopy(tiny_llama)
    m.config._attn_implementation = "eager"
    return m


def _uncompressed(model, prompt: Prompt):
    """One eager forward without a press: per layer the attention weights [H, N, N], the
    cache's keys and values [kv heads, N, d] (after RoPE, as a press sees them) and the
    attention layer's input hidden states [N, hidden]. A press evicts only after its layer has
    attended, so every layer's inputs are these under a press too."""
    inputs: dict[int, torch.Tensor] = {}

    def grab(module, args, kwargs):
        inputs[module.layer_idx] = kwargs["hidden_states"][0].detach().clone()

    hooks = [layer.self_attn.register_forward_pre_hook(grab, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.inference_mode():
            out = model(prompt.input_ids.unsqueeze(0), output_attentions=True, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    cache = out.past_key_values
    return [
        (out.attentions[i][0], cache.layers[i].keys[0], cache.layers[i].values[0], inputs[i])
        for i in range(len(model.model.layers))
    ]


def _top(scores: torch.Tensor, kept: int, forced: list[int]) -> list[list[int]]:
    """Per head: the ``forced`` positions, then the highest ``scores`` among the others up to
    ``kept`` in all, sorted. ``scores``: [kv heads, N]."""
    out = []
    for s in scores:
        s = s.clone().double()
        s[forced] = float("-inf")
        rest = s.topk(kept - len(forced)).indices.tolist()
        out.append(sorted(forced + rest))
    return out


def _expected_snapkv(layer, attn, keys, values, hidden, model, n, kept, window=16, kernel=5):
    heads, kv = attn.shape[0], keys.shape[0]
    obs = attn[:, -window:, : n - window].double().mean(dim=1)  # [H, N - w]: the window's attention
    padded = torch.nn.functional.pad(obs, (kernel // 2, kernel // 2))  # zeros, counted in the mean
    pooled = torch.stack([padded[:, i : i + kernel].mean(dim=1) for i in range(n - window)], dim=1)
    per_kv = pooled.view(kv, heads // kv, n - window).mean(dim=1)
    full = torch.cat([per_kv, torch.zeros(kv, window, dtype=per_kv.dtype)], dim=1)
    return _top(full, kept, list(range(n - window, n)))


def _expected_tova(layer, attn, keys, values, hidden, model, n, kept):
    last = attn[:, -1, : n - 1].double().mean(dim=0)  # the last query's attention, mean over heads
    full = torch.cat([last, torch.zeros(1, dtype=last.dtype)]).expand(keys.shape[0], n)
    return _top(full, kept, [n - 1])


def _expected_keydiff(layer, attn, keys, values, hidden, model, n, kept):
    k = keys.double()
    unit = k / k.norm(dim=-1, keepdim=True)
    anchor = unit.mean(dim=1, keepdim=True)  # [kv, 1, d]
    cos = (k * anchor).sum(-1) / (k.norm(dim=-1) * anchor.norm(dim=-1))
    return _top(-cos, kept, [])


def _expected_streaming_llm(layer, attn, keys, values, hidden, model, n, kept, sink=4):
    return [list(range(sink)) + list(range(n - (kept - sink), n)) for _ in range(keys.shape[0])]


def _expected_expected_attention(layer, attn, keys, values, hidden, model, n, kept, sink=4, future=512):
    """ExpectedAttention (kvpress's definition): the pre-RoPE queries of the layer's input
    after the sinks, their mean and covariance, each carried by the RoPE rotation averaged
    over the next ``future`` positions (R = mean of the per-position rotations, built here by
    rotating the identity with the model's own rotary embedding), the expected logit
    k.mu/sqrt(d) + k'Ck/(2d) softmaxed over positions, averaged over a kv head's query heads,
    times the value's norm; the sinks kept."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attention = model.model.layers[layer].self_attn
    heads, kv, d = attn.shape[0], keys.shape[0], keys.shape[-1]
    h = hidden[sink:].double()
    q = (h @ attention.q_proj.weight.double().T).view(h.shape[0], heads, d).transpose(0, 1)  # [H, s, d]
    mu = q.mean(dim=1)  # [H, d]
    c = q - mu[:, None]
    cov = c.transpose(1, 2) @ c / h.shape[0]  # [H, d, d]
    pos = torch.arange(n, n + future).unsqueeze(0)
    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), pos)
    eye = (
        torch.eye(d).expand(1, future, d, d).transpose(1, 2)
    )  # [1, d(vector), future, d]: basis vectors at each position
    rotated, _ = apply_rotary_pos_emb(eye, eye, cos, sin)  # row i, position t: R_t e_i
    r = rotated[0].double().mean(dim=1).T  # [d, d]: column i = mean_t R_t e_i
    mu, cov = mu @ r.T, r @ cov @ r.T
    k = keys[:, sink:].double().repeat_interleave(heads // kv, dim=0)  # [H, N - sink, d]
    logits = (k @ mu[:, :, None]).squeeze(-1) / d**0.5 + torch.einsum("hnd,hde,hne->hn", k, cov, k) / d / 2
    probs = logits.softmax(dim=-1).view(kv, heads // kv, -1).mean(dim=1)
    scores = probs * values[:, sink:].double().norm(dim=-1)
    full = torch.cat([torch.zeros(kv, sink, dtype=scores.dtype), scores], dim=1)
    return _top(full, kept, list(range(sink)))


EXPECTED = {
    "snapkv": (_expected_snapkv, {"window_size": 16, "kernel_size": 5}),
    "tova": (_expected_tova, {}),
    "keydiff": (_expected_keydiff, {}),
    "streaming_llm": (_expected_streaming_llm, {"n_sink": 4}),
    "expected_attention": (_expected_expected_attention, {}),
}


def _kept_positions(cache, full_keys: list[torch.Tensor]) -> list[list[list[int]]]:
    """Per layer and kv head, the positions of the full cache whose keys the compressed cache
    holds (keys after RoPE are unique per position)."""
    out = []
    for layer, ref in zip(cache.layers, full_keys, strict=True):
        heads = []
        for h in range(ref.shape[0]):
            rows = {tuple(r.tolist()): i for i, r in enumerate(ref[h])}
            heads.append(sorted(rows[tuple(r.tolist())] for r in layer.keys[0, h]))
        out.append(heads)
    return out


def _press_cache(model, name: str, options: dict, prompt: Prompt) -> DynamicCache:
    backend = TransformersBackend(model, CharTokenizer())
    m = build_method(name, {"keep_rate": 0.5, **options})
    cache = DynamicCache(config=model.config)
    with m.applied(backend), torch.inference_mode():
        backend.prefill_into(m.plan(prompt, backend), cache)
    return cache


@pytest.mark.parametrize("name", list(EXPECTED))
def test_press_keeps_what_its_score_computed_from_the_models_own_attention_chooses(tiny_llama, name):
    """SnapKV, TOVA, KeyDiff, StreamingLLM and ExpectedAttention at keep 0.5 on a tiny model in
    eager attention: every layer's and kv head's kept positions equal the ones chosen by the
    press's score computed here from an uncompressed forward (the model's own attention
    weights, keys, values and layer inputs), in float64, not through kvpress. The same check
    on a press whose score is reversed fails (the test can fail)."""
    kvpress = kvpress_module()
    model = _eager(tiny_llama)
    n = 101
    prompt = _prompt(n, seed=4)
    kept = int(n * 0.5)
    source = _uncompressed(model, prompt)
    expect, options = EXPECTED[name]
    want = []
    for i, (attn, keys, values, hidden) in enumerate(source):
        want.append(expect(i, attn, keys, values, hidden, model, n, kept))
    got = _kept_positions(_press_cache(model, name, options, prompt), [k for _, k, _, _ in source])
    assert got == want
    if name == "streaming_llm":
        return  # its score is positions only; reversing it is not a different press
    press_class = getattr(kvpress, build_method(name, {"keep_rate": 0.5, **options}).press_class)
    original = press_class.score
    try:
        press_class.score = lambda self, *a, **k: -original(self, *a, **k)
        broken = _kept_positions(_press_cache(model, name, options, prompt), [k for _, k, _, _ in source])
    finally:
        press_class.score = original
    assert broken != want
