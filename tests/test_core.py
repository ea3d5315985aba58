"""token_importance and select_tokens against slow, obviously-correct references."""

from __future__ import annotations

import math

import pytest
import torch

from specprefill import select_tokens, token_importance
from specprefill.core import force_keep, num_kept


def slow_importance(q: torch.Tensor, k: torch.Tensor, pool: int | None) -> torch.Tensor:
    layers, heads, n_q, d = q.shape
    kv = k.shape[1]
    n = k.shape[2]
    best = torch.full((n_q, n), -1.0, dtype=torch.float64)
    for layer in range(layers):
        for h in range(heads):
            kh = k[layer, h // (heads // kv)].double()
            for j in range(n_q):
                logits = [float(q[layer, h, j].double() @ kh[t]) / math.sqrt(d) for t in range(n)]
                m = max(logits)
                e = [math.exp(x - m) for x in logits]
                a = [x / sum(e) for x in e]
                if pool:
                    r = pool // 2
                    # zero padding, padding counted: always divide by the kernel size
                    a = [sum(a[s] for s in range(t - r, t + r + 1) if 0 <= s < n) / pool for t in range(n)]
                for t in range(n):
                    best[j, t] = max(best[j, t], a[t])
    return best.mean(dim=0).float()


@pytest.mark.parametrize(
    "layers,heads,kv,n_q,n,pool",
    [(2, 4, 2, 1, 23, None), (3, 4, 1, 3, 17, 5), (1, 2, 2, 2, 9, 13), (2, 6, 3, 8, 31, 3)],
)
def test_token_importance_matches_slow_reference(layers, heads, kv, n_q, n, pool):
    g = torch.Generator().manual_seed(layers * 100 + n)
    q = torch.randn(layers, heads, n_q, 8, generator=g)
    k = torch.randn(layers, kv, n, 8, generator=g)
    got = token_importance(q, k, pool)
    assert got.dtype == torch.float32 and got.shape == (n,)
    torch.testing.assert_close(got, slow_importance(q, k, pool), rtol=1e-5, atol=1e-6)


def test_pooling_counts_zero_padding_at_the_edges():
    # One query, one head, attention concentrated on the first token: pooled value at
    # token 0 is (1 + 0) / 3, not 1 / 2 (padding is counted).
    q = torch.zeros(1, 1, 1, 4)
    k = torch.zeros(1, 1, 5, 4)
    q[..., 0] = 100.0
    k[0, 0, 0, 0] = 1.0
    got = token_importance(q, k, pool_kernel=3)
    assert got[0].item() == pytest.approx(1 / 3, abs=1e-6)
    assert got[1].item() == pytest.approx(1 / 3, abs=1e-6)
    assert got[2].item() == pytest.approx(0.0, abs=1e-6)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="even"):
        token_importance(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 5, 4), 4)
    with pytest.raises(ValueError, match="multiple"):
        token_importance(torch.randn(1, 3, 1, 4), torch.randn(1, 2, 5, 4), None)
    with pytest.raises(ValueError, match=r"keep_rate=1.5"):
        select_tokens(torch.rand(10), 1.5)
    with pytest.raises(ValueError, match=r"keep_rate=0"):
        select_tokens(torch.rand(10), 0)
    with pytest.raises(ValueError, match="chunk_size"):
        select_tokens(torch.rand(10), 0.5, 0)


def slow_select(scores: list[float], p: float, chunk: int | None) -> list[int]:
    n = len(scores)
    if chunk is None:
        order = sorted(range(n), key=lambda i: -scores[i])
        return sorted(order[: math.ceil(n * p - 1e-9)])
    chunks = [list(range(s, min(s + chunk, n))) for s in range(0, n, chunk)]
    means = [sum(scores[i] for i in c) / len(c) for c in chunks]
    order = sorted(range(len(chunks)), key=lambda i: -means[i])
    keep = order[: math.ceil(len(chunks) * p - 1e-9)]
    return sorted(i for c in keep for i in chunks[c])


@pytest.mark.parametrize("n", [1, 7, 10, 64, 100, 101])
@pytest.mark.parametrize("p", [0.1, 0.25, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("chunk", [None, 1, 4, 32])
def test_select_tokens_matches_slow_reference(n, p, chunk):
    g = torch.Generator().manual_seed(n * 7 + (chunk or 0))
    scores = torch.rand(n, generator=g)
    got = select_tokens(scores, p, chunk)
    assert got.dtype == torch.int64
    assert got.tolist() == slow_select(scores.tolist(), p, chunk)


def test_select_rounding_is_ceil_and_the_short_last_chunk_counts_by_its_mean():
    assert num_kept(10, 0.3) == 3  # 0.3 * 10 = 3.0000000000000004 must not become 4
    assert num_kept(10, 0.25) == 3
    assert num_kept(7, 0.1) == 1
    # 10 tokens, chunk 4 -> chunks [0-3], [4-7], [8-9]; the last (2 tokens) has the best
    # mean although its sum is the smallest.
    s = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1, 0.9, 0.9])
    assert select_tokens(s, 0.3, 4).tolist() == [8, 9]  # ceil(3 * 0.3) = 1 chunk
    assert select_tokens(s, 0.5, 4).tolist() == [0, 1, 2, 3, 8, 9]  # ceil(1.5) = 2 chunks


def test_force_keep_adds_first_and_last():
    kept = torch.tensor([4, 5])
    assert force_keep(kept, 10, 2, 1).tolist() == [0, 1, 4, 5, 9]
    assert force_keep(kept, 10).tolist() == [4, 5]


def test_the_algorithm_package_imports_nothing_from_the_harness():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "specprefill"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in ("harness", "baselines"), f"{path} imports {n}"
