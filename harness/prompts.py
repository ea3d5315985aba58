"""Prompts a method plans: a benchmark :class:`Sample`, or random token ids (latency grids)."""

from __future__ import annotations

from typing import Any

import torch

from harness.types import Sample
from specprefill.plan import Prompt


def sample_prompt(sample: Sample, tokenizer: Any) -> tuple[Prompt, list[tuple[int, int]]]:
    """The tokenized prompt of a sample with its text parts (for methods that rewrite the
    context), and each token's character span in ``sample.prompt`` (for diagnostics)."""
    enc = tokenizer(sample.prompt, add_special_tokens=sample.add_special_tokens, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.int64)
    body = sample.instruction + sample.context + sample.question
    start = sample.prompt.find(body)
    if start < 0:
        raise ValueError(f"sample {sample.task}/{sample.sample_id}: the prompt does not contain its parts in order")
    end = len(sample.prompt) - len(sample.answer_prefix)
    prompt = Prompt(
        ids,
        sample.instruction,
        sample.context,
        sample.question,
        sample.answer_prefix,
        head=sample.prompt[:start],
        tail=sample.prompt[start + len(body) : end],
        add_special_tokens=sample.add_special_tokens,
    )
    return prompt, [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def random_prompts(batch: int, length: int, vocab: int, generator: torch.Generator) -> list[Prompt]:
    """``batch`` prompts of ``length`` uniformly random token ids below ``vocab``: they have
    no text parts, so only methods that choose among prompt tokens can plan them."""
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    return [Prompt(ids[i]) for i in range(batch)]
