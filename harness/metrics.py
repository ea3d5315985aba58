"""Benchmark metrics as pure functions, with the official semantics and scales.

RULER (``eval/synthetic/constants.py`` of the official code), 0-100 scale, rounded to
two decimals like the official aggregate:

* ``string_match_all``: per sample, the fraction of references found in the prediction
  (case-insensitive substring); mean over samples x 100.
* ``string_match_part``: per sample, 1 if **any** reference is found; mean x 100.
  (lm-eval's RULER QA averages over references instead; we do not.)
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

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


# --------------------------------------------------------------------------- LongBench
#
# THUDM/LongBench ``LongBench/metrics.py``, same names, signatures and behaviour
# (including its quirks, noted where they matter). Each returns a 0-1 score for one
# (prediction, ground truth) pair; :func:`longbench_score` takes the max over ground
# truths and applies the first-line rule; aggregation multiplies by 100.

LONGBENCH_METRICS_VERSION = "longbench-metrics-1"


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_CN_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."


def normalize_zh_answer(s: str) -> str:
    """Lower text and remove (Chinese and ASCII) punctuation and all whitespace."""
    s = s.lower()
    punct = set(string.punctuation + _CN_PUNCTUATION)
    s = "".join(ch for ch in s if ch not in punct)
    return "".join(s.split())


def count_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_count: share of the numbers in the prediction that equal the answer."""
    numbers = re.findall(r"\d+", prediction)
    right = sum(1 for n in numbers if str(n) == str(ground_truth))
    return 0.0 if not numbers else float(right / len(numbers))


def _retrieval(prediction: str, ground_truth: str, pattern: str) -> float:
    ground_truth_id = re.findall(pattern, ground_truth)[0]
    numbers = re.findall(r"\d+", prediction)
    right = sum(1 for n in numbers if str(n) == str(ground_truth_id))
    return 0.0 if not numbers else float(right / len(numbers))


def retrieval_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_en: ground truth 'Paragraph N'; share of predicted numbers equal to N."""
    return _retrieval(prediction, ground_truth, r"Paragraph (\d+)")


def retrieval_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_zh: ground truth '段落N'."""
    return _retrieval(prediction, ground_truth, r"段落(\d+)")


def code_sim_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """lcc, repobench-p: fuzzy ratio of the first line with no comment/backtick marks.

    Official uses ``fuzzywuzzy.fuzz.ratio`` as its requirements install it (without
    python-Levenshtein, i.e. difflib's SequenceMatcher, rounded to an int)."""
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return _fuzz_ratio(line, ground_truth) / 100


def _fuzz_ratio(a: str, b: str) -> int:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Using slow pure-python SequenceMatcher": that is the official path
        from fuzzywuzzy import fuzz

    return int(fuzz.ratio(a, b))


def classification_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """trec, lsht: 1/k if the true class is among the k class names found in the prediction.

    Reproduces the official loop, which removes from the list it iterates over (so a
    class contained in the ground truth can survive the filter)."""
    all_classes = kwargs.get("all_classes")
    if not all_classes:
        raise ValueError("classification_score needs all_classes=[...] (the task's class names)")
    em_match_list = [c for c in all_classes if c in prediction]
    for match_term in em_match_list:  # the official mutates the list it iterates over
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    return 1.0 / len(em_match_list) if ground_truth in em_match_list else 0.0


def rouge_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """ROUGE-L F of the ``rouge`` package (as the official); 0 when it raises (e.g. empty text)."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:
        return 0.0
    return float(scores["rouge-l"]["f"])


def _jieba_cut(text: str) -> list[str]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return list(jieba.cut(text, cut_all=False))


def rouge_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """dureader, vcsum: ROUGE-L F over jieba words."""
    return rouge_score(" ".join(_jieba_cut(prediction)), " ".join(_jieba_cut(ground_truth)))


def f1_score(prediction: Sequence[str], ground_truth: Sequence[str], **kwargs: Any) -> float:
    """Token-multiset F1 of two token lists."""
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction)
    recall = num_same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """English QA: F1 over whitespace tokens after :func:`normalize_answer`."""
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Chinese QA: F1 over jieba words, each normalised, empty ones dropped."""
    pred = [t for t in (normalize_zh_answer(x) for x in _jieba_cut(prediction)) if t]
    gold = [t for t in (normalize_zh_answer(x) for x in _jieba_cut(ground_truth)) if t]
    return f1_score(pred, gold)


LONGBENCH_METRICS: dict[str, Callable[..., float]] = {
    "qa_f1_score": qa_f1_score,
    "qa_f1_zh_score": qa_f1_zh_score,
    "rouge_score": rouge_score,
    "rouge_zh_score": rouge_zh_score,
    "classification_score": classification_score,
    "retrieval_score": retrieval_score,
    "retrieval_zh_score": retrieval_zh_score,
    "count_score": count_score,
    "code_sim_score": code_sim_score,
}

FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")


def longbench_score(
    task: str, metric: str, prediction: str, ground_truths: Sequence[str], all_classes: Sequence[str] | None = None
) -> float:
    """One sample as the official ``scorer``: first line for trec/triviaqa/samsum/lsht,
    max over ground truths; 0-1 (multiply by 100 to aggregate)."""
    if metric not in LONGBENCH_METRICS:
        raise ValueError(f"unknown LongBench metric {metric!r}; allowed: {sorted(LONGBENCH_METRICS)}")
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    fn = LONGBENCH_METRICS[metric]
    score = 0.0
    for gt in ground_truths:
        score = max(score, fn(prediction, gt, all_classes=list(all_classes or [])))
    return score


# --------------------------------------------------------------------------- InfiniteBench
#
# OpenBMB/InfiniteBench ``src/compute_scores.py``: per-task answer parsing, 0-1 per
# sample (x100 at aggregation). ``label`` is the task's ground truth after
# :func:`infinitebench_label` (ints for math_find / math_calc, [text, letter] for the
# choice tasks, a list of strings otherwise).
#
# Two versions of the official scorer, by name (the benchmark option ``scorer``):
#
# * ``"2024-08"`` (default): ``src/compute_scores.py`` at commit
#   ae04ef161b0d2e99eb77c0e845630b44e655bc65 (2024-08-25), its latest change. Against
#   2024-06 it has 214808da39f16c83c8ad35b8bba3980bc76f04a2 (2024-08-08, "fix
#   longdialogue_qa_eng compute score error": any answer as a case-insensitive
#   substring), ae0cdc5ef8bedf6c8e6a94a7f6f0512e2b5c4b0f (2024-08-23, PR #22 "fix
#   code_debug task score computing", "more answer matching template for models like
#   llama3.1": the last standalone option letter, for code_debug and
#   longbook_choice_eng) and ae04ef1 itself (kv_retrieval takes the first label, which
#   we always did).
# * ``"2024-06"``: commit 88b3daa6989da2fbe0077170d7a3c84c25d5ae58 (2024-06-13), what
#   this harness followed up to ``infinitebench-metrics-1``.
#
# Both versions score longbook_sum_eng alike: ``evaluate``'s rouge with
# ``references=[label]`` and ``label`` a list, i.e. ``RougeScorer.score_multi``, the
# best ROUGE-Lsum F over the references (metrics-1 scored only the first one, which
# neither version does).

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
