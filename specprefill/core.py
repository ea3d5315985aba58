"""The SpecPrefill algorithm as pure tensor code (Liu, Chen & Zhang, "Speculative Prefill", ICML 2025,
arXiv:2502.02789: token importance from the speculator's attention, then top-k selection).

Nothing here knows about models: the backend hands over post-RoPE queries and keys,
these functions turn them into one importance score per prompt token and a kept set.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _check_pool_kernel(pool_kernel: int | None) -> None:
    if pool_kernel is None:
        return
    if isinstance(pool_kernel, bool) or not isinstance(pool_kernel, int) or pool_kernel < 1:
        raise ValueError(f"pool_kernel={pool_kernel!r} is invalid; allowed: None or an odd int >= 1")
    if pool_kernel % 2 == 0:
        # avg_pool1d(padding=k//2, stride=1) returns N+1 values for an even kernel, so
        # the score would no longer line up with the tokens.
        raise ValueError(f"pool_kernel={pool_kernel} is even; allowed: None or an odd int >= 1 (the paper uses 13)")


def token_importance(queries: torch.Tensor, keys: torch.Tensor, pool_kernel: int | None = None) -> torch.Tensor:
    """Score every prompt token by the speculator's attention to it.

    Args:
        queries: ``[layers, heads, L, d]`` post-RoPE queries of the last prompt token and
            the ``L-1`` look-ahead tokens, per layer.
        keys: ``[layers, kv_heads, N, d]`` post-RoPE keys of the N prompt tokens only
            (look-ahead keys excluded, so look-ahead queries never attend to each other).
            GQA groups are expanded here: query head ``h`` reads kv head ``h // (heads // kv_heads)``.
        pool_kernel: odd kernel of the zero-padded ``avg_pool1d`` along N, or None.

    Returns:
        float32 ``[N]``: per token, the max over layers x heads of (optionally pooled)
        softmax attention, averaged over the L queries.

    Only the L query rows are scored, one layer at a time: memory is
    ``O(heads * L * N)``, never ``N x N``.
    """
    if queries.dim() != 4 or keys.dim() != 4:
        raise ValueError(
            f"queries must be [layers, heads, L, d] and keys [layers, kv_heads, N, d]; "
            f"got {tuple(queries.shape)} and {tuple(keys.shape)}"
        )
    n_layers, n_heads, _n_q, d = queries.shape
    if keys.shape[0] != n_layers or keys.shape[3] != d:
        raise ValueError(f"layer/head-dim mismatch: queries {tuple(queries.shape)} vs keys {tuple(keys.shape)}")
    n_kv = keys.shape[1]
    if n_heads % n_kv != 0:
        raise ValueError(f"heads={n_heads} is not a multiple of kv_heads={n_kv}")
    _check_pool_kernel(pool_kernel)
    group = n_heads // n_kv
    scale = 1.0 / math.sqrt(d)
    best: torch.Tensor | None = None
    for layer in range(n_layers):
        q = queries[layer].float()  # [H, L, d]
        k = keys[layer].float().repeat_interleave(group, dim=0)  # [H, N, d]
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)  # [H, L, N]
        if pool_kernel is not None and pool_kernel > 1:
            h, l_, n = attn.shape
            attn = F.avg_pool1d(
                attn.reshape(h * l_, 1, n), kernel_size=pool_kernel, stride=1, padding=pool_kernel // 2
            ).reshape(h, l_, n)
        layer_max = attn.amax(dim=0)  # [L, N]
        best = layer_max if best is None else torch.maximum(best, layer_max)
    assert best is not None
    return best.mean(dim=0).to(torch.float32)


def num_kept(n: int, keep_rate: float) -> int:
    """``ceil(n * keep_rate)``, guarded against float noise (0.3 * 10 = 3.0000000000000004)."""
    return min(n, math.ceil(round(n * keep_rate, 9)))


def select_tokens(importance: torch.Tensor, keep_rate: float, chunk_size: int | None = None) -> torch.Tensor:
    """Pick the tokens the base model prefills.

    Args:
        importance: ``[N]`` token scores from :func:`token_importance`.
        keep_rate: fraction in (0, 1].
        chunk_size: None for token mode (top ``ceil(N*p)`` tokens); otherwise chunks of
            ``chunk_size`` consecutive tokens (the last may be shorter) scored by their mean,
            top ``ceil(n_chunks*p)`` chunks kept whole.

    Returns:
        int64 ``[K]``: sorted kept token indices.
    """
    if not (0.0 < keep_rate <= 1.0):
        raise ValueError(f"keep_rate={keep_rate!r} is outside (0, 1]")
    if importance.dim() != 1:
        raise ValueError(f"importance must be [N]; got {tuple(importance.shape)}")
    n = importance.shape[0]
    if chunk_size is None:
        top = torch.topk(importance, num_kept(n, keep_rate)).indices
        return torch.sort(top).values.to(torch.int64)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} is invalid; allowed: None or an int >= 1")
    n_chunks = math.ceil(n / chunk_size)
    pad = n_chunks * chunk_size - n
    padded = F.pad(importance.float(), (0, pad))
    counts = torch.full((n_chunks,), float(chunk_size))
    counts[-1] = chunk_size - pad
    chunk_scores = padded.reshape(n_chunks, chunk_size).sum(dim=1) / counts
    top_chunks = torch.topk(chunk_scores, num_kept(n_chunks, keep_rate)).indices
    starts = top_chunks.unsqueeze(1) * chunk_size + torch.arange(chunk_size).unsqueeze(0)
    kept = starts.flatten()
    kept = kept[kept < n]
    return torch.sort(kept).values.to(torch.int64)


def random_fill(kept: torch.Tensor, n: int, extra: int, seed: int = 0) -> torch.Tensor:
    """Add ``extra`` prompt positions drawn uniformly without replacement from those not in
    ``kept`` (all of them where fewer remain), sorted and unique. Seeded, so a prompt always
    gets the same fill; the draw is a permutation of the positions not kept, in order.

    A named deviation for studies (none in the reference): it fills the selection's gaps with
    tokens no score chose, to tell what a larger budget buys by its content from what it buys
    by leaving less of the span empty.
    """
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        raise ValueError(f"random_fill={extra!r}; allowed: null or an int >= 1")
    rest = torch.ones(n, dtype=torch.bool)
    rest[kept.to(torch.int64)] = False
    free = torch.nonzero(rest).flatten()
    g = torch.Generator().manual_seed(int(seed))
    drawn = free[torch.randperm(int(free.numel()), generator=g)[:extra]]
    return torch.unique(torch.cat([kept.to(torch.int64), drawn]), sorted=True)


def force_keep(kept: torch.Tensor, n: int, first: int = 0, last: int = 0) -> torch.Tensor:
    """Add the first ``first`` and last ``last`` prompt positions to ``kept`` (sorted, unique).

    The reference force-keeps nothing; this is a named deviation, off by default.
    """
    if first < 0 or last < 0:
        raise ValueError(f"force_keep_first={first}, force_keep_last={last}: both must be >= 0")
    extra = [torch.arange(min(first, n)), torch.arange(max(n - last, 0), n)]
    return torch.unique(torch.cat([kept, *extra]).to(torch.int64), sorted=True)
