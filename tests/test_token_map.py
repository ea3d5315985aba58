"""A speculator from another family (specprefill/token_map.py): two different tiny fast
tokenizers on hand-made strings, the max-overlap rule worked by hand, the fallback spans
where ids do not round-trip, SpecPrefill's plan through the map, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specprefill.backends.transformers import TransformersBackend
from specprefill.core import select_tokens, token_importance
from specprefill.method import SpecPrefill
from specprefill.plan import Prompt
from specprefill.token_map import TokenMap, char_spans, check_offsets, map_scores

TEXT = "the cat sat"


def _fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def words() -> PreTrainedTokenizerFast:
    """Whole words, spaces between them left out of every span."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat", "on", "mat"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    return _fast(tok)


@pytest.fixture(scope="module")
def chars() -> PreTrainedTokenizerFast:
    """One token per character, the space included."""
    vocab = {c: i for i, c in enumerate("?abcdefghijklmnopqrstuvwxyz ")}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _fast(tok)


def test_offsets_of_both_tokenizers_on_a_hand_made_string(words, chars):
    ids = words(TEXT, add_special_tokens=False)["input_ids"]
    text, spans = char_spans(words, ids)
    assert text == TEXT and spans.tolist() == [[0, 3], [4, 7], [8, 11]]
    text, spans = char_spans(chars, chars(TEXT, add_special_tokens=False)["input_ids"])
    assert text == TEXT and spans.tolist() == [[i, i + 1] for i in range(11)]


def test_a_word_takes_the_max_of_the_characters_that_overlap_it(words, chars):
    """Speculator = characters, base = words: 'the' <- max(t, h, e), and so on; the spaces'
    scores (9) reach no word, because no word's span holds a space."""
    m = TokenMap.of(torch.tensor(words(TEXT, add_special_tokens=False)["input_ids"]), words, chars)
    assert chars.convert_ids_to_tokens(m.speculator_ids.tolist()) == list(TEXT)
    scores = torch.tensor([1.0, 5.0, 2.0, 9.0, 3.0, 1.0, 1.0, 9.0, 0.0, 7.0, 0.0])
    assert m.to_base(scores).tolist() == [5.0, 3.0, 7.0]


def test_a_character_takes_its_words_score_and_a_space_the_word_before_it(words, chars):
    """Speculator = words, base = characters: each letter overlaps its word; a space overlaps
    no word and takes the last word starting at or before it."""
    m = TokenMap.of(torch.tensor(chars(TEXT, add_special_tokens=False)["input_ids"]), chars, words)
    out = m.to_base(torch.tensor([0.5, 0.25, 0.75])).tolist()
    assert out == [0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.75, 0.75, 0.75]


def test_partial_overlaps_empty_spans_and_the_first_token():
    spec = np.array([[0, 0], [0, 4], [4, 8], [8, 9]])  # an added BOS with an empty span first
    scores = np.array([100.0, 1.0, 2.0, 3.0])
    base = np.array([[0, 2], [2, 6], [6, 9], [9, 9], [0, 0]])
    # [2, 6) straddles two speculator tokens: their max; [6, 9) too; the empty spans at 9 and 0
    # take the last token starting at or before them; the BOS's 100 reaches nothing
    assert map_scores(scores, spec, base).tolist() == [1.0, 2.0, 3.0, 3.0, 1.0]
    with pytest.raises(ValueError, match="3 speculator scores for 4"):
        map_scores(scores[:3], spec, base)


def test_ids_that_do_not_round_trip_get_their_own_pieces_as_spans():
    """'a' 'b' decodes to 'ab', which re-tokenizes as the merge 'ab': one id, not two. Each
    id's own text, laid end to end, gives the spans."""
    tok = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    tok.decoder = decoders.Fuse()
    fast = _fast(tok)
    assert fast("ab", add_special_tokens=False)["input_ids"] == [2]
    text, spans = char_spans(fast, [0, 1, 2])
    assert text == "abab" and spans.tolist() == [[0, 1], [1, 2], [2, 4]]


def _llama(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "sdpa"
    return model


def test_specprefill_scores_the_base_tokens_through_the_speculators_own_tokens(words, chars):
    """Base: words (6 ids); speculator: characters (28 ids), another model. The plan keeps
    the base tokens that the speculator's character scores, carried over by the rule, rank
    first; the look-ahead runs in the speculator's vocabulary."""
    base, spec = _llama(len(words), 0), _llama(len(chars), 1)
    backend = TransformersBackend(base, words, spec, speculator_tokenizer=chars)
    assert (backend.token_map, backend.speculator_tokenizer_id) == ("max_overlap", chars.name_or_path)
    text = "the cat sat on the mat the cat"
    prompt = Prompt(torch.tensor(words(text, add_special_tokens=False)["input_ids"]))
    method = SpecPrefill(keep_rate=0.25, lookahead=2)
    plan = method.plan(prompt, backend)
    assert set(plan.timings) == {"speculator_s", "selection_s", "token_map_s"}
    cap = backend.speculate(torch.tensor(chars(text)["input_ids"]), 2)
    char_scores = token_importance(cap.queries, cap.keys).tolist()
    word_spans = char_spans(words, prompt.input_ids.tolist())[1]
    by_hand = [max(char_scores[s:e]) for s, e in word_spans]  # one character token per character
    assert plan.kept_indices is not None and plan.kept_indices.tolist() == sorted(
        select_tokens(torch.tensor(by_hand), 0.25).tolist()
    )
    assert plan.position_ids.tolist() == plan.kept_indices.tolist()  # the base's original positions


def test_the_base_ids_never_reach_a_speculator_of_another_vocabulary(words, chars):
    """Without its own tokenizer, a speculator with fewer embeddings refuses the base's ids
    in one line instead of reading garbage."""
    base, spec = _llama(40, 0), _llama(len(words), 1)
    backend = TransformersBackend(base, words, spec)
    with pytest.raises(ValueError, match="ids up to 39 for a model of 6 embeddings: the ids come from another"):
        backend.speculate(torch.tensor([1, 39]), 1)


def test_a_tokenizer_without_offsets_is_refused_in_one_line(words):
    class Slow:
        is_fast = False
        name_or_path = "slow-tok"

    with pytest.raises(ValueError, match=r"speculator tokenizer \(Slow, slow-tok\) gives no character offsets"):
        check_offsets(Slow(), "speculator")
    with pytest.raises(ValueError, match="gives no character offsets"):
        TransformersBackend(_llama(len(words), 0), words, _llama(8, 1), speculator_tokenizer=Slow())
