"""RULER generation: every task, official formats, lengths, determinism, cache."""

from __future__ import annotations

import random
import re

import pytest

from harness.benchmarks import ruler
from harness.benchmarks.base import BenchmarkConfig, TokenizerInfo
from harness.benchmarks.text import sent_tokenize
from harness.types import PromptFormat


@pytest.fixture(scope="module")
def tok_info(smollm2_info):
    return smollm2_info


@pytest.fixture(scope="module")
def generated(tok_info):
    return {t: ruler.generate(t, 4096, 2, tok_info.fmt, tok_info.count) for t in ruler.TASKS}


def test_all_13_tasks(generated):
    assert len(ruler.TASKS) == 13 and set(generated) == set(ruler.TASKS)


@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_sample_shape_and_budget(task, generated, tok_info):
    for s in generated[task]:
        kind = ruler.TASKS[task][0]
        assert (
            s.prompt == tok_info.fmt.head + s.instruction + s.context + s.question + tok_info.fmt.tail + s.answer_prefix
        )
        assert s.max_new_tokens == ruler.TASK_TEMPLATES[kind]["tokens_to_generate"]
        n = tok_info.count(s.prompt)
        budget = 4096 - (s.max_new_tokens if kind != "freq_words_extraction" else 0)
        assert n <= budget
        assert n > 0.4 * 4096, f"{task} prompt of {n} tokens is far below the length"
        assert s.references and all(isinstance(r, str) and r for r in s.references)
        assert s.metric == ("string_match_part" if kind == "qa" else "string_match_all")


def test_generation_is_deterministic(tok_info, generated):
    again = ruler.generate("niah_multikey_1", 4096, 2, tok_info.fmt, tok_info.count)
    assert again == generated["niah_multikey_1"]


@pytest.mark.parametrize("task", [t for t in ruler.TASKS if t.startswith("niah")])
def test_niah_needles_are_in_the_context_and_spans_point_at_them(task, generated):
    args = ruler.TASKS[task][1]
    for s in generated[task]:
        needles = [s.prompt[a:b] for a, b in s.spans]
        n_needles = max(args["num_needle_k"], args["num_needle_q"]) * args["num_needle_v"]
        assert len(needles) == n_needles
        assert all(re.fullmatch(r"One of the special magic \w+ for [\w-]+ is: [\w-]+\.", x) for x in needles)
        for ref in s.references:
            assert any(ref in x for x in needles)
        assert all(s.context.count(x) == 1 for x in needles)


def test_single_needle_wording_and_answer_prefix(generated):
    s = generated["niah_single_1"][0]
    assert s.instruction.startswith("A special magic number is hidden within the following text.")
    assert s.question.startswith("\nWhat is the special magic number for ")
    assert s.answer_prefix.startswith(" The special magic number for ") and s.answer_prefix.endswith(" is")
    m = generated["niah_multivalue"][0]
    assert m.instruction.startswith("Some special magic numbers are hidden") and m.answer_prefix.endswith(" are")
    assert len(m.references) == 4


def test_vt_chain_and_icl(generated):
    s = generated["vt"][0]
    assert len(s.references) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in s.references)
    chain = [s.prompt[a:b] for a, b in s.spans]
    assert chain[0].startswith(f"VAR {s.references[0]} = ")
    assert chain[1:] == [f"VAR {s.references[j + 1]} = VAR {s.references[j]}" for j in range(4)]
    value = chain[0].split("= ")[1]
    assert s.question.endswith(f"assigned the value {value} in the text above.")
    # The few-shot example (3-letter variables) comes before the task text.
    assert s.instruction.startswith(" Memorize and track") and s.instruction.count("Memorize and track") == 2
    assert re.search(r"VAR [A-Z]{3} = \d{5}", s.instruction)


def test_qa_gold_document_is_in_the_context(generated):
    for task in ("qa_1", "qa_2"):
        for s in generated[task]:
            assert s.spans and all(s.prompt[a:b].startswith("Document ") for a, b in s.spans)
            assert s.question.startswith("\n\nAnswer the question based on the given documents.")
    assert generated["qa_1"][0].references[0] == "France"


def test_cwe_and_fwe(generated):
    c = generated["cwe"][0]
    assert len(c.references) == 10
    words = re.findall(r"\d+\. (\S+)", c.context)
    assert all(words.count(w) == 30 for w in c.references)  # freq_cw=30 at >= 4K
    f = generated["fwe"][0]
    toks = f.context.split()
    counts = {w: toks.count(w) for w in set(toks)}
    top = sorted((w for w in counts if w != "..."), key=lambda w: -counts[w])[:3]
    assert set(top) == set(f.references)


def test_prefix_sentences_equal_direct_sent_tokenize():
    words = ruler.essay_words()
    ps = ruler.essay_sentences()
    for n in [*random.Random(1).sample(range(1, 20000), 25), 1, 2, len(words)]:
        if n == len(words):
            continue  # the whole essay takes seconds to split directly
        assert ps(n) == sent_tokenize(" ".join(words[:n]).strip()), n


def test_largest_fitting_is_the_linear_answer():
    for limit in (1, 2, 7, 100, 1000, 12345):
        for cap in (None, 50, 20000):
            got = ruler._largest_fitting(lambda n, lim=limit: n <= lim, 1, cap)
            expected = min(limit, cap) if cap else limit
            assert got == expected, (limit, cap)


def test_benchmark_validation():
    with pytest.raises(ValueError, match="did you mean 'niah_single_1'"):
        ruler.Ruler(BenchmarkConfig(name="ruler", tasks=("niah_singel_1",)))
    b = ruler.Ruler(BenchmarkConfig(name="ruler", length=16384))
    with pytest.raises(ValueError, match="beyond the model's context window"):
        b.check_model(8192)
    with pytest.raises(ValueError, match="limit=0"):
        BenchmarkConfig(name="ruler", limit=0)


def test_cache_roundtrip(tmp_path, monkeypatch, tok_info):
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    first = ruler.cached_samples("niah_single_1", 2048, 3, tok_info)
    files = list((tmp_path / "ruler").glob("*.parquet"))
    assert len(files) == 1
    assert ruler.cached_samples("niah_single_1", 2048, 2, tok_info) == first[:2]
    assert ruler.cached_samples("niah_single_1", 2048, 3, tok_info) == first
    other = TokenizerInfo(id="another", count=tok_info.count, fmt=PromptFormat("base"))
    ruler.cached_samples("niah_single_1", 2048, 1, other)
    assert len(list((tmp_path / "ruler").glob("*.parquet"))) == 2  # keyed by tokenizer and format
