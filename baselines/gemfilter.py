"""``gemfilter``: the base model's own early layer selects the tokens (GemFilter, Shi et al. 2024).

No draft model: the base runs its first ``filter_layer`` layers on the whole prompt;
the last prompt token's attention at that layer (softmax per head, summed over heads)
ranks the tokens; the base then prefills the top ``ceil(N * keep)``. Positions are
re-numbered 0..K-1 as in the GemFilter paper (``position_mode=original`` as an option).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

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


def gemfilter_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``query`` ``[heads, d]`` (post-RoPE, last prompt token), ``keys`` ``[kv_heads, N, d]``
    -> ``[N]``: per-head softmax attention summed over heads (float32)."""
    heads, d = query.shape
    k = keys.float().repeat_interleave(heads // keys.shape[0], dim=0)  # [H, N, d]
    attn = torch.softmax(torch.einsum("hd,hnd->hn", query.float(), k) / math.sqrt(d), dim=-1)
    return attn.sum(dim=0)


@register_method("gemfilter")
@dataclass(frozen=True)
class GemFilter(Method):
    reads_base: ClassVar[bool] = True  # its filter layer is the base's own: transformers backend only

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    filter_layer: int = option(13, Allowed(int, ge=1, note="1-based layer of the base model"))
    position_mode: str = option("contiguous", Allowed(str, choices=POSITION_MODES))

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        """The filter layer must be one of the base's."""
        if layers is not None and self.filter_layer > layers:
            raise ValueError(
                f"filter_layer={self.filter_layer}: model {model!r} has {layers} layers; allowed: 1 .. {layers}"
            )

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        t0 = time.perf_counter()
        cap = backend.base_capture(prompt.input_ids, self.filter_layer)
        t1 = time.perf_counter()
        scores = gemfilter_scores(cap.queries[-1, :, 0], cap.keys[-1])
        kept = torch.sort(torch.topk(scores, num_kept(prompt.n, self.keep_for(prompt.n))).indices).values
        t2 = time.perf_counter()
        return kept_plan(
            prompt, kept.to(torch.int64), self.position_mode, {"filter_s": t1 - t0, "selection_s": t2 - t1}
        )
