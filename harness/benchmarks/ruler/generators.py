"""One generator per RULER task family (niah, variable tracking, common and frequent words, QA),
following the official scripts: a sample's parts for a given haystack size."""

from __future__ import annotations

import math
import random
import string
import uuid
from typing import Any

import numpy as np

from harness.benchmarks.ruler.data import cwe_words, essay_sentences, essay_words, qa_data, wordlists
from harness.benchmarks.ruler.tasks import SEED, TASK_TEMPLATES, TASKS, Parts, Rng


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
        # the evidence is the asked needles; the others (multikey_1's three other keys) are distractors
        asked = {
            NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[i], value=v) for i in indices for v in values[i]
        }
        evidence = tuple(s for s in spans if context[s[0] : s[1]] in asked)
        distractors = tuple(s for s in spans if context[s[0] : s[1]] not in asked)
        return Parts(
            head.format(**fmt),
            context,
            tail.format(**fmt),
            prefix.format(**fmt),
            tuple(answers),
            evidence,
            distractors,
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
        labels = [f"Document {i + 1}:\n" for i in range(len(ids))]
        context, places = _join_with_spans(
            [(lab + self.docs[d], True) for lab, d in zip(labels, ids, strict=True)], "\n\n"
        )
        # The evidence the diagnostics follow: HotpotQA's supporting sentences where the data
        # names them (qa_2), else the question's own documents (qa_1's paragraph).
        evidence: dict[int, list[tuple[int, int]]] = qa.get("evidence") or {}
        if evidence:
            spans = [(s + len(lab) + a, s + len(lab) + b) for lab, d, (s, _) in zip(labels, ids, places, strict=True)
                     for a, b in evidence.get(d, [])]  # fmt: skip
        else:
            spans = [place for d, place in zip(ids, places, strict=True) if d in gold_set]
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


def make_generator(task: str, length: int, args: dict[str, Any] | None = None) -> TaskGen:
    """The generator of ``task`` at ``length``; ``args`` replace some of its official settings
    (:func:`task_args`)."""
    kind, _ = TASKS[task]
    return GENERATORS[kind](task_args(task, args), length)


def answer_tokens(task: str, args: dict[str, Any] | None = None) -> int:
    """Tokens to generate for ``task``'s answer: RULER's ``tokens_to_generate``, except for a
    variable-tracking chain longer than RULER's (``vt_hops``). RULER's 30 tokens name the 5
    variables of its 4-hop chain, 6 a variable; an answer of 9 variables (8 hops) needs about
    30 tokens of this kind (``FFBQF XWBGR ...``), so RULER's budget cuts it at its last letter.
    A longer chain gets 6 tokens a variable (54 at 8 hops); 4 hops or fewer keep 30. Only the
    answer's budget: the haystack's room stays RULER's (``length`` minus 30), so the prompts
    are those of RULER's construction."""
    kind, official = TASKS[task]
    settings = task_args(task, args)  # refuses a setting the task does not have
    budget = int(TASK_TEMPLATES[kind]["tokens_to_generate"])
    if kind != "variable_tracking":
        return budget
    per_variable = budget / (int(official["num_hops"]) + 1)
    return max(budget, math.ceil(per_variable * (int(settings["num_hops"]) + 1)))


def task_args(task: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """``task``'s settings (``synthetic.yaml``), with ``args`` replacing the ones it names; a
    setting the task does not have is refused."""
    official = TASKS[task][1]
    unknown = sorted(set(args or {}) - set(official))
    if unknown:
        raise ValueError(f"RULER task {task!r} has no setting(s) {unknown}; allowed: {sorted(official)}")
    return {**official, **(args or {})}
