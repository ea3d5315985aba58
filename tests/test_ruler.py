"""RULER generation: every task, official formats, lengths, determinism, cache."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

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


# RULER's 13 tasks (synthetic.yaml), with the official tokens to generate and metric of each
# task's kind (constants.py). Written out here, not read from the module under test.
NIAH = (128, "string_match_all")
EXPECTED_TASKS = {
    "niah_single_1": NIAH,
    "niah_single_2": NIAH,
    "niah_single_3": NIAH,
    "niah_multikey_1": NIAH,
    "niah_multikey_2": NIAH,
    "niah_multikey_3": NIAH,
    "niah_multivalue": NIAH,
    "niah_multiquery": NIAH,
    "vt": (30, "string_match_all"),
    "cwe": (120, "string_match_all"),
    "fwe": (50, "string_match_all"),
    "qa_1": (32, "string_match_part"),
    "qa_2": (32, "string_match_part"),
}


def test_all_13_tasks(generated):
    assert list(ruler.TASKS) == list(EXPECTED_TASKS)
    for task, samples in generated.items():
        assert [(s.benchmark, s.task, s.sample_id, s.length) for s in samples] == [
            ("ruler", task, 0, 4096),
            ("ruler", task, 1, 4096),
        ]


@pytest.mark.parametrize("task", list(EXPECTED_TASKS))
def test_sample_shape_and_budget(task, generated, tok_info):
    tokens_to_generate, metric = EXPECTED_TASKS[task]
    for s in generated[task]:
        assert (
            s.prompt == tok_info.fmt.head + s.instruction + s.context + s.question + tok_info.fmt.tail + s.answer_prefix
        )
        assert s.max_new_tokens == tokens_to_generate
        n = tok_info.count(s.prompt)
        # fwe's official budget does not reserve the tokens to generate
        budget = 4096 - (tokens_to_generate if task != "fwe" else 0)
        assert n <= budget
        assert n > 0.4 * 4096, f"{task} prompt of {n} tokens is far below the length"
        assert s.references and all(isinstance(r, str) and r for r in s.references)
        assert s.metric == metric


def _digest(samples) -> str:
    return hashlib.sha256(
        json.dumps([[s.prompt, list(s.references), list(s.spans), list(s.distractor_spans)] for s in samples]).encode()
    ).hexdigest()


_OTHER_PROCESS = """
import json, sys
from transformers import AutoTokenizer
from harness.benchmarks import ruler
from harness.models.loading import smollm2_dir
from harness.types import PromptFormat
from tests.test_ruler import _digest
tok = AutoTokenizer.from_pretrained(smollm2_dir())
fmt = PromptFormat.from_tokenizer(tok, chat=True)
count = lambda s: len(tok(s, add_special_tokens=False).input_ids)
print(json.dumps({t: _digest(ruler.generate(t, 4096, 2, fmt, count)) for t in sys.argv[1:]}))
"""


def test_generation_is_deterministic(tok_info, generated):
    again = ruler.generate("niah_multikey_1", 4096, 2, tok_info.fmt, tok_info.count)
    assert again == generated["niah_multikey_1"]
    # Cached sets are reused across processes: another process, with another string-hash
    # seed (set iteration order), must generate the same samples.
    tasks = ["niah_multikey_1", "cwe", "fwe", "qa_2"]
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, *tasks], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout  # fmt: skip
    assert json.loads(out.splitlines()[-1]) == {t: _digest(generated[t]) for t in tasks}


NUMBER = r"\d{7}"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
WORDS = r"[^\n]+?-[^\n]+?"  # adjective-noun (wonderwords: some hold spaces, hyphens, accents)
# task: (needles, references, haystack, key pattern, value pattern), from synthetic.yaml
NIAH_TASKS = {
    "niah_single_1": (1, 1, "repeat", WORDS, NUMBER),
    "niah_single_2": (1, 1, "essay", WORDS, NUMBER),
    "niah_single_3": (1, 1, "essay", WORDS, UUID),
    "niah_multikey_1": (4, 1, "essay", WORDS, NUMBER),
    "niah_multikey_2": (1, 1, "needle", WORDS, NUMBER),
    "niah_multikey_3": (1, 1, "needle", UUID, UUID),
    "niah_multivalue": (4, 4, "essay", WORDS, NUMBER),
    "niah_multiquery": (4, 4, "essay", WORDS, NUMBER),
}


@pytest.mark.parametrize("task", list(NIAH_TASKS))
def test_niah_needles_are_in_the_context_and_spans_point_at_them(task, generated):
    n_needles, n_refs, haystack, key_re, value_re = NIAH_TASKS[task]
    kind = "uuids" if value_re == UUID else "numbers"
    for s in generated[task]:
        needles = [s.prompt[a:b] for a, b in sorted(s.spans + s.distractor_spans)]
        assert len(needles) == n_needles and len(s.references) == n_refs
        # the evidence is the asked needles, one per answer; the others are distractors
        assert len(s.spans) == n_refs and len(s.distractor_spans) == n_needles - n_refs
        assert sorted(re.search(rf"is: ({value_re})\.", s.prompt[a:b])[1] for a, b in s.spans) == sorted(s.references)
        needle = rf"One of the special magic {kind} for ({key_re}) is: ({value_re})\."
        parsed = [re.fullmatch(needle, x) for x in needles]
        assert all(parsed), needles
        assert all(s.context.count(x) == 1 for x in needles)
        # the answers are exactly the values of the needles whose key the question asks for
        asked = [m[2] for m in parsed if m[1] in s.question]
        assert sorted(asked) == sorted(s.references), (s.question, needles)
        lines = s.context.split("\n")
        if haystack == "repeat":  # one noise sentence a line, the needles between them
            noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
            assert lines.count(noise) == len(lines) - n_needles and len(lines) > 50
        elif haystack == "needle":  # the haystack is distractor needles, one a line
            assert all(re.fullmatch(needle, x) for x in lines) and len(lines) > 20
        else:
            assert "The grass is green" not in s.context and s.context.count("One of the special magic") == n_needles


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
    assert re.fullmatch(r"\d{5}", value)
    assert s.question.endswith(f"assigned the value {value} in the text above.")
    # The few-shot example (3-letter variables) comes before the task text.
    assert s.instruction.startswith(" Memorize and track") and s.instruction.count("Memorize and track") == 2
    assert re.search(r"VAR [A-Z]{3} = \d{5}", s.instruction)


def test_qa_gold_document_is_in_the_context(generated):
    for task in ("qa_1", "qa_2"):
        for s in generated[task]:
            assert s.spans
            assert s.question.startswith("\n\nAnswer the question based on the given documents.")
    # qa_1 (SQuAD): the evidence is the question's own paragraph, whole
    assert all(s.prompt[a:b].startswith("Document ") for s in generated["qa_1"] for a, b in s.spans)
    assert generated["qa_1"][0].references[0] == "France"


def test_qa_2_evidence_is_the_supporting_sentences(generated):
    """qa_2's evidence spans are the HotpotQA example's supporting sentences (its
    ``supporting_facts``), read here from RULER's own file, not the ten paragraphs RULER places as
    the question's documents: what the diagnostics say a method kept of the two hops."""
    data = json.loads((ruler.data_dir() / "hotpotqa.json").read_text())
    by_question = {d["question"]: d for d in data}
    for s in generated["qa_2"]:
        example = by_question[s.question.split("Question: ", 1)[1].strip()]
        paragraphs = dict((t, p) for t, p in example["context"])
        expected = sorted(paragraphs[t][k].strip() for t, k in example["supporting_facts"])
        assert sorted(s.prompt[a:b] for a, b in s.spans) == expected
        assert len(expected) >= 2 and s.references == (example["answer"],)
        titles = {t for t, _ in example["supporting_facts"]}
        # each sentence sits in its own paragraph's document in the prompt
        for a, _ in s.spans:
            head = s.prompt.rfind("Document ", 0, a)
            assert any(s.prompt[head:a].split("\n", 1)[1].startswith(t + "\n") for t in titles)


def test_cwe_and_fwe(generated):
    c = generated["cwe"][0]
    assert len(c.references) == 10
    numbers, words = zip(*re.findall(r"(\d+)\. (\S+)", c.context), strict=True)
    assert [int(x) for x in numbers] == list(range(1, len(words) + 1))
    counts = collections.Counter(words)
    # freq_cw=30, freq_ucw=3 at >= 4K: the 10 answers 30 times each, every other word 3 times
    assert {w: counts[w] for w in c.references} == dict.fromkeys(c.references, 30)
    assert set(counts.values()) - {30} == {3} and sum(v == 30 for v in counts.values()) == 10
    f = generated["fwe"][0]
    toks = f.context.split()
    counts = {w: toks.count(w) for w in set(toks)}
    top = sorted((w for w in counts if w != "..."), key=lambda w: -counts[w])[:3]
    assert set(top) == set(f.references)


def test_prefix_sentences_equal_direct_sent_tokenize():
    words = ruler.essay_words()
    ps = ruler.essay_sentences()
    for n in [*random.Random(1).sample(range(1, 20000), 25), 1, 2, len(words) - 1]:
        assert ps(n) == sent_tokenize(" ".join(words[:n]).strip()), n
    whole = sent_tokenize(" ".join(words).strip())  # the whole essay: about two seconds
    assert len(whole) > 30000
    assert ps(len(words)) == whole and ps(len(words) + 7) == whole
    assert ps(0) == [] and ps(-3) == []


def test_largest_fitting_is_the_linear_answer():
    for lo in (1, 3):
        for limit in (3, 4, 7, 100, 1000, 12345) if lo == 3 else (1, 2, 7, 100, 1000, 12345):
            for cap in (None, 50, 20000):
                probes: list[int] = []

                def fits(n: int, lim: int = limit, probes: list[int] = probes) -> bool:
                    probes.append(n)
                    return n <= lim

                got = ruler._largest_fitting(fits, lo, cap)
                linear = max(n for n in range(lo, (cap or 30000) + 1) if n <= limit)  # a linear scan
                assert got == linear, (lo, limit, cap)
                # O(log n) probes, none beyond [lo, cap] or above twice the answer
                assert len(probes) <= 2 * got.bit_length() + 2, (lo, limit, cap, probes)
                assert all(lo <= p <= min(cap or p, max(2 * got, lo)) for p in probes), (lo, limit, cap, probes)
    # nothing fits: the lower bound, after one probe
    probes = []
    assert ruler._largest_fitting(lambda n: probes.append(n) or False, 5, 100) == 5 and probes == [5]


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
    direct = ruler.generate("niah_single_1", 2048, 4, tok_info.fmt, tok_info.count)
    calls = []
    real_generate = ruler.generate

    def generate(*args, **kwargs):
        calls.append(args[:3])
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(ruler.cache, "generate", generate)  # what the cache calls
    first = ruler.cached_samples("niah_single_1", 2048, 3, tok_info)
    assert first == direct[:3] and calls == [("niah_single_1", 2048, 3)]
    files = list((tmp_path / "ruler").glob("*.parquet"))
    assert len(files) == 1
    # read back from the file, not generated again
    assert ruler.cached_samples("niah_single_1", 2048, 2, tok_info) == first[:2]
    assert ruler.cached_samples("niah_single_1", 2048, 3, tok_info) == first
    assert len(calls) == 1
    # more samples than the file holds: generated again, and the file replaced
    assert ruler.cached_samples("niah_single_1", 2048, 4, tok_info) == direct
    assert calls[1:] == [("niah_single_1", 2048, 4)]
    assert ruler.cached_samples("niah_single_1", 2048, 4, tok_info) == direct and len(calls) == 2
    other = TokenizerInfo(id="another", count=tok_info.count, fmt=PromptFormat("base"))
    ruler.cached_samples("niah_single_1", 2048, 1, other)
    assert len(list((tmp_path / "ruler").glob("*.parquet"))) == 2  # keyed by tokenizer and format


def test_cache_key_follows_the_generator(tmp_path, monkeypatch, tok_info):
    """An edit to any file a sample's fields come from (the task generators, the length search,
    the task table, the data readers) keys new cached sets: a stale set is never read back."""
    package = Path(ruler.cache.__file__).parent
    for f in package.glob("*.py"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    key = ruler.cache_key("vt", 4096, tok_info.fmt, tok_info.id)
    monkeypatch.setattr(ruler.cache, "__file__", str(tmp_path / "cache.py"))
    assert ruler.cache_key("vt", 4096, tok_info.fmt, tok_info.id) == key  # the same sources, the same key
    seen = {key}
    for name in ("generators.py", "length.py", "tasks.py", "data.py", "cache.py"):
        with (tmp_path / name).open("a") as f:
            f.write("\n# an edit\n")
        seen.add(ruler.cache_key("vt", 4096, tok_info.fmt, tok_info.id))
    assert len(seen) == 6, "each edited file must change the key"


def _chain(s):
    return [s.prompt[a:b] for a, b in s.spans]


def test_vt_hops_option(tmp_path, monkeypatch, tok_info, generated):
    """``vt_hops`` sets vt's chain length; unset, RULER's own samples and identity."""
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    official = generated["vt"]
    plain = ruler.Ruler(BenchmarkConfig(name="ruler", length=4096, tasks=("vt",), limit=2))
    unset = ruler.Ruler(BenchmarkConfig(name="ruler", length=4096, tasks=("vt",), limit=2, options={"vt_hops": None}))
    assert plain.samples(tok_info) == unset.samples(tok_info) == official
    # Unset, the option is not in the run's identity, nor in the rows' notes.
    assert unset.options() == plain.options() == {"name": "ruler", "version": ruler.VERSION, "length": 4096}
    assert unset.notes == ruler.DEVIATIONS
    four = ruler.Ruler(BenchmarkConfig(name="ruler", length=4096, tasks=("vt",), limit=2, options={"vt_hops": 4}))
    assert four.samples(tok_info) == official  # RULER's own 4, asked for by name
    for hops in (0, 8):
        b = ruler.Ruler(BenchmarkConfig(name="ruler", length=4096, tasks=("vt",), limit=2, options={"vt_hops": hops}))
        assert b.options()["vt_hops"] == hops
        budget = {0: "", 8: ", 54 tokens to generate (official: 30)"}[hops]
        assert b.notes.endswith(f"; vt num_hops={hops} (official: 4){budget}")
        assert b.max_new_tokens() == {0: 30, 8: 54}[hops]
        for s in b.samples(tok_info):
            assert s.max_new_tokens == {0: 30, 8: 54}[hops]
            assert len(s.references) == hops + 1 and len(set(s.references)) == hops + 1
            chain = _chain(s)
            assert chain[0].startswith(f"VAR {s.references[0]} = ")
            assert chain[1:] == [f"VAR {s.references[j + 1]} = VAR {s.references[j]}" for j in range(hops)]
            assert f"{hops + 1} variables are assgined the value" in s.answer_prefix
    # Each chain length has its own cache file: 4 (unset or by name: the same settings, one
    # file), 0 and 8.
    assert len(list((tmp_path / "ruler").glob("vt-4096-*.parquet"))) == 3


def test_answer_tokens():
    """RULER's tokens to generate, but 6 a variable for a chain past RULER's 4 hops (30 for 5
    variables): RULER's 30 cut a 9-variable answer at its last letter (chain_length_qwen_cpu)."""
    assert ruler.answer_tokens("vt") == ruler.answer_tokens("vt", {"num_hops": 4}) == 30
    assert [ruler.answer_tokens("vt", {"num_hops": h}) for h in (0, 2, 5, 8, 20)] == [30, 30, 36, 54, 126]
    assert ruler.answer_tokens("niah_single_1") == 128 and ruler.answer_tokens("qa_2") == 32
    assert ruler.answer_tokens("cwe") == 120 and ruler.answer_tokens("fwe") == 50
    with pytest.raises(ValueError, match=r"RULER task 'qa_1' has no setting\(s\) \['num_hops'\]"):
        ruler.answer_tokens("qa_1", {"num_hops": 2})


def test_vt_answer_budget_only(monkeypatch, tok_info):
    """At 8 hops the answer outgrows RULER's 30 tokens (SmolLM2 writes nine variables in 30-31),
    and gets 54; the budget changes the answer's room only, not the prompt (the haystack's room
    stays length - 30, RULER's)."""
    longer = ruler.generate("vt", 4096, 2, tok_info.fmt, tok_info.count, {"num_hops": 8})
    for s in longer:
        answer = tok_info.count(" " + " ".join(s.references))
        assert 30 <= answer <= s.max_new_tokens == 54
    monkeypatch.setattr(ruler.length, "answer_tokens", lambda task, args=None: 30)
    official_budget = ruler.generate("vt", 4096, 2, tok_info.fmt, tok_info.count, {"num_hops": 8})
    assert [s.max_new_tokens for s in official_budget] == [30, 30]
    assert [s.prompt for s in official_budget] == [s.prompt for s in longer]
    assert [s.references for s in official_budget] == [s.references for s in longer]


def test_vt_hops_refused():
    with pytest.raises(ValueError, match=r"vt_hops=8 sets variable tracking's chain length, but tasks= \['qa_1'\]"):
        ruler.Ruler(BenchmarkConfig(name="ruler", tasks=("qa_1",), options={"vt_hops": 8}))
    with pytest.raises(ValueError, match=r"vt_hops=21; allowed: null or an int in \[0, 20\]"):
        ruler.Ruler(BenchmarkConfig(name="ruler", tasks=("vt",), options={"vt_hops": 21}))
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['hops'\]"):
        ruler.Ruler(BenchmarkConfig(name="ruler", tasks=("vt",), options={"hops": 8}))
    with pytest.raises(ValueError, match=r"RULER task 'qa_1' has no setting\(s\) \['num_hops'\]"):
        ruler.make_generator("qa_1", 4096, {"num_hops": 2})
