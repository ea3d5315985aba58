"""The quality measures of eval rows, each defined once, with its estimator and interval.

A measure is taken over *parts*: groups of tasks (:data:`Parts`). Its value is the mean
over the groups of the mean over each group's tasks of the per-task sample mean: a task
is ``[[task]]``, a LongBench category ``[[its tasks]]``, ``ALL`` the mean over categories
where the benchmark has them (LongBench's "Avg") else ``[[every task]]`` (RULER's mean
over tasks). Every interval is a 95 % percentile bootstrap of *the same statistic*: each
task's samples are resampled within the task (2000 resamples, seeded per task by
:func:`~harness.analysis.stats.task_seed`, so the same task gets the same resampled indices
in every point and in both members of a pair) and combined exactly as the value is. The
value is the statistic on the samples; the interval the percentiles of the statistic on
the resamples: one estimator, so the point lies inside its interval. A conversation's
turns (tasks ``<task>/turn<k>``) are one sample each, not four: their conversations are
resampled by id (:func:`resample_mean`), the same weights in every turn, so ``ALL`` (the
mean over turns) and every paired measure resample whole conversations, and ``n`` counts
conversations.

============== ============================================================================
measure        estimator
============== ============================================================================
score          macro mean of per-sample scores (:func:`macro_mean`)
kept_fraction  macro mean of per-sample kept fractions
needle_kept    macro mean over the tasks that have evidence tokens (others have no value): the
               tokens of the evidence the question asks (a RULER needle of the asked key)
distractor_kept  likewise for look-alike evidence the question does not ask (niah_multikey_1's
               other keys' needles; a conversation turn's other turns' needles)
needle_whole   macro mean, as ``needle_kept``, of the share of the evidence's pieces kept whole
               (each needle, each statement of a variable-tracking chain, qa_1's paragraph,
               each of qa_2's supporting sentences,
               every token of it): what ``needle_kept`` cannot tell, a chain kept in pieces
               from one kept statement by statement
question_kept  macro mean, as ``needle_kept``, of the share of the prompt after the context (the
               question, the chat template's closing, the answer prefix) kept: the reference
               SpecPrefill force-keeps none of it
retention      ratio of macro means, paired: the point's score over the reference's on the
               samples both ran (:func:`paired_ratio`); ``retention_n`` counts them (below
               ``n`` where the reference ran fewer samples, or failed some: renderers say so)
ttft_ratio     ratio of macro means, paired: the point's TTFT over the reference's on the
               samples both ran, when both ran on one machine (< 1 is faster); ``speedup_n``
               counts them (it and ``speedup`` pair the same samples), below ``n`` as
               ``retention_n`` can be
ttft_s         macro mean of per-sample TTFT (the method's own work and the base prefill);
               ``speculator_s`` likewise, the speculator's part of it
speedup        the reference's TTFT over the point's, paired by sample (1 / ttft_ratio; its
               interval from the same resampled samples). **Between runs**: each method's
               eval run timed its samples on its own, minutes apart, so the interval covers
               the samples only, not the drift between runs (20 % or more on a shared
               machine); side-by-side speedups come from the latency job
               (:mod:`harness.analysis.speed`)
speedup_timing ``between runs`` as above; ``side by side`` where the point's rows and its
               reference's come from one job that ran them turn by turn in a turned-over order
               (a multi-turn job with ``also``: rows with ``order``): then the reference is
               that job's own rows and the ratio is side by side. Either ends ``, loaded``
               where some row of the label, the point's or its reference's, saw other work on
               the machine while it ran (:func:`harness.analysis.speed.load_of`: more than
               :data:`~harness.analysis.speed.FOREIGN_CPU_MAX` of its cores busy with other
               processes, or a load average above the cores plus the margin): such a speedup
               times the machine's other work as much as the methods (rows before 2026-12-06
               record no load and are not marked)
speed_anomaly  the speedup above its ideal by more than the latency measures' tolerance
               (:func:`harness.analysis.speed.anomaly`): the words, else ``""``
ideal_speedup  the FLOP model's full prefill over the method's work, ratio of means over
               the point's samples (:mod:`specprefill.flops`, the speculator included)
efficiency     speedup / ideal_speedup
kv_fraction    the base's KV cache after the prefill over the prompt, in tokens: ratio of
               macro means of ``kv_tokens`` and ``prompt_tokens`` over the point's samples
               (a KV press keeps ``keep`` of the cache; a prompt compressor what it kept)
kv_mib         macro mean of the KV memory the method holds after the prefill, in MiB: the
               base's cache (``kv_bytes``, all layers, keys and values) plus any cache the
               method keeps beside it (``speculator_kv_bytes``: KV revival's speculator cache
               of the whole conversation), the normalized column ``kv_held_bytes``
speculator_kv_mib  macro mean of ``speculator_kv_bytes`` alone, in MiB (rows that record it)
kv_memory_ratio  ``kv_held_bytes`` over the reference's, paired by sample (ratio of macro
               means, interval over samples): the memory held against full prefill's
decode_s_per_token  ratio of macro means of ``decode_s`` and ``output_tokens``
e2e_s          macro mean of ``ttft_s + max_new_tokens * decode_s / output_tokens``: the
               end-to-end latency at the benchmark's output length, each sample's decode
               rate over the whole budget (an answer that stops early is not faster)
e2e_speedup    the reference's e2e_s over the point's, paired by sample, between runs like speedup;
               ``e2e_speedup_n`` counts the samples it pairs
prefilled_tokens  a conversation turn's tokens the base prefilled that turn (multi-turn rows;
               :mod:`specprefill.conversation`), macro mean; ``revived_tokens`` those of them
               revived from earlier turns
difference     the gate: macro mean of per-sample paired differences, candidate - baseline
============== ============================================================================

Why a ratio of means and not a mean of per-sample (or per-task) ratios: a sample or task
whose reference scores 0 makes its ratio undefined, and a mean of ratios weighs a task of
near-zero score as much as any other; the ratio of the means is what a table of mean
scores shows (the paper's retention is its table's score over full prefill's), and its
bootstrap is the same ratio on each resample. For TTFT the ratio of means is the ratio of
total prefill time over the same prompts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import POINT, REFERENCE_OF, machine, normalize
from harness.analysis.speed import anomaly, load_of
from harness.analysis.stats import NAN, Estimate, cluster_mean_draws, estimate, mean_draws, task_seed

#: Groups of task names: a measure is the mean over groups of the mean over a group's tasks.
Parts = list[list[str]]
#: What one machine is called when a point's rows ran on several (no ratio is formed).
MIXED = "<more than one machine>"


#: A conversation's turn as a task of its own (:func:`harness.analysis.rows.normalize`).
TURN_TASK = re.compile(r"^(?P<task>.+)/turn\d+$")


def conversation(task: str) -> str | None:
    """The conversation task a turn task (``<task>/turn<k>``) belongs to, else None."""
    m = TURN_TASK.match(task)
    return m["task"] if m else None


def resample_mean(task: str, values: np.ndarray, ids: Iterable[Any]) -> np.ndarray:
    """The bootstrap means of one task's per-sample ``values`` (NaN left out): resampled by
    position within the task (:func:`~harness.analysis.stats.mean_draws`), except a
    conversation's turns, whose conversations are resampled by id with the conversation
    task's seed (:func:`~harness.analysis.stats.cluster_mean_draws`), so a mean over turns
    resamples whole conversations, not turns as if they were independent samples."""
    base = conversation(task)
    if base is None:
        return mean_draws(values[~np.isnan(values)], task_seed(task))
    return cluster_mean_draws(values, [int(i) for i in ids], task_seed(base))


def unit_mean(values: np.ndarray, units: Iterable[int], seed_task: str) -> Estimate:
    """The mean of ``values`` (NaN left out) whose rows belong to ``units`` (a conversation's
    several turns, the same unit), with its 95 % interval resampling whole units (the
    conversation bootstrap of :func:`resample_mean`, seeded by ``seed_task``): e.g. turns
    pooled by the asked needle's depth, where a conversation may have several turns in one
    bin."""
    v = np.asarray(values, dtype=float)
    have = ~np.isnan(v)
    value = float(v[have].mean()) if have.any() else float("nan")
    return estimate(value, cluster_mean_draws(v, [int(u) for u in units], task_seed(seed_task)), int(have.sum()))


class Point:
    """The ok rows of one point by task (each task's samples in sample-id order), with the
    bootstrap draws of each column cached."""

    def __init__(self, rows: pd.DataFrame) -> None:
        self.rows = rows
        self.tasks = {
            str(t): g.drop_duplicates("sample_id").set_index("sample_id").sort_index() for t, g in rows.groupby("task")
        }
        self._draws: dict[tuple, np.ndarray] = {}
        self._loaded: dict[frozenset[str], bool] = {}

    def values(self, task: str, column: str, ids: pd.Index | None = None) -> np.ndarray:
        g = self.tasks.get(task)
        if g is None or column not in g:
            return np.array([], dtype=float)
        s = g[column] if ids is None else g[column].reindex(ids)
        return s.to_numpy(dtype=float)

    def draws(self, task: str, column: str, ids: pd.Index | None = None) -> np.ndarray:
        key = (task, column, None if ids is None else tuple(ids))
        if key not in self._draws:
            g = self.tasks.get(task)
            index = ids if ids is not None else (g.index if g is not None else pd.Index([]))
            self._draws[key] = resample_mean(task, self.values(task, column, ids), index)
        return self._draws[key]

    def units(self, tasks: Iterable[str]) -> int:
        """The samples of ``tasks``, a conversation counted once over its turns."""
        return len({(conversation(t) or t, i) for t in tasks if t in self.tasks for i in self.tasks[t].index})

    def loaded(self, tasks: Iterable[str]) -> bool:
        """Whether some row of ``tasks`` saw other work on the machine while it ran
        (:func:`harness.analysis.speed.load_of`; False where rows record no load)."""
        key = frozenset(t for t in tasks if t in self.tasks)
        if key not in self._loaded:  # a reference is asked once per point set beside it
            self._loaded[key] = bool(key) and bool(load_of(pd.concat([self.tasks[t] for t in key]))["loaded"])
        return self._loaded[key]

    def hardware(self, tasks: Iterable[str] | None = None) -> str:
        """The one machine the rows of ``tasks`` (all) ran on (their ``machine``: hardware and
        CPU flags, :func:`harness.analysis.rows.machine`), or :data:`MIXED`."""
        names = None if tasks is None else set(tasks)
        gs = [g for t, g in self.tasks.items() if names is None or t in names]
        hw = {str(h) for g in gs for h in (g["machine"] if "machine" in g else machine(g))}
        return next(iter(hw)) if len(hw) == 1 else MIXED


def _groups(parts: Parts, values: dict[str, float], complete: bool) -> list[list[str]] | None:
    """Each group's tasks that have a value, or None when a task is missing (``complete``)
    or nothing is left."""
    have = [[t for t in group if t in values and not np.isnan(values[t])] for group in parts]
    if (complete and any(len(h) < len(g) for h, g in zip(have, parts, strict=True))) or not any(have):
        return None
    return [h for h in have if h]


def _macro(groups: list[list[str]], per_task: dict[str, Any]) -> Any:
    """The mean over groups of the mean over each group's tasks (of values or of draws)."""
    return np.mean([np.mean([per_task[t] for t in g], axis=0) for g in groups], axis=0)


def _combine(parts: Parts, values: dict[str, float], draws: dict[str, np.ndarray], complete: bool):
    """(value, draws) of the mean over groups of the mean over tasks, or None when a task
    is missing (``complete``) or nothing is left."""
    groups = _groups(parts, values, complete)
    return None if groups is None else (float(_macro(groups, values)), _macro(groups, draws))


def _tasks(parts: Parts) -> list[str]:
    return [t for group in parts for t in group]


def macro_mean(point: Point, column: str, parts: Parts, complete: bool = True) -> Estimate:
    """The macro mean of ``column`` over ``parts`` with its stratified bootstrap interval;
    ``complete``: NaN when a task has no value (a task a method failed entirely must not
    drop out of a category or ``ALL``), else the tasks without values are left out."""
    values, draws, n = {}, {}, 0
    for t in _tasks(parts):
        v = point.values(t, column)
        v = v[~np.isnan(v)]
        if v.size:
            values[t], draws[t], n = float(v.mean()), point.draws(t, column), n + int(v.size)
    got = _combine(parts, values, draws, complete)
    return NAN if got is None else estimate(got[0], got[1], n)


def common_ids(a: Point, a_col: str, b: Point, b_col: str, task: str) -> pd.Index:
    """The samples of ``task`` both points ran with a value in their column."""
    ga, gb = a.tasks.get(task), b.tasks.get(task)
    if ga is None or gb is None or a_col not in ga or b_col not in gb:
        return pd.Index([])
    return ga.index[ga[a_col].notna()].intersection(gb.index[gb[b_col].notna()]).sort_values()


def paired_ratio(num: Point, num_col: str, den: Point, den_col: str, parts: Parts) -> Estimate:
    """``macro mean(num_col of num) / macro mean(den_col of den)`` over the samples both
    ran, each task's pairs resampled together (the same indices on both sides)."""
    nv, nd, dv, dd, n = {}, {}, {}, {}, 0
    for t in _tasks(parts):
        ids = common_ids(num, num_col, den, den_col, t)
        if not len(ids):
            continue
        nv[t], dv[t] = float(num.values(t, num_col, ids).mean()), float(den.values(t, den_col, ids).mean())
        nd[t], dd[t] = num.draws(t, num_col, ids), den.draws(t, den_col, ids)
        n += len(ids)
    top, bottom = _combine(parts, nv, nd, True), _combine(parts, dv, dd, True)
    if top is None or bottom is None or bottom[0] == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), n)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = top[1] / bottom[1]
    draws[~np.isfinite(draws)] = np.nan
    return estimate(top[0] / bottom[0], draws, n)


def paired_difference(cand: Point, base: Point, column: str, parts: Parts) -> tuple[Estimate, float, float]:
    """(the macro mean of ``cand - base`` per sample over the samples both ran, with its
    interval; the baseline's and the candidate's macro means over those samples)."""
    dv, dd, bv, cv, n = {}, {}, {}, {}, 0
    for t in _tasks(parts):
        ids = common_ids(cand, column, base, column, t)
        if not len(ids):
            continue
        c, b = cand.values(t, column, ids), base.values(t, column, ids)
        dv[t], dd[t] = float((c - b).mean()), resample_mean(t, c - b, ids)
        bv[t], cv[t] = float(b.mean()), float(c.mean())
        n += len(ids)
    return _paired_macro(parts, dv, dd, bv, cv, n)


def paired_difference_of_differences(
    a: tuple[Point, Point], b: tuple[Point, Point], column: str, parts: Parts
) -> tuple[Estimate, float, float]:
    """(the macro mean of ``(a[0] - a[1]) - (b[0] - b[1])`` per sample over the samples all four
    points ran, with its interval; ``b``'s difference and ``a``'s over those samples). Each
    task's samples are resampled together on all four sides, so the interval is that of the
    change in a paired effect between two settings run on the same samples (the position cost
    at two budgets), not of two intervals set side by side."""
    dv, dd, bv, av, n = {}, {}, {}, {}, 0
    for t in _tasks(parts):
        ids = common_ids(a[0], column, a[1], column, t).intersection(common_ids(b[0], column, b[1], column, t))
        if not len(ids):
            continue
        da = a[0].values(t, column, ids) - a[1].values(t, column, ids)
        db = b[0].values(t, column, ids) - b[1].values(t, column, ids)
        dv[t], dd[t] = float((da - db).mean()), resample_mean(t, da - db, ids)
        bv[t], av[t] = float(db.mean()), float(da.mean())
        n += len(ids)
    return _paired_macro(parts, dv, dd, bv, av, n)


def _paired_macro(
    parts: Parts,
    dv: dict[str, float],
    dd: dict[str, np.ndarray],
    bv: dict[str, float],
    cv: dict[str, float],
    n: int,
) -> tuple[Estimate, float, float]:
    """The macro means of per-task paired differences ``dv`` (with their bootstrap draws ``dd``)
    and of the two sides ``bv`` and ``cv``, over ``parts`` (NaN where a part has no task)."""
    groups = _groups(parts, dv, True)
    if groups is None:
        return NAN, float("nan"), float("nan")
    d = estimate(float(_macro(groups, dv)), _macro(groups, dd), n)
    return d, float(_macro(groups, bv)), float(_macro(groups, cv))


# --------------------------------------------------------------------------- labels


def categories(rows: pd.DataFrame, category: Callable[[pd.Series], str] | None = None) -> dict[str, list[str]]:
    """Category -> its tasks: the rows' own ``category`` (LongBench), or ``category(row)``."""
    out: dict[str, set[str]] = {}
    for task, g in rows.groupby("task"):
        c = category(g.iloc[0]) if category is not None else str(g["category"].iloc[0] or "")
        if c:
            out.setdefault(c, set()).add(str(task))
    return {c: sorted(ts) for c, ts in sorted(out.items())}


def all_parts(tasks: Iterable[str], cats: dict[str, list[str]]) -> Parts:
    """``ALL``: the mean over categories where there are any, else over tasks."""
    return [ts for _, ts in sorted(cats.items())] if cats else [sorted(tasks)]


def labels(rows: pd.DataFrame) -> dict[str, Parts]:
    """The summary rows of one point: each task, each category (``[category] <name>``) and
    ``ALL``; with length buckets (LongBench-E), ``<task> @<bucket>`` and ``ALL @<bucket>``
    (over the bucket's tasks), whose task names are ``"<task> @<bucket>"``."""
    tasks = sorted({str(t) for t in rows["task"]})
    cats = categories(rows)
    out: dict[str, Parts] = {t: [[t]] for t in tasks}
    out.update({f"[category] {c}": [ts] for c, ts in cats.items()})
    out["ALL"] = all_parts(tasks, cats)
    buckets = sorted({str(b) for b in rows["bucket"] if b})
    for b in buckets:
        names = sorted({f"{t} @{b}" for t in rows.loc[rows["bucket"] == b, "task"]})
        out.update({name: [[name]] for name in names})
        out[f"ALL @{b}"] = [names]
    return out


def bucketed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a length bucket again, their task named ``"<task> @<bucket>"``."""
    b = rows[rows["bucket"] != ""]
    return b.assign(task=b["task"].astype(str) + " @" + b["bucket"].astype(str))


# --------------------------------------------------------------------------- the summary

COLUMNS = [
    "model", "benchmark", "length", "task", "method", "keep_rate", "n", "failed", "unsupported",
    "score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
    "kept_fraction", "kept_fraction_lo", "kept_fraction_hi", "needle_kept", "needle_kept_lo", "needle_kept_hi",
    "ttft_s", "speculator_s", "ttft_ratio", "ttft_ratio_lo", "ttft_ratio_hi", "speedup", "speedup_lo", "speedup_hi",
    "ideal_speedup", "efficiency", "method_name", "reference", "hardware",
    "speculator", "method_options", "benchmark_options", "dtype", "backend",
    "kv_fraction", "kv_mib", "decode_s_per_token", "e2e_s", "e2e_speedup", "e2e_speedup_lo", "e2e_speedup_hi",
    "prefilled_tokens", "revived_tokens", "speed_anomaly", "speedup_timing",
    "distractor_kept", "speculator_kv_mib", "kv_memory_ratio", "kv_memory_ratio_lo", "kv_memory_ratio_hi",
    "needle_whole", "needle_whole_lo", "needle_whole_hi", "question_kept", "question_kept_lo", "question_kept_hi",
    "retention_n", "speedup_n", "e2e_speedup_n",
]  # fmt: skip


#: How ``speedup_timing`` ends where the rows shared the machine (see the module's table).
LOADED = ", loaded"


def timed_loaded(timing: Any) -> bool:
    """Whether a summary's ``speedup_timing`` says its rows shared the machine."""
    return isinstance(timing, str) and timing.endswith(LOADED)


def references(ok: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """The reference's ok rows by :data:`REFERENCE_OF` key."""
    ref = ok[ok["is_reference"]]
    return {k: g for k, g in ref.groupby(REFERENCE_OF, dropna=False)} if not ref.empty else {}


def side_by_side(rows: pd.DataFrame) -> str | None:
    """The run whose job ran ``rows`` side by side with other methods (every row carries an
    ``order`` and one ``run_id``), or None."""
    if "order" not in rows or rows.empty or rows["run_id"].nunique() != 1:
        return None
    return str(rows["run_id"].iloc[0]) if pd.to_numeric(rows["order"], errors="coerce").notna().all() else None


def run_references(ok: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """The reference's ok rows of side-by-side jobs by :data:`REFERENCE_OF` key plus run."""
    ref = ok[ok["is_reference"]]
    if ref.empty or "order" not in ref:
        return {}
    ref = ref[pd.to_numeric(ref["order"], errors="coerce").notna()]
    return {k: g for k, g in ref.groupby([*REFERENCE_OF, "run_id"], dropna=False)} if not ref.empty else {}


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Eval rows summarized: one row per point (:data:`~harness.analysis.rows.POINT`, the
    ``method`` column its label) and label (task, category, ``ALL``, length bucket), with
    every measure of the module's table and its interval. A ratio to the reference is
    taken against the reference's rows of the same model, benchmark, options, length,
    dtype and backend; a TTFT ratio only where both ran on one machine (the rows'
    ``machine``: hardware and CPU flags; a sweep resumed elsewhere gets none, not a
    cross-machine one)."""
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = normalize(rows)
    ok = df[df["status"] == "ok"]
    refs = references(ok)
    ref_points = {k: (Point(g), Point(bucketed(g))) for k, g in refs.items()}
    run_points = {k: (Point(g), Point(bucketed(g))) for k, g in run_references(ok).items()}
    out = []
    for key, g in df.groupby([*POINT, "label"], dropna=False, sort=True):
        point = dict(zip([*POINT, "label"], key, strict=True))
        good = g[g["status"] == "ok"]
        point["is_reference_point"] = bool(g["is_reference"].any())
        p, pb = Point(good), Point(bucketed(good))
        run = side_by_side(good) if not point["is_reference_point"] else None
        ref_key = tuple(point[k] for k in REFERENCE_OF)
        r = run_points.get((*ref_key, run)) if run is not None else None
        timing = "side by side" if r is not None else "between runs"
        r = r or ref_points.get(ref_key)
        bad = g[g["status"] != "ok"]
        hardware = p.hardware() if not good.empty else ""
        for label, parts in labels(g).items():
            this, ref = (pb, r[1] if r else None) if " @" in label else (p, r[0] if r else None)
            names = set(_tasks(parts))
            # a TTFT ratio only side by side: this label's rows and the reference's on one machine
            here = this.hardware(names)
            same_machine = ref is not None and here != MIXED and ref.hardware(names) == here
            in_label = (
                bad["task"].isin(names) if " @" not in label else (bad["task"] + " @" + bad["bucket"]).isin(names)
            )
            row = {
                "model": point["model"], "benchmark": point["benchmark"], "length": point["length"], "task": label,
                "method": point["label"], "keep_rate": point["keep_rate"],
                "n": this.units(names),
                "failed": int((bad[in_label]["status"] == "failed").sum()),
                "unsupported": int((bad[in_label]["status"] == "unsupported").sum()),
                "method_name": point["method"], "reference": point["reference_method"], "hardware": hardware,
                **{k: point[k] for k in ("speculator", "method_options", "benchmark_options", "dtype", "backend")},
            }  # fmt: skip
            row.update(measures(this, ref, parts, same_machine))
            shown = not np.isnan(row["speedup"]) and not point["is_reference_point"]
            busy = shown and (this.loaded(names) or (ref is not None and ref.loaded(names)))
            row["speedup_timing"] = f"{timing}{LOADED}" if busy else timing if shown else ""
            out.append(row)
    s = pd.DataFrame(out).reindex(columns=COLUMNS)
    return s.sort_values(["model", "benchmark", "length", "task", "method", "keep_rate"]).reset_index(drop=True)


def measures(p: Point, ref: Point | None, parts: Parts, same_machine: bool) -> dict[str, Any]:
    """Every measure of one point over ``parts`` (the module's table), as summary columns."""
    out: dict[str, Any] = {}

    def put(name: str, e: Estimate, interval: bool = True, count: str | None = None) -> None:
        out[name] = e.value
        if interval:
            out[f"{name}_lo"], out[f"{name}_hi"] = e.lo, e.hi
        if count:  # the samples a paired measure pairs (``retention_n``, ...)
            out[count] = e.n

    put("score", macro_mean(p, "score", parts))
    put("kept_fraction", macro_mean(p, "kept_fraction", parts))
    put("needle_kept", macro_mean(p, "needle_kept", parts, complete=False))
    out["distractor_kept"] = macro_mean(p, "distractor_kept", parts, complete=False).value
    put("needle_whole", macro_mean(p, "needle_whole", parts, complete=False))
    put("question_kept", macro_mean(p, "question_kept", parts, complete=False))
    put("ttft_s", macro_mean(p, "ttft_s", parts), interval=False)
    put("speculator_s", macro_mean(p, "speculator_s", parts), interval=False)
    put("ideal_speedup", paired_ratio(p, "flops_full", p, "flops_method", parts), interval=False)
    nan = Estimate(float("nan"), float("nan"), float("nan"), 0)
    put("retention", paired_ratio(p, "score", ref, "score", parts) if ref is not None else nan, count="retention_n")
    timed = ref is not None and same_machine
    put("ttft_ratio", paired_ratio(p, "ttft_s", ref, "ttft_s", parts) if timed else nan)  # type: ignore[arg-type]
    put("speedup", paired_ratio(ref, "ttft_s", p, "ttft_s", parts) if timed else nan, count="speedup_n")  # type: ignore[arg-type]
    out["efficiency"] = out["speedup"] / out["ideal_speedup"] if out["ideal_speedup"] else float("nan")
    out["speed_anomaly"] = anomaly(out["speedup"], out["ideal_speedup"])  # type: ignore[assignment]
    put("kv_fraction", paired_ratio(p, "kv_tokens", p, "prompt_tokens", parts), interval=False)
    out["kv_mib"] = macro_mean(p, "kv_held_bytes", parts).value / 2**20
    out["speculator_kv_mib"] = macro_mean(p, "speculator_kv_bytes", parts).value / 2**20
    put("kv_memory_ratio", paired_ratio(p, "kv_held_bytes", ref, "kv_held_bytes", parts) if ref is not None else nan)
    put("decode_s_per_token", paired_ratio(p, "decode_s", p, "output_tokens", parts), interval=False)
    put("e2e_s", macro_mean(p, "e2e_s", parts), interval=False)
    put("e2e_speedup", paired_ratio(ref, "e2e_s", p, "e2e_s", parts) if timed else nan, count="e2e_speedup_n")  # type: ignore[arg-type]
    put("prefilled_tokens", macro_mean(p, "prefilled_tokens", parts), interval=False)
    put("revived_tokens", macro_mean(p, "revived_tokens", parts), interval=False)
    return out


def point_rows(rows: pd.DataFrame, where: dict[str, object]) -> pd.DataFrame:
    """The normalized ok eval rows matching ``where`` (column -> value; floats compared
    with a tolerance)."""
    d = normalize(rows)
    d = d[(d["status"] == "ok") & ((d["kind"] == "eval") if "kind" in d else True)]
    for k, v in where.items():
        d = d[np.isclose(d[k].astype(float), float(v))] if isinstance(v, float) else d[d[k] == v]  # type: ignore[arg-type]
    return d
