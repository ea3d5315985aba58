"""A benchmark's samples for a model: its tokenizer, and the prompts built in its chat format.

Every runner (quality, latency's benchmark prompts, serving, the front-throughput bench) reads
samples through :func:`benchmark_samples`.
"""

from __future__ import annotations

from typing import Any

from harness.benchmarks.base import Benchmark, TokenizerInfo
from harness.models.catalog import ModelConfig
from harness.models.loading import load_tokenizer, tokenizer_id
from harness.types import PromptFormat, Sample


def benchmark_samples(
    model: ModelConfig, benchmark: Benchmark, prompt_tokens: int | None = None
) -> tuple[Any, list[Sample]]:
    """The model's tokenizer and the benchmark's samples, prompts built in its chat format.
    A benchmark that truncates cuts its text to the model's max input length (else its
    context window), as the official code does before the chat template; ``prompt_tokens``
    instead cuts it so that the whole prompt, template included, holds at most that many
    tokens (a latency grid point's length)."""
    tok = load_tokenizer(model)
    fmt = PromptFormat.from_tokenizer(tok, model.chat_template)

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=fmt.add_special_tokens).input_ids)

    budget = model.max_input_length or model.max_context
    if prompt_tokens is not None:
        budget = prompt_tokens - count(fmt.head + fmt.tail)
    info = TokenizerInfo(id=tokenizer_id(model), count=count, fmt=fmt, tokenizer=tok, max_input_length=budget)
    return tok, benchmark.samples(info)
