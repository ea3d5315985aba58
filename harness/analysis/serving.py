"""The serving measures: per request rate, latency percentiles and verdicts; per run, the
max QPS under the SLOs and its ratio to the reference's.

============== ============================================================================
measure        estimator
============== ============================================================================
ttft/tpot/e2e  p50, p90, p99 over the completed requests at one rate
max_qps        the highest rate tried that passed (both SLOs; each alone too); censored
               when the highest rate tried passed (the true max is higher)
qps ratio      max QPS / the reference's on the same model, benchmark, length, arrival,
               machine and dtype; a lower bound when the method's max is censored,
               unknown when the reference's is
============== ============================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import normalize


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


def summarize_qps_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run and request rate: percentiles, timeouts, score, verdicts."""
    per = []
    rows = normalize(rows)
    for key, g in rows.groupby([*QPS_POINT, "rate"], dropna=False, sort=True):
        first = g.iloc[0]
        per.append(
            {
                **dict(zip([*QPS_POINT, "rate"], key, strict=True)),
                **point_stats(g),
                "is_reference": bool(first["is_reference"]),
                "request_throughput": first["request_throughput"],
                **{k: bool(first[k]) for k in ("pass_timeout_rule", "pass_ttft_slo", "passed")},
            }
        )
    return pd.DataFrame(per)


def summarize_qps(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per serving run: the max QPS (highest passing rate) under both SLOs and
    each alone, the score and TTFT p90 at it, and the ratio to the reference method's max
    QPS on the same model, benchmark, length, arrival process, machine and dtype."""
    if rows.empty:
        return pd.DataFrame()
    rows = normalize(rows)
    rates = summarize_qps_rates(rows)
    out = []
    for key, pts in rates.groupby(QPS_POINT, dropna=False, sort=True):
        best: dict[str, Any] = dict(zip(QPS_POINT, key, strict=True))

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
    keys = ["model", "benchmark", "length", "arrival", "hardware", "dtype"]
    ref = df[df["method"] == df["reference"]][[*keys, "max_qps", "max_qps_censored"]].rename(
        columns={"max_qps": "_ref", "max_qps_censored": "_ref_censored"}
    )
    ref = ref.drop_duplicates(keys, keep="last")
    df = df.merge(ref, on=keys, how="left")
    df["qps_ratio_to_reference"] = (df["max_qps"] / df["_ref"].where(df["_ref"] > 0)).astype(float)
    # A ratio over a censored reference is unknown (both could be anything above); over an
    # exact one, a censored method's ratio is a lower bound.
    df["qps_ratio_bound"] = np.select(
        [df["_ref"].isna(), df["_ref_censored"].astype("boolean").fillna(False).astype(bool), df["max_qps_censored"]],
        ["", "unknown", "lower bound"],
        "exact",
    )
    df.loc[df["qps_ratio_bound"] == "unknown", "qps_ratio_to_reference"] = np.nan
    own = (df["method"] == df["reference"]) & (df["_ref"] > 0)
    df.loc[own, ["qps_ratio_to_reference", "qps_ratio_bound"]] = [1.0, "exact"]
    out = df.drop(columns=["_ref", "_ref_censored"]).sort_values([*keys, "method", "keep_rate"])
    return out.reset_index(drop=True)
