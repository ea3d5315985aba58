"""``random``: uniformly random prompt tokens at the budget, the floor any method must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, SEED, Allowed, option
from specprefill.plan import (
    POSITION_MODES,
    Backend,
    Method,
    Plan,
    Prompt,
    kept_plan,
    register_method,
)


@register_method("random")
@dataclass(frozen=True)
class RandomKeep(Method):
    """``ceil(N * keep)`` tokens drawn uniformly without replacement (seeded, so a sample
    always gets the same set), at their original positions like SpecPrefill's."""

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    seed: int = option(0, SEED)
    position_mode: str = option("original", Allowed(str, choices=POSITION_MODES))

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        n = prompt.n
        g = torch.Generator().manual_seed(int(self.seed))
        kept = torch.sort(torch.randperm(n, generator=g)[: num_kept(n, self.keep_for(n))]).values
        return kept_plan(prompt, kept.to(torch.int64), self.position_mode, {})
