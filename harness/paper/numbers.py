"""The paper's numbers and ours: the published numbers (``conf/paper/published.csv``), each
table's experiment and folders, our rows of a variant (:class:`Ours`, its lookups) and the
committed point files a clone renders from."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import experiments
from harness.analysis.folder import Analysis, analyze_rows, part_rows
from harness.analysis.quality import (
    MIXED,
    Parts,
    Point,
    all_parts,
    categories,
    labels,
    macro_mean,
    paired_ratio,
    point_rows,
)
from harness.analysis.rows import PAPER_POINT_COLUMNS, PAPER_TEXT_COLUMNS
from harness.analysis.stats import Estimate
from harness.experiments import Experiment, variant_of
from harness.registry import task_family

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "conf" / "paper" / "published.csv"
RESULTS = ROOT / "results" / "paper"
#: The paper's checkpoints and the model configs (conf/model) that run them.
MODEL_OF = {
    "meta-llama/Llama-3.1-405B-Instruct-FP8": "llama405b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama8b",
}
SHORT = {"llama405b": "405B", "llama70b": "70B", "llama8b": "8B"}


def experiment_names() -> list[str]:
    """The paper's tables (experiments ``paper_<table>``)."""
    return [n.removeprefix(experiments.PAPER_PREFIX) for n in experiments.names(experiments.PAPER_PREFIX)]


def load_experiment(table: str) -> Experiment:
    table = table.removeprefix(experiments.PAPER_PREFIX)
    if table not in experiment_names():
        raise SystemExit(
            f"paper: table {table!r} has no conf/experiment/paper_{table}.yaml; allowed: {experiment_names()}"
        )
    return experiments.load(experiments.PAPER_PREFIX + table)


def folder(table: str, variant: str, root: Path = RESULTS) -> Path:
    return root / table / variant


def category_of(row: pd.Series) -> str:
    """A sample's category: the benchmark's own (LongBench), else its task's family
    (:meth:`harness.benchmarks.base.Benchmark.family`: RULER's niah, vt, ...)."""
    if isinstance(row.get("category"), str) and row["category"]:
        return str(row["category"])
    return task_family(str(row.get("benchmark", "")), str(row["task"]))


@dataclass
class Ours:
    """Our rows of one variant (their :class:`~harness.analysis.folder.Analysis`), with the
    lookups the tables need."""

    analysis: Analysis

    @classmethod
    def of(cls, rows: pd.DataFrame) -> Ours:
        """The variant's rows (a run folder's or a point file's, as stored) analysed."""
        return cls(analyze_rows(None, rows))

    @property
    def rows(self) -> pd.DataFrame:
        return self.analysis.rows

    @property
    def empty(self) -> bool:
        return self.rows.empty

    def eval(self, model: str | None = None) -> pd.DataFrame:
        """The ok eval rows (normalized: :mod:`harness.analysis.rows`), of ``model`` if given."""
        if self.rows.empty or "keep_rate" not in self.rows:
            cols = ["model", "method", "keep_rate", "task", "sample_id", "score", "ttft_s", "reference_method"]
            return pd.DataFrame(columns=[*cols, "category", "is_reference", "hardware"])
        return point_rows(self.rows, {} if model is None else {"model": model})

    def _point(self, method: str | None, keep: float, model: str | None) -> pd.DataFrame:
        """One method's rows at a keep rate (``None``: the reference's)."""
        d = self.eval(model)
        if method is None:
            return d[d["is_reference"].astype(bool)]
        return d[(d["method"] == method) & np.isclose(d["keep_rate"].astype(float), keep)]

    @staticmethod
    def _parts(rows: pd.DataFrame, group: str, key: Callable[[pd.Series], str] | None) -> Parts | None:
        """The tasks a cell averages: with ``key`` None the summary's own labels (a task,
        ``ALL``: over the rows' categories where they have any, else over tasks); with a
        ``key``, its groups (``ALL``/``Avg``: the mean over them)."""
        if rows.empty:
            return None
        if key is None:
            return labels(rows).get(group)
        cats = categories(rows, key)
        if group in ("ALL", "Avg"):
            return all_parts(set(rows["task"].astype(str)), cats)
        return [cats[group]] if group in cats else None

    def score(
        self,
        method: str,
        keep: float,
        group: str,
        key: Callable[[pd.Series], str] | None = None,
        model: str | None = None,
    ) -> Estimate | None:
        """The score of a cell (:func:`harness.analysis.quality.macro_mean`)."""
        rows = self._point(method, keep, model)
        parts = self._parts(rows, group, key)
        e = macro_mean(Point(rows), "score", parts) if parts else None
        return None if e is None or math.isnan(e.value) else e

    def retention(
        self,
        method: str,
        keep: float,
        group: str,
        key: Callable[[pd.Series], str] | None = None,
        model: str | None = None,
    ) -> Estimate | None:
        """The method's score over the reference's on the samples both ran
        (:func:`harness.analysis.quality.paired_ratio`)."""
        rows = self._point(method, keep, model)
        parts = self._parts(rows, group, key)
        if not parts:
            return None
        e = paired_ratio(Point(rows), "score", Point(self._point(None, 1.0, model)), "score", parts)
        return None if math.isnan(e.value) else e

    def ttft_speedup(self, method: str, keep: float, model: str | None = None) -> Estimate | None:
        """The summary's speedup over ``ALL``: the reference's TTFT over the method's on the
        samples both ran, on one machine (:func:`harness.analysis.quality.paired_ratio`)."""
        rows, ref = self._point(method, keep, model), self._point(None, 1.0, model)
        parts = self._parts(rows, "ALL", None)
        p, r = Point(rows), Point(ref)
        if not parts or p.hardware() == MIXED or p.hardware() != r.hardware():
            return None
        e = paired_ratio(r, "ttft_s", p, "ttft_s", parts)
        return None if math.isnan(e.value) else e

    def provenance(self) -> str:
        r = self.rows
        parts = []
        for col in ("model", "speculator", "backend", "hardware", "dtype", "git_sha"):
            if col in r:
                vals = sorted({str(v) for v in r[col].dropna() if str(v)})
                if vals:  # a speculator only where a method has one
                    parts.append(f"{col} {', '.join(v[:12] if col == 'git_sha' else v for v in vals)}")
        return "; ".join(parts)

    def why_missing(self, kind: str, method: str) -> str:
        """Why a method has no usable row: its rows' status and first error (``unsupported:
        minference needs a CUDA GPU ...``), or ``not run``."""
        if self.rows.empty:
            return "not run"
        d = self.rows[(self.rows["kind"] == kind) & (self.rows["method"] == method)]
        bad = d[d["status"] != "ok"]
        if d.empty or len(bad) < len(d):
            return "not run"
        err = str(bad["error"].dropna().iloc[0]) if "error" in bad and bad["error"].notna().any() else ""
        err = err.split(" (")[0].split(";")[0][:70]  # the error's first clause
        return f"{bad['status'].iloc[0]}: {err}" if err else str(bad["status"].iloc[0])

    def latency(self) -> pd.DataFrame:
        return self.analysis.latency if not self.analysis.of_kind("latency").empty else pd.DataFrame()

    def qps(self) -> pd.DataFrame:
        return self.analysis.qps if not self.analysis.of_kind("qps").empty else pd.DataFrame()


# --------------------------------------------------------------------------- point files

#: A variant's point file, ``results/paper/<table>/<variant>/rows.csv``: its rows trimmed to
#: the columns the tables read. Run folders are git-ignored; this file is committed, so a
#: clone renders the same tables (``make paper-report`` reads it where no run folder is).
POINTS = "rows.csv"
#: An error is kept to its start: a table prints its first clause, at most 70 characters.
ERROR_CHARS = 200
NO_ROWS = ["sub", "kind", "status"]


def run_rows(exp: Experiment, variant: str, root: Path = RESULTS) -> pd.DataFrame:
    """Every row of the variant's run folders, ``sub`` naming the command's subfolder
    (``""`` where it has none); empty where nothing ran."""
    base = folder(exp.table, variant, root)
    subs = dict.fromkeys(c.sub for c in variant_of(exp, variant).commands)
    rows = part_rows({sub: base / sub if sub else base for sub in subs}, "sub")
    return rows if not rows.empty else pd.DataFrame(columns=NO_ROWS)


def write_points(exp: Experiment, variant: str, root: Path = RESULTS) -> Path | None:
    """The variant's point file from its run folders (None where nothing ran)."""
    rows = run_rows(exp, variant, root)
    if rows.empty:
        return None
    kept = rows[[c for c in PAPER_POINT_COLUMNS if c in rows.columns]].copy()
    if "error" in kept:
        kept["error"] = kept["error"].map(lambda e: e[:ERROR_CHARS] if isinstance(e, str) else e)
    path = folder(exp.table, variant, root) / POINTS
    kept.to_csv(path, index=False, lineterminator="\n")
    return path


def read_points(path: Path) -> pd.DataFrame:
    """A point file's rows, each column of the type it was written with (floats exactly)."""
    rows = pd.read_csv(
        path,
        keep_default_na=False,
        na_values=[""],
        float_precision="round_trip",
        dtype=dict.fromkeys(PAPER_TEXT_COLUMNS, str),
    )
    return rows.assign(sub=rows["sub"].fillna(""))


def variant_rows(exp: Experiment, variant: str, root: Path = RESULTS) -> pd.DataFrame:
    """The variant's rows: its run folders where any ran, else its committed point file."""
    rows = run_rows(exp, variant, root)
    points = folder(exp.table, variant, root) / POINTS
    if rows.empty and points.is_file():
        return read_points(points)
    return rows


def load_ours(table: str, variant: str, root: Path = RESULTS) -> Ours:
    return Ours.of(variant_rows(load_experiment(table), variant, root))


@dataclass(frozen=True)
class Published:
    """One number the paper prints: its value, and its text as printed (its precision)."""

    value: float
    text: str


def published() -> pd.DataFrame:
    """``conf/paper/published.csv``: ``value`` a float (NaN where the paper prints none),
    ``printed`` the value as transcribed, so at the paper's precision (33.32, 18.0, 100)."""
    pub = pd.read_csv(PUBLISHED, keep_default_na=False, dtype={"value": str}, na_values={"keep": [""]})
    return pub.assign(printed=pub["value"], value=pd.to_numeric(pub["value"].where(pub["value"] != "")))


def paper_number(pub: pd.DataFrame, **where: Any) -> Published | None:
    d = pub
    for k, v in where.items():
        d = d[np.isclose(d[k], v)] if isinstance(v, float) else d[d[k] == v]
    if d.empty or pd.isna(d["value"].iloc[0]):
        return None
    return Published(float(d["value"].iloc[0]), str(d["printed"].iloc[0]))


def implied_ratio(a: Published | None, b: Published | None) -> float | None:
    """``a / b`` of two published numbers: a ratio the paper implies but does not print."""
    return None if a is None or b is None or b.value == 0 else a.value / b.value
