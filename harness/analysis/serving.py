"""The serving measures: per request rate, latency percentiles and verdicts; per run, the
max QPS under the SLOs and its ratio to the reference's.

============== ============================================================================
measure        estimator
============== ============================================================================
ttft/tpot/e2e  p50, p90, p99 over the completed requests at one rate
max_qps        the highest rate tried that passed (both SLOs; each alone too); censored
               when the highest rate tried passed (the true max is higher)
ttft growth    per rate: the least-squares slope of TTFT on the request's send time
               (seconds of TTFT per second of the burst), bootstrap interval over requests
               (:func:`harness.analysis.stats.slope_ci`); ``queue_grows`` where the interval
               lies wholly above :data:`GROWTH_TOLERANCE`: the server fell behind the
               offered rate during the burst. Under overload the slope is about
               (offered / sustained rate) - 1.
               NaN with fewer than 5 completed requests or rows without send times
max_qps_steady the highest rate that passed *and* whose queue did not grow: a short burst
               can pass a rate the server cannot sustain (its queue absorbs the burst
               before any request times out); NaN where a passing rate's growth is unknown
peak thru      the highest delivered request throughput (completed requests / the
               burst's duration) over the rates tried: what the server delivered when
               offered more, a lower bound on its capacity; one run, no interval
qps ratio      max QPS / the reference's on the same model, benchmark, length, arrival,
               machine and dtype, on the same requests (:data:`REQUESTS`) under the same
               serving settings (:data:`SETTINGS`); a lower bound when the method's max is
               censored, an upper bound when only the reference's is, unknown when both
               are; none (NaN, ``qps_ratio_bound``
               :data:`NO_MATCHING_REFERENCE`) where the reference ran only on other
               requests or settings, or :data:`SEVERAL_REFERENCES` where more than one run
               of the reference matches. The steady max QPS and the peak throughput take
               their ratios to the same reference's
============== ============================================================================
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import QPS_SETTING_COLUMNS, normalize
from harness.analysis.stats import slope_ci


def _pct(a: pd.Series, q: float) -> float:
    a = a.dropna()
    return float(np.percentile(a.to_numpy(dtype=float), q)) if len(a) else float("nan")


def point_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Latency percentiles, timeouts and score of one request rate's request rows."""
    ok = rows[rows["status"] == "ok"]
    kept = rows["kept_tokens"].astype(float) / rows["prompt_tokens"].astype(float)
    out: dict[str, Any] = {
        "requests": len(rows),
        "completed": len(ok),
        "failed": int((rows["status"] != "ok").sum()),
        "timeouts": int(rows["timed_out"].sum()),
        "score": float(ok["score"].mean()) if len(ok) else float("nan"),
        "kept_fraction": float(kept.mean()),
        "kept_missing": int(rows["kept_tokens"].isna().sum()),
        **{f"ttft_p{q}_s": _pct(ok["ttft_s"], q) for q in (50, 90, 99)},
        **{f"tpot_p{q}_s": _pct(ok["tpot_s"], q) for q in (50, 90, 99)},
        **{f"e2e_p{q}_s": _pct(ok["e2e_s"], q) for q in (50, 90, 99)},
        "speculator_median_s": _pct(rows["speculator_s"], 50),
        **ttft_growth(ok),
    }
    return out


#: How steep a TTFT trend over a burst must be (its whole interval above this, in seconds of
#: TTFT per second) to say the queue grew: 0.1 is a server at least 10 % behind the offered
#: rate. Gentler trends come without overload: the burst's start from an empty server, and,
#: where requests go out task by task (``qps.request_order=benchmark``, the only order before
#: the shuffled default), a later task's longer prompts or answers. On the CPU default (24
#: requests a rate, task by task) full prefill's slope was 0.015 [0.002, 0.031] at half its
#: capacity and 0.68 [0.56, 0.86] at twice it.
GROWTH_TOLERANCE = 0.1


def ttft_growth(ok: pd.DataFrame) -> dict[str, Any]:
    """How fast the queue grew during one rate's burst: the slope of the completed requests'
    TTFT on their send times (``start_time``) with its interval, and ``queue_grows`` where
    the interval lies wholly above :data:`GROWTH_TOLERANCE` (None where the slope is
    unknown: too few requests, or rows written before send times were recorded)."""
    if "start_time" in ok and len(ok):
        est = slope_ci(pd.to_numeric(ok["start_time"], errors="coerce"), pd.to_numeric(ok["ttft_s"], errors="coerce"))
    else:
        est = slope_ci([], [])
    grows = None if np.isnan(est.lo) else bool(est.lo > GROWTH_TOLERANCE)
    return {"ttft_growth": est.value, "ttft_growth_lo": est.lo, "ttft_growth_hi": est.hi, "queue_grows": grows}


#: A serving point (one run's rates). ``machine`` is the rows' hardware and CPU flags
#: (:func:`harness.analysis.rows.machine`): two CPUs of one name with other kernels are two.
QPS_POINT = ["model", "method", "keep_rate", "benchmark", "length", "arrival", "hardware", "machine", "dtype", "run_id"]
#: The serving settings a run's verdicts, and so its max QPS, depend on: each a column of
#: every qps row (column: its ``qps.<setting>`` in conf/qps.yaml, harness.jobs.qps): the
#: timeout rule, the TTFT p90 SLO, the warm-up requests before each rate, the arrival
#: times' seed. A max QPS is compared only with the reference's under the same values
#: (:data:`REFERENCE_KEY`). Rows written before they were recorded have none: unknown (NaN;
#: :func:`with_settings` fills them from the run's config where it is at hand), matched
#: only with a reference whose settings are unknown too.
SETTINGS = dict(
    zip(QPS_SETTING_COLUMNS, ("timeout_s", "max_timeouts", "ttft_p90_slo_s", "warmups", "seed"), strict=True)
)
#: The planning front's settings (JSON; empty where the method is served without a front,
#: the reference always): the method's own, like its options, so recorded, not matched.
FRONT = "front_options"
#: What a method's max QPS is compared with: the reference's run on the same point (model,
#: benchmark, length, arrival process, machine and dtype), under the same settings.
REFERENCE_POINT = ["model", "benchmark", "length", "arrival", "hardware", "machine", "dtype"]
#: A run's request set: its benchmark's options and the (task, sample) of every request it
#: served (derived from its rows, so older rows have it too). Every rate's verdict is over
#: all the requests, so a max QPS is compared only with the reference's on the same ones
#: (another ``limit=`` or ``tasks=`` is another load).
REQUESTS = "request_set"
REFERENCE_KEY = [*REFERENCE_POINT, REQUESTS, *SETTINGS]
#: ``qps_ratio_bound`` where a reference ran on the method's point only on other requests or
#: under other serving settings (another SLO, timeout rule, warm-up or seed): no ratio.
NO_MATCHING_REFERENCE = "no reference under these settings"
#: ``qps_ratio_bound`` where more than one run of the reference matches (the same point,
#: requests and settings, another model setting or run): which one is meant is not guessed.
SEVERAL_REFERENCES = "several matching references"


def setting_columns(q: Any, front: Mapping[str, Any] | None) -> dict[str, Any]:
    """A qps row's serving settings from the job's ``qps:`` settings (``q``, anything with
    the attributes :data:`SETTINGS` names) and its front's (None: served without one)."""
    return {
        **{col: getattr(q, name) for col, name in SETTINGS.items()},
        FRONT: json.dumps(dict(front), sort_keys=True) if front is not None else None,
    }


def with_settings(rows: pd.DataFrame, settings: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``rows`` (qps rows) with the :data:`SETTINGS` a row lacks (written before they were
    recorded) taken from its run's ``qps:`` settings, ``settings[run_id]`` (its config.yaml)."""
    rows = rows.copy()
    for col, name in SETTINGS.items():
        known = {run: float(s[name]) for run, s in settings.items() if isinstance(s.get(name), int | float)}
        have = pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(np.nan, index=rows.index)
        rows[col] = have.fillna(rows["run_id"].map(known)).astype(float)
    return rows


def request_set(rows: pd.DataFrame) -> str:
    """One run's request set (:data:`REQUESTS`): how many requests, and a stable hash of its
    benchmark options and its requests' (task, sample_id) in the order it sent them (the
    ``request`` index: ``qps.request_order``), the same whatever the order of the rows."""
    opts = sorted({str(v) for v in rows["benchmark_options"].dropna()}) if "benchmark_options" in rows else []
    col = {c: rows[c] if c in rows else pd.Series("", index=rows.index) for c in ("task", "sample_id", "request")}
    sent = sorted({(str(r).zfill(9), str(t), str(i)) for t, i, r in zip(col["task"], col["sample_id"], col["request"],
                                                                         strict=True)})  # fmt: skip
    reqs = [(t, i) for _, t, i in sent]
    digest = zlib.crc32(json.dumps([opts, reqs]).encode())
    return f"{len(reqs)} requests #{digest:08x}"


def _run_settings(rows: pd.DataFrame) -> dict[str, Any]:
    """One run's serving settings and request set: each the run's recorded value (NaN, or
    "" for the front, where its rows have none)."""
    out: dict[str, Any] = {REQUESTS: request_set(rows)}
    for col in SETTINGS:
        v = pd.to_numeric(rows[col], errors="coerce").dropna() if col in rows else pd.Series(dtype=float)
        out[col] = float(v.iloc[0]) if len(v) else float("nan")
    f = rows[FRONT].dropna() if FRONT in rows else pd.Series(dtype=object)
    out[FRONT] = str(f.iloc[0]) if len(f) else ""
    return out


def summarize_qps_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run and request rate: percentiles, timeouts, score, verdicts."""
    per = []
    rows = normalize(rows)
    settings = {run: _run_settings(g) for run, g in rows.groupby("run_id", sort=False)}
    for key, g in rows.groupby([*QPS_POINT, "rate"], dropna=False, sort=True):
        first = g.iloc[0]
        per.append(
            {
                **dict(zip([*QPS_POINT, "rate"], key, strict=True)),
                **settings[first["run_id"]],
                **point_stats(g),
                "is_reference": bool(first["is_reference"]),
                "request_throughput": first["request_throughput"],
                # what the server delivered of what was offered (below 1 by the burst's
                # drain even when it keeps up; far below where it cannot)
                "delivered_fraction": float(first["request_throughput"]) / float(key[-1])
                if pd.notna(first["request_throughput"]) and key[-1]
                else float("nan"),
                **{k: bool(first[k]) for k in ("pass_timeout_rule", "pass_ttft_slo", "passed")},
            }
        )
    return pd.DataFrame(per)


def summarize_qps(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per serving run: the max QPS (highest passing rate) under both SLOs and
    each alone, the score and TTFT p90 at it, its serving settings (:data:`SETTINGS`), and
    the ratio to the reference method's max QPS on the same model, benchmark, length,
    arrival process, machine and dtype under the same settings (:data:`REFERENCE_KEY`)."""
    if rows.empty:
        return pd.DataFrame()
    rows = normalize(rows)
    rates = summarize_qps_rates(rows)
    out = []
    for key, pts in rates.groupby(QPS_POINT, dropna=False, sort=True):
        best: dict[str, Any] = dict(zip(QPS_POINT, key, strict=True))
        best.update(pts.iloc[0][[REQUESTS, *SETTINGS, FRONT]].to_dict())

        def highest(col: str, pts: pd.DataFrame = pts) -> float:
            ok = pts[pts[col]]["rate"]
            return float(ok.max()) if len(ok) else 0.0

        best.update(
            max_qps=highest("passed"),
            max_qps_timeout_rule=highest("pass_timeout_rule"),
            max_qps_ttft_slo=highest("pass_ttft_slo"),
            rates_tested=len(pts),
        )
        # The highest rate tried passed: the search ran out of points, the true max is higher.
        best["max_qps_censored"] = bool(pts.loc[pts["rate"].idxmax(), "passed"])
        # Steady: passed and the queue did not grow; unknown where a passing rate's growth is.
        passing = pts[pts["passed"]]
        if passing["queue_grows"].isna().any():
            best["max_qps_steady"] = float("nan")
        else:
            steady = passing[~passing["queue_grows"].astype(bool)]["rate"]
            best["max_qps_steady"] = float(steady.max()) if len(steady) else 0.0
        top = pts.loc[pts["rate"].idxmax()]
        grew = top["queue_grows"]  # a numpy bool where every rate's is known, None where not
        best["max_qps_steady_censored"] = bool(top["passed"]) and pd.notna(grew) and not bool(grew)
        thru = pd.to_numeric(pts["request_throughput"], errors="coerce")
        best["peak_throughput"] = float(thru.max()) if thru.notna().any() else float("nan")
        at = pts[pts["rate"] == best["max_qps"]]
        best["score_at_max_qps"] = float(at["score"].iloc[0]) if len(at) else float("nan")
        best["ttft_p90_at_max_qps_s"] = float(at["ttft_p90_s"].iloc[0]) if len(at) else float("nan")
        run = rows[rows["run_id"] == best["run_id"]]
        best["score_all_rates"] = float(run["score"].mean())
        best["reference"] = run["reference_method"].iloc[0]
        out.append(best)
    df = pd.DataFrame(out)
    keys = REFERENCE_KEY
    refs = df[df["method"] == df["reference"]]
    ref = refs[[*keys, "max_qps", "max_qps_censored", "max_qps_steady", "max_qps_steady_censored", "peak_throughput"]]
    ref = ref.rename(
        columns={
            "max_qps": "_ref",
            "max_qps_censored": "_ref_censored",
            "max_qps_steady": "_ref_steady",
            "max_qps_steady_censored": "_ref_steady_censored",
            "peak_throughput": "_ref_peak",
        }
    )
    # More than one reference run at a key: no ratio over a guess (NaN keys count as equal).
    counts = ref.groupby(keys, dropna=False).size().rename("_refs").reset_index()
    ref = ref.drop_duplicates(keys).merge(counts, on=keys, how="left")
    # Settings unknown (rows written before they were recorded) match unknown only: NaN
    # keys join NaN keys, never a known value.
    df = df.merge(ref, on=keys, how="left")
    # A reference on the same point under other settings: said, not silently left blank.
    point = REFERENCE_POINT
    elsewhere = df[point].merge(refs[point].drop_duplicates(), on=point, how="left", indicator=True)["_merge"]
    other_settings = df["_ref"].isna().to_numpy() & (elsewhere == "both").to_numpy()
    several = (df["_refs"].fillna(0) > 1).to_numpy()
    df.loc[several, ["_ref", "_ref_steady", "_ref_peak"]] = np.nan
    df["qps_ratio_to_reference"] = (df["max_qps"] / df["_ref"].where(df["_ref"] > 0)).astype(float)
    # over a reference whose steady max is itself a lower bound: unknown (NaN), as for max QPS
    steady_ref = df["_ref_steady"].where((df["_ref_steady"] > 0) & ~df["_ref_steady_censored"].eq(True))
    df["steady_qps_ratio"] = (df["max_qps_steady"] / steady_ref).astype(float)
    df["peak_throughput_ratio"] = (df["peak_throughput"] / df["_ref_peak"].where(df["_ref_peak"] > 0)).astype(float)
    # A ratio over a censored reference is unknown where the method's max is censored too
    # (both could be anything above) and an upper bound where it is exact (the reference's
    # true max is higher); over an exact one, a censored method's ratio is a lower bound.
    ref_censored = df["_ref_censored"].astype("boolean").fillna(False).astype(bool)
    df["qps_ratio_bound"] = np.select(
        [
            several,
            other_settings,
            df["_ref"].isna(),
            ref_censored & df["max_qps_censored"],
            ref_censored,
            df["max_qps_censored"],
        ],
        [SEVERAL_REFERENCES, NO_MATCHING_REFERENCE, "", "unknown", "upper bound", "lower bound"],
        "exact",
    )
    df.loc[df["qps_ratio_bound"] == "unknown", "qps_ratio_to_reference"] = np.nan
    own = (df["method"] == df["reference"]) & (df["_ref"] > 0) & ~several
    df.loc[own, ["qps_ratio_to_reference", "qps_ratio_bound"]] = [1.0, "exact"]
    out = df.drop(columns=["_ref", "_ref_censored", "_ref_steady", "_ref_steady_censored", "_ref_peak", "_refs"])
    out = out.sort_values([*keys, "method", "keep_rate"])
    return out.reset_index(drop=True)
