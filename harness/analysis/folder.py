"""One results folder analysed: its rows, read and normalized once, and every summary of them.

:class:`Analysis` is what every reader is handed: the summary and ``report.html``
(:mod:`harness.report.summary`), the figures (:mod:`harness.rendering.plots`), the
regression gate (:mod:`harness.regress.compare`), the paper tables (:mod:`harness.paper`)
and the studies (:mod:`harness.studies`). None of them reads the store, normalizes rows or
summarizes them on its own (``tests/test_analysis.py`` checks their source): they ask an
Analysis, built by :func:`analyze` (a folder), :func:`analyze_rows` (rows already in hand,
e.g. a committed point file) or :func:`analyze_parts` (several folders, each row tagged with
its part). Each summary is computed the first time a reader asks for it, then kept.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.quality import summarize
from harness.analysis.rows import normalize
from harness.analysis.serving import summarize_qps, summarize_qps_rates, with_settings
from harness.analysis.speed import summarize_latency
from harness.failures import job_errors
from harness.store import read_results, run_folders


@dataclass
class Analysis:
    """Everything a results folder's pages, verdicts and tables are made of: its rows
    (normalized: :mod:`harness.analysis.rows`), the jobs that failed as a whole, and the
    summaries of each kind of row (computed when first read)."""

    out: Path | None  # the folder (None: rows that are not a folder's, e.g. a point file's)
    rows: pd.DataFrame
    job_errors: list[tuple[str, str]] = field(default_factory=list)  # (run folder, the error's last lines)
    #: The columns the rows were stored with (normalizing adds some: the gate refuses a
    #: folder by what was stored, harness.regress.compare.read_folder).
    stored_columns: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        self.stored_columns = frozenset(map(str, self.rows.columns))
        # Rows without a method column are only the empty frame of a part that ran nothing.
        if "method" in self.rows or self.rows.empty:
            self.rows = normalize(self.rows)

    @property
    def folder(self) -> Path:
        """The results folder of these rows (a page is written there); an error for rows
        that are not one folder's."""
        if self.out is None:
            raise ValueError("these rows are not one results folder's (analyze_rows without out); nowhere to write")
        return self.out

    def of_kind(self, kind: str) -> pd.DataFrame:
        """The rows of ``kind`` (eval, latency, qps), whatever their status."""
        if self.rows.empty or "kind" not in self.rows:
            return self.rows.iloc[0:0]
        return self.rows[self.rows["kind"] == kind]

    def ok(self, kind: str) -> pd.DataFrame:
        """The rows of ``kind`` whose status is ``ok``."""
        d = self.of_kind(kind)
        return d[d["status"] == "ok"] if not d.empty else d

    @cached_property
    def summary(self) -> pd.DataFrame:
        """Quality: :func:`harness.analysis.quality.summarize` of the eval rows."""
        return summarize(self.of_kind("eval"))

    @cached_property
    def latency(self) -> pd.DataFrame:
        """TTFT side by side: :func:`harness.analysis.speed.summarize_latency` of the latency rows."""
        return summarize_latency(self.of_kind("latency"))

    @cached_property
    def qps_rows(self) -> pd.DataFrame:
        """The qps rows with their runs' serving settings (:data:`harness.analysis.serving.SETTINGS`):
        a row's own, else (rows written before they were recorded) its run's config.yaml's."""
        qrows = self.of_kind("qps")
        if qrows.empty:
            return qrows
        configs = run_configs(self.out) if self.out is not None else {}
        return with_settings(qrows, {k: c.get("qps") or {} for k, c in configs.items()})

    @cached_property
    def qps(self) -> pd.DataFrame:
        """Serving: :func:`harness.analysis.serving.summarize_qps` of the qps rows."""
        return summarize_qps(self.qps_rows)

    @cached_property
    def qps_rates(self) -> pd.DataFrame:
        """Each offered rate of the qps rows, with its run's settings (the TTFT SLO ``ttft_p90_slo_s``, ...)."""
        return summarize_qps_rates(self.qps_rows) if not self.qps_rows.empty else pd.DataFrame()


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


def analyze_rows(out: Path | None, rows: pd.DataFrame) -> Analysis:
    """The analysis of ``rows`` (any kinds), those of the folder ``out`` where they are a folder's."""
    return Analysis(Path(out) if out is not None else None, rows)


def analyze(out: Path, strict: bool = False) -> Analysis:
    """Read ``out``'s rows (every run folder under it) and its jobs' errors. ``strict``: a
    damaged row file raises :class:`harness.store.DamagedRowFile` instead of being skipped."""
    out = Path(out)
    return Analysis(out, read_results(out, strict=strict), job_errors(out))


def part_rows(parts: Mapping[str, Path], column: str) -> pd.DataFrame:
    """Every row under each folder of ``parts`` (those that exist), as stored (not
    normalized), with ``column`` naming its part; empty (no columns) where none has rows."""
    frames = []
    for name, folder in parts.items():
        rows = read_results(folder) if Path(folder).exists() else pd.DataFrame()
        if not rows.empty:
            frames.append(rows.assign(**{column: name}))
    if not frames:
        return pd.DataFrame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # columns all empty in one part's rows
        return pd.concat(frames, ignore_index=True)


def analyze_parts(parts: Mapping[str, Path], column: str) -> Analysis:
    """The analysis of several folders' rows together (:func:`part_rows`)."""
    return Analysis(None, part_rows(parts, column))
