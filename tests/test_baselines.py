"""Baselines behind the one Method interface: budgets, scope, determinism, errors."""

from __future__ import annotations

import math

import pytest
import torch

from baselines.gemfilter import GemFilter, gemfilter_scores
from baselines.rag import RagBM25, RagDense, chunk
from baselines.random_keep import RandomKeep
from baselines.truncate import Truncate
from harness.benchmarks import ruler
from harness.types import Sample
from specprefill import Prompt, SpecPrefill
from specprefill.backends.transformers import TransformersBackend
from specprefill.plan import build_method

METHODS = {
    "truncate": lambda k: Truncate(keep_rate=k),
    "random": lambda k: RandomKeep(keep_rate=k),
    "gemfilter": lambda k: GemFilter(keep_rate=k, filter_layer=1),
    "rag_bm25": lambda k: RagBM25(keep_rate=k),
    "rag_dense": lambda k: RagDense(keep_rate=k),
    "specprefill": lambda k: SpecPrefill(keep_rate=k, lookahead=1, chunk_size=32, pool_kernel=13),
}
QUERY_AWARE = {"rag_bm25", "rag_dense"}


@pytest.fixture(scope="module")
def samples(smollm2_info, longbench_sample) -> list[Sample]:
    r = ruler.generate("niah_single_2", 2048, 1, smollm2_info.fmt, smollm2_info.count)[0]
    return [r, longbench_sample]


def _prompt(sample: Sample, tokenizer) -> Prompt:
    ids = torch.tensor(tokenizer(sample.prompt, add_special_tokens=sample.add_special_tokens).input_ids)
    body = sample.instruction + sample.context + sample.question
    start = sample.prompt.find(body)
    return Prompt(ids, sample.instruction, sample.context, sample.question, sample.answer_prefix,
                  head=sample.prompt[:start], tail=sample.prompt[start + len(body): len(sample.prompt) - len(sample.answer_prefix)],
                  add_special_tokens=sample.add_special_tokens)  # fmt: skip


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("keep", [0.3, 0.5])
def test_achieved_budget_scope_and_determinism(name, keep, backend, samples, smollm2_tokenizer):
    for sample in samples:
        prompt = _prompt(sample, smollm2_tokenizer)
        method = METHODS[name](keep)
        plan = method.plan(prompt, backend)
        achieved = plan.k / prompt.n
        if name in QUERY_AWARE:
            # whole chunks up to the budget: never above it (+ re-tokenisation seams), within a few chunks below
            assert keep - 0.08 <= achieved <= keep + 0.01, (name, sample.task, achieved)
            text = smollm2_tokenizer.decode(plan.input_ids)
            assert sample.question.strip() in text and sample.instruction.strip() in text
            assert method.scope == "query_aware_context" and plan.kept_indices is None
        elif name == "specprefill":
            # ceil(n_chunks * keep) whole chunks of 32: at most (N + 31) * keep + 32 tokens
            assert keep - 32 / prompt.n <= achieved <= keep + 32 * (1 + keep) / prompt.n + 1e-9
        else:
            assert plan.k == math.ceil(round(prompt.n * keep, 9)), (name, plan.k)
            assert plan.kept_indices is not None and method.scope == "prompt"
        again = METHODS[name](keep).plan(prompt, backend)
        assert torch.equal(again.input_ids, plan.input_ids) and torch.equal(again.position_ids, plan.position_ids)


def test_truncate_keeps_head_and_tail(samples, smollm2_tokenizer, backend):
    prompt = _prompt(samples[0], smollm2_tokenizer)
    plan = Truncate(keep_rate=0.2).plan(prompt, backend)
    k, n = plan.k, prompt.n
    assert plan.kept_indices is not None
    assert plan.kept_indices.tolist() == list(range(k // 2)) + list(range(n - (k - k // 2), n))
    assert plan.position_ids.tolist() == list(range(k)) and plan.next_position == k


def test_random_positions_and_seed(samples, smollm2_tokenizer, backend):
    prompt = _prompt(samples[0], smollm2_tokenizer)
    a = RandomKeep(keep_rate=0.3, seed=1).plan(prompt, backend)
    b = RandomKeep(keep_rate=0.3, seed=2).plan(prompt, backend)
    assert a.kept_indices is not None and b.kept_indices is not None
    assert not torch.equal(a.kept_indices, b.kept_indices)
    assert torch.equal(a.position_ids, a.kept_indices) and a.next_position == prompt.n


@torch.no_grad()
def test_gemfilter_selects_by_the_layer_attention(tiny_llama):
    from tests.conftest import CharTokenizer

    be = TransformersBackend(tiny_llama, CharTokenizer())
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(3))
    tiny_llama.config._attn_implementation = "eager"
    try:
        probs = tiny_llama(input_ids=ids.unsqueeze(0), output_attentions=True).attentions[1][0, :, -1, :]  # layer 2
    finally:
        tiny_llama.config._attn_implementation = "sdpa"
    cap = be.base_capture(ids, 2)
    torch.testing.assert_close(
        gemfilter_scores(cap.queries[-1, :, 0], cap.keys[-1]), probs.sum(0), rtol=1e-4, atol=1e-5
    )
    plan = GemFilter(keep_rate=0.25, filter_layer=2).plan(Prompt(ids), be)
    assert plan.kept_indices is not None
    assert plan.kept_indices.tolist() == sorted(torch.topk(probs.sum(0), 10).indices.tolist())
    assert plan.position_ids.tolist() == list(range(10)) and "filter_s" in plan.timings


def test_chunking():
    assert chunk("One. Two words here.\nThree.", "sentences", 100) == ["One.", "Two words here.", "Three."]
    assert chunk("a b c d e", "words", 2) == ["a b", "c d", "e"]


def test_errors_name_the_value():
    with pytest.raises(ValueError, match=r"keep_rate=1\.2"):
        build_method("truncate", {"keep_rate": 1.2})
    with pytest.raises(ValueError, match="chunking='pages'"):
        build_method("rag_bm25", {"keep_rate": 0.3, "chunking": "pages"})
    # chunk_words is read by chunking='words' only: set beside 'sentences' it would be silently unused
    with pytest.raises(ValueError, match=r"^chunk_words=50: chunking='sentences' .* does not read it"):
        build_method("rag_dense", {"keep_rate": 0.3, "chunking": "sentences", "chunk_words": 50})
    assert build_method("rag_bm25", {"keep_rate": 0.3, "chunking": "words", "chunk_words": 50}).chunk_words == 50
    with pytest.raises(ValueError, match="filter_layer=0"):
        build_method("gemfilter", {"keep_rate": 0.3, "filter_layer": 0})
    with pytest.raises(ValueError, match="position_mode='shuffled'"):
        build_method("random", {"keep_rate": 0.3, "position_mode": "shuffled"})


def test_missing_dense_model_is_named(samples, smollm2_tokenizer, backend):
    with pytest.raises(RuntimeError, match=r"sentence-transformers model '/nonexistent/minilm'"):
        RagDense(keep_rate=0.3, model_path="/nonexistent/minilm").plan(_prompt(samples[0], smollm2_tokenizer), backend)
