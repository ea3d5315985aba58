"""Diagnostics of what a method kept: the fraction of a sample's evidence tokens (a RULER
needle, a variable-tracking chain, qa_1's paragraph, qa_2's supporting sentences) that survived into the prefill, and
the share of its evidence pieces (each needle, each statement of the chain, qa_1's paragraph,
each of qa_2's supporting sentences) that survived whole, and the share of the prompt after the context (the question,
the chat template's closing, the answer prefix) that survived."""

from __future__ import annotations

import hashlib

import torch


def needle_tokens(offsets: list[tuple[int, int]], spans: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Indices of tokens whose characters overlap any span. ``offsets``: per-token char spans."""
    idx = [i for i, (a, b) in enumerate(offsets) if b > a and any(a < e and s < b for s, e in spans)]
    return torch.tensor(idx, dtype=torch.int64)


def needle_kept(kept: torch.Tensor | None, needles: torch.Tensor) -> float | None:
    """Fraction of needle tokens the method kept (None when there is nothing to track, or
    when the method rewrote the text so no token maps back to the prompt)."""
    if needles.numel() == 0 or kept is None:
        return None
    return float(torch.isin(needles, kept).float().mean())


def pieces_whole(
    kept: torch.Tensor | None, offsets: list[tuple[int, int]], spans: tuple[tuple[int, int], ...]
) -> float | None:
    """Fraction of the evidence spans every one of whose tokens the method kept: a
    variable-tracking chain of five statements with four kept whole reads 0.8 whatever share
    of its tokens was kept (:func:`needle_kept`). None where :func:`needle_kept` is, or when
    no span covers a token."""
    if kept is None:
        return None
    pieces = [needle_tokens(offsets, (span,)) for span in spans]
    pieces = [t for t in pieces if t.numel()]
    if not pieces:
        return None
    return sum(bool(torch.isin(t, kept).all()) for t in pieces) / len(pieces)


def question_span(prompt: str, instruction: str, context: str, question: str) -> tuple[int, int] | None:
    """The characters of ``prompt`` after its context, up to its end: the question, the chat
    template's closing and the answer prefix (``head + instruction + context + question + tail +
    answer_prefix``, :class:`specprefill.plan.Prompt`). None without a context or a question, or
    when the parts are not found in order."""
    if not context or not question:
        return None
    start = prompt.find(instruction + context + question)
    if start < 0:
        return None
    return (start + len(instruction) + len(context), len(prompt))


def question_kept(
    kept: torch.Tensor | None, offsets: list[tuple[int, int]], span: tuple[int, int] | None
) -> float | None:
    """Share of the tokens after the context (:func:`question_span`) the method kept. The
    reference SpecPrefill force-keeps nothing, not even the question; a method that drops part
    of it changes what is asked. None where :func:`needle_kept` is, or without a span."""
    if span is None:
        return None
    return needle_kept(kept, needle_tokens(offsets, (span,)))


def kept_hash(kept: torch.Tensor | None) -> str | None:
    """Which prompt tokens a method kept, as SHA-256 (16 hex) of their sorted indices (None where
    no token maps back to the prompt: a rewritten text, a KV press's per-head entries). Two rows
    of one sample with the same hash prefilled the same tokens, whatever positions they gave them
    (the position study pairs on it)."""
    if kept is None:
        return None
    idx = torch.sort(kept.detach().to("cpu", torch.int64).flatten()).values
    return hashlib.sha256(idx.numpy().astype("<i8").tobytes()).hexdigest()[:16]


def needle_depth(prompt: str, context: str, spans: tuple[tuple[int, int], ...]) -> float | None:
    """Where the evidence sits in the context: the mean start of its spans as a fraction of
    the context (0 = its first character, 1 = its end), as RULER's needle depth is a share of
    the haystack. None without spans or when the context is not found in the prompt."""
    start = prompt.find(context) if context else -1
    if not spans or start < 0:
        return None
    depths = [(s - start) / len(context) for s, _ in spans]
    return float(min(1.0, max(0.0, sum(depths) / len(depths))))
