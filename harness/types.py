"""Frozen records passed between stages: a benchmark sample, a model's prompt format (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specprefill.plan import prompt_text


@dataclass(frozen=True)
class Sample:
    """One benchmark sample, split into the parts methods may treat differently.

    ``prompt`` is the full text the model sees (chat template applied), as
    :meth:`PromptFormat.wrap` assembles it from the parts.
    ``spans``: character spans in ``prompt`` of the evidence a diagnostic tracks
    (RULER's asked needles, variable-tracking chain statements, qa_1's paragraph, qa_2's supporting sentences).
    ``length``: RULER's target length, or the dataset's own length field (LongBench).
    """

    benchmark: str
    task: str
    sample_id: int
    length: int
    instruction: str
    context: str
    question: str
    answer_prefix: str
    prompt: str
    references: tuple[str, ...]
    max_new_tokens: int
    metric: str
    spans: tuple[tuple[int, int], ...] = field(default=())
    #: Spans of look-alike evidence the question does not ask (RULER niah_multikey_1's
    #: other keys' needles): tracked apart from ``spans`` (``distractor_kept``).
    distractor_spans: tuple[tuple[int, int], ...] = field(default=())
    #: Whether tokenizing ``prompt`` adds the tokenizer's special tokens (BOS): False when
    #: a chat template already wrote them.
    add_special_tokens: bool = False
    #: Stop strings for decoding (LongBench samsum stops at a newline).
    stop: tuple[str, ...] = ()
    #: Class names for classification metrics (LongBench trec, lsht).
    all_classes: tuple[str, ...] = ()
    #: Grouping used in aggregation: the benchmark's category and, for LongBench-E, the
    #: length bucket ("0-4k", "4-8k", "8k+").
    category: str = ""
    bucket: str = ""
    #: The ground truth in its official type, as JSON, where it is not a list of strings
    #: (InfiniteBench: ints for math, [text, letter] for choices).
    label_json: str = ""


@dataclass(frozen=True)
class PromptFormat:
    """How a model wraps a user turn: ``head + user_text + tail``.

    Built from the tokenizer's chat template (or empty for base prompting).
    ``add_special_tokens``: whether tokenizing the wrapped text should add BOS; False when
    the chat template already writes the special tokens.
    """

    name: str
    head: str = ""
    tail: str = ""
    add_special_tokens: bool = True

    def wrap(self, instruction: str, context: str, question: str, answer_prefix: str = "") -> str:
        """A sample's prompt text in this format (:func:`specprefill.plan.prompt_text`)."""
        return prompt_text(self.head, instruction, context, question, self.tail, answer_prefix)

    @classmethod
    def from_tokenizer(cls, tokenizer: object, chat: bool) -> PromptFormat:
        if not chat or not getattr(tokenizer, "chat_template", None):
            return cls(name="base")
        sentinel = "\x00SPECPREFILL_USER\x00"
        text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": sentinel}], tokenize=False, add_generation_prompt=True
        )
        head, tail = text.split(sentinel)
        return cls(name="chat", head=head, tail=tail, add_special_tokens=False)
