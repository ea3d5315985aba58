"""RULER's task definitions: templates, tokens to generate, metrics and each task's needle/haystack settings
(``synthetic.yaml`` and ``constants.py`` of the packaged RULER)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

VERSION = "ruler-1"
SEED = 42
GENERATOR_NOTES = "bisect haystack search; fresh Random(42) sample stream; single chat wrap"
#: Every deliberate difference from the official generator (the package doc), for the rows
#: (``benchmark_notes``); :data:`GENERATOR_NOTES` stays the sample cache's key as it was.
DEVIATIONS = GENERATOR_NOTES + "; niah keys drawn uniformly from wonderwords' product (the official: its sorted set)"

TASK_TEMPLATES: dict[str, dict[str, Any]] = {
    "niah": {
        "tokens_to_generate": 128,
        "template": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        "metric": "string_match_all",
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assgined the value {query}, they are: ",
        "metric": "string_match_all",
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
        "metric": "string_match_all",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
        "metric": "string_match_all",
    },
    "qa": {
        "tokens_to_generate": 32,
        "template": "Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        "answer_prefix": " Answer:",
        "metric": "string_match_part",
    },
}

TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "niah_single_1": (
        "niah",
        dict(
            type_haystack="repeat",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_single_2": (
        "niah",
        dict(
            type_haystack="essay",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_single_3": (
        "niah",
        dict(
            type_haystack="essay",
            type_needle_k="words",
            type_needle_v="uuids",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_multikey_1": (
        "niah",
        dict(
            type_haystack="essay",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=4,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_multikey_2": (
        "niah",
        dict(
            type_haystack="needle",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_multikey_3": (
        "niah",
        dict(
            type_haystack="needle",
            type_needle_k="uuids",
            type_needle_v="uuids",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=1,
        ),
    ),
    "niah_multivalue": (
        "niah",
        dict(
            type_haystack="essay",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=1,
            num_needle_v=4,
            num_needle_q=1,
        ),
    ),
    "niah_multiquery": (
        "niah",
        dict(
            type_haystack="essay",
            type_needle_k="words",
            type_needle_v="numbers",
            num_needle_k=1,
            num_needle_v=1,
            num_needle_q=4,
        ),
    ),
    "vt": ("variable_tracking", dict(num_chains=1, num_hops=4)),
    "cwe": ("common_words_extraction", dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    "fwe": ("freq_words_extraction", dict(alpha=2.0)),
    "qa_1": ("qa", dict(dataset="squad")),
    "qa_2": ("qa", dict(dataset="hotpotqa")),
}

MIN_LENGTH, MAX_LENGTH = 1024, 131072


@dataclass(frozen=True)
class Parts:
    """A generated sample before the model's prompt format is applied."""

    instruction: str
    context: str
    question: str
    answer_prefix: str
    references: tuple[str, ...]
    context_spans: tuple[tuple[int, int], ...] = ()
    #: Needles the question does not ask (niah_multikey_1's other keys), spans in the context.
    distractor_spans: tuple[tuple[int, int], ...] = ()


class Rng:
    """The two global RNGs the official scripts use (``random`` and ``np.random``), per task."""

    def __init__(self, seed: int) -> None:
        self.py = random.Random(seed)
        self.np = np.random.RandomState(seed)
