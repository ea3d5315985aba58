"""InfiniteBench's official metrics.

OpenBMB/InfiniteBench ``src/compute_scores.py``: per-task answer parsing, 0-1 per
sample (x100 at aggregation). ``label`` is the task's ground truth after
:func:`infinitebench_label` (ints for math_find / math_calc, [text, letter] for the
choice tasks, a list of strings otherwise).

Two versions of the official scorer, by name (the benchmark option ``scorer``):

* ``"2024-08"`` (default): ``src/compute_scores.py`` at commit
  ae04ef161b0d2e99eb77c0e845630b44e655bc65 (2024-08-25), its latest change. Against
  2024-06 it has 214808da39f16c83c8ad35b8bba3980bc76f04a2 (2024-08-08, "fix
  longdialogue_qa_eng compute score error": any answer as a case-insensitive
  substring), ae0cdc5ef8bedf6c8e6a94a7f6f0512e2b5c4b0f (2024-08-23, PR #22 "fix
  code_debug task score computing", "more answer matching template for models like
  llama3.1": the last standalone option letter, for code_debug and
  longbook_choice_eng) and ae04ef1 itself (kv_retrieval takes the first label, which
  we always did).
* ``"2024-06"``: commit 88b3daa6989da2fbe0077170d7a3c84c25d5ae58 (2024-06-13), what
  this harness followed up to ``infinitebench-metrics-1``.

Both versions score longbook_sum_eng alike: ``evaluate``'s rouge with
``references=[label]`` and ``label`` a list, i.e. ``RougeScorer.score_multi``, the
best ROUGE-Lsum F over the references (metrics-1 scored only the first one, which
neither version does).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from harness.benchmarks.longbench.metrics import f1_score, normalize_answer, normalize_zh_answer

INFINITEBENCH_METRICS_VERSION = "infinitebench-metrics-2"

#: Scorer name -> the OpenBMB/InfiniteBench commit whose ``src/compute_scores.py`` it follows.
INFINITEBENCH_SCORERS: dict[str, str] = {
    "2024-08": "ae04ef161b0d2e99eb77c0e845630b44e655bc65",
    "2024-06": "88b3daa6989da2fbe0077170d7a3c84c25d5ae58",
}
INFINITEBENCH_DEFAULT_SCORER = "2024-08"


def infinitebench_scorer(name: Any) -> str:
    """The scorer name, checked: a clear error for anything not in :data:`INFINITEBENCH_SCORERS`."""
    if not isinstance(name, str) or name not in INFINITEBENCH_SCORERS:
        raise ValueError(f"InfiniteBench scorer={name!r} is unknown; allowed: {list(INFINITEBENCH_SCORERS)}")
    return name


def infinitebench_metrics_version(scorer: str) -> str:
    """The metrics version string for one scorer, e.g. ``infinitebench-metrics-2+scorer-2024-08@ae04ef1``."""
    return f"{INFINITEBENCH_METRICS_VERSION}+scorer-{scorer}@{INFINITEBENCH_SCORERS[infinitebench_scorer(scorer)][:7]}"


def _first_int(prediction: str) -> str:
    for item in re.split("[^0-9]", prediction):
        if item != "":
            return item
    return ""


def _words(pred: str, chars: str) -> list[str]:
    for c in chars:
        pred = pred.replace(c, " ")
    return pred.split()


def ib_passkey(pred: str, label: Any) -> float:
    """passkey / number_string: the first integer in the output equals the answer."""
    label = label[0] if isinstance(label, list) else label
    return float(str(label) == _first_int(pred))


def ib_kv_retrieval(pred: str, label: Any) -> float:
    """kv_retrieval, both scorers: the value appears as a word after splitting on punctuation.

    Up to 2024-06 (88b3daa) the official compared the whole label (a list, in its data)
    against the words, which can never match; ae04ef1 (2024-08-25) takes its first
    element, and so do we under either scorer (as metrics-1 did)."""
    label = label[0] if isinstance(label, list) else label
    return float(label in _words(pred, "\n:\"'.,?!{}"))


def ib_code_run(pred: str, label: Any) -> float:
    """code_run: the last word of the output is the integer answer."""
    label = label[0] if isinstance(label, list) else label
    words = _words(pred.strip(), "\n.`':\"")
    if not words:
        return 0.0
    try:
        return float(int(words[-1]) == int(label))
    except ValueError:
        return 0.0


def _squeeze(pred: str, chars: list[str]) -> str:
    for c in chars:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    return pred


def _after_answer_prefix(
    pred: str, chars: list[str], prefixes: tuple[str, ...], accepted: tuple[str, ...]
) -> float | None:
    """The official answer-prefix rule: after blanking ``chars``, find the first prefix
    present; score 1 if the text after it starts with an accepted answer, else 0.
    None when no prefix occurs (the caller's fallback applies)."""
    pred = _squeeze(pred, chars)
    for prefix in prefixes:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        if len(pred) < idx + len(prefix) + 1:
            return 0.0
        rest = pred[idx + len(prefix) + 1 :]
        return float(any(rest.startswith(a) for a in accepted))
    return None


_CODE_DEBUG_CHARS = ["\n", "`", "'", '"', "-", "*", "Option", "option"]
_CODE_DEBUG_PREFIXES = ("answer is:", "is:", "answer:", "correct option is:")
_CHOICE_CHARS = ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]
_CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")


def _last_letter(pred: str, letters: str) -> str | None:
    """PR #22's regex (ae0cdc5): the first standalone letter of ``letters`` with no other
    after it on the same line (``.`` stops at newlines, no flags), as the official."""
    m = re.search(rf"\b[{letters}]\b(?!.*\b[{letters}]\b)", pred)
    return None if m is None else m.group(0)


def ib_code_debug(pred: str, label: Any) -> float:
    """code_debug, scorer 2024-08 (ae0cdc5, PR #22): the last standalone A-J letter is the
    answer's; else the output, with ``_CODE_DEBUG_CHARS`` blanked, starts with the letter
    or the function name (so "Because ..." counts for B, as in the official); else the
    answer-prefix rule of 2024-06."""
    pred = pred.strip()
    fn_name, letter = label[0], label[1]
    if _last_letter(pred, "A-J") == letter:
        return 1.0
    squeezed = _squeeze(pred, _CODE_DEBUG_CHARS)
    if squeezed.startswith(letter) or squeezed.startswith(fn_name):
        return 1.0
    found = _after_answer_prefix(squeezed, _CODE_DEBUG_CHARS, _CODE_DEBUG_PREFIXES, (letter, fn_name))
    return 0.0 if found is None else found


def ib_code_debug_2024_06(pred: str, label: Any) -> float:
    """code_debug, scorer 2024-06 (88b3daa): starts with "<letter>." or "<letter>:", or
    names the letter/the function right after an answer prefix ("The correct answer is B"
    has none of them, so it scores 0)."""
    pred = pred.strip()
    fn_name, letter = label[0], label[1]
    if pred[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    found = _after_answer_prefix(pred, _CODE_DEBUG_CHARS, _CODE_DEBUG_PREFIXES, (letter, fn_name))
    return 0.0 if found is None else found


def ib_math_find(pred: str, label: Any) -> float:
    """math_find: the first number in the output equals the answer (int or float)."""
    label = label[0] if isinstance(label, list) else label
    m = re.search(r"\d+\.\d+|\d+", pred)
    if m is None:
        return 0.0
    found = m.group(0).strip()
    if isinstance(label, int):
        try:
            return float(int(found) == label)
        except ValueError:  # the official raises on "3.5" against an int label
            return 0.0
    return float(float(found) == float(label))


def ib_longdialogue(pred: str, label: Any) -> float:
    """longdialogue_qa_eng, scorer 2024-08 (214808d): any answer, upper-cased, is a
    substring of the upper-cased output."""
    labels = label if isinstance(label, list) else [label]
    pred = pred.strip().upper()
    return float(any(str(item).upper() in pred for item in labels))


def ib_longdialogue_2024_06(pred: str, label: Any) -> float:
    """longdialogue_qa_eng, scorer 2024-06 (88b3daa): the first answer (as given, not
    upper-cased) is one of the upper-cased words of the output."""
    label = label[0] if isinstance(label, list) else label
    return float(label in [w.upper() for w in _words(pred.strip(), "\n:\"'.,?!{}")])


def ib_choice(pred: str, label: Any) -> float:
    """longbook_choice_eng, scorer 2024-08 (ae0cdc5, PR #22): the last standalone A-D
    letter is the answer's; else the 2024-06 rules."""
    if _last_letter(pred.strip(), "A-D") in label:
        return 1.0
    return ib_choice_2024_06(pred, label)


def ib_choice_2024_06(pred: str, label: Any) -> float:
    """longbook_choice_eng, scorer 2024-06 (88b3daa): first letter, an answer prefix, or
    the first A-D word."""
    pred = pred.strip()
    if pred == "":
        return 0.0
    if pred[0] in "ABCD":
        return float(pred[0] in label)
    if pred in label:
        return 1.0
    found = _after_answer_prefix(pred, _CHOICE_CHARS, _CHOICE_PREFIXES, tuple(label))
    if found is not None:
        return found
    pred = _squeeze(pred, _CHOICE_CHARS)
    for word in pred.split():
        if word in "ABCD":
            return float(word in label)
    return 0.0


def ib_qa_f1(pred: str, label: Any) -> float:
    """English QA: token F1 after normalisation, max over answers."""
    labels = label if isinstance(label, list) else [label]
    return max((f1_score(normalize_answer(pred).split(), normalize_answer(g).split()) for g in labels), default=0.0)


def ib_qa_f1_zh(pred: str, label: Any) -> float:
    """Chinese QA: character F1 after normalisation, max over answers."""
    labels = label if isinstance(label, list) else [label]
    return max((f1_score(list(normalize_zh_answer(pred)), list(normalize_zh_answer(g))) for g in labels), default=0.0)


def ib_rouge_lsum(pred: str, label: Any) -> float:
    """longbook_sum_eng, both scorers: the best ROUGE-Lsum F over the references.

    The official ``ROUGE_SCORER.compute(predictions=[pred], references=[label])`` with
    ``label`` a list goes to rouge-score's ``RougeScorer.score_multi`` (huggingface/evaluate
    ``metrics/rouge/rouge.py``), which keeps the reference with the highest F; no stemming
    (``evaluate``'s default)."""
    from rouge_score import rouge_scorer

    refs = [str(x) for x in label] if isinstance(label, list) else [str(label)]
    if not refs:
        raise ValueError("longbook_sum_eng: no reference summary to score against")
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    return float(scorer.score_multi(refs, pred)["rougeLsum"].fmeasure)


def ib_math_calc(pred: str, label: Any) -> float:
    """math_calc: length of the correct prefix of the predicted intermediate values / len(label)."""
    if label and isinstance(label[0], list):
        label = label[0]
    nums = [int(x) for x in re.split("[^0-9]", pred) if x != ""]
    cnt = 0
    for i, v in enumerate(label):
        if i >= len(nums) or v != nums[i]:
            break
        cnt += 1
    return cnt / len(label)


INFINITEBENCH_METRICS: dict[str, Callable[[str, Any], float]] = {
    "passkey": ib_passkey,
    "number_string": ib_passkey,
    "kv_retrieval": ib_kv_retrieval,
    "longbook_sum_eng": ib_rouge_lsum,
    "longbook_choice_eng": ib_choice,
    "longbook_qa_eng": ib_qa_f1,
    "longbook_qa_chn": ib_qa_f1_zh,
    "longdialogue_qa_eng": ib_longdialogue,
    "math_find": ib_math_find,
    "math_calc": ib_math_calc,
    "code_run": ib_code_run,
    "code_debug": ib_code_debug,
}

#: Per scorer, the tasks whose parser differs from :data:`INFINITEBENCH_METRICS` (the 2024-08 one).
_INFINITEBENCH_OVERRIDES: dict[str, dict[str, Callable[[str, Any], float]]] = {
    "2024-08": {},
    "2024-06": {
        "longbook_choice_eng": ib_choice_2024_06,
        "longdialogue_qa_eng": ib_longdialogue_2024_06,
        "code_debug": ib_code_debug_2024_06,
    },
}


def infinitebench_score(task: str, prediction: str, label: Any, scorer: str = INFINITEBENCH_DEFAULT_SCORER) -> float:
    """One sample, 0-1, with the task's official parser in the named scorer version."""
    if task not in INFINITEBENCH_METRICS:
        raise ValueError(f"unknown InfiniteBench task {task!r}; allowed: {sorted(INFINITEBENCH_METRICS)}")
    fn = _INFINITEBENCH_OVERRIDES[infinitebench_scorer(scorer)].get(task, INFINITEBENCH_METRICS[task])
    return float(fn(prediction, label))
