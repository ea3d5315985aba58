"""RULER metrics on hand-written cases with answers worked out from the official formulas."""

from __future__ import annotations

import pytest

from harness.benchmarks.ruler.metrics import (
    score_one,
    string_match_all,
    string_match_all_per_sample,
    string_match_part,
    string_match_part_per_sample,
)

CASES = [
    # (prediction, references, string_match_all, string_match_part)
    ("The number is 1234567.", ["1234567"], 100.0, 100.0),
    ("nothing here", ["1234567"], 0.0, 0.0),
    ("values: 11, 22", ["11", "22", "33", "44"], 50.0, 100.0),
    ("UPPER case ANSWER", ["upper CASE answer"], 100.0, 100.0),  # case-insensitive
    ("", ["x"], 0.0, 0.0),  # empty prediction
    ("Paris", ["paris", "Paris, France"], 50.0, 100.0),  # QA: any reference -> full credit
    ("12345678", ["1234567"], 100.0, 100.0),  # substring match, as the official
]


@pytest.mark.parametrize("pred,refs,sm_all,sm_part", CASES)
def test_per_sample(pred, refs, sm_all, sm_part):
    assert string_match_all_per_sample([pred], [refs]) == [sm_all]
    assert string_match_part_per_sample([pred], [refs]) == [sm_part]
    assert score_one("string_match_all", pred, refs) == sm_all
    assert score_one("string_match_part", pred, refs) == sm_part


def test_aggregates_are_means_on_0_100_rounded_to_2():
    preds = [c[0] for c in CASES]
    refs = [c[1] for c in CASES]
    assert string_match_all(preds, refs) == round(sum(c[2] for c in CASES) / len(CASES), 2)
    assert string_match_part(preds, refs) == round(sum(c[3] for c in CASES) / len(CASES), 2)
    assert string_match_all(["a b", "c"], [["a", "b", "z"], ["c"]]) == pytest.approx(83.33)


def test_part_differs_from_lm_evals_average():
    # lm-eval's RULER QA averages over references (50 here); RULER's gives full credit.
    assert string_match_part(["Paris"], [["Paris", "the city of Paris, France"]]) == 100.0


def test_bad_input():
    with pytest.raises(ValueError, match="unknown metric"):
        score_one("rouge", "a", ["a"])
    with pytest.raises(ValueError, match="non-empty list"):
        string_match_all(["a"], ["a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 predictions but 1"):
        string_match_all(["a", "b"], [["a"]])


# ----------------------------------------------------------------- LongBench metrics
# Expected values worked out by hand from the official formulas (THUDM/LongBench metrics.py).

from harness.benchmarks.longbench.metrics import (  # noqa: E402
    classification_score,
    code_sim_score,
    count_score,
    longbench_score,
    normalize_answer,
    normalize_zh_answer,
    qa_f1_score,
    qa_f1_zh_score,
    retrieval_score,
    retrieval_zh_score,
    rouge_score,
    rouge_zh_score,
)

LONGBENCH_CASES = [
    # metric, prediction, ground truth, kwargs, expected
    (qa_f1_score, "The Osprey.", "Osprey", {}, 1.0),  # article + punctuation stripped
    (qa_f1_score, "thirty long years", "thirty years", {}, 0.8),  # P=2/3, R=1 -> 0.8
    (qa_f1_score, "", "anything", {}, 0.0),  # empty prediction
    (qa_f1_score, "a an the", "the", {}, 0.0),  # only articles: no tokens left
    (qa_f1_zh_score, "西湖边的图书馆。", "西湖边的图书馆", {}, 1.0),  # Chinese punctuation dropped
    (count_score, "There are 4 paragraphs, not 5.", "4", {}, 0.5),  # 1 of 2 numbers right
    (count_score, "four", "4", {}, 0.0),  # no number in text
    (retrieval_score, "Paragraph 2", "Paragraph 2", {}, 1.0),
    (retrieval_score, "Paragraph 2 or Paragraph 12", "Paragraph 2", {}, 0.5),
    (retrieval_zh_score, "段落3", "段落3", {}, 1.0),
    (classification_score, "Numeric value", "Numeric value", {"all_classes": ["Numeric value", "Entity"]}, 1.0),
    (
        classification_score,
        "Entity or Numeric value",
        "Numeric value",
        {"all_classes": ["Numeric value", "Entity"]},
        0.5,
    ),
    (classification_score, "Location", "Numeric value", {"all_classes": ["Numeric value", "Location"]}, 0.0),
    (code_sim_score, "# a comment\n    return x", "    return x", {}, 1.0),  # first line without comment marks
    (code_sim_score, "abcd", "abce", {}, 0.75),  # SequenceMatcher ratio 0.75 -> 75
    (rouge_score, "the cat sat", "the cat sat", {}, 1.0),
    (rouge_score, "", "the cat", {}, 0.0),  # the rouge package raises on empty text: 0
]


@pytest.mark.parametrize("fn,pred,gt,kw,expected", LONGBENCH_CASES)
def test_longbench_metrics(fn, pred, gt, kw, expected):
    assert fn(pred, gt, **kw) == pytest.approx(expected, abs=1e-6)


def test_normalisers():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_zh_answer("你好，世界！ A.") == "你好世界a"


def test_rouge_l_value():
    # LCS("cats sat on mats today", "cats lay on mats today") = 4 of 5 tokens: P = R = F = 0.8
    assert rouge_score("cats sat on mats today", "cats lay on mats today") == pytest.approx(0.8, abs=1e-6)
    # The rouge package's summary-level ROUGE-L counts a repeated word once in the union
    # LCS: 0.8 here, not the textbook 5/6. We use the package, so we inherit that.
    assert rouge_score("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(0.8, abs=1e-6)
    assert rouge_zh_score("小明去图书馆", "小明去图书馆") == pytest.approx(1.0, abs=1e-6)


def test_longbench_score_first_line_and_max_over_references():
    # trec scores only the first line
    assert (
        longbench_score(
            "trec", "classification_score", "Location\nNumeric value", ["Numeric value"], ["Numeric value", "Location"]
        )
        == 0.0
    )
    # the same prediction on a task without the first-line rule keeps both lines
    assert longbench_score("triviaqa", "qa_f1_score", "\nOsprey\nmore", ["Osprey"]) == 1.0
    assert longbench_score("hotpotqa", "qa_f1_score", "Osprey", ["Gull Island", "the Osprey"]) == 1.0
    with pytest.raises(ValueError, match="unknown LongBench metric"):
        longbench_score("trec", "bleu", "x", ["x"])
    with pytest.raises(ValueError, match="all_classes"):
        classification_score("x", "x")
