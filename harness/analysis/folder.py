"""One results folder analysed: its rows, normalized once, and every summary of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.latency import summarize_latency
from harness.analysis.quality import summarize
from harness.analysis.rows import normalize
from harness.analysis.serving import summarize_qps, summarize_qps_rates
from harness.store import read_results, run_folders


@dataclass
class Analysis:
    """Everything a results folder's pages are made of: its rows and their summaries."""

    out: Path
    rows: pd.DataFrame  # normalized (harness.analysis.rows)
    summary: pd.DataFrame  # quality (harness.analysis.quality)
    latency: pd.DataFrame
    qps: pd.DataFrame
    qps_rates: pd.DataFrame


def run_configs(out: Path) -> dict[str, dict[str, Any]]:
    """Each run folder's ``config.yaml`` under ``out``, by run id (the folder's name)."""
    from omegaconf import OmegaConf

    configs: dict[str, dict[str, Any]] = {}
    for folder in run_folders(out):
        try:
            cfg = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
        except Exception:  # an unreadable config must not cost the report; the rows still show
            cfg = {}
        configs[folder.name] = {str(k): v for k, v in cfg.items()} if isinstance(cfg, dict) else {}
    return configs


def analyze_rows(out: Path, rows: pd.DataFrame) -> Analysis:
    """The summaries of ``rows`` (any kinds) of the folder ``out``."""
    rows = normalize(rows)
    kind = rows["kind"] if "kind" in rows else pd.Series(dtype=object)
    qrows = rows[kind == "qps"]
    rates = summarize_qps_rates(qrows) if not qrows.empty else pd.DataFrame()
    if not rates.empty:
        slo = {k: (c.get("qps") or {}).get("ttft_p90_slo_s") for k, c in run_configs(out).items()}
        rates["slo_s"] = rates["run_id"].map(slo).astype(float)
    return Analysis(
        Path(out), rows, summarize(rows[kind == "eval"]), summarize_latency(rows[kind == "latency"]),
        summarize_qps(qrows), rates,
    )  # fmt: skip


def analyze(out: Path) -> Analysis:
    """Read ``out``'s rows (every run folder under it) and summarize them."""
    return analyze_rows(Path(out), read_results(Path(out)))
