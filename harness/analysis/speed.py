"""The latency measures: TTFT over the batch x length grid and the speedup measured side by side.

The timing protocol (:func:`harness.jobs.latency.measure_point` writes it, this module reads
it): at a grid point every timed iteration plans one fresh prompt set, and the reference,
its A/A copy and the method each time that same set in turn, the order rotated from one
iteration to the next so that each is first as often as the others (recorded per row,
``order``); warm-up iterations are recorded and left out. The reference's row and a
method's row of one iteration are a *pair*.

============== ============================================================================
measure        estimator
============== ============================================================================
speedup        the median over the timed pairs of the reference's TTFT / the method's (one
               run); interval: the percentile bootstrap over the pairs
               (:func:`harness.analysis.stats.paired_ratio_ci`: a slow minute moves both
               members of a pair and cancels), none under
               :data:`~harness.analysis.stats.MIN_PAIRS` pairs. With several runs at a point,
               the run whose speedup is the median's, value and interval both
               (:func:`point_speedup`)
aa_speedup     the same estimator on the A/A check (:data:`~harness.analysis.rows.AA_METHOD`:
               the reference's own work on the same prompts, timed like any method) of the
               run the point's speedup comes from; it must read 1.0: ``aa_ok`` is false
               when its interval excludes 1.0 *and* it is more than :data:`AA_TOL` away
               (an order effect, a warm-up too short, something the two sides do not share);
               the A/A check's own line at a point timed in several runs shows the run
               farthest from 1.0 (:func:`worst_check`), each method's line its own run's
ttft           median, p90 and p99 over the timed iterations (the reference pools its runs)
ideal_speedup  the FLOP model's full prefill over the method's work (median over iterations);
               ``ideal_ttft_s``: the reference's median TTFT at the point over it
efficiency     speedup / ideal_speedup
ideal_engine_speedup
               where the speculator runs on another engine than the base (vLLM; a
               calibration pass measures its FLOP rate at the point, ``speculator_flop_rate``):
               the reference's TTFT over the time the method's work would take at each
               engine's own rate, the base's from the reference's TTFT in the same pair
               (:func:`engine_ideal`), median over pairs; ``efficiency_engine`` = speedup over
               it. NaN where one rate serves both (the FLOP ideal is then the ideal)
anomaly        a speedup above its ideal (the ideal per engine where there is one, else the
               FLOP ideal) by more than :func:`anomaly_tolerance` (10 % for a method that
               does the reference's whole work, a press or the A/A check; 15 % for one that
               does less): the words say by how much and the likely causes; and, for a
               method that does at least the reference's work (ideal 1.0 or less, the A/A
               check aside), an interval lying wholly above 1.0, inside the tolerance or
               not (:func:`interval_anomaly`: such a method cannot be faster)
loaded         the machine had work of others while the point was timed: some timed row
               of the point's runs saw more than :data:`FOREIGN_CPU_MAX` of its cores busy
               with other processes (``foreign_cpu``), or a 1-minute load average above the
               cores plus :data:`LOAD_MARGIN` (``loadavg_1m``)
flags          what makes the point's speed claim unsafe, in words (anomaly, A/A check
               failed, loaded, too few pairs, order not balanced: rows older than the
               protocol, no warm-up); ``comparable`` is false where any but "loaded" holds
decode         with ``decode_tokens`` > 0 (tokens decoded after each prefill, outside TTFT):
               ``decode_s_per_token``, the median over the timed iterations of the decode
               seconds over the tokens (one step of the batch); ``e2e_speedup``, the
               speedup's estimator on TTFT + decode seconds (the same pairs)
energy         where the hardware counts it (:mod:`harness.energy`: NVML on NVIDIA GPUs, RAPL
               on CPUs that expose it): ``energy_j_per_request``, the median over the timed
               iterations of the batch's joules over the TTFT window over the batch size;
               ``energy_j_per_token``, the same over the prompt tokens; ``energy_ratio``, the
               speedup's estimator on joules (the reference's over the method's, the same
               pairs: above 1 the method uses less); ``decode_j_per_token`` over the decode
               after the prefill; ``energy_source``, what was read, or "not measurable here:"
               and why (NaN columns then, never zeros)
between lines  two lines of one latency job (neither the reference, or one of them): the
               speedup's estimator with the base line in the reference's place, paired by
               iteration within each run both timed (:func:`paired_ttft_ratio`,
               :func:`between_lines`): how two methods compare side by side, not through
               their ratios to full prefill; none for lines never timed in one job
kv_mib         median over the timed iterations of the KV cache one prompt leaves after the
               prefill (``kv_bytes``: all layers, keys and values, a KV press's eviction
               included; a left-padded batch counts its padding), in MiB; NaN where the
               backend cannot measure it (vLLM)
============== ============================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import AA_METHOD, LATENCY_POINT, keep_lines, normalize
from harness.analysis.stats import MIN_PAIRS, Estimate, paired_ratio_ci

COLUMNS = [
    "model",
    "backend",
    "prompt_source",
    "batch",
    "length",
    "method",
    "keep_rate",
    "n",
    "pairs",
    "failed",
    "ttft_median_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "method_median_s",
    "base_prefill_median_s",
    "kept_fraction",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "ideal_speedup",
    "ideal_ttft_s",
    "efficiency",
    "ideal_engine_speedup",
    "efficiency_engine",
    "aa_speedup",
    "aa_speedup_lo",
    "aa_speedup_hi",
    "aa_ok",
    "anomaly",
    "loaded",
    "foreign_cpu",
    "loadavg_1m",
    "flags",
    "comparable",
    "kv_mib",
    "decode_s_per_token",
    "e2e_speedup",
    "e2e_speedup_lo",
    "e2e_speedup_hi",
    "decode_speedup",
    "decode_speedup_lo",
    "decode_speedup_hi",
    "energy_j_per_request",
    "energy_j_per_token",
    "energy_ratio",
    "energy_ratio_lo",
    "energy_ratio_hi",
    "decode_j_per_token",
    "energy_source",
    "reference",
    "is_reference",
    "method_name",
    "speculator",
    "dtype",
    "method_options",
]

#: The A/A check fails when its interval excludes 1.0 and its value is further than this from
#: 1.0: a 95 % interval excludes the truth once in twenty runs, and a 2 % order effect on a
#: shared CPU is not worth failing a gate for; a 5 % one moves every speedup of the run.
AA_TOL = 0.05
#: Some timed row of a point saw more than this share of its cores busy with other processes.
FOREIGN_CPU_MAX = 0.10
#: ... or a 1-minute load average above the cores plus this (the job's own threads count
#: for about the cores: alone on 2 cores the regression suite's rows read 1.78-2.00; one
#: more busy thread for a minute brings it to about 3).
LOAD_MARGIN = 0.5
#: What can make a measured speedup beat the FLOP ideal (named with every anomaly).
ANOMALY_CAUSES = (
    "noise the interval does not show, an order or warm-up effect (the A/A check tells), other work on the "
    "machine while one side ran, a kernel or patch on one side only (a faster path, a process-wide wrapper), "
    "or a speculator on another engine or in another dtype than the base (one FLOP rate for both does not hold)"
)


def does_reference_work(ideal: float) -> bool:
    """Whether a method whose ideal speedup is ``ideal`` does at least the reference's work
    (1.0 or less: a press, full prefill, the A/A check, SpecKV)."""
    return ideal <= 1.0 + 1e-9


def anomaly_tolerance(ideal: float) -> float:
    """How far a speedup may exceed its ideal before it is an anomaly: 10 % where the ideal
    is 1.0 or less (the method does at least the reference's work: a press, full prefill, the
    A/A check), 15 % where the method does less (its own overheads scale differently with
    the FLOPs, e.g. a short prefill's attention)."""
    return 0.10 if does_reference_work(ideal) else 0.15


def anomaly(speedup: float, ideal: float, kind: str = "FLOP") -> str:
    """The words for a speedup above its ideal by more than :func:`anomaly_tolerance`; ``""``
    where it is not (or either is unknown: a text rewrite has no FLOP ideal). ``kind``
    names the ideal (``FLOP``, or ``per-engine``)."""
    if not (np.isfinite(speedup) and np.isfinite(ideal) and ideal > 0):
        return ""
    tol = anomaly_tolerance(ideal)
    if speedup <= ideal * (1 + tol):
        return ""
    return (
        f"anomaly: {speedup:.2f}x is above its {kind} ideal {ideal:.2f}x by {speedup / ideal - 1:.0%} "
        f"(tolerance {tol:.0%}); likely causes: {ANOMALY_CAUSES}"
    )


def interval_anomaly(e: Estimate, ideal: float, kind: str = "FLOP") -> str:
    """The words for a method that does at least the reference's work (its ideal 1.0 or
    less: a press, SpecKV, SpecPrefill at a high keep) whose whole interval lies above 1.0: it
    cannot be faster than the reference, so such an interval is the job's timing (order,
    drift), inside the tolerance of :func:`anomaly` or not; ``""`` otherwise (above its ideal
    but not above 1.0, the FLOP model's precision, is :func:`anomaly`'s to judge)."""
    if not (np.isfinite(e.lo) and np.isfinite(ideal) and ideal > 0 and does_reference_work(ideal)) or e.lo <= 1.0:
        return ""
    return (
        f"anomaly: {e.value:.2f}x [{e.lo:.2f}, {e.hi:.2f}] lies wholly above 1.00x, and the method does at least the "
        f"reference's work ({kind} ideal {ideal:.2f}x); likely causes: {ANOMALY_CAUSES}"
    )


def engine_ideal(reference: pd.DataFrame, method: pd.DataFrame) -> float:
    """The ideal speedup per engine of one run's pairs (rows of each side, matched by
    ``iteration``): per pair, the base's rate is the reference's FLOPs over its TTFT, the
    speculator's the calibrated ``speculator_flop_rate``, and the ideal is the reference's
    TTFT over ``(flops_method - flops_speculator) / base rate + flops_speculator /
    speculator rate``; the median over pairs (NaN without a rate)."""
    ref = reference.set_index("iteration")
    m = method.set_index("iteration")
    its = ref.index.intersection(m.index)
    if its.empty or "speculator_flop_rate" not in m:
        return math.nan
    r, x = ref.loc[its], m.loc[its]
    base_rate = r["flops_full"].astype(float) / r["ttft_s"].astype(float)
    spec = pd.to_numeric(x["flops_speculator"], errors="coerce")
    spec_rate = pd.to_numeric(x["speculator_flop_rate"], errors="coerce")
    t = (x["flops_method"].astype(float) - spec) / base_rate + spec / spec_rate
    ideal = (r["ttft_s"].astype(float) / t).dropna()
    return float(ideal.median()) if len(ideal) else math.nan


def aa_fails(e: Estimate) -> bool:
    """Whether an A/A check's estimate says the two sides of a pair are not timed alike."""
    return bool(np.isfinite(e.lo) and not e.lo <= 1.0 <= e.hi and abs(e.value - 1.0) > AA_TOL)


def run_speedup(reference_ttft: dict[int, float], method_ttft: dict[int, float]) -> Estimate:
    """One run's speedup from its timed iterations (iteration -> seconds): the pairs are the
    iterations both sides timed (:func:`harness.analysis.stats.paired_ratio_ci`)."""
    its = sorted(reference_ttft.keys() & method_ttft.keys())
    return paired_ratio_ci([reference_ttft[i] for i in its], [method_ttft[i] for i in its])


def paired_ttft_ratio(num: pd.DataFrame, den: pd.DataFrame) -> Estimate | None:
    """``num``'s TTFT over ``den``'s, two lines' timed ok latency rows at one grid point: per
    run (``run_id``) that timed both, paired by iteration (:func:`run_speedup`), then the median
    run (:func:`point_speedup`); None where no run timed both. With the reference's rows as
    ``num`` this is a line's speedup."""
    runs = [
        run_speedup(_by_iteration(n, n["ttft_s"]), _by_iteration(d, d["ttft_s"]))
        for run, n in num.groupby("run_id")
        if len(d := den[den["run_id"] == run])
    ]
    return point_speedup(runs)


#: Where two lines of latency rows are paired: one grid point of one model, backend and dtype
#: on one prompt source (the methods' own columns left out).
LINE_SETUP = ["model", "backend", "dtype", "prompt_source", "batch", "length"]
BETWEEN_COLUMNS = [*LINE_SETUP, "line", "base", "runs", "pairs", "speedup", "speedup_lo", "speedup_hi", "ideal_ratio",
                   "base_ttft_median_s", "line_ttft_median_s"]  # fmt: skip


def _timed_ok(rows: pd.DataFrame) -> pd.DataFrame:
    """Latency ``rows`` normalized, the ok timed ones (warm-ups left out), each with its
    ``line`` (:func:`harness.analysis.rows.keep_lines` within a grid point, :data:`LINE_SETUP`)."""
    df = normalize(rows)
    ok = df[(df["status"] == "ok") & ~df["warmup"].astype(bool)] if not df.empty else df
    return ok.assign(line=keep_lines(ok, LINE_SETUP)) if not ok.empty else ok.assign(line=pd.Series(dtype=object))


def line_names(rows: pd.DataFrame) -> list[str]:
    """The lines of latency ``rows`` that ran (:func:`between_lines`' names), sorted."""
    return sorted(set(_timed_ok(rows)["line"]))


def between_lines(rows: pd.DataFrame, base: str) -> pd.DataFrame:
    """Every line of latency ``rows`` against the line ``base`` (a label, with its keep where the label was timed at several) at
    each grid point that timed it: the base's TTFT over the line's, paired by iteration in the
    runs that timed both (:func:`paired_ttft_ratio`; above 1 the line is faster), the FLOP
    model's ratio for it (``ideal_ratio``: the line's ideal speedup over the base's, medians
    over those rows) and the two lines' median TTFTs over those runs; :data:`BETWEEN_COLUMNS`. A line never timed in a job
    with the base gets no row."""
    ok = _timed_ok(rows)
    if ok.empty:
        return pd.DataFrame(columns=BETWEEN_COLUMNS)
    out = []
    for setup, g in ok.groupby(LINE_SETUP, dropna=False, sort=True):
        b = g[g["line"] == base]
        if b.empty:
            continue
        for line, c in g[g["line"] != base].groupby("line", sort=True):
            runs = sorted(set(c["run_id"]) & set(b["run_id"]))
            b_in, c_in = b[b["run_id"].isin(runs)], c[c["run_id"].isin(runs)]
            e = paired_ttft_ratio(b_in, c_in)
            if e is None:
                continue
            ideal = _num(c_in, "ideal_speedup").median() / _num(b_in, "ideal_speedup").median()
            out.append({
                **dict(zip(LINE_SETUP, setup, strict=True)), "line": line, "base": base, "runs": len(runs),
                "pairs": e.n, "speedup": e.value, "speedup_lo": e.lo, "speedup_hi": e.hi, "ideal_ratio": float(ideal),
                "base_ttft_median_s": float(b_in["ttft_s"].astype(float).median()),
                "line_ttft_median_s": float(c_in["ttft_s"].astype(float).median()),
            })  # fmt: skip
    return pd.DataFrame(out).reindex(columns=BETWEEN_COLUMNS)


def point_speedup(runs: list[Estimate]) -> Estimate | None:
    """A point measured in several runs: the median run's speedup (its value and interval;
    with an even count the lower middle one), so the interval is that value's own."""
    runs = [e for e in runs if not np.isnan(e.value)]
    return sorted(runs, key=lambda e: e.value)[(len(runs) - 1) // 2] if runs else None


def worst_check(runs: list[Estimate]) -> Estimate | None:
    """The A/A check's own line at a point timed in several runs: the run farthest from 1.0
    (on a log scale), so the line passes only where every run's check does; a median run
    (:func:`point_speedup`) would let one run's failed check hide behind another's pass."""
    runs = [e for e in runs if np.isfinite(e.value) and e.value > 0]
    return max(runs, key=lambda e: abs(math.log(e.value))) if runs else None


def _stats(x: pd.Series) -> dict[str, float]:
    a = x.to_numpy(dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def _energy(good: pd.DataFrame) -> dict[str, Any]:
    """A point's energy medians (see the module's table) and the source, or why none."""
    j = _num(good, "energy_j")
    batch = good["batch"].astype(float)
    sources = good["energy_source"].dropna() if "energy_source" in good else pd.Series(dtype=object)
    measured = sources[j.reindex(sources.index).notna()]
    out: dict[str, Any] = {
        "energy_source": str((measured if len(measured) else sources).iloc[0]) if len(sources) else None
    }
    if j.notna().any():
        out["energy_j_per_request"] = float((j / batch).median())
        out["energy_j_per_token"] = float((j / (batch * _num(good, "prompt_tokens"))).median())
    dj = _num(good, "decode_energy_j")
    if dj.notna().any():
        out["decode_j_per_token"] = float((dj / (batch * _num(good, "decode_tokens"))).median())
    return out


def _e2e(rows: pd.DataFrame) -> pd.Series:
    """TTFT + the decode seconds after it, per row."""
    return rows["ttft_s"].astype(float) + pd.to_numeric(rows["decode_s"], errors="coerce")


def _tpot(rows: pd.DataFrame) -> pd.Series:
    """Time per output token after the prefill (the decode's seconds over its tokens)."""
    return pd.to_numeric(rows["decode_s"], errors="coerce") / pd.to_numeric(rows["decode_tokens"], errors="coerce")


def _by_iteration(rows: pd.DataFrame, values: pd.Series) -> dict[int, float]:
    return dict(zip(rows["iteration"].astype(int), values.astype(float), strict=True))


def _num(rows: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(np.nan, index=rows.index)


def load_of(rows: pd.DataFrame) -> dict[str, Any]:
    """The most load any of ``rows`` saw (``foreign_cpu``, ``loadavg_1m``) and whether that
    makes them loaded (see the module's table); NaN and not loaded where rows predate it."""
    foreign, load, cpus = _num(rows, "foreign_cpu"), _num(rows, "loadavg_1m"), _num(rows, "cpus")
    f = float(foreign.max()) if foreign.notna().any() else math.nan
    over = (load - cpus - LOAD_MARGIN).max() if (load.notna() & cpus.notna()).any() else math.nan
    loaded = bool((np.isfinite(f) and f > FOREIGN_CPU_MAX) or (np.isfinite(over) and over > 0))
    return {"foreign_cpu": f, "loadavg_1m": float(load.max()) if load.notna().any() else math.nan, "loaded": loaded}


def _flags(entry: dict[str, Any], pair_rows: pd.DataFrame, all_rows: pd.DataFrame) -> None:
    """``entry``'s anomaly, flags and whether its speed claim is comparable (see the module's
    table); ``pair_rows``: its timed rows and its reference's in the same runs;
    ``all_rows``: every row of those runs, warm-ups included."""
    flags: list[str] = []
    per_engine = entry.get("ideal_engine_speedup", math.nan)
    ideal, kind = (
        (per_engine, "per-engine") if np.isfinite(per_engine) else (entry.get("ideal_speedup", math.nan), "FLOP")
    )
    words = anomaly(entry.get("speedup", math.nan), ideal, kind)
    if not words and entry.get("method") != AA_METHOD:  # the A/A check has its own rule (aa_fails)
        e = Estimate(entry.get("speedup", math.nan), entry.get("speedup_lo", math.nan),
                     entry.get("speedup_hi", math.nan), 0)  # fmt: skip
        words = interval_anomaly(e, ideal, kind)
    entry["anomaly"] = words
    if words:
        flags.append(words)
    aa = Estimate(
        entry.get("aa_speedup", math.nan), entry.get("aa_speedup_lo", math.nan), entry.get("aa_speedup_hi", math.nan), 0
    )
    if np.isfinite(aa.value):
        entry["aa_ok"] = not aa_fails(aa)
        if not entry["aa_ok"]:
            flags.append(f"A/A check failed: {aa.value:.3f}x [{aa.lo:.3f}, {aa.hi:.3f}] (must hold 1.0)")
    pairs = entry.get("pairs", 0)
    if pairs and pairs < MIN_PAIRS:
        flags.append(f"too few pairs: {pairs} timed (at least {MIN_PAIRS} for an interval)")
    order = _num(pair_rows, "order")
    if order.isna().all():
        flags.append("order not balanced: the rows predate the order-balanced protocol (the reference timed first)")
    if not all_rows["warmup"].astype(bool).any():
        flags.append("no warm-up iteration: the first timed iteration runs cold")
    load = load_of(pair_rows)
    entry.update(load)
    if load["loaded"]:
        flags.append(
            f"loaded: other work on the machine while timed (foreign CPU up to {load['foreign_cpu']:.0%} of the "
            f"cores, 1-minute load up to {load['loadavg_1m']:.1f})"
        )
    entry["flags"] = "; ".join(flags)
    entry["comparable"] = not any(not f.startswith("loaded") for f in flags)


def summarize_latency(rows: pd.DataFrame) -> pd.DataFrame:
    """Latency rows: per point (:data:`~harness.analysis.rows.LATENCY_POINT`, the ``method``
    column its label): TTFT median/p90/p99 over the timed iterations, the method's own cost,
    the base prefill, and the module's paired speedup, A/A check, ideal speedup, efficiency,
    load and flags (the reference's own line: 1.0, pooling its rows of every run at the point)."""
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = normalize(rows).copy()
    df[["batch", "length"]] = df[["batch", "length"]].astype(int)
    timed = df[~df["warmup"].astype(bool)]
    ok = timed[timed["status"] == "ok"]
    by_run = ["run_id", "batch", "length", "reference_method"]
    ref_rows = {k: g for k, g in ok[ok["is_reference"]].groupby(by_run)}
    refs = {k: _by_iteration(g, g["ttft_s"]) for k, g in ref_rows.items()}
    decoded = "decode_s" in ok and pd.to_numeric(ok["decode_s"], errors="coerce").notna().any()
    ref_e2e = {k: _by_iteration(g, _e2e(g)) for k, g in ref_rows.items()} if decoded else {}
    ref_tpot = {k: _by_iteration(g, _tpot(g)) for k, g in ref_rows.items()} if decoded else {}
    ref_j = {k: _by_iteration(g, _num(g, "energy_j")) for k, g in ref_rows.items()}
    aa_rows = ok[ok["method"] == AA_METHOD]
    aa = {k: run_speedup(refs[k], _by_iteration(g, g["ttft_s"])) for k, g in aa_rows.groupby(by_run) if k in refs}
    all_by_run = {k: g for k, g in df.groupby(by_run)}
    out = []
    for key, g in timed.groupby([*LATENCY_POINT, "label", "is_reference"], dropna=False, sort=True):
        item = dict(zip([*LATENCY_POINT, "label", "is_reference"], key, strict=True))
        good = g[g["status"] == "ok"]
        entry: dict[str, Any] = {k: item[k] for k in LATENCY_POINT}
        entry.update(
            method=item["label"],
            method_name=item["method"],
            n=len(good),
            failed=int((g["status"] != "ok").sum()),
            reference=item["reference_method"],
            is_reference=bool(item["is_reference"]),
        )
        if good.empty:
            out.append(entry)
            continue
        entry.update(_timings(good, decoded))
        runs = [k for k in good.groupby(by_run).groups if k in refs]
        if item["is_reference"]:
            out.append(_reference_entry(entry, good))
            continue
        per_run = {
            k: run_speedup(refs[k], _by_iteration(gr, gr["ttft_s"])) for k, gr in good.groupby(by_run) if k in refs
        }
        e = (
            point_speedup(list(per_run.values()))
            if item["method"] != AA_METHOD
            else worst_check(list(per_run.values()))
        )
        ideal = float(good["ideal_speedup"].median())
        entry["ideal_speedup"] = ideal
        if e is not None:
            entry.update(speedup=e.value, speedup_lo=e.lo, speedup_hi=e.hi, efficiency=e.value / ideal, pairs=e.n)
            run = next(k for k, v in per_run.items() if v is e)
            if run in aa and item["method"] != AA_METHOD:
                a = aa[run]
                entry.update(aa_speedup=a.value, aa_speedup_lo=a.lo, aa_speedup_hi=a.hi)
        paired: list[Paired] = []  # the ratios paired like the speedup
        if np.isfinite(entry.get("energy_j_per_request", math.nan)):
            paired.append(("energy_ratio", ref_j, lambda r: _num(r, "energy_j")))
        if "decode_s_per_token" in entry:
            paired += [("e2e_speedup", ref_e2e, _e2e), ("decode_speedup", ref_tpot, _tpot)]
        entry.update(_paired_ratios(good.groupby(by_run), paired))
        on_two = _num(good, "speculator_flop_rate").notna().any() and _num(good, "flops_speculator").gt(0).any()
        if on_two:  # the method's own calls ran on the speculator's engine
            ideals = [engine_ideal(ref_rows[k], gr) for k, gr in good.groupby(by_run) if k in ref_rows]
            entry["ideal_engine_speedup"] = float(np.nanmedian(ideals)) if any(np.isfinite(ideals)) else math.nan
            if e is not None:
                entry["efficiency_engine"] = e.value / entry["ideal_engine_speedup"]
        if item["method"] == AA_METHOD and e is not None:
            entry.update(aa_speedup=e.value, aa_speedup_lo=e.lo, aa_speedup_hi=e.hi)
        pair_rows = pd.concat([good, *(ref_rows[k] for k in runs)])
        _flags(entry, pair_rows, pd.concat([all_by_run[k] for k in runs]) if runs else g)
        out.append(entry)
    return _with_ideal_ttft(pd.DataFrame(out).reindex(columns=COLUMNS))


def _reference_entry(entry: dict[str, Any], good: pd.DataFrame) -> dict[str, Any]:
    """The reference's own line: every ratio 1.0 by definition (those its rows have), and its load."""
    entry.update(speedup=1.0, ideal_speedup=1.0, efficiency=1.0, comparable=True, flags="", anomaly="")
    if "decode_s_per_token" in entry:
        entry.update(e2e_speedup=1.0, decode_speedup=1.0)
    if "energy_j_per_request" in entry:
        entry["energy_ratio"] = 1.0
    entry.update(load_of(good))
    return entry


#: A ratio measured as the speedup is: (its column, the reference's values by run and
#: iteration, the per-row value).
Paired = tuple[str, dict[Any, dict[int, float]], Callable[[pd.DataFrame], pd.Series]]


def _paired_ratios(by_run: Any, paired: list[Paired]) -> dict[str, float]:
    """Each ``(column, the reference's values by run, the per-row value)`` as the speedup is:
    the reference's value over the method's, paired by iteration within a run, then
    :func:`point_speedup` over runs; ``column``, ``column_lo``, ``column_hi``."""
    out: dict[str, float] = {}
    for col, ref, value in paired:
        est = point_speedup([run_speedup(ref[k], _by_iteration(gr, value(gr))) for k, gr in by_run if k in ref])
        if est is not None:
            out.update({col: est.value, f"{col}_lo": est.lo, f"{col}_hi": est.hi})
    return out


def _timings(good: pd.DataFrame, decoded: bool) -> dict[str, Any]:
    """A point's ok timed rows: TTFT median/p90/p99, the method's own and the base's
    prefill medians, the kept fraction, the KV held and, where decoded, time per token."""
    st = _stats(good["ttft_s"])
    kv = pd.to_numeric(good["kv_bytes"], errors="coerce").median() / 2**20 if "kv_bytes" in good else math.nan
    out: dict[str, Any] = {
        "ttft_median_s": st["median"],
        "ttft_p90_s": st["p90"],
        "ttft_p99_s": st["p99"],
        "method_median_s": float(good["method_s"].median()),
        "base_prefill_median_s": float(good["base_prefill_s"].median()),
        "kept_fraction": float(good["kept_fraction"].mean()),
        "kv_mib": float(kv),
        **_energy(good),
    }
    if decoded and pd.to_numeric(good.get("decode_s"), errors="coerce").notna().any():
        out["decode_s_per_token"] = float(
            (pd.to_numeric(good["decode_s"], errors="coerce") / pd.to_numeric(good["decode_tokens"])).median()
        )
    return out


def _with_ideal_ttft(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with empty flags as "" and the ideal TTFT: the reference's median at the
    point over the method's ideal speedup."""
    df["anomaly"] = df["anomaly"].fillna("")
    df["flags"] = df["flags"].fillna("")
    at = ["model", "backend", "dtype", "prompt_source", "batch", "length", "reference"]
    ref = df[df["is_reference"].astype(bool)].groupby(at, dropna=False)["ttft_median_s"].first()
    base = ref.reindex(pd.MultiIndex.from_frame(df[at])).to_numpy(dtype=float)
    df["ideal_ttft_s"] = base / df["ideal_speedup"].to_numpy(dtype=float)
    return df


#: What names one break-even line: a method at a keep on one model, engine and prompt kind.
BREAK_EVEN_LINE = ["model", "backend", "dtype", "prompt_source", "method", "keep_rate"]


def _crossing(lengths: list[int], values: list[float]) -> tuple[float, str]:
    """The shortest length where ``values`` (per length, ascending lengths) passes 1: the first
    grid point above 1, interpolated on log2(length) from the point before it (``interpolated``),
    the first length itself where already above (``at or below``), or NaN (``not reached``)."""
    for i, (n, v) in enumerate(zip(lengths, values, strict=True)):
        if not (np.isfinite(v) and v > 1.0):
            continue
        if i == 0:
            return float(n), "at or below"
        n0, v0 = lengths[i - 1], values[i - 1]
        if not np.isfinite(v0):
            return float(n), "at or below"
        t = (1.0 - v0) / (v - v0)
        return float(2 ** (math.log2(n0) + t * (math.log2(n) - math.log2(n0)))), "interpolated"
    return math.nan, "not reached"


def break_even(lat: pd.DataFrame) -> pd.DataFrame:
    """Per method and keep (:data:`BREAK_EVEN_LINE`) over the grid's lengths: the shortest
    prompt length at which the measured speedup's 95 % interval lies above 1 (its lower bound
    > 1), and the length where the FLOP model's ideal passes 1, each the first grid point
    above 1 interpolated from the point before it on log2(length) (``*_how`` says which:
    ``interpolated``, ``at or below`` the shortest length measured, ``not reached`` up to the
    longest). ``regresses``: a longer point's lower bound falls back to 1 or below. Lines
    measured at fewer than two lengths are left out (nothing to bracket). ``batch``: the batch
    size of each point in length order (a constant-token grid's line runs across batch
    sizes, e.g. ``2,1`` for 2x4K and 1x8K); where one length was timed at several batch
    sizes, a line per batch size."""
    cols = [*BREAK_EVEN_LINE, "batch", "lengths", "break_even_tokens", "break_even_how", "ideal_break_even_tokens",
            "ideal_break_even_how", "regresses"]  # fmt: skip
    if lat.empty:
        return pd.DataFrame(columns=cols)
    d = lat[~lat["is_reference"].astype(bool) & (lat["method_name"] != AA_METHOD)]
    lines = []
    for key, g in d.groupby(BREAK_EVEN_LINE, dropna=False, sort=True):
        if g["length"].duplicated().any():  # a length at several batch sizes: a line per batch size
            lines += [(key, str(b), gb) for b, gb in g.groupby("batch", sort=True)]
        else:  # one batch size per length (a constant-token grid's lines run across them)
            lines.append((key, ",".join(str(b) for b in g.sort_values("length")["batch"]), g))
    out = []
    for key, batch, g in lines:
        g = g.sort_values("length")
        if g["length"].nunique() < 2:
            continue
        lengths = g["length"].astype(int).tolist()
        lo = pd.to_numeric(g["speedup_lo"], errors="coerce").tolist()
        at, how = _crossing(lengths, lo)
        ideal_at, ideal_how = _crossing(lengths, pd.to_numeric(g["ideal_speedup"], errors="coerce").tolist())
        first = next((i for i, v in enumerate(lo) if np.isfinite(v) and v > 1.0), None)
        regresses = first is not None and any(not (np.isfinite(v) and v > 1.0) for v in lo[first + 1 :])
        out.append({**dict(zip(BREAK_EVEN_LINE, key, strict=True)), "batch": batch, "lengths": lengths,
                    "break_even_tokens": at,
                    "break_even_how": how, "ideal_break_even_tokens": ideal_at, "ideal_break_even_how": ideal_how,
                    "regresses": bool(regresses)})  # fmt: skip
    return pd.DataFrame(out, columns=cols)
