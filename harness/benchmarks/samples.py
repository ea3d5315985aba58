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


def benchmark_samples(model: ModelConfig, benchmark: Benchmark) -> tuple[Any, list[Sample]]:
    """The model's tokenizer and the benchmark's samples, prompts built in its chat format."""
    tok = load_tokenizer(model)
    fmt = PromptFormat.from_tokenizer(tok, model.chat_template)
    info = TokenizerInfo(
        id=tokenizer_id(model),
        count=lambda s: len(tok(s, add_special_tokens=fmt.add_special_tokens).input_ids),
        fmt=fmt,
        tokenizer=tok,
        max_input_length=model.max_input_length or model.max_context,
    )
    return tok, benchmark.samples(info)
