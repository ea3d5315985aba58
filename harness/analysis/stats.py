"""Uncertainty: seeded bootstrap confidence intervals for means, macro means, paired
differences and paired ratios.

A score averaged over 10 samples is not exact: 50 against 60 at n=10 is noise. Every
interval here is a percentile bootstrap over samples (resampling with replacement, the
same resampled indices for both members of a pair, so a paired comparison keeps its
pairing), seeded so a table is reproducible. Macro means (a category, ``ALL``) resample
within each part and average the parts' resampled means, as the point estimate does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval and the number of samples it rests on."""

    value: float
    lo: float
    hi: float
    n: int

    def excludes_zero(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)


NAN = Estimate(float("nan"), float("nan"), float("nan"), 0)


def _indices(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    lo, hi = np.nanpercentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def task_seed(task: str) -> int:
    """A task's bootstrap seed: the same resampled indices for a task in every point, so
    two points' draws of one task are paired."""
    return SEED + sum(map(ord, task))


def mean_draws(values: np.ndarray, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """``resamples`` bootstrap means of ``values`` (all NaN when there are none)."""
    if values.size == 0:
        return np.full(resamples, np.nan)
    return np.asarray(values[_indices(values.size, resamples, seed)].mean(axis=1))


def estimate(value: float, draws: np.ndarray, n: int, level: float = LEVEL) -> Estimate:
    """``value`` with the percentile interval of its bootstrap ``draws`` (NaN draws left
    out; no interval when every draw is NaN)."""
    if np.isnan(draws).all():
        return Estimate(value, float("nan"), float("nan"), n)
    return Estimate(value, *_interval(draws, level), n)


def mean_ci(
    x: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Estimate:
    """The mean of ``x`` and its percentile-bootstrap interval (NaN values are dropped)."""
    a = np.asarray(x, dtype=float)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return NAN
    draws = a[_indices(a.size, resamples, seed)].mean(axis=1)
    return Estimate(float(a.mean()), *_interval(draws, level), int(a.size))


def macro_mean_ci(
    parts: Sequence[Sequence[float] | np.ndarray], resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Estimate:
    """The mean of the parts' means (LongBench's category and ``Avg``, RULER's ``ALL``), with
    a stratified bootstrap: each part resampled within itself. NaN when a part is empty."""
    arrays = [np.asarray(p, dtype=float) for p in parts]
    arrays = [a[~np.isnan(a)] for a in arrays]
    if not arrays or any(a.size == 0 for a in arrays):
        return Estimate(float("nan"), float("nan"), float("nan"), sum(a.size for a in arrays))
    draws = np.mean([a[_indices(a.size, resamples, seed + i)].mean(axis=1) for i, a in enumerate(arrays)], axis=0)
    value = float(np.mean([a.mean() for a in arrays]))
    return Estimate(value, *_interval(draws, level), int(sum(a.size for a in arrays)))


def paired_diff_ci(
    candidate: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Estimate:
    """Mean of ``candidate - baseline`` over paired samples (same index = same sample), with
    the bootstrap interval of that mean."""
    c, b = np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)
    if c.shape != b.shape:
        raise ValueError(f"paired samples differ in number: {c.shape} vs {b.shape}")
    return mean_ci(c - b, resamples, seed, level)


def paired_ratio_ci(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Estimate:
    """``mean(numerator) / mean(denominator)`` over paired samples (retention: a method's
    score over the reference's on the same samples; a TTFT ratio), resampling the pairs."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in number: {a.shape} vs {b.shape}")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size == 0 or b.mean() == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), int(a.size))
    idx = _indices(a.size, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    draws[~np.isfinite(draws)] = np.nan
    return Estimate(float(a.mean() / b.mean()), *_interval(draws, level), int(a.size))


def ratio_of_medians_ci(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Estimate:
    """``median(numerator) / median(denominator)`` of two independent sets of timed
    iterations (a speedup measured side by side), each resampled within itself."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if a.size == 0 or b.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    da = np.median(a[_indices(a.size, resamples, seed)], axis=1)
    db = np.median(b[_indices(b.size, resamples, seed + 1)], axis=1)
    return Estimate(float(np.median(a) / np.median(b)), *_interval(da / db, level), int(min(a.size, b.size)))
