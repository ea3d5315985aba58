"""The one interface every prefill method implements, and the records it exchanges.

A :class:`Method` turns a tokenized prompt into a :class:`Plan`: which token ids the base
model prefills, at which position ids, and what choosing them cost. Full prefill,
SpecPrefill and every baseline are siblings behind it; the runner never asks which one
it holds. Methods that need something from the backend (a speculator's attention) ask
for it through the :class:`Backend` protocol, so the algorithm never touches model code.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import torch


def prompt_text(head: str, instruction: str, context: str, question: str, tail: str, answer_prefix: str) -> str:
    """The prompt text from its parts, the one place it is assembled: the user turn
    (``instruction + context + question``) inside the chat template's ``head`` and
    ``tail``, then the answer prefix."""
    return head + instruction + context + question + tail + answer_prefix


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt plus its text parts (methods that rewrite text need them).

    ``input_ids``: int64 ``[N]``. The text parts concatenate (inside the model's chat
    template) to the prompt; ``context`` is the part compression methods may shorten.
    """

    input_ids: torch.Tensor
    instruction: str = ""
    context: str = ""
    question: str = ""
    answer_prefix: str = ""
    #: Chat-template text around the user turn: the prompt text is
    #: ``head + instruction + context + question + tail + answer_prefix``.
    head: str = ""
    tail: str = ""
    #: Whether tokenizing the prompt text adds special tokens (for methods that re-tokenize).
    add_special_tokens: bool = False
    #: The tokens the answer may take (the task's ``max_new_tokens`` as the run budgets it),
    #: for a method whose draft writes the answer ahead (SpecKV); None where no answer is
    #: asked (a latency grid's prompts).
    answer_tokens: int | None = None

    @property
    def n(self) -> int:
        return int(self.input_ids.shape[0])

    def text(self, context: str | None = None) -> str:
        """The prompt text, with ``context`` in place of the original context if given."""
        ctx = self.context if context is None else context
        return prompt_text(self.head, self.instruction, ctx, self.question, self.tail, self.answer_prefix)


@dataclass(frozen=True)
class Plan:
    """What the base model prefills.

    ``input_ids`` and ``position_ids``: int64 ``[K]``. ``next_position``: position id of
    the first generated token (N for original positions, K for contiguous ones).
    ``kept_indices``: int64 ``[K]`` indices into the prompt, or None when the method
    rewrote the text. ``timings``: the method's own cost in seconds, by part
    (``speculator_s``, ``selection_s``, ...); their sum counts inside TTFT.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    next_position: int
    kept_indices: torch.Tensor | None
    timings: Mapping[str, float] = field(default_factory=dict)
    #: Prefill ``input_ids[:prefix]`` in one forward and the rest in a second, into the same
    #: cache (a KV press acting inside the model compresses the first part only: the context
    #: before the question is seen). None: the whole plan in one forward.
    prefix: int | None = None
    #: The draft model's answer, when the method wrote one (SpecPC's look-ahead): int64 ``[T]``.
    #: A composed SpecKV reads it instead of drafting again (SpecKV-PC, baselines/compose.py).
    draft_ids: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def kept(self) -> int:
        """The prompt's tokens the base prefills (a text rewrite: its own tokens): ``k`` less
        what the method adds to the prefill (SpecKV's draft and the last token again)."""
        return int(self.kept_indices.shape[0]) if self.kept_indices is not None else self.k

    @property
    def method_s(self) -> float:
        return float(sum(self.timings.values()))


@dataclass(frozen=True)
class SpeculatorCapture:
    """Post-RoPE attention inputs of the speculator (the SpecPrefill paper: queries and keys after RoPE).

    ``queries``: ``[layers, heads, L, d]`` for the last prompt token and the L-1
    look-ahead tokens; ``keys``: ``[layers, kv_heads, N, d]`` of the prompt tokens only;
    ``lookahead_ids``: the L-1 tokens the speculator generated.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    lookahead_ids: list[int]


@dataclass(frozen=True)
class Generation:
    """What the base model produced for one plan. Times in seconds.

    ``prefill_s``: the base model's prefill of the plan up to the first token's logits;
    ``decode_s``: the remaining tokens. ``timing_source`` says where they come from:
    ``wall`` (timed around the model calls in this process), ``engine`` (the serving
    engine's own request timestamps), or ``none`` (not measured: both are NaN, never a
    silent stand-in). ``first_logits``: float32 ``[vocab]`` at the last prefilled token,
    where the backend exposes them (else None).
    """

    text: str
    token_ids: list[int]
    prefill_s: float
    decode_s: float
    timing_source: str = "wall"
    first_logits: torch.Tensor | None = None
    #: The base model's KV cache after the prefill: tokens held per layer (the most over
    #: layers) and bytes over all layers, keys and values; None where the backend cannot see
    #: its cache (a serving engine).
    kv_tokens: int | None = None
    kv_bytes: int | None = None


#: Method options added after results were first stored, with their defaults
#: (:meth:`Method.options` leaves them out at these values).
LATER_OPTIONS: dict[str, Any] = {"keep_tokens": None, "max_gap": None, "gap_scale": None, "random_fill": None}


class Unsupported(RuntimeError):
    """Raised by a method that cannot run on this hardware or setup; the runner records
    the sample as ``unsupported`` with the reason and goes on."""


#: What part of the prompt a method reduces, recorded with every row.
SCOPES = ("prompt", "context", "query_aware_context")
#: Where kept tokens sit: at their original positions (decoding from N), re-numbered 0..K-1
#: (decoding from K), spread evenly over the original span 0..N-1 in their order (decoding
#: from N: :func:`spread_positions`), or with runs of neighbours kept adjacent and the empty
#: positions shared evenly among the gaps between runs (decoding from N: :func:`even_gap_positions`).
POSITION_MODES = ("original", "contiguous", "spread", "even_gaps")


def check_keep(keep_rate: object) -> None:
    """Reject a keep rate outside (0, 1], naming the value."""
    if isinstance(keep_rate, bool) or not isinstance(keep_rate, int | float):
        raise ValueError(f"keep_rate={keep_rate!r} must be a number in (0, 1]")
    if not 0.0 < float(keep_rate) <= 1.0:
        raise ValueError(f"keep_rate={keep_rate} is outside (0, 1]; e.g. keep=0.3 keeps 30% of prompt tokens")


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Reject an option value outside ``allowed``, naming both."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {list(allowed)}")


def check_int(name: str, value: object, low: int) -> None:
    """Reject an option that is not an int >= ``low`` (bools included), naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}; allowed: int >= {low}")


def check_position_mode(mode: str) -> None:
    if mode not in POSITION_MODES:
        raise ValueError(f"position_mode={mode!r} is invalid; allowed: {list(POSITION_MODES)}")


class Backend(Protocol):
    """The backend that owns the models: what methods may ask of it (``tokenizer``,
    ``speculate*``, ``draft``, ``base_capture``), and what the harness runs plans with
    (``generate`` for eval, ``prefill`` for latency). ``method_flops`` counts the model
    FLOPs of the calls made on a method's behalf (speculator, early layers), for ideal
    speedups; the harness reads and resets it around a method's ``plan``. A backend that can
    measure its KV cache sets ``last_kv`` after each ``prefill``: (tokens the cache holds, its
    bytes per prompt of the batch); one that cannot (vLLM's paged cache) leaves it unset. With
    ``decode_tokens``, ``prefill`` also decodes that many tokens after its clock stops and
    sets ``last_decode_s`` (the transformers backend; vLLM refuses it)."""

    name: str
    tokenizer: Any
    method_flops: int

    @property
    def base_config(self) -> Any: ...

    def speculate(self, input_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture: ...

    def speculate_batch(self, input_ids: torch.Tensor, lookahead: int) -> list[SpeculatorCapture]: ...

    def speculate_window(self, input_ids: torch.Tensor, window: int, draft: int = 0) -> SpeculatorCapture: ...

    def draft(self, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]: ...

    def base_capture(self, input_ids: torch.Tensor, num_layers: int) -> SpeculatorCapture: ...

    def generate(self, plan: Plan, max_new_tokens: int, stop: Sequence[str] = ()) -> Generation: ...

    def prefill(self, plans: Sequence[Plan], decode_tokens: int = 0) -> float: ...


class Method(ABC):
    """One prefill strategy. Subclasses are frozen dataclasses of their options."""

    name: ClassVar[str]
    #: Whether the method needs the backend's speculator model.
    needs_speculator: ClassVar[bool] = False
    #: ``prompt``: chooses among all prompt tokens; ``context``: shortens the context only,
    #: without the question; ``query_aware_context``: shortens the context using the
    #: question. Instruction, question and answer prefix stay whole for the latter two.
    scope: ClassVar[str] = "prompt"
    #: Whether every plan is the whole prompt at its own positions (full prefill): such a
    #: method is served by the engine directly, with no planning front.
    identity: ClassVar[bool] = False
    #: Whether the method changes how the base model computes (a sparse-attention patch, a
    #: KV press), through :meth:`applied`; such a method needs the base model in this
    #: process (backend ``transformers``), where the hook can reach it.
    acts_in_model: ClassVar[bool] = False
    #: Whether the keep budget applies to the base model's KV cache after the prefill (a KV
    #: press: every token is prefilled, the cache keeps ``keep_rate`` of them) rather than
    #: to what the plan prefills.
    compresses_cache: ClassVar[bool] = False
    #: Whether the method reads the base model's own attention (``Backend.base_capture``:
    #: GemFilter), which only a backend holding the base in this process exposes.
    reads_base: ClassVar[bool] = False
    #: How the method carries over a conversation's turns (:mod:`specprefill.conversation`:
    #: ``prefix_cache``, ``reselect``, ``frozen``, ``revival``); None: no multi-turn form.
    turn_policy: ClassVar[str | None] = None
    #: Whether its plans carry the draft model's answer (``Plan.draft_ids``: SpecPC's look-ahead).
    writes_draft: ClassVar[bool] = False

    @property
    def needs_answer_length(self) -> bool:
        """Whether planning needs the prompt's answer length (``Prompt.answer_tokens``: a draft
        of the task's answer length), which random token ids do not have."""
        return False

    def __post_init__(self) -> None:  # noqa: B027  (a hook with nothing to do by default, not abstract)
        """A method dataclass's own rules that tie options together (its fields were checked
        against their declarations first: :func:`register_method`). Defined here so that
        every method dataclass's ``__init__`` calls it."""

    def keep_for(self, n: int) -> float:
        """The fraction of a prompt of ``n`` tokens this method keeps: ``keep_tokens / n``
        (capped at 1) where the method has a token budget set (``keep_tokens=``), else its
        ``keep_rate``. ``num_kept(n, keep_for(n))`` is then exactly the budget."""
        tokens = getattr(self, "keep_tokens", None)
        if tokens is not None:
            return min(1.0, int(tokens) / n)
        return float(getattr(self, "keep_rate", 1.0))

    def options(self) -> dict[str, Any]:
        """The options recorded in every result row and in the run's identity; an option added
        after runs were stored (:data:`LATER_OPTIONS`) only where it is not at its default, so
        adding one orphans no stored run and changes no stored row's ``method_options``."""
        d: dict[str, Any] = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}
        return {k: v for k, v in d.items() if not (k in LATER_OPTIONS and v == LATER_OPTIONS[k])}

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        """Refuse, before anything loads, options the model's shape cannot take: a
        ``ValueError`` naming the option and what is allowed. ``model``: its name (for the
        message); ``layers``: the base's layer
        count (None where unknown); ``max_context``: its context window; ``longest_prompt``:
        the run's longest prompt in tokens; ``draft_layers``: the speculator's (draft's)
        layer count where the model has one and its shape is known. Nothing to check by default."""
        return None

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """The scope in which this method acts inside the backend's model; nothing by default.

        A method that changes the model itself (MInference's sparse-attention patch, a KV
        press) does it here, not in :meth:`plan`: on entry it changes the model, on exit it
        restores it exactly (every replaced function and attribute back to the original
        object), also when the body raises. Runners enter it around this method's turn
        only (its planning and the base model's prefill/decode of its plans) and leave it
        before anything else runs on the same backend, so a reference measured beside it
        (``make latency`` interleaves both, iteration by iteration, on one model) is never
        touched. Entering it is not timed: it is set-up, like loading the model. A method
        that cannot run here does not raise from it; its :meth:`plan` raises
        :class:`Unsupported`, so the runner records the sample and goes on."""
        yield

    @abstractmethod
    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        """Choose what the base model prefills for ``prompt``."""

    def plan_batch(self, prompts: Sequence[Prompt], backend: Backend) -> list[Plan]:
        """Plans for a batch of prompts (latency grids). One at a time by default; a
        method whose own model runs batched overrides it. Each plan's ``timings`` are its
        share of the batch's cost, so they sum to what the batch cost."""
        return [self.plan(p, backend) for p in prompts]


_REGISTRY: dict[str, type[Method]] = {}
M = TypeVar("M", bound=type[Method])


def register_method(name: str) -> Callable[[M], M]:
    """Class decorator: make a method buildable by name from config."""

    def wrap(cls: M) -> M:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method name {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _declared_first(cls)
        _REGISTRY[name] = cls
        return cls

    return wrap


def _declared_first(cls: type) -> None:
    """Make ``cls(...)`` check every field against its declaration (specprefill.options)
    before the class's own ``__post_init__`` (rules that tie options together), however
    the method is built: by name from a config, or directly in Python."""
    from specprefill.options import check_declared

    if not dataclasses.is_dataclass(cls) or getattr(cls, "_declared_first", None) is cls:
        return
    # the class's own rules, else the nearest base's (Method's at the end: nothing to do)
    own = next(c.__dict__["__post_init__"] for c in cls.__mro__ if "__post_init__" in c.__dict__)

    def __post_init__(self: Any) -> None:
        if type(self) is cls:  # once, by the most derived class (a subclass calls super's)
            check_declared(self, f"method {cls.name!r}: ")
        own(self)

    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
    cls._declared_first = cls  # type: ignore[attr-defined]


def registered_methods() -> list[str]:
    return sorted(_REGISTRY)


def method_class(name: str) -> type[Method]:
    """The class registered as ``name`` (unknown: a ``ValueError`` listing them)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; allowed: {registered_methods()}")
    return _REGISTRY[name]


def build_method(name: str, options: Mapping[str, Any]) -> Method:
    """Instantiate a registered method; unknown names and options, and values their
    declarations refuse, get a clear error in one line."""
    import difflib

    from specprefill.options import check_options

    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown method {name!r}; allowed: {registered_methods()}{hint}")
    cls = _REGISTRY[name]
    allowed: set[str] = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"method {name!r} has no option(s) {unknown}; allowed: {sorted(allowed)}")
    try:  # each value against its field's declaration (specprefill.options), then the class's own rules
        check_options(cls, options)
    except ValueError as e:
        raise ValueError(f"method {name!r}: {e}") from None
    return cls(**options)


def text_plan(prompt: Prompt, backend: Backend, context: str, timings: Mapping[str, float]) -> Plan:
    """A plan for a method that rewrote the context: the new prompt text, re-tokenized,
    at contiguous positions (no token maps back to the original prompt)."""
    ids = backend.tokenizer(prompt.text(context), add_special_tokens=prompt.add_special_tokens).input_ids
    t = torch.tensor(ids, dtype=torch.int64)
    k = int(t.shape[0])
    return Plan(
        input_ids=t,
        position_ids=torch.arange(k, dtype=torch.int64),
        next_position=k,
        kept_indices=None,
        timings=dict(timings),
    )


def position_steps(kept: torch.Tensor, n: int) -> torch.Tensor:
    """The steps of ``kept``'s original positions (sorted indices into a prompt of ``n``
    tokens): into the first kept token (from position -1), between kept tokens, and from the
    last to the first generated token (index ``n``); ``K + 1`` of them, a step of ``s`` leaving
    ``s - 1`` positions empty. The position treatments below rewrite these steps."""
    kept = kept.to(torch.int64)
    last = int(kept[-1]) if kept.numel() else -1
    return torch.cat([torch.diff(kept, prepend=kept.new_tensor([-1])), kept.new_tensor([n - last])])


def positions_of_steps(steps: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the kept tokens' positions, the first generated token's) that ``steps``
    (:func:`position_steps`, rewritten) walk from position -1."""
    pos = steps.cumsum(0) - 1
    return pos[:-1], int(pos[-1])


def check_gap_options(position_mode: str, max_gap: int | None, gap_scale: float | None) -> None:
    """Refuse ``max_gap`` or ``gap_scale`` with another position mode than the original, or both
    together: each rewrites the gaps of the original positions."""
    if max_gap is not None and position_mode != "original":
        raise ValueError(
            f"max_gap={max_gap} with position_mode={position_mode!r}: it caps the gaps of the original positions; "
            f"allowed: max_gap=null, or position_mode='original'"
        )
    if gap_scale is not None and (position_mode != "original" or max_gap is not None):
        raise ValueError(
            f"gap_scale={gap_scale} with position_mode={position_mode!r} and max_gap={max_gap}: it scales the gaps of "
            f"the original positions; allowed: gap_scale=null, or position_mode='original' with max_gap=null"
        )


def capped_positions(kept: torch.Tensor, n: int, max_gap: int) -> tuple[torch.Tensor, int]:
    """The original positions of ``kept`` (sorted indices into a prompt of ``n`` tokens) with
    every step (:func:`position_steps`) longer than ``max_gap`` shortened to ``max_gap``.
    Returns (positions, next position). Order and every step of at most ``max_gap`` stay as
    they were; ``max_gap=1`` is the re-numbered 0..K-1 (decoding from K), a ``max_gap`` of
    ``n`` or more the original positions (decoding from N)."""
    if isinstance(max_gap, bool) or not isinstance(max_gap, int) or max_gap < 1:
        raise ValueError(f"max_gap={max_gap!r}; allowed: int >= 1 (null: the original positions as they are)")
    return positions_of_steps(position_steps(kept, n).clamp(max=max_gap))


def spread_positions(k: int, n: int) -> torch.Tensor:
    """Positions for ``k`` kept tokens of a prompt of ``n`` spread evenly over the prompt's
    span, in their order: ``floor(i * n / k)`` for i = 0..k-1 (strictly increasing, as
    ``n >= k``; the first at 0, the first generated token at ``n``). The span and the number
    of empty positions are the original positions' (N and N - K), but every gap is N/K - 1 or
    N/K wide: no long empty stretch, and each kept token sits where its rank, not its place
    in the prompt, puts it."""
    if k > n:
        raise ValueError(f"k={k} kept tokens of a prompt of n={n}; allowed: k <= n")
    return torch.div(torch.arange(k, dtype=torch.int64) * n, max(k, 1), rounding_mode="floor")


def even_gap_positions(kept: torch.Tensor, n: int) -> torch.Tensor:
    """Positions for ``kept`` (sorted indices into a prompt of ``n`` tokens) that keep each
    run of neighbouring kept tokens adjacent, as the original positions do, and share the
    original positions' N - K empty positions evenly among its gaps: before the first kept
    token, between runs and after the last (``floor(E / g)`` each, one more for the first
    ``E mod g``), so the first generated token is at ``n`` again. The span, the order, the
    runs and the number of empty positions are the original positions'; what differs is that
    no gap is longer than the others."""
    steps = position_steps(kept, n)
    gaps = steps > 1
    g, empty = int(gaps.sum()), int((steps - 1).sum())
    if g:
        share = torch.full((g,), empty // g, dtype=torch.int64)
        share[: empty % g] += 1
        steps = torch.ones_like(steps)
        steps[gaps] += share
    return positions_of_steps(steps)[0]


def scaled_positions(kept: torch.Tensor, n: int, scale: float) -> tuple[torch.Tensor, int]:
    """The original positions of ``kept`` (sorted indices into a prompt of ``n`` tokens) with
    every step's (:func:`position_steps`) empty positions multiplied by ``scale`` in (0, 1]
    (rounded half up, at least 1 where there was one, so no two runs merge). Order, runs and
    the gaps' proportions stay; the span shrinks. Returns (positions, next position);
    ``scale=1`` is the original positions."""
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0.0 < float(scale) <= 1.0:
        raise ValueError(f"gap_scale={scale!r}; allowed: a number in (0, 1] (null: the original positions as they are)")
    empty = position_steps(kept, n) - 1
    scaled = torch.where(empty > 0, torch.floor(empty.double() * float(scale) + 0.5).clamp(min=1).to(torch.int64), 0)
    return positions_of_steps(1 + scaled)


def kept_plan(
    prompt: Prompt,
    kept: torch.Tensor,
    position_mode: str,
    timings: Mapping[str, float],
    max_gap: int | None = None,
    gap_scale: float | None = None,
) -> Plan:
    """A plan that keeps prompt tokens ``kept`` (sorted), at their original positions
    (decoding from N), with gaps capped at ``max_gap`` (:func:`capped_positions`) or scaled by
    ``gap_scale`` (:func:`scaled_positions`; original positions only, one of the two), spread
    evenly over 0..N-1 (:func:`spread_positions`; decoding from N), its runs adjacent with the
    gaps between them made even (:func:`even_gap_positions`; decoding from N), or re-numbered
    0..K-1 (decoding from K)."""
    check_position_mode(position_mode)
    check_gap_options(position_mode, max_gap, gap_scale)
    if gap_scale is not None:
        positions, next_pos = scaled_positions(kept, prompt.n, gap_scale)
    elif max_gap is not None:
        positions, next_pos = capped_positions(kept, prompt.n, max_gap)
    elif position_mode == "original":
        positions, next_pos = kept, prompt.n
    elif position_mode == "spread":
        positions, next_pos = spread_positions(int(kept.shape[0]), prompt.n), prompt.n
    elif position_mode == "even_gaps":
        positions, next_pos = even_gap_positions(kept, prompt.n), prompt.n
    else:
        positions, next_pos = torch.arange(kept.shape[0], dtype=torch.int64), int(kept.shape[0])
    return Plan(
        input_ids=prompt.input_ids[kept],
        position_ids=positions,
        next_position=next_pos,
        kept_indices=kept,
        timings=dict(timings),
    )


def full_plan(prompt: Prompt) -> Plan:
    """Every prompt token at its own position."""
    n = prompt.n
    idx = torch.arange(n, dtype=torch.int64)
    return Plan(input_ids=prompt.input_ids, position_ids=idx, next_position=n, kept_indices=idx)
