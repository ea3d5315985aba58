"""The seeded bootstrap every measure of :mod:`harness.analysis` shares.

A score averaged over 10 samples is not exact: 50 against 60 at n=10 is noise. Every
interval is a percentile bootstrap over samples (resampling with replacement; a task's
seed is the same in every point, so both members of a pair get the same resampled
indices), seeded so a table is reproducible. The measures build their statistics from
:func:`mean_draws` (:mod:`harness.analysis.quality`), :func:`paired_ratio_ci` (the latency
speedup: timed iterations paired by prompt set, :mod:`harness.analysis.speed`) and
:func:`ratio_of_medians_ci` (two independent sets of timings).
"""

from __future__ import annotations

import zlib
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


NAN = Estimate(float("nan"), float("nan"), float("nan"), 0)


def _indices(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    lo, hi = np.nanpercentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def task_seed(task: str) -> int:
    """A task's bootstrap seed: the same resampled indices for a task in every point, so
    two points' draws of one task are paired. A stable hash of the name (CRC-32), the same
    in every process and Python version, and different for names with the same letters
    (a sum of character codes gave gov_report and multi_news one seed, 1095)."""
    return SEED + zlib.crc32(task.encode())


def mean_draws(values: np.ndarray, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """``resamples`` bootstrap means of ``values`` (all NaN when there are none)."""
    if values.size == 0:
        return np.full(resamples, np.nan)
    return np.asarray(values[_indices(values.size, resamples, seed)].mean(axis=1))


def cluster_mean_draws(values: np.ndarray, ids: Sequence[int], seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """``resamples`` bootstrap means of ``values`` (one per unit ``ids``) whose resampling
    is keyed by the unit, not its position: the Poisson bootstrap (each unit weighs a
    Poisson(1) count in a resample, drawn from ``seed`` and the unit's id), so a unit gets
    the same weight wherever it appears: in every turn of a conversation, in both members
    of a pair, in any subset of the units. A mean over several columns of the same units
    (a conversation's turns) then resamples whole units. NaN values (a turn a unit lacks)
    are left out of that resample's mean; all NaN when there are none."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return np.full(resamples, np.nan)
    if len(ids) != v.size:
        raise ValueError(f"cluster_mean_draws: {v.size} values against {len(ids)} ids; one id per value")
    w = np.stack([np.random.default_rng([seed, int(i)]).poisson(1.0, resamples) for i in ids], axis=1).astype(float)
    have = ~np.isnan(v)
    w[:, ~have] = 0.0
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (w[:, have] @ v[have]) / total
    out[total == 0] = np.nan
    return np.asarray(out)


def estimate(value: float, draws: np.ndarray, n: int, level: float = LEVEL) -> Estimate:
    """``value`` with the percentile interval of its bootstrap ``draws`` (NaN draws left
    out; no interval when every draw is NaN)."""
    if np.isnan(draws).all():
        return Estimate(value, float("nan"), float("nan"), n)
    return Estimate(value, *_interval(draws, level), n)


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
        return NAN
    da = np.median(a[_indices(a.size, resamples, seed)], axis=1)
    db = np.median(b[_indices(b.size, resamples, seed + 1)], axis=1)
    return Estimate(float(np.median(a) / np.median(b)), *_interval(da / db, level), int(min(a.size, b.size)))


#: Fewer timed pairs than this give a speedup without an interval: a bootstrap over 3 or 4
#: pairs has only a handful of distinct medians, so its "95 %" would be the min-max of a
#: few ratios (the old protocol's three iterations read that way).
MIN_PAIRS = 5


def _pairs(
    fn: str, x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, what: tuple[str, str]
) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as float arrays of equal shape (refused, naming ``fn`` and the two
    sides ``what``, where they are not), with the pairs that have a NaN member left out."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"{fn}: {a.size} {what[0]} against {b.size} {what[1]}; pairs need equal counts")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]


def paired_ratio_ci(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Estimate:
    """The median of the per-pair ratios ``numerator[i] / denominator[i]`` (a speedup timed
    side by side: pair ``i`` is the reference and the method on the same prompts in the same
    iteration), with the percentile interval of the bootstrap that resamples *pairs*, so
    whatever moves both members of a pair (a slower minute, a different prompt set) cancels
    in each ratio instead of widening or biasing the interval. Pairs with a NaN member are
    left out; with fewer than :data:`MIN_PAIRS` pairs the interval is NaN (the value stays)."""
    a, b = _pairs("paired_ratio_ci", numerator, denominator, ("numerators", "denominators"))
    ratios = a / b
    if ratios.size == 0:
        return NAN
    value = float(np.median(ratios))
    if ratios.size < MIN_PAIRS:
        return Estimate(value, float("nan"), float("nan"), int(ratios.size))
    draws = np.median(ratios[_indices(ratios.size, resamples, seed)], axis=1)
    return Estimate(value, *_interval(draws, level), int(ratios.size))


def slope_ci(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Estimate:
    """The least-squares slope of ``y`` on ``x`` with the percentile interval of the
    bootstrap that resamples (x, y) pairs. Pairs with a NaN member are left out; with fewer
    than :data:`MIN_PAIRS` pairs, or no spread in ``x``, the slope is NaN (too few points
    to fit a trend); a resample without spread in ``x`` is left out of the interval."""
    a, b = _pairs("slope_ci", x, y, ("x values", "y values"))
    n = int(a.size)
    if n < MIN_PAIRS or np.ptp(a) == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), n)

    def fit(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        dx = xs - xs.mean(axis=-1, keepdims=True)
        var = (dx * dx).sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(
                (dx * (ys - ys.mean(axis=-1, keepdims=True))).sum(axis=-1) / np.where(var > 0, var, np.nan)
            )

    idx = _indices(n, resamples, seed)
    return Estimate(float(fit(a, b)), *_interval(fit(a[idx], b[idx]), level), n)
