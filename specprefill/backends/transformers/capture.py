"""The speculator's pass: prefill B prompts, decode the look-ahead, capture what SpecPrefill
scores with (:func:`capture_batch`), in named steps.

Equal lengths: one (chunked) prefill of ``[B, N]``, whose last column is every prompt's last
token, where the query hook looks. Unequal lengths: each prompt's first n_i - 1 tokens are
prefilled right-padded to M = max n_i - 1 columns, at positions 0..M-1, with no padding
mask: the padding comes after every real token of its row, so causal attention already
keeps it out of the real tokens, and SDPA keeps its fast causal path (a left-padding mask
costs ~30% more on CPU and the flash/GQA kernels on GPU). Then every prompt's last token
runs in one single-token step at its own position n_i - 1, its 2-D mask showing it its own
n_i - 1 tokens only: that step's query is the captured one (:func:`last_tokens`). No query
ever has nothing to attend to, so the padding cannot make NaNs; the last logits are checked
finite anyway. Look-ahead token j of row i is decoded at position n_i + j.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specprefill.backends.transformers.hooks import capture_last_queries
from specprefill.flops import Shape, speculator_flops
from specprefill.plan import SpeculatorCapture


def checked_prompts(model: Any, input_ids: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The prompts of ``input_ids`` (``[B, N]`` or B ``[n_i]``), refused in one line where a
    shape is wrong or an id is past the model's embeddings (another tokenizer's ids)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids of shape {tuple(input_ids.shape)}; allowed: [B, N] or a list of [n_i]")
        rows = list(input_ids.unbind(0))
    else:
        rows = list(input_ids)
    if not rows or any(r.dim() != 1 or r.shape[0] < 1 for r in rows):
        raise ValueError(
            f"prompt shapes {[tuple(r.shape) for r in rows]}; allowed: one or more 1-D prompts of >= 1 token"
        )
    vocab = model.get_input_embeddings().num_embeddings
    if max(int(r.max()) for r in rows) >= vocab:  # another family's ids would index garbage, or crash
        raise ValueError(
            f"token ids up to {max(int(r.max()) for r in rows)} for a model of {vocab} embeddings: the ids come "
            f"from another tokenizer; a speculator from another family needs its own tokenizer "
            f"(TransformersBackend(speculator_tokenizer=...))"
        )
    return rows


def capture_flops(model: Any, lengths: list[int], past: int, lookahead: int) -> int:
    """The model FLOPs of the pass (padding not counted; what a kept cache holds was read before)."""
    shape = Shape.of(model.config)
    flops = sum(speculator_flops(shape, past + k, lookahead) for k in lengths)
    return flops - speculator_flops(shape, past, 1) if past else flops


def padded(rows: list[torch.Tensor], ragged: bool) -> torch.Tensor:
    """``[B, M]``: each row's tokens (ragged: its first n_i - 1, then padding), M columns."""
    n = max(int(r.shape[0]) for r in rows)
    m = n - 1 if ragged else n
    ids = torch.zeros(len(rows), m, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, : int(r.shape[0]) - 1 if ragged else n] = r[:-1] if ragged else r
    return ids


def prefill_chunks(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cache: Any,
    past: int,
    chunk: int,
    captured: list[list],
    keep_earlier: bool = False,
) -> Any:
    """Prefill ``ids`` ``[B, M]`` into ``cache`` at positions past.., ``chunk`` columns per
    forward; the captured queries are the last chunk's (``keep_earlier``: every chunk's).
    Returns the last forward's output."""
    b, m = ids.shape
    out = None
    for start in range(0, m, chunk):
        end = min(m, start + chunk)
        for per_layer in captured if not keep_earlier else ():  # only the last chunk's rows count
            per_layer.clear()
        out = model(
            input_ids=ids[:, start:end],
            position_ids=torch.arange(past + start, past + end, device=ids.device).unsqueeze(0).expand(b, end - start),
            attention_mask=mask[:, : past + end],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return out


def last_tokens(
    model: Any,
    rows: list[torch.Tensor],
    lens: torch.Tensor,
    m: int,
    mask: torch.Tensor,
    cache: Any,
    captured: list[list],
) -> tuple[Any, torch.Tensor]:
    """Ragged prompts' last tokens, ``[B, 1]`` at positions n_i - 1, each seeing its row's
    n_i - 1 tokens and itself: their queries are the captured ones. Returns the output and
    the mask grown by the step."""
    for per_layer in captured:
        per_layer.clear()
    b = len(rows)
    own = torch.arange(m, device=lens.device).unsqueeze(0) < (lens - 1).unsqueeze(1)  # [B, M]
    mask = torch.cat([own.to(torch.int64), mask.new_ones(b, 1)], dim=1)
    last = torch.stack([r[-1] for r in rows]).to(lens.device)
    out = model(
        input_ids=last.unsqueeze(1),
        position_ids=(lens - 1).unsqueeze(1),
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out, mask


def check_finite(model: Any, out: Any, lengths: list[int]) -> None:
    """Refuse non-finite last logits, naming the prompts (an overflow in a low precision)."""
    if not bool(torch.isfinite(out.logits[:, -1]).all()):
        bad = (~torch.isfinite(out.logits[:, -1])).any(-1).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"the speculator gave non-finite logits for the prompts of {[lengths[i] for i in bad]} tokens "
            f"(batch rows {bad}): an overflow in {next(model.parameters()).dtype}?"
        )


def look_ahead(
    model: Any, out: Any, mask: torch.Tensor, cache: Any, lens: torch.Tensor, past: int, steps: int
) -> list[list[int]]:
    """Decode ``steps`` greedy tokens per row (token j of row i at position past + n_i + j),
    the query hook capturing each; returns the tokens."""
    b = int(lens.shape[0])
    generated: list[list[int]] = [[] for _ in range(b)]
    for step in range(steps):
        nxt = out.logits[:, -1].argmax(-1)  # [B]
        for row, t in zip(generated, nxt.tolist(), strict=True):
            row.append(int(t))
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        out = model(
            input_ids=nxt.unsqueeze(1),
            position_ids=(lens + past + step).unsqueeze(1),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return generated


def capture_batch(
    model: Any,
    input_ids: torch.Tensor | Sequence[torch.Tensor],
    lookahead: int,
    device: torch.device,
    prefill_chunk: int | None = None,
    cache: Any = None,
) -> tuple[list[SpeculatorCapture], int]:
    """Prefill ``model`` on B prompts at once (``[B, N]``, or B ``[n_i]`` tensors) and decode
    ``lookahead - 1`` greedy tokens per prompt (the module's doc says how). Returns per row
    ``queries`` ``[layers, heads, L, d]`` (last prompt token, then the look-ahead tokens) and
    ``keys`` ``[layers, kv_heads, n_i, d]`` (the row's own prompt tokens only, padding and
    look-ahead excluded), with the pass's FLOPs.

    ``cache``: a cache already holding earlier tokens of one prompt (a conversation's, at
    positions 0..P-1): the B = 1 prompt is its continuation, prefilled at P.., the keys are
    every cached token's and the new ones', and the look-ahead tokens are dropped from the
    cache afterwards."""
    from transformers import DynamicCache

    rows = checked_prompts(model, input_ids)
    lengths = [int(r.shape[0]) for r in rows]
    b, n = len(rows), max(lengths)
    if cache is not None and b != 1:
        raise ValueError(f"a batch of {b} prompts with an existing cache; allowed: one prompt continuing it")
    past = int(cache.get_seq_length()) if cache is not None else 0
    flops = capture_flops(model, lengths, past, lookahead)
    ragged = min(lengths) != n
    ids = padded(rows, ragged).to(device)
    m = int(ids.shape[1])  # prefilled columns
    lens = torch.tensor(lengths, dtype=torch.int64, device=device)  # [B]
    mask = torch.ones(b, past + m, dtype=torch.int64, device=device)  # nothing to hide in the prefill
    kept_cache = cache is not None
    cache = cache if kept_cache else DynamicCache(config=model.config)
    with capture_last_queries(model) as captured:
        out = prefill_chunks(model, ids, mask, cache, past, prefill_chunk or m, captured)
        if ragged:
            out, mask = last_tokens(model, rows, lens, m, mask, cache, captured)
        check_finite(model, out, lengths)
        # Keys of the prompt only (later look-ahead steps append to the cache), gathered on the first
        # device when the model's layers are spread over several: [B, layers, kv_heads, M (+1), d].
        p = m + 1 if ragged else n
        keys = torch.stack([layer.keys[:, :, : past + p, :].to(device) for layer in cache.layers], dim=1)
        generated = look_ahead(model, out, mask, cache, lens, past, lookahead - 1)
    if kept_cache and lookahead > 1:  # the look-ahead tokens leave a kept cache
        cache.crop(-(lookahead - 1))
    queries = torch.stack(
        [torch.cat([q.to(device) for q in per_layer], dim=2) for per_layer in captured], dim=1
    )  # [B, layers, H, L, d]
    if not ragged:
        return [SpeculatorCapture(queries[i], keys[i], generated[i]) for i in range(b)], flops
    return (
        [  # row i's keys: its first n_i - 1 columns and its last token's (column M)
            SpeculatorCapture(queries[i], torch.cat([keys[i, :, :, : k - 1], keys[i, :, :, m:]], dim=2), generated[i])
            for i, k in enumerate(lengths)
        ],
        flops,
    )


def prefill_one(
    model: Any,
    input_ids: torch.Tensor,
    device: torch.device,
    prefill_chunk: int | None,
    captured: list[list],
    keep_earlier: bool = False,
) -> tuple[int, Any, Any]:
    """One prompt's (``[n]``) chunked prefill into a fresh cache, its last logits checked
    finite: (n, the cache, the last forward's output)."""
    from transformers import DynamicCache

    (row,) = checked_prompts(model, input_ids.unsqueeze(0))
    n = int(row.shape[0])
    mask = torch.ones(1, n, dtype=torch.int64, device=device)
    cache = DynamicCache(config=model.config)
    out = prefill_chunks(model, row.unsqueeze(0).to(device), mask, cache, 0, prefill_chunk or n, captured, keep_earlier)
    check_finite(model, out, [n])
    return n, cache, out


def greedy(
    model: Any, out: Any, cache: Any, n: int, max_new_tokens: int, eos_ids: Sequence[int], device: torch.device
) -> list[int]:
    """Greedy tokens after a prefill of ``n`` tokens (``out``: its last forward's output), as
    transformers' ``generate`` writes them: up to ``max_new_tokens``, the first EOS included
    and nothing after it. Each token but the last is fed back (``generate`` never feeds its
    last), so the cache ends holding ``n + len(tokens) - 1`` entries."""
    mask = torch.ones(1, n, dtype=torch.int64, device=device)
    tokens: list[int] = []
    eos = set(eos_ids)
    while True:
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        if nxt in eos or len(tokens) == max_new_tokens:
            return tokens
        mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
        out = model(
            input_ids=torch.tensor([[nxt]], device=device),
            position_ids=torch.tensor([[n + len(tokens) - 1]], device=device),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )


def capture_window(
    model: Any,
    input_ids: torch.Tensor,
    window: int,
    device: torch.device,
    prefill_chunk: int | None = None,
    draft: int = 0,
    eos_ids: Sequence[int] = (),
) -> tuple[SpeculatorCapture, int]:
    """One prompt's prefill (``[n]``): the post-RoPE queries of its last ``window`` tokens and
    every token's keys (what SpecPC scores with, baselines/specpc.py), with the pass's FLOPs.

    ``draft`` > 0: the prefill goes on as ``generate`` with up to ``draft`` greedy tokens
    (:func:`greedy`; ``lookahead_ids``), and each decode step's query joins the window's, as
    SpecPC's attention store records them: queries ``[layers, heads, window + T - 1, d]``
    (T tokens written, T - 1 fed back) and keys ``[layers, kv_heads, n + T - 1, d]``.
    Without: queries ``[layers, heads, window, d]``, keys ``[layers, kv_heads, n, d]``."""
    (row,) = checked_prompts(model, input_ids.unsqueeze(0))
    n = int(row.shape[0])
    if not 1 <= window <= n:
        raise ValueError(f"window={window} for a prompt of {n} tokens; allowed: 1 .. {n}")
    if draft < 0:
        raise ValueError(f"draft={draft}; allowed: >= 0 tokens")
    with capture_last_queries(model, rows=window) as captured:
        n, cache, out = prefill_one(model, input_ids, device, prefill_chunk, captured, keep_earlier=True)
        prefill_forwards = len(captured[0])
        tokens = greedy(model, out, cache, n, draft, eos_ids, device) if draft else []
    queries = torch.stack(
        [
            torch.cat(
                [torch.cat([q.to(device) for q in per_layer[:prefill_forwards]], dim=2)[0, :, -window:]]
                + [q.to(device)[0] for q in per_layer[prefill_forwards:]],
                dim=1,
            )
            for per_layer in captured
        ]
    )
    seen = n + max(len(tokens) - 1, 0)
    keys = torch.stack([layer.keys[0, :, :seen, :].to(device) for layer in cache.layers])  # type: ignore[union-attr,index]
    return SpeculatorCapture(queries, keys, tokens), capture_flops(model, [n], 0, max(len(tokens), 1))


def draft_tokens(
    model: Any,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    device: torch.device,
    prefill_chunk: int | None = None,
) -> tuple[list[int], int]:
    """One prompt's (``[n]``) greedy continuation by ``model``, as transformers' ``generate``
    gives it: up to ``max_new_tokens`` tokens, the first EOS included and nothing after it
    (what SpecKV's draft writes, baselines/speckv.py), with the pass's FLOPs."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}; allowed: >= 1")
    n, cache, out = prefill_one(model, input_ids, device, prefill_chunk, [])
    tokens = greedy(model, out, cache, n, max_new_tokens, eos_ids, device)
    return tokens, capture_flops(model, [n], 0, len(tokens))
