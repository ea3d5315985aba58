"""LongBench's official metrics.

THUDM/LongBench ``LongBench/metrics.py``, same names, signatures and behaviour
(including its quirks, noted where they matter). Each returns a 0-1 score for one
(prediction, ground truth) pair; :func:`longbench_score` takes the max over ground
truths and applies the first-line rule; aggregation multiplies by 100.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

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
