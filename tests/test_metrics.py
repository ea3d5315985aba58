"""RULER metrics on hand-written cases with answers worked out from the official formulas."""

from __future__ import annotations

import pytest

from harness.metrics import (
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
