"""KV-cache presses (NVIDIA kvpress 0.5.5) as methods: the whole prompt is prefilled, and
the press evicts entries of the KV cache during that prefill, so decoding reads a smaller
cache. A press cannot shorten the prefill itself (its TTFT is full prefill plus its own
scoring); prompt-compression methods (SpecPrefill, LLMLingua, RAG) shorten what is
prefilled. Rows of both record what the cache holds after the prefill (``kv_tokens``,
``kv_bytes``) and the decode time, so the two families compare on TTFT, decode and memory.

The press logic is kvpress's own: ``with press(model):`` registers its forward hooks on the
attention layers (``kvpress/presses/base_press.py``), which compress the cache in place in
the forward that prefills from position 0 and leave every later forward alone. Budget:
kvpress's ``compression_ratio`` is the fraction *removed*; our ``keep_rate`` is the fraction
kept, so ``keep_rate=0.1`` is ``compression_ratio=0.9`` (both recorded in every row: the
options and ``compression_ratio``); with ``keep_tokens`` the ratio is set per prompt so
that the cache holds ``keep_tokens`` entries, the part prefilled uncompressed after the
press included.

Two settings, distinct rows (option ``query_aware``), both as kvpress's pipeline
(``KVPressTextGenerationPipeline.preprocess``) lays out a prompt: what the press compresses
is prefilled first under it, then the rest uncompressed at its original positions
(:attr:`specprefill.plan.Plan.prefix`), the question's suffix (the chat template's tail)
and the answer prefix always among the rest:

* ``true`` (default; SpecPrefill's setting, kvpress's "query-aware" evaluation, where the
  question is put inside the context): the press sees the context *and the question* and
  may evict the question's own entries; the chat template's tail and the answer prefix are
  prefilled uncompressed after it. ``compress_tail: true`` compresses those too (the whole
  prompt in one prefill under the press: this harness's first form of the setting, kept
  as a named option; rows before the option existed ran it).
* ``false``: kvpress's pipeline with ``question=``: the context (everything before the
  question) is prefilled under the press, then the question, the chat template's tail and
  the answer prefix uncompressed.

On prompts with no text parts (a latency grid's random ids) there is no question and no
tail: the whole prompt goes through the press in every setting.

kvpress is written against transformers < 5.3; on 5.19 its hooks need the
``cache_position`` argument 5.3 stopped passing to attention layers, which
:func:`specprefill.backends.transformers.cache_positions_restored` gives back around the
press. ``import kvpress`` also wraps transformers' attention functions for the whole
process (``kvpress.attention_patch``: head-wise masking for presses such as KVzip; a
pass-through otherwise); :func:`kvpress_module` takes that wrapper back out of the process
right after the import and :func:`attention_patched` puts it in for a press's own turn
only, so a reference (or any method) timed or evaluated beside a press runs transformers'
attention exactly as it does alone (``tests/test_kvpress.py`` checks both).
``tests/test_kvpress.py`` also checks, on the pinned versions, that the kept keys are the
ones the press's score chooses, computed independently.

Like MInference, a press acts inside the model, so it needs the base model in this process
(backend ``transformers``); an early-exit speculator is not used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from specprefill.backends.transformers import cache_positions_restored
from specprefill.options import FLAG, KEEP, KEEP_TOKENS, SEED, Allowed, option
from specprefill.plan import Backend, Method, Plan, Prompt, full_plan, register_method

#: The attribute :meth:`KVPress.applied` sets on the base model while its press is on.
APPLIED = "_kvpress_applied"
#: ... and the press object itself (its ratio set per prompt under ``keep_tokens``).
PRESS = "_kvpress_press"
#: kvpress's wrapped attention functions by name, taken out of transformers' registry after
#: the import (:func:`kvpress_module`) and put back only inside :func:`attention_patched`.
_WRAPPED: dict[str, Any] = {}
#: How many :func:`attention_patched` blocks are open (their wrappers stay while one is).
_OPEN = [0]


def _attention_functions() -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def _unpatch() -> None:
    """Take kvpress's wrappers out of transformers' attention registry (kvpress sets them in
    the registry instance's local mapping, over transformers' own global one), keeping them
    in :data:`_WRAPPED`."""
    local = _attention_functions()._local_mapping
    for name, fn in list(local.items()):
        if getattr(fn, "__module__", "") == "kvpress.attention_patch":
            _WRAPPED[name] = fn
            del local[name]


def kvpress_module() -> Any:
    """kvpress, imported without its process-wide attention patch (see the module's doc);
    importing it any other way (``import kvpress`` elsewhere first) is undone here too."""
    module = importlib.import_module("kvpress")
    if not _OPEN[0]:
        _unpatch()
    return module


@contextlib.contextmanager
def attention_patched() -> Iterator[None]:
    """kvpress's attention wrappers in transformers' registry for the body only (a press's
    own turn; kvpress's head-wise presses need them), transformers' own functions after."""
    kvpress_module()
    local = _attention_functions()._local_mapping
    before = {name: local[name] for name in _WRAPPED if name in local}
    local.update(_WRAPPED)
    _OPEN[0] += 1
    try:
        yield
    finally:
        _OPEN[0] -= 1
        for name in _WRAPPED:
            if name in before:
                local[name] = before[name]
            else:
                local.pop(name, None)


def _first_token_from(prompt: Prompt, tokenizer: Any, boundary: int, what: str) -> int | None:
    """The index of the prompt's first token starting at or after character ``boundary`` of
    its text, from the tokenizer's offsets; None where the prompt has no text parts (random
    ids) or no token starts there. Refuses a prompt whose text does not tokenize to its ids."""
    if not (prompt.context or prompt.question):
        return None
    text = prompt.text()
    enc = tokenizer(text, add_special_tokens=prompt.add_special_tokens, return_offsets_mapping=True)
    if list(enc["input_ids"]) != prompt.input_ids.tolist():
        raise ValueError(f"the prompt's text does not tokenize to its ids; {what} is unknown")
    for i, (start, end) in enumerate(enc["offset_mapping"]):
        if end > start and start >= boundary:
            return i
    return None


def question_start(prompt: Prompt, tokenizer: Any) -> int | None:
    """The index of the prompt's first token after its context (the question's first)."""
    boundary = len(prompt.head) + len(prompt.instruction) + len(prompt.context)
    return _first_token_from(prompt, tokenizer, boundary, "the question's first token")


def question_end(prompt: Prompt, tokenizer: Any) -> int | None:
    """The index of the prompt's first token after its question (the chat template's tail,
    else the answer prefix); None without text parts or when nothing follows the question."""
    boundary = len(prompt.head) + len(prompt.instruction) + len(prompt.context) + len(prompt.question)
    return _first_token_from(prompt, tokenizer, boundary, "the question's end")


#: ``n_sink``: the first tokens a press always keeps.
SINK = Allowed(int, ge=0, note="first tokens always kept")


@dataclass(frozen=True)
class KVPress(Method):
    """One kvpress press at ``compression_ratio = 1 - keep_rate``; subclasses name the press
    class and add its options (their fields, passed to it by name)."""

    acts_in_model: ClassVar[bool] = True
    compresses_cache: ClassVar[bool] = True
    #: The kvpress class this method applies.
    press_class: ClassVar[str]
    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    query_aware: bool = option(True, Allowed(bool, note="the press sees the question"))
    compress_tail: bool = option(False, Allowed(bool, note="also compress the chat tail and answer prefix"))

    def __post_init__(self) -> None:
        if self.compress_tail and not self.query_aware:
            raise ValueError(
                "compress_tail=true with query_aware=false: the question and the tail are prefilled uncompressed when "
                "the press does not see the question; allowed: compress_tail=true only with query_aware=true"
            )

    @property
    def compression_ratio(self) -> float:
        """kvpress's budget: the fraction of the cache removed."""
        return round(1.0 - float(self.keep_rate), 12)

    def press(self) -> Any:
        """The kvpress press object (kvpress imported here, its attention patch taken back:
        :func:`kvpress_module`)."""
        kvpress = kvpress_module()

        extra = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("keep_rate", "keep_tokens", "query_aware", "compress_tail"):
            extra.pop(name)
        return getattr(kvpress, self.press_class)(compression_ratio=self.compression_ratio, **extra)

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """The press's hooks on the backend's base model for the body, removed on exit
        (kvpress's own context manager), with ``cache_position`` restored for them."""
        base: Any = getattr(backend, "base", None)
        if base is None:
            yield
            return
        if getattr(base, APPLIED, None) is not None:
            raise RuntimeError(f"{self.name}: the base model already has a press on: {getattr(base, APPLIED)!r}")
        press = self.press()
        with cache_positions_restored(base), attention_patched(), press(base):
            setattr(base, APPLIED, self)
            setattr(base, PRESS, press)
            try:
                yield
            finally:
                delattr(base, APPLIED)
                delattr(base, PRESS)

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        base: Any = getattr(backend, "base", None)
        if base is None or getattr(base, APPLIED, None) != self:
            raise RuntimeError(
                f"{self.name}: plan() ran outside {type(self).__name__}.applied(backend) (or on a backend without the "
                f"base model in this process), so no press is on and its prefill would be full prefill recorded as "
                f"{self.name}; runners enter method.applied(backend) around the method's turn"
            )
        plan = full_plan(prompt)
        if not (self.query_aware and self.compress_tail):
            split = question_end if self.query_aware else question_start
            plan = dataclasses.replace(plan, prefix=split(prompt, backend.tokenizer))
        if self.keep_tokens is not None:  # a budget in tokens: the cache holds that many, the uncompressed rest too
            pressed = plan.prefix if plan.prefix is not None and 0 < plan.prefix < plan.k else plan.k
            kept = max(1, min(pressed, int(self.keep_tokens) - (plan.k - pressed)))
            # kvpress keeps int(n * (1 - ratio)) entries: half a token above the count, so float error cannot drop one
            getattr(base, PRESS).compression_ratio = 1.0 - (kept + 0.5) / pressed
        return plan


@register_method("snapkv")
@dataclass(frozen=True)
class SnapKV(KVPress):
    """SnapKV (Li et al., 2024): scores from the attention of the last ``window_size`` prompt
    queries, pooled with ``kernel_size``."""

    press_class: ClassVar[str] = "SnapKVPress"
    window_size: int = option(64, Allowed(int, ge=1, note="the last prompt queries that score"))
    # avg_pool1d(padding=k // 2, stride=1): an even kernel gives one score too many
    kernel_size: int = option(5, Allowed(int, ge=1, odd=True, note="the scores' pooling"))


@register_method("knorm")
@dataclass(frozen=True)
class Knorm(KVPress):
    """Keeps the keys of smallest L2 norm (Devoto et al., 2024)."""

    press_class: ClassVar[str] = "KnormPress"


@register_method("streaming_llm")
@dataclass(frozen=True)
class StreamingLLM(KVPress):
    """StreamingLLM (Xiao et al., 2024): the first ``n_sink`` tokens and the most recent."""

    press_class: ClassVar[str] = "StreamingLLMPress"
    n_sink: int = option(4, SINK)


@register_method("tova")
@dataclass(frozen=True)
class TOVA(KVPress):
    """TOVA (Oren et al., 2024): the last token's attention, averaged over heads."""

    press_class: ClassVar[str] = "TOVAPress"


@register_method("expected_attention")
@dataclass(frozen=True)
class ExpectedAttention(KVPress):
    """Expected Attention (kvpress): attention of the next ``n_future_positions`` queries,
    estimated from the query statistics."""

    press_class: ClassVar[str] = "ExpectedAttentionPress"
    n_future_positions: int = option(512, Allowed(int, ge=1))
    n_sink: int = option(4, SINK)
    use_covariance: bool = option(True, FLAG)
    use_vnorm: bool = option(True, FLAG)


@register_method("keydiff")
@dataclass(frozen=True)
class KeyDiff(KVPress):
    """KeyDiff (Park et al., 2025): keys least similar to the mean key."""

    press_class: ClassVar[str] = "KeyDiffPress"


@register_method("random_kv")
@dataclass(frozen=True)
class RandomKV(KVPress):
    """Random eviction, the presses' floor. ``seed`` fixed by default (kvpress's default
    None draws a new choice each run): a named deviation, recorded in the options."""

    press_class: ClassVar[str] = "RandomPress"
    seed: int = option(0, SEED)


@register_method("kvzip")
@dataclass(frozen=True)
class KVzip(KVPress):
    """KVzip (Kim et al., 2025): importance from reconstructing the context; it masks the
    evicted entries inside attention (head-wise) instead of shortening the cache, so
    ``kv_tokens`` and ``kv_bytes`` stay those of the full prompt."""

    press_class: ClassVar[str] = "KVzipPress"
    n_sink: int = option(4, SINK)

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """KVzip loads its tokenizer from the model config's ``name_or_path``; a model built
        here (random weights) has none, so it gets the backend's tokenizer's for the turn."""
        base: Any = getattr(backend, "base", None)
        own = getattr(getattr(base, "config", None), "_name_or_path", None)
        path = getattr(backend.tokenizer, "name_or_path", "")
        if base is None or own or not path:
            with super().applied(backend):
                yield
            return
        base.config._name_or_path = path
        try:
            with super().applied(backend):
                yield
        finally:
            base.config._name_or_path = own
