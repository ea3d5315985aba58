"""A FLOPs model of Llama-style prefill, for ideal speedups.

Prefill is compute-bound, so the ideal TTFT speedup of a method is the ratio of the
matmul FLOPs full prefill does to the FLOPs the method does (its own model calls plus
the base model's prefill of the kept tokens). Counted: the linear layers (Q, K, V, O
projections and the gated MLP) for every token, causal attention (QK^T and AV) over the
token pairs, and the LM head once (logits of the last token only). Norms, RoPE and
softmax are left out (they are O(tokens x hidden), a few per cent at most).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    """What the FLOPs model needs of a Llama-style decoder."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a Hugging Face config (``LlamaConfig`` and relatives)."""
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=hd,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
        )

    @property
    def linear_per_token(self) -> int:
        """FLOPs (2 per multiply-add) of one token through every layer's projections and MLP."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * 2 * (d * q + 2 * d * kv + q * d + 3 * d * self.intermediate)

    @property
    def attention_per_pair(self) -> int:
        """FLOPs of one (query, key) pair in every layer: QK^T and AV, all query heads."""
        return self.layers * 4 * self.heads * self.head_dim


def causal_pairs(n: int) -> int:
    """(query, key) pairs of causal attention over ``n`` tokens."""
    return n * (n + 1) // 2


def prefill_flops(shape: Shape, tokens: int, pairs: int) -> int:
    """One sequence: ``tokens`` through the linear layers, ``pairs`` attention pairs, LM head once."""
    return tokens * shape.linear_per_token + pairs * shape.attention_per_pair + 2 * shape.hidden * shape.vocab


def speculator_flops(shape: Shape, n: int, lookahead: int) -> int:
    """A speculator's prefill of ``n`` tokens, then ``lookahead - 1`` decode steps (step
    ``s`` attends to ``n + s + 1`` keys)."""
    flops = prefill_flops(shape, n, causal_pairs(n))
    for step in range(lookahead - 1):
        flops += prefill_flops(shape, 1, n + step + 1)
    return flops
