"""``speckv``: the draft model's answer chooses which KV entries of the target to keep (SpecKV;
Galim et al., "Draft-based Approximate Inference for LLMs", arXiv 2506.08373; code:
furiosa-ai/draft-based-approx-llm, ``draft_approx_llm/speckv/``, read at commit d79e404).

As the authors' code does it (``speckv_generate``, ``speckv_generate_from_lookahead_ids``,
``util.compress_kv``):

1. The draft (the model config's speculator) writes its greedy answer to the prompt: up to
   ``lookahead_tokens`` tokens (null, their setting: the task's answer length), stopping after
   its EOS, as ``generate`` does.
2. The target prefills the prompt and the draft's L tokens in one forward (every token: SpecKV
   does not shorten the prefill). In every layer, after its attention, the cache is
   compressed: with ``W = window_size + L + 1`` (the last ``window_size + 1`` prompt tokens
   and the draft's), the post-RoPE queries of the last W tokens attend (scaled by
   ``1/sqrt(d)``, causal within the window, softmax in float32 over every key) to the keys
   before the window; per KV head the scores are reduced over its query heads and the W
   queries (``reduction_type`` max), pooled over keys (``pool_type`` max, ``kernel_size`` 7,
   ``padding = kernel // 2``), and the top ``C - window_size`` keys kept (C =
   ``max_capacity_prompt``: 256 / 512 / 1024 in the paper; null: ``ceil(N * keep_rate)``, the
   harness's keep sweeps), followed by the window's keys. Layers and KV heads choose their own
   keys; positions stay the original ones (the keys carry their RoPE).
3. The cache is cut to its first C entries (``DynamicCache.crop(C)``): the chosen keys and the
   first ``window_size`` of the window, i.e. without the prompt's last token and the draft's.
   The target then prefills the prompt's last token again, at its own position N-1, over that
   cache; its logits give the first token, and decoding goes on from position N.

A prompt of at most C tokens is generated whole (the draft still ran, as in theirs). Their
prefill switches to MInference's vertical-slash sparse attention above
``prefill_window_size + prefill_vertical_size`` tokens (4096), with the scores' top
``prefill_vertical_size`` keys as its verticals; this harness does not run that kernel for
SpecKV: such prompts are refused unless ``sparse_prefill: false`` (a dense prefill, a named
deviation recorded in the rows). TTFT counts the draft's answer (``speculator_s``) and the
target's prefill of N + L + 1 tokens; the rows carry the cache left (``kv_tokens``,
``kv_bytes``) and the decode time, like the KV presses'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from baselines.specpc import check_one_budget
from specprefill.backends.transformers import compressing_cache
from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import Backend, Method, Plan, Prompt, full_plan, register_method

#: The attribute :meth:`SpecKV.applied` sets on the base model while its hook is on: the turn's
#: window and budget, which :meth:`SpecKV.plan` fills in for the hook.
TURN = "_speckv_turn"


def speckv_indices(
    queries: torch.Tensor,
    keys: torch.Tensor,
    window: int,
    keep: int,
    reduction: str = "max",
    pool: str = "max",
    kernel: int = 7,
) -> torch.Tensor:
    """The keys each KV head keeps before the window (step 2 of the module's doc):
    ``queries`` ``[B, H, window, d]`` (post-RoPE, the forward's last ``window`` tokens),
    ``keys`` ``[B, KVH, S, d]`` -> int64 ``[B, KVH, keep]``, indices into ``[0, S - window)``
    in order of score."""
    b, heads, w, d = queries.shape
    kv_heads, s = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(queries, keys.repeat_interleave(group, dim=1).transpose(2, 3)) / math.sqrt(d)
    future = torch.full((w, w), torch.finfo(scores.dtype).min, device=scores.device).triu(1)
    scores[:, :, -w:, -w:] += future
    scores = scores.softmax(dim=-1, dtype=torch.float32)[:, :, :, : s - w]  # [B, H, W, S - W]
    scores = scores.reshape(b, kv_heads, group * w, s - w)  # heads h = kv * group + g: transformers' repeat_kv
    scores = scores.amax(dim=2) if reduction == "max" else scores.mean(dim=2)
    pooled = F.max_pool1d if pool == "max" else F.avg_pool1d
    scores = pooled(scores, kernel_size=kernel, padding=kernel // 2, stride=1)
    return scores.topk(min(keep, s - w), dim=-1).indices


def speckv_compress(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int,
    keep: int,
    reduction: str = "max",
    pool: str = "max",
    kernel: int = 7,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache after step 2: each KV head's ``keep`` chosen entries (in order of score), then
    the window's ``window`` entries, ``[B, KVH, keep + window, d]``."""
    idx = speckv_indices(queries, keys, window, keep, reduction, pool, kernel)
    gather = idx[..., None].expand(-1, -1, -1, keys.shape[-1])
    s = keys.shape[2]
    kept_k = torch.cat([keys[:, :, : s - window].gather(2, gather), keys[:, :, s - window :]], dim=2)
    kept_v = torch.cat([values[:, :, : s - window].gather(2, gather), values[:, :, s - window :]], dim=2)
    return kept_k, kept_v


@dataclass
class _Turn:
    """What the hook needs for the prompt being prefilled (set by :meth:`SpecKV.plan`): the
    hook compresses only a prefill of ``length`` tokens from an empty cache (the plan's first
    part), so a forward of anything else under it is left alone (the draft's, when the
    speculator is the base's own first layers)."""

    length: int = 0  # N + L; 0: no prefill to compress
    window: int = 0  # W = window_size + L + 1
    capacity: int = 0  # C


@register_method("speckv")
@dataclass(frozen=True)
class SpecKV(Method):
    needs_speculator: ClassVar[bool] = True
    acts_in_model: ClassVar[bool] = True
    compresses_cache: ClassVar[bool] = True

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    max_capacity_prompt: int | None = option(
        None, Allowed(int, ge=2, null=True, note="KV entries kept per layer and head; null: ceil(N * keep_rate)")
    )
    window_size: int = option(32, Allowed(int, ge=1))
    kernel_size: int = option(7, Allowed(int, ge=1, odd=True))
    pool_type: str = option("max", Allowed(str, choices=("max", "mean")))
    reduction_type: str = option("max", Allowed(str, choices=("max", "mean")))
    lookahead_tokens: int | None = option(
        None, Allowed(int, ge=1, null=True, note="draft tokens; null: the task's answer length")
    )
    prefill_window_size: int = option(2048, Allowed(int, ge=64, note="a multiple of 64"))
    prefill_vertical_size: int = option(2048, Allowed(int, ge=1))
    sparse_prefill: bool = option(True, Allowed(bool, note="false: a dense prefill above 4096 tokens (deviation)"))

    def __post_init__(self) -> None:
        check_one_budget(self.max_capacity_prompt, self.keep_tokens)
        if self.prefill_window_size % 64:
            raise ValueError(f"prefill_window_size={self.prefill_window_size}; allowed: a multiple of 64")
        dense_limit = self.prefill_window_size + self.prefill_vertical_size
        cap = self.max_capacity_prompt
        if cap is not None and not self.window_size < cap <= dense_limit:
            raise ValueError(
                f"max_capacity_prompt={cap}; allowed: window_size ({self.window_size}) < it <= prefill_window_size + "
                f"prefill_vertical_size ({dense_limit})"
            )

    @property
    def needs_answer_length(self) -> bool:
        return self.lookahead_tokens is None

    def capacity(self, n: int) -> int:
        """C for a prompt of ``n`` tokens."""
        return int(self.max_capacity_prompt or num_kept(n, self.keep_for(n)))

    def _check_dense(self, n: int, what: str) -> None:
        limit = self.prefill_window_size + self.prefill_vertical_size
        if self.sparse_prefill and n > limit:
            raise ValueError(
                f"speckv: {what} of {n} tokens passes prefill_window_size + prefill_vertical_size = {limit}, where the "
                f"authors' SpecKV prefills with MInference's vertical-slash sparse attention, which this harness does "
                f"not run for SpecKV; allowed: at most {limit} tokens, or sparse_prefill=false (a dense prefill, a "
                f"named deviation)"
            )

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        self._check_dense(longest_prompt, "the run's longest prompt")

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """The compressing hook on the backend's base model for the body (removed on exit)."""
        base: Any = getattr(backend, "base", None)
        if base is None:
            yield
            return
        if getattr(base, TURN, None) is not None:
            raise RuntimeError(f"{self.name}: the base model already has a SpecKV hook on")
        turn = _Turn()
        with compressing_cache(base, self._compressor(turn)):
            setattr(base, TURN, turn)
            try:
                yield
            finally:
                delattr(base, TURN)

    def _compressor(self, turn: _Turn) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        def compress(
            layer: int, queries: Callable[[int], torch.Tensor], keys: torch.Tensor, values: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            w, cap = turn.window, turn.capacity
            if not turn.length or keys.shape[2] != turn.length:
                return keys, values
            lookahead = w - int(self.window_size) - 1
            if keys.shape[2] > cap + lookahead + 1:  # theirs: compress when the prefill passes C + L + 1
                keep = cap - int(self.window_size)
                keys, values = speckv_compress(
                    queries(w), keys, values, w, keep, self.reduction_type, self.pool_type, int(self.kernel_size)
                )
            return keys[:, :, :cap], values[:, :, :cap]  # crop(C)

        return compress

    def _turn(self, backend: Backend) -> _Turn:
        turn = getattr(getattr(backend, "base", None), TURN, None)
        if not isinstance(turn, _Turn):
            raise RuntimeError(
                f"{self.name}: plan() ran outside SpecKV.applied(backend) (or on a backend without the base model in "
                f"this process), so no cache would be compressed; runners enter method.applied(backend) around the "
                f"method's turn"
            )
        return turn

    def _draft(self, prompt: Prompt, backend: Backend, turn: _Turn) -> tuple[torch.Tensor, dict[str, float]]:
        """The draft's answer to the whole prompt (step 1), timed."""
        budget = self.lookahead_tokens or prompt.answer_tokens
        if budget is None:
            raise ValueError(
                "speckv: lookahead_tokens=null drafts the task's answer length, and this prompt asks no answer (a "
                "latency grid's); allowed: lookahead_tokens=N"
            )
        turn.length = 0  # the draft's own forwards are left alone
        t0 = time.perf_counter()
        draft = torch.tensor(backend.draft(prompt.input_ids, int(budget)), dtype=torch.int64)
        return draft, {"speculator_s": time.perf_counter() - t0}

    def _check_capacity(self, n: int, cap: int) -> None:
        if cap <= self.window_size and n > cap:
            raise ValueError(
                f"speckv keeps {cap} entries of a {n}-token prompt, not more than window_size={self.window_size}; "
                f"allowed: a budget above the window (max_capacity_prompt, keep_tokens or a larger keep_rate)"
            )

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        turn = self._turn(backend)
        n, cap = prompt.n, self.capacity(prompt.n)
        self._check_capacity(n, cap)
        draft, timings = self._draft(prompt, backend, turn)
        if n <= cap:  # theirs: generated whole
            return dataclasses.replace(full_plan(prompt), timings=timings)
        return self._compressed(full_plan(prompt), draft, turn, cap, timings)

    def plan_after(self, first: Plan, prompt: Prompt, backend: Backend) -> Plan:
        """SpecKV over what a prompt-side method kept (``first``; SpecKV-PC when it is SpecPC,
        baselines/compose.py): the kept tokens at ``first``'s positions are SpecKV's prompt,
        the draft's tokens follow from ``first.next_position`` on, and the last kept token is
        prefilled again at its own position. The draft is ``first``'s own when it wrote one
        (theirs: SpecPC's look-ahead ids, ``lookahead_tokens`` unused), else this method's
        draft of the whole prompt. The budget C is of the kept tokens."""
        turn = self._turn(backend)
        k, cap = first.k, self.capacity(first.k)
        self._check_capacity(k, cap)
        if first.draft_ids is not None:
            draft, timings = first.draft_ids, dict(first.timings)
        else:
            draft, own = self._draft(prompt, backend, turn)
            timings = {**first.timings, "speculator_s": first.timings.get("speculator_s", 0.0) + own["speculator_s"]}
        if k <= cap:
            return dataclasses.replace(first, timings=timings, prefix=None)
        return self._compressed(first, draft, turn, cap, timings)

    def _compressed(self, kept: Plan, draft: torch.Tensor, turn: _Turn, cap: int, timings: dict[str, float]) -> Plan:
        """The plan of steps 2-3 over ``kept`` (the prompt whole, or what a first method kept):
        its tokens and the draft's in one forward the hook compresses, then its last token
        again at its own position."""
        k, lookahead = kept.k, int(draft.shape[0])
        self._check_dense(k + lookahead, "the prompt and its draft")
        turn.length, turn.window, turn.capacity = k + lookahead, int(self.window_size) + lookahead + 1, cap
        start = kept.next_position
        return Plan(
            input_ids=torch.cat([kept.input_ids, draft, kept.input_ids[-1:]]),
            position_ids=torch.cat([kept.position_ids, torch.arange(start, start + lookahead), kept.position_ids[-1:]]),
            next_position=start,
            kept_indices=kept.kept_indices,
            timings=timings,
            prefix=k + lookahead,
        )
