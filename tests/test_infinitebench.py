"""InfiniteBench: answer parsing and metrics (hand-worked cases), loading, prompts, truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.benchmarks import infinitebench as ib
from harness.benchmarks.base import BenchmarkConfig
from harness.metrics import infinitebench_score
from harness.types import PromptFormat

FIXTURES = Path(__file__).parent / "fixtures" / "infinitebench"

CASES = [
    # task, prediction, label (official types), expected 0-1
    ("passkey", " 71432.", ["71432"], 1.0),
    ("passkey", "The key is 7143 2", ["71432"], 0.0),  # first integer only
    ("number_string", "5551234567 and more 1", ["5551234567"], 1.0),
    ("kv_retrieval", 'The value is "v7-w6".', ["v7-w6"], 1.0),
    ("kv_retrieval", "v7-w6x", ["v7-w6"], 0.0),
    ("code_run", "The value is 13.", 13, 1.0),  # last word, punctuation split off
    ("code_run", "13 is wrong, it is 14", 13, 0.0),
    ("code_run", "", 13, 0.0),
    ("code_debug", "D. broken", ["broken", "D"], 1.0),
    ("code_debug", "The correct option is: broken", ["broken", "D"], 1.0),
    ("code_debug", "I think func_1", ["broken", "D"], 0.0),
    ("math_find", "42", 42, 1.0),
    ("math_find", "The answer: 42.5", 42, 0.0),  # the official would raise here
    ("math_find", "about 3.5", 3.5, 1.0),
    ("math_calc", "[5, 8, 6, 17]", [5, 8, 6, 16], 0.75),  # correct prefix of 3 of 4
    ("math_calc", "8, 5", [5, 8, 6, 16], 0.0),
    ("longdialogue_qa_eng", "Cara.", ["CARA"], 1.0),
    ("longbook_choice_eng", "C", ["Seven", "C"], 1.0),
    ("longbook_choice_eng", "The answer is: C", ["Seven", "C"], 1.0),
    ("longbook_choice_eng", "Seven", ["Seven", "C"], 1.0),
    ("longbook_choice_eng", "", ["Seven", "C"], 0.0),
    ("longbook_qa_eng", "The Osprey", ["Osprey", "the Osprey"], 1.0),
    ("longbook_qa_eng", "Osprey ship", ["Osprey"], 2 / 3),  # P=1/2, R=1
    ("longbook_qa_chn", "杭州。", ["杭州"], 1.0),  # character F1, punctuation dropped
    ("longbook_qa_chn", "在杭州", ["杭州"], 0.8),  # P=2/3, R=1
    ("longbook_sum_eng", "cats sat on mats today", ["cats lay on mats today"], 0.8),
]


@pytest.mark.parametrize("task,pred,label,expected", CASES)
def test_metrics(task, pred, label, expected):
    assert infinitebench_score(task, pred, label) == pytest.approx(expected, abs=1e-6)


def test_labels_are_converted_to_official_types():
    assert ib.label("math_find", {"answer": ["42"]}) == 42
    assert ib.label("math_find", {"answer": ["3.5"]}) == 3.5
    assert ib.label("math_calc", {"answer": ["5", "8"]}) == [5, 8]
    assert ib.label("code_debug", {"answer": "broken", "options": ["a", "b", "c", "broken"]}) == ["broken", "D"]
    assert ib.label("longbook_choice_eng", {"answer": ["x", "B"], "options": ["y", "x", "z", "w"]}) == ["x", "B"]
    assert ib.label("passkey", {"answer": ["1"]}) == ["1"]


@pytest.fixture(scope="module")
def tok(smollm2_info):
    return smollm2_info


def _bench(**options):
    return ib.InfiniteBench(
        BenchmarkConfig(name="infinitebench", limit=2, options={"data_dir": str(FIXTURES), **options})
    )


def test_all_12_tasks_load_with_official_templates(tok):
    samples = _bench().samples(tok)
    assert len(ib.TASKS) == 12 and {s.task for s in samples} == set(ib.TASKS) and len(samples) == 24
    for s in samples:
        assert not s.prompt.startswith(tok.fmt.head) and s.add_special_tokens  # no chat template by default
        assert s.max_new_tokens == ib.MAX_NEW_TOKENS[s.task] and s.label_json
    run = next(s for s in samples if s.task == "code_run")
    assert run.instruction == "There is a function called func_3 in the following Python code.\n\n"
    assert run.question.endswith("Please compute the exact value of func_3(4). The value of func_3(4) is")
    find = next(s for s in samples if s.task == "math_find")
    # "The .+ of" -> "the largest number" (the last 3 chars, " of", dropped) -> the official prefix
    assert find.instruction == "What is the largest number in the following list?\n\n"
    choice = next(s for s in samples if s.task == "longbook_choice_eng")
    assert "\nC. Seven\n" in choice.question and choice.question.endswith("The letter of the correct answer is")
    b = _bench()
    assert b.score(next(s for s in samples if s.task == "passkey"), "71432") == 100.0
    debug = next(s for s in samples if s.task == "code_debug")
    assert b.score(debug, "D.") == 100.0
    assert b.score(debug, "D") == 0.0  # the official parser needs "D." or "D:" (or an answer prefix)


def test_truncation_is_middle_and_capped_by_the_model(tok, smollm2_tokenizer):
    long = "Mara kept the lighthouse. " * 3000
    text = ib.TEMPLATES["longbook_sum_eng"].format(context=long)
    cut = ib.truncate_by_tokens(text, smollm2_tokenizer, 1000)
    ids = smollm2_tokenizer.encode(text)
    assert cut == smollm2_tokenizer.decode(ids[:500] + ids[-500:], skip_special_tokens=True)
    s = _bench(truncate_len=600)._sample(
        "longbook_sum_eng", 0, {"context": long, "input": "", "answer": ["x"]}, tok, PromptFormat("base"), 600
    )
    assert s.instruction == "Summarize the book below.\n\n" and s.question == "\n\nSummary:"
    assert len(smollm2_tokenizer.encode(s.prompt)) <= 602
    chat = _bench(chat=True).samples(tok)
    assert chat[0].prompt.startswith(tok.fmt.head) and not chat[0].add_special_tokens


def test_errors(tmp_path, monkeypatch, tok):
    with pytest.raises(ValueError, match="unknown option"):
        _bench(trunc=5)
    with pytest.raises(FileNotFoundError, match=r"no passkey\.jsonl"):
        ib.InfiniteBench(
            BenchmarkConfig(name="infinitebench", tasks=("passkey",), options={"data_dir": str(tmp_path)})
        ).samples(tok)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(
        RuntimeError, match=r"xinrongzhang2022/InfiniteBench \(split 'passkey', revision unpinned\).*data_dir"
    ):
        ib.InfiniteBench(BenchmarkConfig(name="infinitebench", tasks=("passkey",))).samples(tok)
    with pytest.raises(ValueError, match="unknown InfiniteBench task"):
        infinitebench_score("passkeys", "1", ["1"])
    assert json.loads(json.dumps(ib.label("code_run", {"answer": 13}))) == ["13"]
