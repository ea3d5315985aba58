"""``compose``: a prompt-side method, then a KV press during the base's prefill of what it kept
(``method=compose method.first=specprefill method.then=snapkv``): the prefill is the shorter
one the first method plans, and decoding reads a cache the press shrank further. With
``then=speckv`` the KV side is SpecKV over the kept tokens; ``first=specpc then=speckv`` is
SpecKV-PC (Galim et al., arXiv 2506.08373; ``draft_approx_llm/speckvpc/speckvpc.py`` at
d79e404, preset ``conf/method/speckvpc.yaml``): SpecPC's draft writes its look-ahead, SpecKV
reuses those tokens as its draft (no second draft), prefills the kept tokens and the draft
at the kept tokens' positions (contiguous, as SpecPC's ``generate`` numbers them), keeps C
entries per layer and head, and prefills the last kept token again.

The budget split, both recorded in every row's options: ``keep_rate`` (or ``keep_tokens``) is
the first method's, the fraction of the prompt it keeps; ``then_keep_rate`` is the press's,
the fraction of those kept tokens its cache holds, so the cache holds about ``keep_rate *
then_keep_rate`` of the prompt. ``first_options`` / ``then_options`` are each part's options
(null in a config: its ``conf/method`` preset, resolved by the harness, budgets aside).

The order of work, every part inside TTFT: the first method plans with no press on (its
speculator's forward is never compressed, even when the speculator is the base's own first
layers), then the press's hooks go on, and the base prefills the plan under them: the kept
tokens up to the question's end compressed, the chat template's tail and the answer prefix
after them uncompressed, as the press alone does (a method that rewrote the text: the whole
plan compressed). ``speculator_s`` / ``selection_s`` (or the rewriter's own parts) are the
first method's (SpecKV's own draft added where the first wrote none); the press's scoring is
inside the base's prefill, as for a press alone. SpecKV's budget: ``then_keep_rate`` of the
kept tokens, or ``then_options.max_capacity_prompt`` (entries, as their 256 / 512 / 1024).
Needs the base in this process (backend ``transformers``): refused on vLLM before loading.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from baselines.kv_presses import APPLIED, KVPress, question_end
from baselines.speckv import SpecKV
from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import (
    Backend,
    Method,
    Plan,
    Prompt,
    build_method,
    method_class,
    register_method,
    registered_methods,
)

#: The attribute :meth:`Compose.applied` sets on the base model: the open stack the press
#: goes on in (:meth:`Compose.plan` enters it once the first method has planned).
STACK = "_compose_stack"


@register_method("compose")
@dataclass(frozen=True)
class Compose(Method):
    acts_in_model: ClassVar[bool] = True
    compresses_cache: ClassVar[bool] = True
    #: The options naming the parts (the harness resolves their ``*_options`` from presets).
    parts: ClassVar[tuple[str, ...]] = ("first", "then")

    first: str = option("specprefill", Allowed(str, note="a method that keeps prompt tokens"))
    then: str = option("snapkv", Allowed(str, note="a KV press or speckv"))
    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    then_keep_rate: float = option(0.5, Allowed(float, gt=0, le=1, note="of the first method's kept tokens"))
    first_options: dict[str, Any] = option(allowed=Allowed(dict, null=True), factory=dict)
    then_options: dict[str, Any] = option(allowed=Allowed(dict, null=True), factory=dict)

    def __post_init__(self) -> None:
        for part in self.parts:
            if getattr(self, part) not in registered_methods():
                raise ValueError(
                    f"{part}={getattr(self, part)!r} is not a method; allowed: one of {registered_methods()}"
                )
        if not issubclass(method_class(self.then), (KVPress, SpecKV)):
            raise ValueError(
                f"then={self.then!r} is not a KV-side method; allowed: a kvpress method (snapkv, knorm, tova, ...) "
                f"or speckv"
            )
        first = self.first_method()
        self.then_method()  # its options checked
        if first.compresses_cache or first.acts_in_model or first.identity or first.turn_policy == "revival":
            raise ValueError(
                f"first={self.first!r} does not keep prompt tokens before the prefill; allowed: a prompt-side method "
                f"(specprefill, specpc, truncate, random, gemfilter, rag_bm25, rag_dense, the LLMLingua family)"
            )
        given = self.then_options or {}
        if not self.speckv and (given.get("query_aware", True) is not True or given.get("compress_tail", False)):
            raise ValueError(
                f"then_options={given}: the press compresses the kept tokens up to the question's end and the tail "
                f"after it whole; allowed: query_aware true, compress_tail false"
            )
        if self.speckv and self.first == "specpc" and given.get("lookahead_tokens") is not None:
            raise ValueError(
                f"then_options.lookahead_tokens={given['lookahead_tokens']}: SpecKV reuses SpecPC's draft here "
                f"(SpecKV-PC), so it drafts nothing of its own and would not read it; allowed: null, or "
                f"first_options.lookahead_tokens=N for the draft's length"
            )
        object.__setattr__(self, "needs_speculator", first.needs_speculator)
        object.__setattr__(self, "reads_base", first.reads_base)

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        first = self.first_method()
        try:
            first.check_model(model, layers, max_context, longest_prompt, draft_layers)
        except ValueError as e:
            raise ValueError(f"first={self.first}: {e} (its options: method.first_options.<name>=...)") from e
        # SpecKV prefills what the first method keeps (at most its budget), not the prompt
        kept = getattr(first, "max_capacity_prompt", None) or num_kept(longest_prompt, first.keep_for(longest_prompt))
        longest_kept = min(longest_prompt, int(kept)) if self.speckv else longest_prompt
        self.then_method().check_model(model, layers, max_context, longest_kept, draft_layers)

    def first_method(self) -> Method:
        budget = {"keep_rate": self.keep_rate, "keep_tokens": self.keep_tokens}
        return build_method(self.first, {**(self.first_options or {}), **budget})

    @property
    def speckv(self) -> bool:
        """Whether the KV side is SpecKV (SpecKV-PC when the first method is SpecPC)."""
        return issubclass(method_class(self.then), SpecKV)

    @property
    def needs_answer_length(self) -> bool:
        first = self.first_method()
        return first.needs_answer_length or (self.then_method().needs_answer_length and not first.writes_draft)

    def then_method(self) -> Method:
        opts = {**(self.then_options or {}), "keep_rate": self.then_keep_rate}
        if self.speckv:
            return build_method(self.then, opts)
        return build_method(self.then, {**opts, "query_aware": True, "compress_tail": False})

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """The first method's scope, and an open stack the press goes on in at :meth:`plan`;
        everything closed on exit."""
        base: Any = getattr(backend, "base", None)
        with contextlib.ExitStack() as stack, self.first_method().applied(backend):
            if base is not None:
                setattr(base, STACK, stack)
                stack.callback(delattr, base, STACK)
            yield

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        base: Any = getattr(backend, "base", None)
        stack = getattr(base, STACK, None)
        if stack is None:
            raise RuntimeError(
                f"{self.name}: plan() ran outside Compose.applied(backend) (or on a backend without the base model in "
                f"this process); runners enter method.applied(backend) around the method's turn"
            )
        then = self.then_method()
        on = getattr(base, APPLIED, None)
        if on is not None and on != then:
            raise RuntimeError(f"{self.name}: another press is on the base model: {on!r}")
        if on is not None:  # planned before in this scope (a latency job's iterations): off for the first method
            raise RuntimeError(
                f"{self.name}: plan() ran twice in one applied() scope; the press would be on during the first "
                f"method's planning; allowed: one plan per method.applied(backend)"
            )
        plan = self.first_method().plan(prompt, backend)  # no press on yet
        stack.enter_context(then.applied(backend))  # its press built at then_keep_rate
        if isinstance(then, SpecKV):
            return then.plan_after(plan, prompt, backend)
        kept = plan.kept_indices
        end = question_end(prompt, backend.tokenizer) if kept is not None else None
        if kept is None or end is None:
            return plan
        pressed = int(torch.count_nonzero(kept < end))
        return dataclasses.replace(plan, prefix=pressed if 0 < pressed < plan.k else None)
