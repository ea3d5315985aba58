"""The serving measures: per request rate, latency percentiles and verdicts; per run, the
max QPS under the SLOs and its ratio to the reference's.

============== ============================================================================
measure        estimator
============== ============================================================================
ttft/tpot/e2e  p50, p90, p99 over the completed requests at one rate
max_qps        the highest rate tried that passed (both SLOs; each alone too); censored
               when the highest rate tried passed (the true max is higher)
qps ratio      max QPS / the reference's on the same model, benchmark, length, arrival,
               machine and dtype, under the same serving settings (:data:`SETTINGS`); a
               lower bound when the method's max is censored, unknown when the
               reference's is; none (NaN, ``qps_ratio_bound`` :data:`NO_MATCHING_REFERENCE`)
               where the reference ran only under other settings
============== ============================================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import QPS_SETTING_COLUMNS, normalize


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
    }
    return out


QPS_POINT = ["model", "method", "keep_rate", "benchmark", "length", "arrival", "hardware", "dtype", "run_id"]
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
REFERENCE_POINT = ["model", "benchmark", "length", "arrival", "hardware", "dtype"]
REFERENCE_KEY = [*REFERENCE_POINT, *SETTINGS]
#: ``qps_ratio_bound`` where a reference ran on the method's point only under other
#: serving settings (another SLO, timeout rule, warm-up or seed): no ratio is taken.
NO_MATCHING_REFERENCE = "no reference under these settings"


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


def _run_settings(rows: pd.DataFrame) -> dict[str, Any]:
    """One run's serving settings: each the run's recorded value (NaN, or "" for the front,
    where its rows have none)."""
    out: dict[str, Any] = {}
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
        best.update(pts.iloc[0][[*SETTINGS, FRONT]].to_dict())

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
    ref = refs[[*keys, "max_qps", "max_qps_censored"]].rename(
        columns={"max_qps": "_ref", "max_qps_censored": "_ref_censored"}
    )
    ref = ref.drop_duplicates(keys, keep="last")
    # Settings unknown (rows written before they were recorded) match unknown only: NaN
    # keys join NaN keys, never a known value.
    df = df.merge(ref, on=keys, how="left")
    # A reference on the same point under other settings: said, not silently left blank.
    point = REFERENCE_POINT
    elsewhere = df[point].merge(refs[point].drop_duplicates(), on=point, how="left", indicator=True)["_merge"]
    other_settings = df["_ref"].isna().to_numpy() & (elsewhere == "both").to_numpy()
    df["qps_ratio_to_reference"] = (df["max_qps"] / df["_ref"].where(df["_ref"] > 0)).astype(float)
    # A ratio over a censored reference is unknown (both could be anything above); over an
    # exact one, a censored method's ratio is a lower bound.
    df["qps_ratio_bound"] = np.select(
        [
            other_settings,
            df["_ref"].isna(),
            df["_ref_censored"].astype("boolean").fillna(False).astype(bool),
            df["max_qps_censored"],
        ],
        [NO_MATCHING_REFERENCE, "", "unknown", "lower bound"],
        "exact",
    )
    df.loc[df["qps_ratio_bound"] == "unknown", "qps_ratio_to_reference"] = np.nan
    own = (df["method"] == df["reference"]) & (df["_ref"] > 0)
    df.loc[own, ["qps_ratio_to_reference", "qps_ratio_bound"]] = [1.0, "exact"]
    out = df.drop(columns=["_ref", "_ref_censored"]).sort_values([*keys, "method", "keep_rate"])
    return out.reset_index(drop=True)
