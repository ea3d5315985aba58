"""``specpc``: the draft model's attention drops prompt tokens (SpecPC; Galim et al., "Draft-based
Approximate Inference for LLMs", arXiv 2506.08373; code: furiosa-ai/draft-based-approx-llm,
``draft_approx_llm/specpc/``, read at commit d79e404).

As the authors' code does it:

1. The draft (the model config's speculator) prefills the whole prompt; at every layer from
   ``starting_layer_index`` (0-based; 8 in their configs) the attention of the last
   ``window_size`` prompt tokens (64) over every prompt token is computed (scaled dot
   products of the post-RoPE queries and keys, the window causal among itself, softmax in
   float32 cast back to the model's dtype), weighted by ``linspace(0, 1, window)`` over the
   queries (``weighted_query``), and reduced over heads and queries, then over layers, by
   ``reduction_type`` (``max``; ``mean`` is their sum). With ``lookahead_tokens: 1`` (their
   SpecPC configs) the draft's ``generate`` runs the prefill only, so nothing else adds.
   With more (``null`` in their SpecKV-PC configs: ``generate``'s default, 20 new tokens,
   greedy, stopping after EOS), each decode step's single query attends over the prompt and
   the tokens fed back so far; its weights, cut to the prompt's keys and reduced over heads
   (not weighted), then layers, join the window's by the same reduction. The draft's tokens
   travel in the plan (``draft_ids``): SpecKV-PC's SpecKV reads them.
2. The scores are pooled (``pool_type`` max, ``kernel_size`` 64 for their Qwen pair, 32 for
   Llama; zero padding, centred), the top ``C`` positions taken in order of score, each
   expanded by ``neighbor_tokens`` offsets ordered by distance (0, -1, +1, -2, ...), the
   window put first, duplicates dropped in that order, cut to ``C`` and sorted. ``C`` is
   ``max_capacity_prompt`` (tokens, window included: 1024 / 2048 / 3072 in the paper) or,
   where it is null, ``ceil(N * keep_rate)`` (the harness's keep sweeps).
3. The target prefills the kept tokens at contiguous positions 0..C-1 (their ``generate`` on
   the gathered ids); ``position_mode: original`` is a named deviation.

Deviations, each an option recorded in the rows: ``position_mode``; ties between offsets
-k and +k in the neighbour order are broken with a stable sort (negative first; theirs is
``argsort`` without ``stable``, unspecified). The capture and the draft are one pass, as their
``generate`` under the attention store is.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
import torch.nn.functional as F

from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import POSITION_MODES, Backend, Method, Plan, Prompt, kept_plan, register_method

POOL_TYPES = ("max", "avg", "mean")
#: New tokens transformers' ``generate`` writes when given no ``max_new_tokens`` (its default
#: ``max_length`` of 20, counted after the prompt): SpecPC's look-ahead in SpecKV-PC, whose
#: configs set ``lookahead_tokens: null`` and whose draft call passes no length.
GENERATE_DEFAULT = 20


def check_one_budget(max_capacity_prompt: int | None, keep_tokens: int | None) -> None:
    """Refuse two token budgets (the authors' ``max_capacity_prompt`` and the harness's
    ``keep_tokens``), naming both."""
    if max_capacity_prompt is not None and keep_tokens is not None:
        raise ValueError(
            f"max_capacity_prompt={max_capacity_prompt} and keep_tokens={keep_tokens}: two token budgets; allowed: "
            f"one of them (keep_tokens is max_capacity_prompt for every prompt)"
        )


def _pool(kind: str, s: torch.Tensor, kernel: int) -> torch.Tensor:
    """``s`` ``[1, 1, n]`` pooled over ``kernel`` (stride 1), zero-padded to keep its length, centred."""
    padded = F.pad(s, ((kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2))
    if kind == "max":
        return F.max_pool1d(padded, kernel_size=kernel, stride=1)
    return F.avg_pool1d(padded, kernel_size=kernel, stride=1)


def specpc_scores(
    queries: torch.Tensor,
    keys: torch.Tensor,
    starting_layer: int = 8,
    weighted: bool = True,
    reduction: str = "max",
    window: int | None = None,
) -> torch.Tensor:
    """Per prompt token, the draft's attention to it (step 1 of the module's doc): ``queries``
    ``[layers, heads, R, d]`` (post-RoPE), ``keys`` ``[layers, kv_heads, S, d]`` -> ``[N]``.

    The first ``window`` rows (null: all R) are the prompt's last tokens, weighted over the
    window; the R - window rows after them are the draft's decode steps (one query each, not
    weighted), whose keys take S = N + R - window (the tokens fed back before them). Each
    row sees the keys up to its own position; every step's weights are cut to the N prompt
    keys and reduced over heads and rows, then layers, then steps (``generate``'s attention
    store in theirs)."""
    layers, heads, rows, d = queries.shape
    w = rows if window is None else window
    if not 1 <= w <= rows:
        raise ValueError(f"window={window} for {rows} captured query rows; allowed: 1 .. {rows}")
    if starting_layer >= layers:
        raise ValueError(
            f"starting_layer_index={starting_layer}: the draft has {layers} layer(s); allowed: 0 .. {layers - 1}"
        )
    n = keys.shape[2] - (rows - w)
    reduce = torch.amax if reduction == "max" else torch.sum
    per_layer = []
    for layer in range(starting_layer, layers):
        q = queries[layer]
        k = keys[layer].repeat_interleave(heads // keys.shape[1], dim=0)  # [H, S, d]: transformers' repeat_kv
        s = k.shape[1]
        attn = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(d)  # [H, R, S]
        future = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu(1)  # causal over the last R keys
        attn[:, :, s - rows :] += torch.where(future, torch.finfo(attn.dtype).min, 0.0).to(attn.dtype)
        attn = torch.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)[:, :, :n]
        prefill = attn[:, :w]
        if w > 1 and weighted:
            prefill = prefill * torch.linspace(0, 1, w, device=q.device, dtype=attn.dtype)[None, :, None]
        steps = [reduce(prefill, dim=(0, 1))] + [reduce(attn[:, r], dim=0) for r in range(w, rows)]
        per_layer.append(torch.stack(steps))  # [steps, N]
    by_step = reduce(torch.stack(per_layer), dim=0)  # over layers
    return reduce(by_step, dim=0)  # over steps


def _unique(ind: torch.Tensor) -> torch.Tensor:
    """``ind`` without repeats, in order of first appearance (``pandas.unique``, as theirs)."""
    return torch.as_tensor(pd.unique(ind.cpu().numpy()), dtype=torch.int64)


def check_window(window: int, n: int) -> None:
    """Refuse a window longer than the prompt, naming both."""
    if window > n:
        raise ValueError(f"window_size={window} is longer than the prompt ({n} tokens); allowed: <= {n}")


def specpc_select(
    scores: torch.Tensor,
    capacity: int,
    window: int,
    kernel: int = 64,
    pool: str | None = "max",
    neighbors: int | None = 64,
) -> torch.Tensor:
    """The kept positions, sorted (step 2 of the module's doc)."""
    n = int(scores.shape[0])
    check_window(window, n)
    s = scores.reshape(1, 1, n)
    if pool is not None:
        s = _pool(pool, s, kernel)
    s = s.reshape(n)
    ind = s.topk(capacity, sorted=True).indices if capacity < n else torch.arange(n)
    nb = kernel if neighbors is None else neighbors
    if nb > 0:
        adj = torch.arange(-((nb - 1) // 2), nb - 1 - (nb - 1) // 2 + 1)
        # their tie order: torch's default (unstable) argsort on the CPU, as their code calls it; for
        # more than 16 offsets it is not negative-first (harness/studies/draft_source_check.py)
        adj = adj[adj.abs().argsort()]
        ind = _unique((ind.cpu()[:, None] + adj).reshape(-1).clamp(0, n - 1))
    ind = _unique(torch.cat([torch.arange(n - window, n), ind.cpu()]))[:capacity]
    return ind.sort().values


@register_method("specpc")
@dataclass(frozen=True)
class SpecPC(Method):
    needs_speculator: ClassVar[bool] = True
    writes_draft: ClassVar[bool] = True

    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    max_capacity_prompt: int | None = option(
        None, Allowed(int, ge=1, null=True, note="tokens kept, window included; null: ceil(N * keep_rate)")
    )
    window_size: int = option(64, Allowed(int, ge=1))
    kernel_size: int = option(64, Allowed(int, ge=1, note="64 for the paper's Qwen pair, 32 for Llama"))
    pool_type: str | None = option("max", Allowed(str, choices=POOL_TYPES, null=True))
    neighbor_tokens: int | None = option(64, Allowed(int, ge=0, null=True, note="null: kernel_size"))
    reduction_type: str = option("max", Allowed(str, choices=("max", "mean")))
    lookahead_tokens: int | None = option(
        1, Allowed(int, ge=1, null=True, note=f"1: the paper's SpecPC; null: generate's default ({GENERATE_DEFAULT})")
    )
    starting_layer_index: int = option(8, Allowed(int, ge=0, note="0-based draft layer"))
    weighted_query: bool = option(True, Allowed(bool))
    position_mode: str = option("contiguous", Allowed(str, choices=POSITION_MODES))

    def __post_init__(self) -> None:
        check_one_budget(self.max_capacity_prompt, self.keep_tokens)

    def check_model(
        self, model: str, layers: int | None, max_context: int, longest_prompt: int, draft_layers: int | None = None
    ) -> None:
        """The draft layer the scores start at must be one of the draft's (theirs: 8 of 24 on
        Qwen2.5-0.5B); refused before anything loads rather than failing every sample."""
        i = int(self.starting_layer_index)
        if draft_layers is not None and i >= draft_layers:
            raise ValueError(
                f"starting_layer_index={i}: the draft of model {model!r} has {draft_layers} layer(s); allowed: 0 .. "
                f"{draft_layers - 1}"
            )

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        t0 = time.perf_counter()
        window = int(self.window_size)
        check_window(window, prompt.n)  # before the speculator runs
        cap = backend.speculate_window(prompt.input_ids, window, int(self.lookahead_tokens or GENERATE_DEFAULT))
        t1 = time.perf_counter()
        scores = specpc_scores(
            cap.queries,
            cap.keys,
            int(self.starting_layer_index),
            bool(self.weighted_query),
            str(self.reduction_type),
            window,
        )
        capacity = int(self.max_capacity_prompt or num_kept(prompt.n, self.keep_for(prompt.n)))
        kept = specpc_select(scores, capacity, window, int(self.kernel_size), self.pool_type, self.neighbor_tokens)
        t2 = time.perf_counter()
        plan = kept_plan(prompt, kept, self.position_mode, {"speculator_s": t1 - t0, "selection_s": t2 - t1})
        return dataclasses.replace(plan, draft_ids=torch.tensor(cap.lookahead_ids, dtype=torch.int64))
