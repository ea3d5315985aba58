"""Prefill policies over a conversation: a long shared context, then several questions in turns.

The SpecPrefill paper (Liu, Chen & Zhang, ICML 2025) leaves multi-turn use to future work;
these are the ways a prefill method can carry over a conversation, measured turn by turn.
A conversation is one token sequence: turn 1's prompt, then per later turn the previous
answer and the new question (the *new segment* of that turn); positions are conversation
positions, so a token keeps its position whatever is prefilled around it.

=================  ===========================================================================
policy             what the base model prefills on turn k
=================  ===========================================================================
``prefix_cache``   full prefill with a prefix cache (method ``full``): turn 1's whole prompt,
                   then each new segment; the base holds every token. The reference.
``reselect``       the method on the whole conversation so far, from scratch, in a fresh
                   cache (``specprefill`` and any single-turn method): no reuse, the naive
                   policy; the speculator reads the whole conversation every turn.
``frozen``         turn 1 as SpecPrefill selects it; later turns append their new segment
                   whole (``specprefill_frozen``). Tokens turn 1 dropped never return.
``revival``        KV revival (``specprefill_revival``): the speculator keeps the whole
                   conversation in its own cache and reads only each new segment; its
                   attention from the new question re-scores every earlier token, the usual
                   selection runs over the earlier conversation (``keep_rate`` of it, chunks
                   and pooling as configured), and the base prefills the selected tokens it
                   does not hold yet (*revived*, at their original positions, each attending
                   only to the held tokens before it) together with the new segment whole.
=================  ===========================================================================

Turn 1 of ``frozen`` and ``revival`` is SpecPrefill's selection of turn 1's prompt. At
``keep_rate`` 1 every policy prefills every token and decodes what full prefill decodes.
The base prefills through :meth:`TransformersBackend.conversation_turn` (attention by
position), the speculator of ``revival`` through ``speculate_conversation``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specprefill.core import force_keep, select_tokens, token_importance
from specprefill.plan import Generation, Method, Prompt

#: The policies, in the order tables show them.
POLICIES = ("prefix_cache", "reselect", "frozen", "revival")


def multiturn_methods() -> dict[str, str]:
    """Every registered method with a multi-turn form, and its policy."""
    from specprefill.plan import _REGISTRY

    return {name: cls.turn_policy for name, cls in sorted(_REGISTRY.items()) if cls.turn_policy is not None}


def check_multiturn(method: Method, backend: str) -> None:
    """Refuse, before anything loads, a method or backend with no multi-turn form here."""
    if method.turn_policy is None:
        allowed = ", ".join(f"{m} ({p})" for m, p in multiturn_methods().items())
        raise ValueError(f"method {method.name!r} has no multi-turn form; allowed on a multi-turn benchmark: {allowed}")
    if backend != "transformers":
        raise ValueError(
            f"backend={backend!r} on a multi-turn benchmark: the per-turn caches are the transformers backend's "
            f"(a serving engine's prefix cache is its own); allowed: backend=transformers"
        )
    if getattr(method, "keep_tokens", None) is not None:
        raise ValueError(
            f"method {method.name!r} with keep_tokens={method.keep_tokens}: a conversation's turns grow, and its "  # type: ignore[attr-defined]
            f"policies select a fraction of each; allowed: keep_tokens=null (keep=) on a multi-turn benchmark"
        )
    if method.turn_policy in ("frozen", "revival") and getattr(method, "position_mode", "original") != "original":
        raise ValueError(
            f"method {method.name!r} with position_mode={method.position_mode!r}: a conversation keeps tokens at "  # type: ignore[attr-defined]
            f"their conversation positions; allowed: position_mode=original"
        )
    for opt in ("max_gap", "gap_scale", "random_fill"):
        if method.turn_policy in ("frozen", "revival") and getattr(method, opt, None) is not None:
            raise ValueError(
                f"method {method.name!r} with {opt}={getattr(method, opt)}: a conversation keeps tokens at their "
                f"conversation positions; allowed: {opt}=null"
            )


@dataclass
class TurnResult:
    """One turn: the base model's generation and what it took. ``held``: the conversation
    positions the base's cache holds after this turn's prefill (sorted); ``prefilled``: the
    tokens the base prefilled this turn; ``revived``: those of them from earlier turns
    (``revival`` only: 0 elsewhere); ``timings``: the method's own seconds this turn;
    ``speculator_kv_bytes``: the speculator's cache the conversation keeps after the turn
    (``revival``: its cache of the whole conversation; 0 where the speculator's cache is
    dropped after its pass), memory held beside the base's cache."""

    generation: Generation
    prompt_tokens: int
    prefilled: int
    revived: int
    held: torch.Tensor
    timings: dict[str, float] = field(default_factory=dict)
    speculator_kv_bytes: int = 0


class ConversationRun:
    """One conversation under ``method``'s policy on a backend that keeps caches between
    turns (:class:`~specprefill.backends.transformers.TransformersBackend`)."""

    def __init__(self, method: Method, backend: Any) -> None:
        if method.turn_policy is None:
            check_multiturn(method, "transformers")
        self.method = method
        self.policy = str(method.turn_policy)
        self.backend = backend
        if self.policy == "revival" and getattr(backend, "speculator_tokenizer", None) is not None:
            raise ValueError(
                "KV revival keeps the speculator's cache of the conversation in the base's tokens; a speculator from "
                "another family (its own tokenizer) has no such cache; allowed: a speculator with the base's tokenizer"
            )
        self.ids = torch.zeros(0, dtype=torch.int64)
        self.conv = backend.open_conversation() if self.policy != "reselect" else None
        self.turns = 0
        self.last: TurnResult | None = None

    def turn(self, new_ids: torch.Tensor, max_new_tokens: int, stop: Sequence[str] = ()) -> TurnResult:
        """Append ``new_ids`` (turn 1: the prompt; later: the previous answer and the new
        question) and run the turn: prefill by the policy, then greedy decoding."""
        new = new_ids.to(torch.int64)
        if new.dim() != 1 or new.numel() == 0:
            raise ValueError(f"new_ids of shape {tuple(new.shape)}; allowed: [m], m >= 1")
        before = int(self.ids.numel())
        self.ids = torch.cat([self.ids, new])
        n = int(self.ids.numel())
        segment = torch.arange(before, n, dtype=torch.int64)
        self.turns += 1
        m: Any = self.method
        b = self.backend
        timings: dict[str, float] = {}
        revived = 0
        if self.policy == "reselect":
            plan = m.plan(Prompt(self.ids), b)
            gen = b.generate(plan, max_new_tokens, stop)
            held = plan.kept_indices if plan.kept_indices is not None else torch.arange(plan.k)
            self.last = TurnResult(gen, n, plan.k, 0, held, dict(plan.timings))
            return self.last
        assert self.conv is not None
        if self.policy == "prefix_cache" or (self.policy == "frozen" and self.turns > 1):
            ids, pos = new, segment
        elif self.policy == "frozen":
            plan = m.plan(Prompt(self.ids), b)
            ids, pos, timings = plan.input_ids, plan.position_ids, dict(plan.timings)
        else:  # revival
            t0 = time.perf_counter()
            cap = b.speculate_conversation(self.conv, new, int(m.lookahead))
            timings["speculator_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            importance = token_importance(cap.queries, cap.keys, m.pool_kernel)
            if self.turns == 1:
                pos = self._select(importance, n)
            else:
                chosen = self._select(importance[:before], before)
                fresh = chosen[~torch.isin(chosen, self.conv.positions)]
                revived = int(fresh.numel())
                pos = torch.cat([fresh, segment])
            ids = self.ids[pos]
            timings["selection_s"] = time.perf_counter() - t0
        gen = b.conversation_turn(self.conv, ids, pos, n, max_new_tokens, stop)
        held = torch.sort(self.conv.positions).values
        kept = self.conv.speculator_bytes() if self.policy == "revival" else 0
        self.last = TurnResult(gen, n, int(ids.numel()), revived, held, timings, kept)
        return self.last

    def _select(self, importance: torch.Tensor, n: int) -> torch.Tensor:
        m: Any = self.method
        kept = select_tokens(importance, float(m.keep_rate), m.chunk_size)
        if m.force_keep_first or m.force_keep_last:
            kept = force_keep(kept, n, m.force_keep_first, m.force_keep_last)
        return kept

    def answer(self) -> torch.Tensor:
        """The last turn's answer as conversation tokens (what the next turn's new segment
        starts with)."""
        if self.last is None:
            raise RuntimeError("no turn has run yet: the first turn's new tokens are the prompt")
        return torch.tensor(self.last.generation.token_ids, dtype=torch.int64)
