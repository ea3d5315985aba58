"""A shared-context conversation benchmark, built offline from RULER's generators.

Task ``niah_keys``: RULER's ``niah_multikey_1`` sample (an essay haystack holding four
needles with different keys, one of them asked) is turn 1, exactly as RULER builds it at
the run's length; turns 2..``turns`` ask the other keys one by one, each a follow-up user
message after the model's previous answer, worded
as RULER words the single-key question, with RULER's answer prefix and scored by RULER's
``string_match_all`` against that key's value. Each turn's evidence is its own needle, so
every question needs different tokens of the shared context: what a prefill that kept only
turn 1's evidence loses shows on turns 2..4.

The conversation text is the model's chat template over the turns (the first user message,
the assistant's answer, the next user message, ...): :meth:`MultiTurn.turns` gives each
follow-up's text, the piece the template puts between the previous answer and the next
answer (end of the assistant message, the user message, the generation prompt, the answer
prefix). Without a chat template the turns are separated by a blank line.

The order of the later keys (option ``key_order``): ``shuffled`` (default) draws it per
conversation from a seed of the task and sample id (:func:`key_rng`), so a turn's needle is
as likely to sit early as late in the context and a trend over turns is not a trend over
needle depth; ``document`` asks them in the order their needles appear (this benchmark's
first version, where turn 2's needle lies before turn 4's and turn and depth move
together). Every row records its needle's depth (``needle_depth``) and its place among the
needles (``turn_needle``, 1 = the first in the context).
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.benchmarks.ruler import cached_samples
from harness.benchmarks.ruler.metrics import VERSION as RULER_METRICS_VERSION
from harness.benchmarks.ruler.metrics import score_one
from harness.benchmarks.ruler.tasks import DEVIATIONS as RULER_DEVIATIONS
from harness.benchmarks.ruler.tasks import MAX_LENGTH, MIN_LENGTH
from harness.benchmarks.ruler.tasks import VERSION as RULER_VERSION
from harness.types import Sample
from specprefill.options import Allowed

#: Each task's RULER source task.
SOURCES = {"niah_keys": "niah_multikey_1"}
#: The needle sentence RULER writes (generators.NEEDLE with numbers as values).
NEEDLE = re.compile(r"One of the special magic numbers for (?P<key>[\w-]+) is: (?P<value>\d+)\.")
#: Tokens a follow-up turn adds beyond its answer, at most (the question, the template's
#: turn markers, the answer prefix): the context window must hold the last turn.
TURN_TOKENS = 96
#: How the later turns' keys are ordered (see the module's doc).
KEY_ORDERS = ("shuffled", "document")


def key_rng(task: str, sample_id: int) -> random.Random:
    """The generator of one conversation's key order: seeded by a stable hash of the task
    and the sample id (the same order in every run, method and Python process)."""
    return random.Random(zlib.crc32(f"{task}/{sample_id}".encode()))


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation sample. ``text``: what the turn appends after the
    previous answer (empty for turn 1, whose text is the sample's prompt); ``spans``: the
    turn's evidence in turn 1's prompt (character spans of ``Sample.prompt``); ``needle``:
    the asked needle's place among the context's needles in document order (1 = first)."""

    index: int
    key: str
    text: str
    references: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    needle: int = 0


def chat_pieces(tokenizer: Any, chat: bool) -> tuple[str, str]:
    """(what the chat template writes between an assistant answer and the next user text,
    what it writes after that user text): from the template rendered on sentinels."""
    if not chat or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return "\n\n", ""
    u1, a, u2 = "\x00SP_U1\x00", "\x00SP_A\x00", "\x00SP_U2\x00"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": u1}, {"role": "assistant", "content": a}, {"role": "user", "content": u2}],
        tokenize=False,
        add_generation_prompt=True,
    )
    if not all(s in text for s in (u1, a, u2)):
        raise ValueError("the chat template drops a message's text; the conversation cannot be laid out from it")
    return text[text.index(a) + len(a) : text.index(u2)], text[text.index(u2) + len(u2) :]


@register_benchmark
class MultiTurn(Benchmark):
    """Conversations over one shared context (``turns`` questions, 2..4, default 4)."""

    name = "multiturn"
    version = f"2+ruler{RULER_VERSION}"
    metrics_version = RULER_METRICS_VERSION
    notes = f"turn 1 is RULER's sample, so RULER's: {RULER_DEVIATIONS}"
    all_tasks = tuple(SOURCES)
    allowed_options: ClassVar[dict[str, Allowed]] = {
        "turns": Allowed(int, ge=2, le=4, note="one per needle key"),
        "key_order": Allowed(str, choices=KEY_ORDERS),
    }
    multiturn = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)  # the options against their declarations
        self.n_turns = int(cfg.options.get("turns", 4))
        self.key_order = str(cfg.options.get("key_order", "shuffled"))
        self._pieces = ("\n\n", "")

    def options(self) -> dict[str, Any]:
        return {**super().options(), "turns": self.n_turns, "key_order": self.key_order}

    def check_model(self, max_context: int) -> None:
        n = self.cfg.length
        if not MIN_LENGTH <= n <= MAX_LENGTH:
            raise ValueError(f"length={n} is outside RULER's range; allowed: {MIN_LENGTH}..{MAX_LENGTH} tokens")
        need = n + (self.n_turns - 1) * (TURN_TOKENS + self.max_new_tokens())
        if need > max_context:
            raise ValueError(
                f"length={n} with {self.n_turns} turns needs up to {need} tokens (each later turn adds its answer "
                f"and question) beyond the model's context window ({max_context}); allowed: length <= "
                f"{max_context - (self.n_turns - 1) * (TURN_TOKENS + self.max_new_tokens())}"
            )

    def max_new_tokens(self) -> int:
        return 128  # RULER's niah tokens_to_generate

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        self._pieces = chat_pieces(tok.tokenizer, tok.fmt.name == "chat")
        out = []
        for task in self.tasks:
            for s in cached_samples(SOURCES[task], self.cfg.length, self.cfg.limit, tok):
                out.append(Sample(**{**s.__dict__, "benchmark": self.name, "task": task}))
        return out

    def turns(self, sample: Sample) -> list[Turn]:
        """The sample's turns: turn 1 (its own question), then the other keys in the
        benchmark's ``key_order`` (shuffled per conversation, or as their needles appear)."""
        needles = []
        for a, b in sorted(sample.spans + sample.distractor_spans):
            m = NEEDLE.fullmatch(sample.prompt[a:b])
            if m is None:
                raise ValueError(f"sample {sample.task}/{sample.sample_id}: span {a}:{b} is not a RULER needle")
            needles.append((m["key"], m["value"], (a, b)))
        first = [k for k, v, _ in needles if v in sample.references and sample.question.count(k) == 1]
        if len(first) != 1:
            raise ValueError(f"sample {sample.task}/{sample.sample_id}: cannot tell which needle turn 1 asks")
        later = [k for k, _, _ in needles if k != first[0]]
        if self.key_order == "shuffled":
            key_rng(sample.task, sample.sample_id).shuffle(later)
        order = [first[0], *later]
        between, after = self._pieces
        out = []
        for i, key in enumerate(order[: self.n_turns]):
            rank, value, span = next((r, v, s) for r, (k, v, s) in enumerate(needles, 1) if k == key)
            question = sample.question.replace(first[0], key).lstrip("\n")
            prefix = sample.answer_prefix.replace(first[0], key)
            text = "" if i == 0 else between + question + after + prefix
            out.append(Turn(i + 1, key, text, (value,), (span,), rank))
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return score_one(sample.metric, prediction, sample.references)

    def score_turn(self, sample: Sample, turn: Turn, prediction: str) -> float:
        """One turn's score: RULER's metric against that turn's key's value."""
        return score_one(sample.metric, prediction, turn.references)
