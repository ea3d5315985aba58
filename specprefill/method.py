"""Full prefill and SpecPrefill as :class:`~specprefill.plan.Method` siblings."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from specprefill.core import force_keep, random_fill, select_tokens, token_importance
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import (
    POSITION_MODES,
    Backend,
    Method,
    Plan,
    Prompt,
    check_gap_options,
    full_plan,
    kept_plan,
    register_method,
)
from specprefill.token_map import TokenMap


@register_method("full")
@dataclass(frozen=True)
class FullPrefill(Method):
    """The baseline: the base model prefills every prompt token."""

    identity: ClassVar[bool] = True
    turn_policy: ClassVar[str | None] = "prefix_cache"

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        return full_plan(prompt)


@register_method("specprefill")
@dataclass(frozen=True)
class SpecPrefill(Method):
    """Speculative Prefill (Liu, Chen & Zhang, ICML 2025). Defaults are the reference code's (L=8, no pooling, token mode).

    ``position_mode='contiguous'`` (re-number kept tokens 0..K-1), ``max_gap`` (the original
    positions with every gap shortened to at most that many positions:
    :func:`specprefill.plan.capped_positions`), ``gap_scale`` (each gap's empty positions scaled:
    :func:`specprefill.plan.scaled_positions`), ``force_keep_*`` and ``random_fill`` (M more
    tokens drawn at random from those not selected: :func:`specprefill.core.random_fill`) are
    named deviations from the reference, off by default.
    """

    needs_speculator: ClassVar[bool] = True
    turn_policy: ClassVar[str | None] = "reselect"

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    lookahead: int = option(8, Allowed(int, ge=1, note="look-ahead steps; 1 = the last prompt token"))
    pool_kernel: int | None = option(None, Allowed(int, ge=1, odd=True, null=True, note="null: no pooling"))
    chunk_size: int | None = option(None, Allowed(int, ge=1, null=True, note="null: token mode"))
    position_mode: str = option("original", Allowed(str, choices=POSITION_MODES))
    force_keep_first: int = option(0, Allowed(int, ge=0))
    force_keep_last: int = option(0, Allowed(int, ge=0))
    max_gap: int | None = option(
        None,
        Allowed(
            int,
            ge=1,
            null=True,
            note="null: the original positions as they are; N: each gap between kept tokens shortened to at most N "
            "positions (a deviation; 1 = re-numbered 0..K-1)",
        ),
    )
    gap_scale: float | None = option(
        None,
        Allowed(
            float,
            gt=0.0,
            le=1.0,
            null=True,
            note="null: the original positions as they are; f: each gap's empty positions times f (a deviation)",
        ),
    )

    random_fill: int | None = option(
        None,
        Allowed(
            int,
            ge=1,
            null=True,
            note="null: the selection as it is; M: M more prompt tokens drawn at random from those not selected "
            "(seeded), at their own positions (a deviation)",
        ),
    )

    def __post_init__(self) -> None:
        try:
            check_gap_options(self.position_mode, self.max_gap, self.gap_scale)
        except ValueError as e:
            raise ValueError(f"method {self.name!r}: {e}") from None

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        """The look-ahead's extra tokens must fit the context window after the longest prompt."""
        la = int(self.lookahead)
        if la > 1 and longest_prompt + la - 1 > max_context:  # la = 1: the benchmark's own check
            raise ValueError(
                f"lookahead={la}: {la - 1} look-ahead tokens after a prompt of up to {longest_prompt} tokens pass "
                f"model {model!r}'s context window ({max_context}); allowed: lookahead <= "
                f"{max(1, max_context - longest_prompt + 1)}"
            )

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        return self.plan_batch([prompt], backend)[0]

    def plan_batch(self, prompts: Sequence[Prompt], backend: Backend) -> list[Plan]:
        """One speculator forward for the whole batch, prompts of any lengths (the backend
        left-pads them; each capture is the prompt's own), then scoring and selection per
        prompt. Each plan's ``speculator_s`` is an equal share of the batch forward (they sum
        to it) and its ``selection_s`` its own; with a speculator from another family,
        ``token_map_s`` is its share of tokenizing the text for the speculator, and the
        speculator's scores reach the base's tokens by :mod:`specprefill.token_map`'s rule."""
        if not prompts:
            return []
        t0 = time.perf_counter()
        # A speculator from another family reads the prompt text in its own tokens
        # (specprefill.token_map); its scores are carried onto the base's tokens below.
        other = getattr(backend, "speculator_tokenizer", None)
        maps = [TokenMap.of(p.input_ids, backend.tokenizer, other) for p in prompts] if other is not None else None
        token_map_s = (time.perf_counter() - t0) / len(prompts)
        t0 = time.perf_counter()
        inputs = [m.speculator_ids for m in maps] if maps is not None else [p.input_ids for p in prompts]
        # Backend.speculate_batch (specprefill/plan.py) still declares only the [B, N] form;
        # the transformers backend (and the vLLM one, which delegates to it) take B [n_i] prompts.
        caps = backend.speculate_batch(inputs, self.lookahead)  # type: ignore[arg-type]
        speculator_s = (time.perf_counter() - t0) / len(prompts)
        plans = []
        for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
            t1 = time.perf_counter()
            importance = token_importance(cap.queries, cap.keys, self.pool_kernel)
            if maps is not None:
                importance = maps[i].to_base(importance)
            kept = select_tokens(importance, self.keep_for(prompt.n), self.chunk_size)
            if self.force_keep_first or self.force_keep_last:
                kept = force_keep(kept, prompt.n, self.force_keep_first, self.force_keep_last)
            if self.random_fill:
                kept = random_fill(kept, prompt.n, int(self.random_fill))
            timings = {"speculator_s": speculator_s, "selection_s": time.perf_counter() - t1}
            if maps is not None:
                timings["token_map_s"] = token_map_s
            plans.append(kept_plan(prompt, kept, self.position_mode, timings, self.max_gap, self.gap_scale))
        return plans


@register_method("specprefill_frozen")
@dataclass(frozen=True)
class SpecPrefillFrozen(SpecPrefill):
    """SpecPrefill over a conversation with turn 1's selection frozen: later turns append
    their new tokens whole (:mod:`specprefill.conversation`, policy ``frozen``). On one prompt
    it is SpecPrefill."""

    turn_policy: ClassVar[str | None] = "frozen"


@register_method("specprefill_revival")
@dataclass(frozen=True)
class SpecPrefillRevival(SpecPrefill):
    """SpecPrefill over a conversation with KV revival: the speculator re-scores the whole
    conversation for each new question and the base prefills the newly selected earlier
    tokens at their original positions, then the new turn (:mod:`specprefill.conversation`,
    policy ``revival``). On one prompt it is SpecPrefill."""

    turn_policy: ClassVar[str | None] = "revival"
