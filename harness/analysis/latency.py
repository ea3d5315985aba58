"""The latency measures: TTFT over the batch x length grid and the speedup measured side by side.

============== ============================================================================
measure        estimator
============== ============================================================================
speedup        median TTFT of the reference / median TTFT of the method over the timed
               iterations of one run (the two interleaved on the same prompts); interval:
               each side's iterations resampled within itself (:func:`run_speedup`). With
               several runs at a point, the run whose speedup is the median's, value and
               interval both (:func:`point_speedup`)
ttft           median, p90 and p99 over the timed iterations (the reference pools its runs)
ideal_speedup  the FLOP model's full prefill over the method's work (median over iterations);
               ``ideal_ttft_s``: the reference's median TTFT at the point over it
efficiency     speedup / ideal_speedup
decode         with ``decode_tokens`` > 0 (tokens decoded after each prefill, outside TTFT):
               ``decode_s_per_token``, the median over the timed iterations of the decode
               seconds over the tokens (one step of the batch); ``e2e_speedup``, the
               speedup's estimator on TTFT + decode seconds (the same run, interleaved)
kv_mib         median over the timed iterations of the KV cache one prompt leaves after the
               prefill (``kv_bytes``: all layers, keys and values, a KV press's eviction
               included; a left-padded batch counts its padding), in MiB; NaN where the
               backend cannot measure it (vLLM)
============== ============================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.rows import LATENCY_POINT, normalize
from harness.analysis.stats import Estimate, ratio_of_medians_ci

COLUMNS = [
    "model", "backend", "prompt_source", "batch", "length", "method", "keep_rate", "n", "failed", "ttft_median_s",
    "ttft_p90_s", "ttft_p99_s", "method_median_s", "base_prefill_median_s", "kept_fraction", "speedup", "speedup_lo",
    "speedup_hi", "ideal_speedup", "ideal_ttft_s", "efficiency", "kv_mib", "decode_s_per_token", "e2e_speedup", "e2e_speedup_lo",
    "e2e_speedup_hi", "reference", "is_reference", "method_name", "speculator", "dtype",
    "method_options",
]  # fmt: skip


def run_speedup(reference_ttft: np.ndarray, method_ttft: np.ndarray) -> Estimate:
    """One run's speedup: median reference TTFT / median method TTFT, each side's timed
    iterations resampled within itself."""
    return ratio_of_medians_ci(reference_ttft, method_ttft)


def point_speedup(runs: list[Estimate]) -> Estimate | None:
    """A point measured in several runs: the median run's speedup (its value and interval;
    with an even count the lower middle one), so the interval is that value's own."""
    runs = [e for e in runs if not np.isnan(e.value)]
    return sorted(runs, key=lambda e: e.value)[(len(runs) - 1) // 2] if runs else None


def _stats(x: pd.Series) -> dict[str, float]:
    a = x.to_numpy(dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def _e2e(rows: pd.DataFrame) -> np.ndarray:
    """TTFT + the decode seconds after it, per row."""
    return (rows["ttft_s"].astype(float) + pd.to_numeric(rows["decode_s"], errors="coerce")).to_numpy(dtype=float)


def summarize_latency(rows: pd.DataFrame) -> pd.DataFrame:
    """Latency rows: per point (:data:`~harness.analysis.rows.LATENCY_POINT`, the ``method``
    column its label): TTFT median/p90/p99 over the timed iterations, the method's own cost,
    the base prefill, and the module's speedup, ideal speedup and efficiency (the reference's
    own line: 1.0, pooling its rows of every run at the point)."""
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = normalize(rows).copy()
    df[["batch", "length"]] = df[["batch", "length"]].astype(int)
    timed = df[~df["warmup"].astype(bool)]
    ok = timed[timed["status"] == "ok"]
    by_run = ["run_id", "batch", "length", "reference_method"]
    refs = {k: g["ttft_s"].to_numpy(dtype=float) for k, g in ok[ok["is_reference"]].groupby(by_run)}
    decoded = "decode_s" in ok and pd.to_numeric(ok["decode_s"], errors="coerce").notna().any()
    ref_e2e = {k: _e2e(g) for k, g in ok[ok["is_reference"]].groupby(by_run)} if decoded else {}
    out = []
    for key, g in timed.groupby([*LATENCY_POINT, "label", "is_reference"], dropna=False, sort=True):
        item = dict(zip([*LATENCY_POINT, "label", "is_reference"], key, strict=True))
        good = g[g["status"] == "ok"]
        entry: dict[str, Any] = {k: item[k] for k in LATENCY_POINT}
        entry.update(method=item["label"], method_name=item["method"], n=len(good),
                     failed=int((g["status"] != "ok").sum()), reference=item["reference_method"],
                     is_reference=bool(item["is_reference"]))  # fmt: skip
        if good.empty:
            out.append(entry)
            continue
        st = _stats(good["ttft_s"])
        entry.update(
            ttft_median_s=st["median"], ttft_p90_s=st["p90"], ttft_p99_s=st["p99"],
            method_median_s=float(good["method_s"].median()), base_prefill_median_s=float(good["base_prefill_s"].median()),
            kept_fraction=float(good["kept_fraction"].mean()),
            kv_mib=float(pd.to_numeric(good.get("kv_bytes"), errors="coerce").median()) / 2**20
            if "kv_bytes" in good else float("nan"),
        )  # fmt: skip
        if decoded and pd.to_numeric(good.get("decode_s"), errors="coerce").notna().any():
            entry["decode_s_per_token"] = float(
                (pd.to_numeric(good["decode_s"], errors="coerce") / pd.to_numeric(good["decode_tokens"])).median()
            )
        if item["is_reference"]:
            entry.update(speedup=1.0, ideal_speedup=1.0, efficiency=1.0)
            if "decode_s_per_token" in entry:
                entry["e2e_speedup"] = 1.0
        else:
            runs = [
                run_speedup(refs[k], gr["ttft_s"].to_numpy(dtype=float)) for k, gr in good.groupby(by_run) if k in refs
            ]
            e = point_speedup(runs)
            ideal = float(good["ideal_speedup"].median())
            if e is not None:
                entry.update(speedup=e.value, speedup_lo=e.lo, speedup_hi=e.hi, efficiency=e.value / ideal)
            entry["ideal_speedup"] = ideal
            if "decode_s_per_token" in entry:
                e2e = point_speedup([
                    run_speedup(ref_e2e[k], _e2e(gr))
                    for k, gr in good.groupby(by_run) if k in ref_e2e
                ])  # fmt: skip
                if e2e is not None:
                    entry.update(e2e_speedup=e2e.value, e2e_speedup_lo=e2e.lo, e2e_speedup_hi=e2e.hi)
        out.append(entry)
    df = pd.DataFrame(out).reindex(columns=COLUMNS)
    # the ideal TTFT: the reference's median at the point over the method's ideal speedup
    at = ["model", "backend", "dtype", "prompt_source", "batch", "length", "reference"]
    ref = df[df["is_reference"].astype(bool)].groupby(at, dropna=False)["ttft_median_s"].first()
    base = ref.reindex(pd.MultiIndex.from_frame(df[at])).to_numpy(dtype=float)
    df["ideal_ttft_s"] = base / df["ideal_speedup"].to_numpy(dtype=float)
    return df
