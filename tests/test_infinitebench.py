"""InfiniteBench: answer parsing and metrics (hand-worked cases), loading, prompts, truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.benchmarks import infinitebench as ib
from harness.benchmarks.base import BenchmarkConfig
from harness.benchmarks.infinitebench.metrics import (
    INFINITEBENCH_DEFAULT_SCORER,
    INFINITEBENCH_SCORERS,
    infinitebench_score,
)
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


# OpenBMB/InfiniteBench src/compute_scores.py: "2024-08" = ae04ef161b0d2e99eb77c0e845630b44e655bc65,
# "2024-06" = 88b3daa6989da2fbe0077170d7a3c84c25d5ae58. Worked by hand from those two files.
SCORER_CASES = [
    # task, prediction, label, expected under 2024-08, expected under 2024-06
    # PR #22 (ae0cdc5): the last standalone A-J letter; 2024-06 needs "B." / "B:" or an answer prefix with ":"
    ("code_debug", "The correct answer is B", ["broken", "B"], 1.0, 0.0),
    ("code_debug", "The correct answer is B", ["broken", "D"], 0.0, 0.0),
    ("code_debug", "D", ["broken", "D"], 1.0, 0.0),
    ("code_debug", "The answer is (B) broken.", ["broken", "B"], 1.0, 0.0),
    # PR #22 also accepts an output starting with the function name, or with the letter
    ("code_debug", "broken has the bug", ["broken", "D"], 1.0, 0.0),
    ("code_debug", "Because of a typo", ["broken", "B"], 1.0, 0.0),  # the official quirk: starts with "B"
    ("code_debug", "B. broken, not A", ["broken", "B"], 1.0, 1.0),  # last letter A; starts with "B"
    ("code_debug", "The correct option is: D", ["broken", "D"], 1.0, 1.0),
    ("code_debug", "So B\nnot A", ["broken", "B"], 1.0, 0.0),  # B is the last letter of its line
    # longbook_choice_eng (ae0cdc5): the last standalone A-D letter first, then the 2024-06 rules
    ("longbook_choice_eng", "A careful reading gives B", ["x", "B"], 1.0, 0.0),  # 2024-06: first char A
    ("longbook_choice_eng", "A careful reading gives B", ["x", "A"], 1.0, 1.0),  # falls back to the first char
    # the regex has no flags, so "." stops at a newline: the first letter that is the last of its line
    ("longbook_choice_eng", "C or D? D\nC is wrong", ["x", "D"], 1.0, 0.0),
    # longdialogue_qa_eng (214808d): any answer as a case-insensitive substring, not a whole word
    ("longdialogue_qa_eng", "It is MacCara.", ["CARA"], 1.0, 0.0),
    ("longdialogue_qa_eng", "cara", ["Cara"], 1.0, 0.0),  # 2024-06 compares the label as given to upper-case words
    ("longdialogue_qa_eng", "It is John, or Cara", ["JOHN", "CARA"], 1.0, 1.0),
    ("longdialogue_qa_eng", "It is Cara", ["JOHN", "CARA"], 1.0, 0.0),  # 2024-06 looks for the first answer only
    ("longdialogue_qa_eng", "It is John", ["CARA"], 0.0, 0.0),
    # unchanged tasks score alike (kv_retrieval: 88b3daa compared the label list itself and scored 0;
    # ae04ef1 takes its first element, which we do under both scorers)
    ("kv_retrieval", 'The value is "v7-w6".', ["v7-w6"], 1.0, 1.0),
    ("passkey", " 71432.", ["71432"], 1.0, 1.0),
]


@pytest.mark.parametrize("task,pred,label,current,old", SCORER_CASES)
def test_scorer_versions(task, pred, label, current, old):
    assert INFINITEBENCH_DEFAULT_SCORER == "2024-08" and list(INFINITEBENCH_SCORERS) == ["2024-08", "2024-06"]
    assert infinitebench_score(task, pred, label) == current  # the default is the current official
    assert infinitebench_score(task, pred, label, "2024-08") == current
    assert infinitebench_score(task, pred, label, "2024-06") == old


@pytest.mark.parametrize("scorer", ["2024-08", "2024-06"])
def test_summary_takes_the_best_reference(scorer):
    """Both versions: evaluate's rouge with a list of references -> RougeScorer.score_multi,
    the best ROUGE-Lsum F (0.8 here: LCS 4 of 5 words each side), wherever it is in the list."""
    pred = "cats sat on mats today"
    worse, better = "dogs ran far away", "cats lay on mats today"
    assert infinitebench_score("longbook_sum_eng", pred, [worse], scorer) == 0.0
    assert infinitebench_score("longbook_sum_eng", pred, [worse, better], scorer) == pytest.approx(0.8)
    assert infinitebench_score("longbook_sum_eng", pred, [better, worse], scorer) == pytest.approx(0.8)
    # ROUGE-Lsum: the union LCS over newline-split sentences (here the summary's lines swapped)
    two = infinitebench_score("longbook_sum_eng", "on mats today\ncats sat", [worse, "cats sat\non mats today"], scorer)
    assert two == pytest.approx(1.0)


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
    assert json.loads(debug.label_json)[1] == "D"
    assert b.score(debug, "D.") == 100.0
    assert b.score(debug, "The correct answer is D") == 100.0  # the current official (PR #22)
    assert b.score(debug, "The correct answer is C") == 0.0
    old = _bench(scorer="2024-06")
    assert old.score(debug, "D.") == 100.0
    assert old.score(debug, "The correct answer is D") == 0.0  # 2024-06 needs "D." or "D:" (or "is: D")


def test_scorer_option_is_recorded_and_checked():
    default, old = _bench(), _bench(scorer="2024-06")
    assert default.scorer == "2024-08" and _bench(scorer=None).scorer == "2024-08"
    assert default.options()["scorer"] == "2024-08" and old.options()["scorer"] == "2024-06"
    assert default.options() != old.options()  # so the run ids differ
    assert default.metrics_version == "infinitebench-metrics-2+scorer-2024-08@ae04ef1"
    assert old.metrics_version == "infinitebench-metrics-2+scorer-2024-06@88b3daa"
    assert ib.InfiniteBench.metrics_version == "infinitebench-metrics-2"
    conf = Path(__file__).parents[1] / "conf" / "benchmark" / "infinitebench.yaml"
    from omegaconf import OmegaConf

    assert OmegaConf.load(conf).options.scorer == INFINITEBENCH_DEFAULT_SCORER
    for bad in ("current", "2024-07", 202406, ""):
        with pytest.raises(ValueError, match=rf"scorer={bad!r}; allowed: null or one of \['2024-08', '2024-06'\]"):
            _bench(scorer=bad)
    with pytest.raises(ValueError, match=r"scorer='latest' is unknown; allowed: \['2024-08', '2024-06'\]"):
        infinitebench_score("passkey", "1", ["1"], "latest")


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
