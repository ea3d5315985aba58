"""Confidence intervals for the quality summary: every score, retention and TTFT ratio row.

The summary's rows are task means and macro means of them (categories, ``ALL``, length
buckets). Their intervals come from one seeded bootstrap per task (:mod:`harness.stats`):
each task's samples are resampled within the task, and a category's or ``ALL``'s draws are
the same macro means of the tasks' draws as its point estimate is of the task means.
Retention (a method's score over the reference's) and the TTFT ratio are paired: only the
samples both ran, resampled together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from harness.stats import RESAMPLES, estimate, mean_draws, task_seed

#: The columns that identify a summary point (besides its task label).
POINT_KEYS = ["model", "benchmark", "length", "method", "keep_rate", "_bopts", "_run", "_base", "_ref"]
PAIR_KEYS = ["model", "benchmark", "length", "_bopts", "_run", "_ref"]
Draws = dict[str, np.ndarray]  # task -> [RESAMPLES] resampled means


def _task_draws(values: np.ndarray, task: str) -> np.ndarray:
    return mean_draws(values, task_seed(task))


def _combine(draws: Draws, names: list[str]) -> np.ndarray:
    if not names or any(n not in draws for n in names):
        return np.full(RESAMPLES, np.nan)
    return np.mean([draws[n] for n in names], axis=0)


def _rows_draws(label: str, tasks: Draws, cats: dict[str, list[str]], buckets: dict[str, Draws]) -> np.ndarray:
    """The draws of one summary row, built like its point estimate."""
    if label.startswith("[category] "):
        return _combine(tasks, cats.get(label[len("[category] ") :], []))
    if label == "ALL":
        if cats:
            cat_draws = {c: _combine(tasks, ts) for c, ts in cats.items()}
            return _combine(cat_draws, list(cat_draws))
        return _combine(tasks, list(tasks))
    if label.startswith("ALL @"):
        b = buckets.get(label[len("ALL @") :], {})
        return _combine(b, list(b))
    if " @" in label:
        task, bucket = label.split(" @", 1)
        return buckets.get(bucket, {}).get(task, np.full(RESAMPLES, np.nan))
    return tasks.get(label, np.full(RESAMPLES, np.nan))


def _interval(d: np.ndarray) -> tuple[float, float]:
    e = estimate(float("nan"), d, 0)
    return e.lo, e.hi


def _draws_of(rows: pd.DataFrame, column: str, sample_ids: Callable[[str], set] | None = None) -> tuple[Draws, dict]:
    """Per task (and per length bucket) draws of ``column``'s mean, over the ok rows (and,
    with ``sample_ids``, only the samples it returns for the task)."""
    tasks: Draws = {}
    buckets: dict[str, Draws] = {}
    for (task, bucket), g in rows.groupby(["task", "bucket"], dropna=False):
        if sample_ids is not None:
            g = g[g["sample_id"].isin(sample_ids(task))]
        g = g.sort_values("sample_id")
        values = g[column].to_numpy(dtype=float)
        if bucket:
            buckets.setdefault(str(bucket), {})[str(task)] = _task_draws(values, f"{task}@{bucket}")
    for task, g in rows.groupby("task"):
        if sample_ids is not None:
            g = g[g["sample_id"].isin(sample_ids(str(task)))]
        tasks[str(task)] = _task_draws(g.sort_values("sample_id")[column].to_numpy(dtype=float), str(task))
    return tasks, buckets


def intervals(df: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """For every summary row: ``score_lo``/``score_hi`` (95 %), ``retention`` (score over the
    reference's on the same samples) with ``retention_lo``/``retention_hi``, and
    ``ttft_ratio_lo``/``ttft_ratio_hi`` (paired, where the row has a side-by-side ratio).
    ``df``: the labelled sample rows summarize works on; ``summary``: its output, still
    keyed by the point columns."""
    ok = df[df["status"] == "ok"].copy()
    ok["bucket"] = ok["bucket"].fillna("")
    ok["category"] = ok["category"].fillna("")
    out = summary.copy()
    for c in ("score_lo", "score_hi", "retention", "retention_lo", "retention_hi", "ttft_ratio_lo", "ttft_ratio_hi"):
        out[c] = np.nan
    refs = {k: g for k, g in ok[ok["_base"] == ok["_ref"]].groupby(PAIR_KEYS, dropna=False)}
    for key, rows in out.groupby(POINT_KEYS, dropna=False):
        point = ok
        for k, v in zip(POINT_KEYS, key, strict=True):
            point = point[point[k].isna()] if isinstance(v, float) and np.isnan(v) else point[point[k] == v]
        cats = {c: sorted(set(g["task"])) for c, g in point.groupby("category") if c}
        tasks, buckets = _draws_of(point, "score")
        pair_key = tuple(key[POINT_KEYS.index(k)] for k in PAIR_KEYS)
        ref = refs.get(pair_key)
        paired = None
        if ref is not None:
            ids = {t: set(g["sample_id"]) & set(ref[ref["task"] == t]["sample_id"]) for t, g in point.groupby("task")}

            def both(task: str, ids: dict = ids) -> set:
                return ids.get(task.split("@")[0], set())

            paired = [_draws_of(point, "score", both), _draws_of(ref, "score", both)]
            paired_t = [_draws_of(point, "ttft_s", both), _draws_of(ref, "ttft_s", both)]
            means = {
                t: (
                    point[(point["task"] == t) & point["sample_id"].isin(s)]["score"].mean(),
                    ref[(ref["task"] == t) & ref["sample_id"].isin(s)]["score"].mean(),
                )
                for t, s in ids.items()
            }
        for i, label in zip(rows.index, rows["task"], strict=True):
            lo, hi = _interval(_rows_draws(label, tasks, cats, buckets))
            out.loc[i, ["score_lo", "score_hi"]] = lo, hi
            if paired is None:
                continue
            m = _rows_draws(label, paired[0][0], cats, paired[0][1])
            r = _rows_draws(label, paired[1][0], cats, paired[1][1])
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = m / r
            ratio[~np.isfinite(ratio)] = np.nan
            out.loc[i, "retention"] = _point_retention(label, means, cats)
            out.loc[i, ["retention_lo", "retention_hi"]] = _interval(ratio)
            if pd.notna(out.loc[i, "ttft_ratio"]):
                mt = _rows_draws(label, paired_t[0][0], cats, paired_t[0][1])
                rt = _rows_draws(label, paired_t[1][0], cats, paired_t[1][1])
                with np.errstate(divide="ignore", invalid="ignore"):
                    out.loc[i, ["ttft_ratio_lo", "ttft_ratio_hi"]] = _interval(mt / rt)
    return out


def _point_retention(label: str, means: dict[str, tuple[float, float]], cats: dict[str, list[str]]) -> float:
    """The retention of a row from the paired task means, macro-averaged like the row."""

    def macro(names: list[str], i: int) -> float:
        vals = [means[n][i] for n in names if n in means]
        return float(np.mean(vals)) if vals and len(vals) == len(names) else float("nan")

    if label.startswith("[category] "):
        names = cats.get(label[len("[category] ") :], [])
        a, b = macro(names, 0), macro(names, 1)
    elif label == "ALL":
        if cats:
            a = float(np.mean([macro(ts, 0) for ts in cats.values()]))
            b = float(np.mean([macro(ts, 1) for ts in cats.values()]))
        else:
            a, b = macro(list(means), 0), macro(list(means), 1)
    elif label in means:
        a, b = means[label]
    else:
        return float("nan")  # length buckets: see the long table's per-bucket scores
    return a / b if b else float("nan")
