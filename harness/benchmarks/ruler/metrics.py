"""RULER's official metrics as pure functions.

RULER (``eval/synthetic/constants.py`` of the official code), 0-100 scale, rounded to
two decimals like the official aggregate:

* ``string_match_all``: per sample, the fraction of references found in the prediction
  (case-insensitive substring); mean over samples x 100.
* ``string_match_part``: per sample, 1 if **any** reference is found; mean x 100.
  (lm-eval's RULER QA averages over references instead; we do not.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

VERSION = "metrics-1"


def _check(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no predictions to score")
    for r in refs:
        if isinstance(r, str) or len(r) == 0:
            raise ValueError(f"each reference entry must be a non-empty list of strings; got {r!r}")


def string_match_all_per_sample(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> list[float]:
    _check(preds, refs)
    return [
        sum(1.0 for r in ref if r.lower() in p.lower()) / len(ref) * 100 for p, ref in zip(preds, refs, strict=True)
    ]


def string_match_part_per_sample(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> list[float]:
    _check(preds, refs)
    return [max(1.0 if r.lower() in p.lower() else 0.0 for r in ref) * 100 for p, ref in zip(preds, refs, strict=True)]


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's aggregate for niah, vt, cwe, fwe (0-100)."""
    scores = string_match_all_per_sample(preds, refs)
    return round(sum(scores) / len(scores), 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's aggregate for qa_1 / qa_2 (0-100)."""
    scores = string_match_part_per_sample(preds, refs)
    return round(sum(scores) / len(scores), 2)


PER_SAMPLE: dict[str, Callable[[Sequence[str], Sequence[Sequence[str]]], list[float]]] = {
    "string_match_all": string_match_all_per_sample,
    "string_match_part": string_match_part_per_sample,
}


def score_one(metric: str, prediction: str, references: Sequence[str]) -> float:
    """One sample's score on the 0-100 scale, by metric name."""
    if metric not in PER_SAMPLE:
        raise ValueError(f"unknown metric {metric!r}; allowed: {sorted(PER_SAMPLE)}")
    return PER_SAMPLE[metric]([prediction], [list(references)])[0]
