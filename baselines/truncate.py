"""``truncate``: keep the head and the tail of the prompt, cut the middle (LongBench-style)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import (
    POSITION_MODES,
    Backend,
    Method,
    Plan,
    Prompt,
    kept_plan,
    register_method,
)


@register_method("truncate")
@dataclass(frozen=True)
class Truncate(Method):
    """Keep the first ``K // 2`` and last ``K - K // 2`` prompt tokens, ``K = ceil(N * keep)``.

    Positions are re-numbered by default: the result is a shorter, ordinary prompt."""

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    position_mode: str = option("contiguous", Allowed(str, choices=POSITION_MODES))

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        n = prompt.n
        k = num_kept(n, self.keep_for(n))
        kept = torch.cat([torch.arange(k // 2), torch.arange(n - (k - k // 2), n)]).to(torch.int64)
        return kept_plan(prompt, torch.unique(kept, sorted=True), self.position_mode, {})
