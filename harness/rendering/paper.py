"""The paper's tables beside ours.

The published numbers of Liu et al., "Speculative Prefill: Turbocharging TTFT with
Lightweight and Training-Free Token Importance Estimation" (ICML 2025) and of its OpenReview
rebuttal are data (``conf/paper/published.csv``, one row per number). Each table has an
experiment (``conf/experiment/paper_<table>.yaml``) with a ``paper`` variant (the paper's
models, GPUs) and a ``cpu`` variant (SmolLM2 on offline data, the table's shape kept), each a
list of harness commands writing under ``results/paper/<table>/<variant>/``.

``python -m harness.rendering.paper run --table T [--variant cpu] [--dry-run]`` (``make paper
table=T``) runs one; the dry run prints the commands, the GPUs and an estimate of GPU-hours
from the FLOP model, then each command's own plan. ``python -m harness.rendering.paper report``
(``make paper-report``) renders every table from whatever rows exist into
``results/paper/<table>.md`` and its figure ``<table>.png``: three columns per compared
number, ours (with our 95 % interval and n), the paper's as printed, and Δ where our setting
is the paper's (else what differs); relative measures (retention: a method's score over full
prefill's on the same samples; speedup) beside absolute ones so a different model's run
compares in shape; for a cell with no run, the reason. ``baselines.md`` holds the rebuttal's
comparisons with other methods, ``headline.md`` the abstract's figures.

A run also writes the variant's point file (``rows.csv``: its rows, trimmed to the columns
the tables read). The run folders are git-ignored and the point files committed, so a clone
renders the committed tables byte for byte from them.
"""

from __future__ import annotations

import argparse
import math
import re
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import experiments
from harness.analysis.latency import summarize_latency
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
from harness.analysis.rows import normalize
from harness.analysis.serving import summarize_qps
from harness.analysis.stats import Estimate
from harness.experiments import Experiment, cannot_run, variant_of
from harness.registry import task_family
from harness.rendering.plots import _panels, _plt
from harness.rendering.tables import flag_word, md_table
from harness.store import read_results

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


# --------------------------------------------------------------------------- experiments


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


def command_lines(exp: Experiment, variant: str, root: Path = RESULTS, dry_run: bool = False) -> list[list[str]]:
    return experiments.command_lines(exp, variant, folder(exp.table, variant, root), dry_run)


def no_delta(exp: Experiment, variant: str, pub: pd.DataFrame) -> str:
    """Why a difference from the paper's number would mislead in this variant: ``""`` where
    it runs the paper's setting (each of the paper's models stands for itself, the paper's
    benchmark), else what differs (``other model and benchmark``)."""
    v = variant_of(exp, variant)
    differs = []
    if any(mine != theirs for theirs, mine in v.models.items()):  # {the paper's model config: ours}
        differs.append("model")
    ours = {a.split("=", 1)[1] for c in v.commands for a in c.args if a.startswith("benchmark=")}
    if ours - set(pub[pub["source"] == exp.source]["benchmark"]):
        differs.append("benchmark")
    return "other " + " and ".join(differs) if differs else ""


def plan_text(exp: Experiment, variant: str, root: Path = RESULTS) -> str:
    return experiments.plan_text(exp, variant, folder(exp.table, variant, root), kind="paper table")


def run(table: str, variant: str, dry_run: bool, root: Path = RESULTS) -> int:
    exp = load_experiment(table)
    print(plan_text(exp, variant, root), flush=True)
    if experiments.run_commands(exp, variant, folder(exp.table, variant, root), dry_run):
        return 1
    if not dry_run:
        kept = write_points(exp, variant, root)
        print(f"kept {kept}" if kept else "no rows to keep", flush=True)
        print(f"rendered {write_report(root)}")
    return 0


# --------------------------------------------------------------------------- our numbers


def category_of(row: pd.Series) -> str:
    """A sample's category: the benchmark's own (LongBench), else its task's family
    (:meth:`harness.benchmarks.base.Benchmark.family`: RULER's niah, vt, ...)."""
    if isinstance(row.get("category"), str) and row["category"]:
        return str(row["category"])
    return task_family(str(row.get("benchmark", "")), str(row["task"]))


@dataclass
class Ours:
    """Our rows of one variant, with the lookups the tables need."""

    rows: pd.DataFrame

    def __post_init__(self) -> None:
        if "method" in self.rows:  # normalized once: every lookup below reads them
            self.rows = normalize(self.rows)

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
        d = self.rows[self.rows["kind"] == "latency"] if not self.rows.empty else self.rows
        return summarize_latency(d) if not d.empty else pd.DataFrame()

    def qps(self) -> pd.DataFrame:
        d = self.rows[self.rows["kind"] == "qps"] if not self.rows.empty else self.rows
        return summarize_qps(d) if not d.empty else pd.DataFrame()


# --------------------------------------------------------------------------- point files

#: A variant's point file, ``results/paper/<table>/<variant>/rows.csv``: its rows trimmed to
#: the columns the tables read. Run folders are git-ignored; this file is committed, so a
#: clone renders the same tables (``make paper-report`` reads it where no run folder is).
POINTS = "rows.csv"
#: What the tables read: :class:`Ours` (lookups, provenance, why a cell is empty),
#: :mod:`harness.analysis`'s latency and serving summaries; ``sub`` is the command's
#: subfolder (one per QPS category). tests/test_paper.py renders from these columns alone
#: and from whole rows and compares.
POINT_COLUMNS = (
    "sub", "kind", "run_id", "config_hash", "status", "error", "git_sha", "hardware", "model", "speculator",
    "dtype", "backend", "method", "method_options", "reference_method", "keep_rate",
    "benchmark", "benchmark_options", "length", "task", "category", "sample_id", "score", "ttft_s",
    "prompt_source", "batch", "iteration", "warmup", "kept_fraction", "method_s", "base_prefill_s", "ideal_speedup",
    "arrival", "rate", "request", "prompt_tokens", "kept_tokens", "timed_out", "e2e_s", "tpot_s", "speculator_s",
    "pass_timeout_rule", "pass_ttft_slo", "passed", "request_throughput",
)  # fmt: skip
#: Text columns, read back as text (a git SHA of digits alone stays a SHA).
TEXT_COLUMNS = (
    "sub", "kind", "run_id", "config_hash", "status", "error", "git_sha", "hardware", "model", "speculator",
    "dtype", "backend", "method", "method_options", "reference_method", "benchmark", "benchmark_options", "task",
    "category", "prompt_source", "arrival",
)  # fmt: skip
#: An error is kept to its start: a table prints its first clause, at most 70 characters.
ERROR_CHARS = 200
NO_ROWS = ["sub", "kind", "status"]


def run_rows(exp: Experiment, variant: str, root: Path = RESULTS) -> pd.DataFrame:
    """Every row of the variant's run folders, ``sub`` naming the command's subfolder
    (``""`` where it has none); empty where nothing ran."""
    base = folder(exp.table, variant, root)
    frames = []
    for sub in dict.fromkeys(c.sub for c in variant_of(exp, variant).commands):
        f = base / sub if sub else base
        rows = read_results(f) if f.exists() else pd.DataFrame()
        if not rows.empty:
            frames.append(rows.assign(sub=sub))
    if not frames:
        return pd.DataFrame(columns=NO_ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # columns all empty in one category's rows
        return pd.concat(frames, ignore_index=True)


def write_points(exp: Experiment, variant: str, root: Path = RESULTS) -> Path | None:
    """The variant's point file from its run folders (None where nothing ran)."""
    rows = run_rows(exp, variant, root)
    if rows.empty:
        return None
    kept = rows[[c for c in POINT_COLUMNS if c in rows.columns]].copy()
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
        dtype=dict.fromkeys(TEXT_COLUMNS, str),
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
    return Ours(variant_rows(load_experiment(table), variant, root))


# --------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Published:
    """One number the paper prints: its value, and its text as printed (its precision)."""

    value: float
    text: str


#: ``(ours, paper, Δ)``: three cells, one column each (:func:`columns`).
Cell = tuple[str, str, str]
#: A reference's own ratio (retention, speedup): 1 by definition, nothing to compare.
REFERENCE: Cell = ("1 (reference)", "1 (reference)", "-")
LEGEND = (
    "Columns: ours (value [95 % interval] n=samples), the paper's as it prints it, and "
    "Δ = ours - paper. Δ is printed only where our setting is the paper's (its model on its "
    "benchmark); elsewhere the Δ cell says what differs. A paper column's ratio that the paper "
    "does not print itself (a retention, a speedup, a QPS ratio) is the ratio of two numbers it "
    "prints, at our precision.\n"
)


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def cell(
    ours: Estimate | float | None,
    paper: Published | float | None,
    fmt: str = "{:.2f}",
    why: str = "not run",
    no_delta: str = "",
) -> Cell:
    """``(ours [lo, hi] n=K, paper, Δ = ours - paper)``; ``why`` stands in for a missing
    run. A :class:`Published` number is printed as the paper prints it, a float (a ratio
    of published numbers) in ``fmt``. ``no_delta`` is why our setting is not the paper's
    (:func:`no_delta`): the Δ cell says so instead of printing a difference."""
    if isinstance(ours, Estimate):
        o = _fmt(ours.value, fmt)
        if not math.isnan(ours.lo):
            o += f" [{_fmt(ours.lo, fmt)}, {_fmt(ours.hi, fmt)}]"
        o += f" n={ours.n}"
        value: float | None = None if math.isnan(ours.value) else ours.value
    elif ours is None or (isinstance(ours, float) and math.isnan(ours)):
        o, value = f"({why})", None
    else:
        o, value = _fmt(float(ours), fmt), float(ours)
    if isinstance(paper, Published):
        p, theirs = paper.text, paper.value
    elif paper is None or math.isnan(paper):
        p, theirs = "-", None
    else:
        p, theirs = _fmt(paper, fmt), float(paper)
    if value is None or theirs is None:
        d = "-"
    elif no_delta:
        d = f"— ({no_delta})"
    else:
        d = _fmt(value - theirs, "{:+" + fmt[2:])
    return o, p, d


def columns(name: str, c: Cell) -> dict[str, str]:
    """A cell triple as three columns: ``<name>: ours``, ``<name>: paper``, ``<name>: Δ``."""
    return {f"{name}: ours": c[0], f"{name}: paper": c[1], f"{name}: Δ": c[2]}


def published() -> pd.DataFrame:
    """``conf/paper/published.csv``: ``value`` a float (NaN where the paper prints none),
    ``printed`` the value as transcribed, so at the paper's precision (33.32, 18.0, 100)."""
    pub = pd.read_csv(PUBLISHED, keep_default_na=False, dtype={"value": str}, na_values={"keep": [""]})
    return pub.assign(printed=pub["value"], value=pd.to_numeric(pub["value"].where(pub["value"] != "")))


def _paper(pub: pd.DataFrame, **where: Any) -> Published | None:
    d = pub
    for k, v in where.items():
        d = d[np.isclose(d[k], v)] if isinstance(v, float) else d[d[k] == v]
    if d.empty or pd.isna(d["value"].iloc[0]):
        return None
    return Published(float(d["value"].iloc[0]), str(d["printed"].iloc[0]))


def _ratio(a: Published | None, b: Published | None) -> float | None:
    """``a / b`` of two published numbers: a ratio the paper implies but does not print."""
    return None if a is None or b is None or b.value == 0 else a.value / b.value


def retention_cell(
    ours: Ours, method: str, keep: float, group: str, key: Callable[[pd.Series], str] | None, model: str | None
) -> str:
    """Our retention of one group, else why there is none: undefined where full prefill
    scored 0 there (a ratio over 0, however the method scored), not run otherwise."""
    est = ours.retention(method, keep, group, key, model=model)
    if est is not None:
        return cell(est, None)[0]
    full = ours.score("full", 1.0, group, key, model)
    if full is not None and full.value == 0 and ours.score(method, keep, group, key, model) is not None:
        return "(undefined: full prefill scored 0)"
    return "(not run)"


def _md(rows: list[dict[str, str]]) -> str:
    return md_table(pd.DataFrame(rows)) if rows else "(nothing)\n"


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def _missing(exp: Experiment, variant: str) -> str:
    v = exp.variants[variant]
    need = f"needs {v.gpus} GPU(s)" if v.gpus else "runs on CPU"
    return f"not run: {need}; `make paper table={exp.table}{'' if variant == 'paper' else ' variant=' + variant}`"


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Mark:
    """One point of a table's figure: ``series`` of ``source`` (``paper``, or the variant
    that measured it) at ``x`` in ``panel``, with our 95 % interval where there is one."""

    panel: str
    source: str
    series: str
    x: str | float
    y: float
    lo: float = math.nan
    hi: float = math.nan
    lower_bound: bool = False  # ours is a lower bound (a QPS search that never failed)


def figure(marks: list[Mark], title: str, path: Path) -> Path | None:
    """One PNG, a panel per ``Mark.panel``: over keep rates, curves (the paper's dashed with
    hollow markers, ours solid with their intervals); over categories or grid points, grouped
    bars (the paper's hatched and hollow, ours filled with their intervals; a lower bound
    marked ``>=``). None where there is nothing to draw."""
    if not marks:
        return None
    panels = list(dict.fromkeys(m.panel for m in marks))
    names = list(dict.fromkeys(m.series for m in marks))  # one colour per series in every panel
    fig, axes = _panels(len(panels), width=5.6, height=4.2)
    for ax, panel in zip(axes, panels, strict=False):
        pm = [m for m in marks if m.panel == panel]
        lines = list(dict.fromkeys((m.source, m.series) for m in pm))
        xs = list(dict.fromkeys(m.x for m in pm))
        categorical = any(isinstance(x, str) for x in xs)
        width = 0.8 / len(lines)
        for i, (source, series) in enumerate(lines):
            ms = [m for m in pm if (m.source, m.series) == (source, series)]
            color = f"C{names.index(series) % 10}"
            paper = source == "paper"
            label = f"{series} ({'paper' if paper else 'ours, ' + source})"
            y = np.array([m.y for m in ms])
            if categorical:
                x = np.array([xs.index(m.x) + (i - (len(lines) - 1) / 2) * width for m in ms])
                fill = {"color": "none", "hatch": "///"} if paper else {"color": color}
                ax.bar(x, y, width=width, edgecolor=color, label=label, **fill)
            else:
                x = np.array([float(m.x) for m in ms])
                ax.plot(
                    x,
                    y,
                    ls="--" if paper else "-",
                    marker="o",
                    color=color,
                    label=label,
                    mfc="none" if paper else color,
                )
            lo, hi = np.array([m.lo for m in ms]), np.array([m.hi for m in ms])
            has = ~(np.isnan(lo) | np.isnan(hi))
            if has.any():
                err = np.clip(np.vstack([y[has] - lo[has], hi[has] - y[has]]), 0, None)
                ax.errorbar(x[has], y[has], yerr=err, fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
            for xb, yb in zip(x[[m.lower_bound for m in ms]], y[[m.lower_bound for m in ms]], strict=True):
                ax.annotate(">=", (xb, yb), ha="center", va="bottom", fontsize=7)
        if categorical:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=30, ha="right", fontsize=7)
            ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
        else:
            ax.set_xlabel("keep rate", fontsize=8)
        ax.set_title(panel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2 if categorical else 1)
    fig.suptitle(textwrap.fill(title, width=int(14 * 5.6 * len(panels))), fontsize=10)  # ~14 characters an inch
    plt = _plt()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No version in the file: the same marks give the same bytes wherever they are drawn.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- tables

Built = tuple[str, list[Mark]]


def _longbench_405b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama405b")
    keeps = [0.1, 0.3, 0.5, 0.7]
    nd = no_delta(exp, variant, pub)
    ev = ours.eval(model)
    tasks = list(src[src["metric"] == "score"]["task"])
    if not ev.empty:  # a run on another benchmark (the CPU variant's RULER): its own tasks
        tasks = [t for t in tasks if t in set(ev["task"])] + sorted(set(ev["task"]) - set(tasks))
    rows = []
    for t in tasks:
        full = _paper(src, task=t, method="full", metric="score")
        r = {
            "dataset": t,
            **columns("full score", cell(ours.score("full", 1.0, t, None, model), full, no_delta=nd)),
        }
        for k in keeps:
            r[f"retention keep {k:g} (ours)"] = retention_cell(ours, "specprefill", k, t, None, model)
        rows.append(r)
    speed, marks = [], []
    for k in keeps:
        sp, p = ours.ttft_speedup("specprefill", k, model), _paper(src, metric="ttft_speedup", keep=k)
        speed.append(
            {
                "keep": f"{k:g}",
                **columns("TTFT speedup", cell(sp, p, no_delta=nd)),
                "score ALL (ours)": cell(ours.score("specprefill", k, "ALL", None, model), None, "{:.1f}")[0],
                "retention ALL (ours)": retention_cell(ours, "specprefill", k, "ALL", None, model),
            }
        )
        panel = "TTFT speedup over full prefill vs keep"
        if p is not None:
            marks.append(Mark(panel, "paper", "SpecPrefill", k, p.value))
        if sp is not None:
            marks.append(Mark(panel, variant, "SpecPrefill", k, sp.value, sp.lo, sp.hi))
        ret = ours.retention("specprefill", k, "ALL", None, model=model)
        if ret is not None:
            panel = "score retention (ALL) vs keep (the paper prints none)"
            marks.append(Mark(panel, variant, "SpecPrefill", k, ret.value, ret.lo, ret.hi))
    md = (
        "Full-prefill score per dataset and SpecPrefill's retention (its score over full prefill's "
        "on the same samples; the paper prints no per-dataset SpecPrefill numbers):\n\n"
        + _md(rows)
        + "\nTTFT speedup over full prefill (ours: mean TTFT ratio on the same samples, between runs: each "
        "method's eval run timed on its own, so the interval covers the samples, not the drift between runs):\n\n"
        + _md(speed)
    )
    return md, marks


def _qps(exp: Experiment, pub: pd.DataFrame, rows: pd.DataFrame, variant: str) -> tuple[str, str, list[Mark]]:
    src = pub[pub["source"] == exp.source]
    v = exp.variants[variant]
    nd = no_delta(exp, variant, pub)
    table, prov, marks = [], [], []
    for cat in dict.fromkeys(src["task"]):
        o = Ours(rows[rows["sub"] == _slug(cat)] if not rows.empty else rows)
        if not o.empty:
            prov.append(f"{cat}: {o.provenance()}")
        q = o.qps()
        spec_keep = float(src[(src["task"] == cat) & (src["method"] == "specprefill")]["keep"].iloc[0])
        timeout = str(src[src["task"] == cat]["setting"].iloc[0]).removeprefix("timeout=")
        for base in dict.fromkeys(src["base"]):
            mine = v.models.get(MODEL_OF[base])
            short = SHORT[MODEL_OF[base]]
            got: dict[str, pd.Series | None] = {}
            for method in ("full", "specprefill"):
                m = q[(q["model"] == mine) & (q["method"] == method)] if mine is not None and not q.empty else q
                if method != "full" and len(m):
                    m = m[np.isclose(m["keep_rate"].astype(float), spec_keep)]
                got[method] = m.iloc[-1] if mine is not None and len(m) else None
            p_full = _paper(src, base=base, task=cat, method="full", metric="max_qps")
            why = "not in this variant" if mine is None else ("not run" if o.empty else "no row")
            for method in ("full", "specprefill"):
                g = got[method]
                pq = _paper(src, base=base, task=cat, method=method, metric="max_qps")
                ps = _paper(src, base=base, task=cat, method=method, metric="score")
                max_qps = _max_qps_cell(g, pq, ps, why, nd)
                r = {
                    "category": cat,
                    "keep, timeout": f"{spec_keep:g}, {timeout}",
                    "paper's base": short,
                    "method": "full" if method == "full" else f"SpecPrefill {spec_keep:.0%}",
                    **columns("max QPS", max_qps),
                    "score at it: ours": f"({why})" if g is None else f"{g['score_at_max_qps']:.1f}",
                    "score at it: paper": "-" if ps is None else ps.text,
                }
                if method == "full":
                    r.update(columns("over full's max QPS", REFERENCE))
                else:
                    r.update(columns("over full's max QPS", _qps_ratio(g, pq, p_full, why, nd)))
                table.append(r)
                at, label = f"{cat}, {short}", "full" if method == "full" else "SpecPrefill"
                if pq is not None:
                    marks.append(Mark("max QPS", "paper", label, at, pq.value))
                if g is not None:
                    bound = max_qps[0].startswith(">=")
                    marks.append(Mark("max QPS", variant, label, at, float(g["max_qps"]), lower_bound=bound))
                if method != "full":
                    panel, ratio = "SpecPrefill's max QPS over full prefill's", _ratio(pq, p_full)
                    if ratio is not None:
                        marks.append(Mark(panel, "paper", "SpecPrefill", at, ratio))
                    if g is not None and g.get("qps_ratio_bound", "exact") in ("exact", "lower bound"):
                        bound = g.get("qps_ratio_bound") == "lower bound"
                        ours = float(g["qps_ratio_to_reference"])
                        marks.append(Mark(panel, variant, "SpecPrefill", at, ours, lower_bound=bound))
    note = (
        "Max QPS before more than 4 requests exceed the timeout, the task score at it, and the "
        "ratio to full prefill's max QPS on the same model (the paper's: the ratio of its two "
        "printed rates). `>=`: the highest rate the search tried still passed, so the true max "
        "QPS is higher (a lower bound); a ratio over a reference that is itself a lower bound is "
        "unknown (`?`).\n\n"
    )
    return note + _md(table), "; ".join(prov), marks


def _max_qps_cell(g: pd.Series | None, pq: Published | None, ps: Published | None, why: str, nd: str) -> Cell:
    """Our max QPS (``>=`` where the search never failed: a lower bound) beside the paper's
    (``times out`` where it prints neither a rate nor a score)."""
    ge = ">=" if g is not None and bool(g.get("max_qps_censored", False)) else ""
    o, p, d = cell(None if g is None else float(g["max_qps"]), pq, why=why, no_delta=nd)
    if pq is None and ps is None:
        p = "times out"
    return ge + o, p, (ge + d if d[0] in "+-" and d != "-" else d)


def _qps_ratio(g: pd.Series | None, pq: Published | None, p_full: Published | None, why: str, nd: str) -> Cell:
    """SpecPrefill's max QPS over full prefill's: ours (bounds marked) beside the paper's."""
    paper = _ratio(pq, p_full)
    # The paper's full prefill timing out at every rate leaves its ratio unbounded.
    theirs = "- (full times out)" if pq is not None and p_full is None else None
    if g is None:
        o, p, d = cell(None, paper, why=why, no_delta=nd)
    elif g.get("qps_ratio_bound", "exact") == "unknown":
        o, p, d = "? (full's max is a lower bound)", _fmt(paper, "{:.2f}"), "-"
    else:
        o, p, d = cell(float(g["qps_ratio_to_reference"]), paper, no_delta=nd)
        ge = ">=" if g.get("qps_ratio_bound") == "lower bound" else ""
        o, d = ge + o, (ge + d if d[0] in "+-" and d != "-" else d)
    return o, theirs or p, d


def _latency_grid(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    lat = ours.latency()
    nd = no_delta(exp, variant, pub)
    blocked = cannot_run(exp.variants[variant])
    grid = list(dict.fromkeys(src["task"]))
    if not lat.empty:  # our grid points (a CPU variant's differ from the paper's: its rows are ours)
        mine = sorted({(int(b), int(n)) for b, n in zip(lat["batch"], lat["length"], strict=True)}, key=lambda x: x[1])
        grid = [g for g in grid if tuple(int(x) for x in g.split("x")) in mine]
        grid += [f"{b}x{n}" for b, n in mine if f"{b}x{n}" not in grid]
    rows, marks = [], []
    for method, keep in dict.fromkeys(zip(src["method"], src["keep"], strict=True)):
        label = method if method != "specprefill" else f"specprefill {keep:.0%}"
        for g in grid:
            b, n = (int(x) for x in g.split("x"))
            p = _paper(src, task=g, method=method, keep=float(keep), metric="latency_s")
            pf = _paper(src, task=g, method="full", metric="latency_s")
            got = None
            if not lat.empty:
                m = lat[(lat["method_name"] == method) & (lat["batch"] == b) & (lat["length"] == n)]
                m = m[np.isclose(m["keep_rate"].astype(float), float(keep))] if method != "full" else m
                got = m.iloc[0] if len(m) and int(m.iloc[0]["n"]) > 0 else None
            reason = "not run" if got is not None else ours.why_missing("latency", method)
            if got is None and method in blocked:
                reason = "cannot run in this table: see below"
            med = None if got is None else Estimate(float(got["ttft_median_s"]), math.nan, math.nan, int(got["n"]))
            r = {"method": label, "batch x length": g, **columns("latency s", cell(med, p, why=reason, no_delta=nd))}
            if method == "full":
                r.update(columns("speedup", REFERENCE))
            else:
                est = None
                if got is not None:
                    est = Estimate(
                        float(got["speedup"]), float(got["speedup_lo"]), float(got["speedup_hi"]), int(got["n"])
                    )
                paper_speedup = _ratio(pf, p)
                r.update(columns("speedup", cell(est, paper_speedup, why=reason, no_delta=nd)))
                check = "ok" if got is None else flag_word(got.get("flags"))
                if check != "ok":  # an unsafe speed claim says so in its cell (the summary has the words)
                    r["speedup: ours"] += f" ({check})"
                if paper_speedup is not None:
                    marks.append(
                        Mark("paper: speedup over full prefill (70B, 8 GPUs)", "paper", label, g, paper_speedup)
                    )
                if est is not None:
                    panel = f"ours ({variant}): speedup over full prefill"
                    marks.append(Mark(panel, variant, label, g, est.value, est.lo, est.hi))
            rows.append(r)
    md = (
        "Batch latency in seconds (ours: median of the timed iterations, n of them) and the speedup "
        "over full prefill (ours: measured side by side in one run, the median of the per-iteration ratios "
        "with its 95 % interval over the pairs, none under 5 pairs; a cell marked `old protocol` was timed "
        "before the order-balanced protocol, the reference always first; `ANOMALY`, `A/A FAILED`: see the "
        "latency summary's flags; the paper's: its full-prefill latency over the method's):\n\n"
        + _md(rows)
        + "".join(f"\n{m}: cannot run in this table: {r}.\n" for m, r in blocked.items())
    )
    return md, marks


#: The paper's LongBench category abbreviations and LongBench's own names (our rows' ``category``).
CATEGORY = {
    "SQA": "single-doc QA",
    "MQA": "multi-doc QA",
    "Sum": "summarization",
    "FSL": "few-shot",
    "Code": "code",
    "Synth": "synthetic",
}


def _categories_8b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama8b")
    nd = no_delta(exp, variant, pub)
    ev = ours.eval(model)
    our_cats = sorted({category_of(r) for _, r in ev.iterrows()}) if not ev.empty else []
    paper_cats = [c for c in dict.fromkeys(src["task"]) if c != "Avg"]
    # The paper's categories where ours are LongBench's too (or nothing ran); a run on another
    # benchmark (the CPU variant's RULER) shows its own beside the paper's Avg.
    shown = paper_cats if not our_cats or "benchmark" not in nd else []
    groups = [(c, CATEGORY[c]) for c in shown]
    groups += [(c, c) for c in our_cats if c not in {CATEGORY[p] for p in shown}]
    groups.append(("Avg", "Avg"))
    methods = list(dict.fromkeys(zip(src["method"], src["keep"], strict=True)))
    rows, marks = [], []
    for theirs, mine in groups:
        full_p = _paper(src, task=theirs, method="full", metric="score")
        for method, keep in methods:
            label = "full" if method == "full" else f"keep {keep:.0%}"
            p = _paper(src, task=theirs, method=method, keep=float(keep), metric="score")
            sc = ours.score(method, float(keep), mine, category_of, model)
            r = {"category": theirs if theirs == mine else f"{theirs} ({mine})", "method": label}
            r.update(columns("score", cell(sc, p, no_delta=nd)))
            if method == "full":
                r.update(columns("retention", REFERENCE))
            else:
                ret = retention_cell(ours, method, float(keep), mine, category_of, model)
                paper_ret = _ratio(p, full_p)
                est = ours.retention(method, float(keep), mine, category_of, model=model)
                c = cell(est, paper_ret, "{:.3f}", no_delta=nd)
                r.update(columns("retention", (ret if est is None else c[0], c[1], c[2])))
                if theirs == "Avg":
                    panel = "retention of the Avg vs keep"
                    if paper_ret is not None:
                        marks.append(Mark(panel, "paper", "SpecPrefill", float(keep), paper_ret))
                    if est is not None:
                        marks.append(Mark(panel, variant, "SpecPrefill", float(keep), est.value, est.lo, est.hi))
            rows.append(r)
            if theirs != "Avg":
                if p is not None:
                    marks.append(Mark("score per category (LongBench)", "paper", label, theirs, p.value))
                if sc is not None:
                    panel = (
                        "score per category (LongBench)"
                        if "benchmark" not in nd
                        else f"ours ({variant}): score per category"
                    )
                    marks.append(Mark(panel, variant, label, theirs, sc.value, sc.lo, sc.hi))
    md = (
        "Category averages (macro means of the tasks in each category; Avg is the mean of the "
        "categories) and retention (a method's score over full prefill's on the same samples; "
        "the paper's: its two printed scores' ratio). Ours are per our categories (LongBench's, "
        "or RULER's task families on a RULER run):\n\n" + _md(rows)
    )
    return md, marks


BUILDERS: dict[str, Callable[[Experiment, pd.DataFrame, Ours, str], Built]] = {
    "longbench_405b": _longbench_405b,
    "latency_grid": _latency_grid,
    "categories_8b": _categories_8b,
}


def _headline(pub: pd.DataFrame, root: Path) -> str:
    src = pub[pub["source"] == "abstract"]
    paper_model = MODEL_OF[str(src["base"].iloc[0])]
    best_ttft: tuple[float, str, str] | None = None  # (speedup, where, our model)
    for table in ("latency_grid", "longbench_405b"):
        for variant in ("paper", "cpu"):
            lat = load_ours(table, variant, root).latency()
            if not lat.empty and lat["speedup"].notna().any():
                i = lat["speedup"].astype(float).idxmax()
                where = f"{table}/{variant}: {lat.loc[i, 'model']} {lat.loc[i, 'method']}"
                cand = (float(lat.loc[i, "speedup"]), where, str(lat.loc[i, "model"]))
                best_ttft = cand if best_ttft is None or cand[0] > best_ttft[0] else best_ttft
    best_qps: tuple[float, str, str] | None = None
    qps_runs = False
    exp = load_experiment("qps")
    for variant in exp.variants:
        rows = variant_rows(exp, variant, root)
        for sub in dict.fromkeys(rows["sub"]) if not rows.empty else []:
            q = Ours(rows[rows["sub"] == sub]).qps()
            qps_runs = qps_runs or not q.empty
            q = q[q["method"] != q["reference"]] if not q.empty else q  # the reference's own 1.0 is no claim
            if not q.empty and q["qps_ratio_to_reference"].notna().any():
                i = q["qps_ratio_to_reference"].astype(float).idxmax()
                lower = q.loc[i, "qps_ratio_bound"] == "lower bound"
                where = f"qps/{variant}/{sub}: {q.loc[i, 'model']}" + (" (a lower bound)" if lower else "")
                cand = (float(q.loc[i, "qps_ratio_to_reference"]), where, str(q.loc[i, "model"]))
                best_qps = cand if best_qps is None or cand[0] > best_qps[0] else best_qps

    def nd(best: tuple[float, str, str] | None) -> str:
        return "" if best is None or best[2] == paper_model else "other model"

    rows = [
        {
            "claim": "up to x TTFT",
            **columns(
                "ratio",
                cell(
                    None if best_ttft is None else best_ttft[0],
                    _paper(src, metric="ttft_speedup"),
                    no_delta=nd(best_ttft),
                ),
            ),
            "ours from": "-" if best_ttft is None else best_ttft[1],
        },
        {
            "claim": "up to x max QPS",
            **columns(
                "ratio",
                cell(
                    None if best_qps is None else best_qps[0],
                    _paper(src, metric="max_qps_speedup"),
                    why="no exact ratio: see qps.md" if qps_runs else "not run",
                    no_delta=nd(best_qps),
                ),
            ),
            "ours from": "-" if best_qps is None else best_qps[1],
        },
    ]
    return (
        "The abstract's headline figures (Llama-3.1-405B-Instruct-FP8), against the best ratio in "
        "any of our runs (Δ only where that run is the 405B's):\n\n" + _md(rows)
    )


def _baselines(pub: pd.DataFrame, root: Path, image: str | None = None) -> Built:
    """The rebuttal's comparisons with other methods, and what is known of RULER."""
    src = pub[pub["source"] == "rebuttal: claims"]
    exp = load_experiment("latency_grid")
    grid = pub[pub["source"] == exp.source]
    rows, marks = [], []
    quality = _paper(src, metric="retention_vs_minference")
    rows.append(
        {
            "claim": "SpecPrefill keep 10 %'s LongBench score over MInference's (70B base)",
            "variant": "-",
            **columns(
                "ratio", cell(None, quality, "{:.3f}", why="not run: no experiment runs MInference on LongBench")
            ),
        }
    )
    for g in dict.fromkeys(grid["task"]):
        p = _ratio(
            _paper(grid, task=g, method="minference", metric="latency_s"),
            _paper(grid, task=g, method="specprefill", keep=0.1, metric="latency_s"),
        )
        if p is not None:
            marks.append(Mark("MInference latency over SpecPrefill 10 %'s", "paper", "70B", g, p))
    for variant in exp.variants:
        ours_rows = load_ours("latency_grid", variant, root)
        lat = ours_rows.latency()
        ratios: dict[str, float] = {}
        if not lat.empty:
            lat = lat.assign(point=lat["batch"].astype(int).astype(str) + "x" + lat["length"].astype(int).astype(str))
            ok = lat[lat["n"].astype(int) > 0]
            mi = ok[ok["method_name"] == "minference"].set_index("point")["ttft_median_s"]
            sp = ok[(ok["method_name"] == "specprefill") & np.isclose(ok["keep_rate"].astype(float), 0.1)]
            sp = sp.set_index("point")["ttft_median_s"]
            ratios = {g: float(mi[g] / sp[g]) for g in mi.index.intersection(sp.index)}
            for g, r in ratios.items():
                marks.append(Mark("MInference latency over SpecPrefill 10 %'s", variant, "ours", g, r))
        blocked = cannot_run(exp.variants[variant])
        why = (
            "cannot run in this table: see latency_grid.md"
            if "minference" in blocked
            else ours_rows.why_missing("latency", "minference")
        )
        nd = no_delta(exp, variant, pub)
        for name, metric, pick in (("lowest", "latency_reduction_min", min), ("highest", "latency_reduction_max", max)):
            ours = pick(ratios.values()) if ratios else None
            rows.append(
                {
                    "claim": f"MInference's batch latency over SpecPrefill keep 10 %'s, {name} over the grid",
                    "variant": variant,
                    **columns("ratio", cell(ours, _paper(src, metric=metric), why=why, no_delta=nd)),
                }
            )
    md = (
        "# Baselines and RULER\n\n"
        "Published: the rebuttal's claims against other methods (`rebuttal: claims` in "
        "`conf/paper/published.csv`), Llama-3.1-70B-Instruct base with a Llama-3.1-8B-Instruct speculator.\n\n"
        + LEGEND
        + (f"\n![Baselines: ours beside the paper's]({image})\n" if image else "")
        + "\n## Against MInference\n\n"
        "Only these comparisons carry numbers. The latency ratios are over the batch x length grid "
        "of `latency_grid.md` (ours: the ratio of the two medians at each of our grid points, no "
        "interval; the figure shows each point).\n\n"
        + _md(rows)
        + "\nClaims without a number, so without a table: SpecPrefill's LongBench score surpasses "
        "MInference's from keep 30 %; it beats RAG and LLMLingua-2 at an equal number of kept "
        "tokens (both run here: `method=rag_bm25`, `rag_dense`, `llmlingua2`).\n"
        "\n## RULER\n\n"
        "No RULER number is transcribed (`conf/paper/published.csv` holds the abstract, figures 2 "
        "and 3, the 8B category table and the rebuttal's latency grid and claims), so there is no "
        "RULER table: one would be a row per published number there, as the others are. Our CPU "
        "variants run RULER only as an offline stand-in for LongBench "
        "(`longbench_405b.md`, `categories_8b.md`, `qps.md`).\n"
    )
    return md, marks


def _render(table: str, root: Path = RESULTS, image: str | None = None) -> Built:
    exp = load_experiment(table)
    pub = published()
    parts = [f"# {exp.title}\n", f"Published: {exp.source} of the SpecPrefill paper (ICML 2025).\n", LEGEND]
    if image:
        parts.append(f"![{exp.title}: ours beside the paper's]({image})\n")
    marks: list[Mark] = []
    for variant in exp.variants:
        v = exp.variants[variant]
        rows = variant_rows(exp, variant, root)
        parts.append(f"\n## Variant `{variant}`\n")
        if v.note:
            parts.append(v.note.strip() + "\n")
        if exp.table == "qps":
            body, prov, m = _qps(exp, pub, rows, variant)
        else:
            ours = Ours(rows)
            prov = "" if ours.empty else ours.provenance()
            body, m = BUILDERS[exp.table](exp, pub, ours, variant)
        marks += m
        points = folder(exp.table, variant, root) / POINTS
        kept = f"; kept in `{points.relative_to(root)}`" if prov and points.is_file() else ""
        parts.append(f"\nOur rows: {prov or _missing(exp, variant)}{kept}.\n\n" + body)
    return "\n".join(parts), list(dict.fromkeys(marks))


def render(table: str, root: Path = RESULTS) -> str:
    """One table's markdown: each variant that has an experiment, ours beside the paper's."""
    return _render(table, root)[0]


def headline(root: Path = RESULTS) -> str:
    """The abstract's headline figures beside the best of our runs (markdown)."""
    return "# Headline figures\n\n" + _headline(published(), root)


def baselines(root: Path = RESULTS) -> str:
    """The rebuttal's comparisons with other methods beside ours, and RULER (markdown)."""
    return _baselines(published(), root)[0]


def write_report(root: Path = RESULTS) -> Path:
    """``results/paper/<table>.md`` and its figure ``<table>.png`` for every experiment,
    ``headline.md``, and ``baselines.md`` with ``baselines.png``."""
    root.mkdir(parents=True, exist_ok=True)
    for table in experiment_names():
        md, marks = _render(table, root, image=f"{table}.png")
        (root / f"{table}.md").write_text(md)
        figure(marks, load_experiment(table).title, root / f"{table}.png")
    (root / "headline.md").write_text(headline(root))
    md, marks = _baselines(published(), root, image="baselines.png")
    (root / "baselines.md").write_text(md)
    figure(
        marks,
        "Against MInference: Llama-3.1-70B-Instruct base, Llama-3.1-8B-Instruct speculator",
        root / "baselines.png",
    )
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one table's experiment")
    r.add_argument("--table", required=True, help=f"one of {experiment_names()}")
    r.add_argument("--variant", default="paper", help="paper (the paper's models and GPUs) | cpu")
    r.add_argument("--dry-run", action="store_true", help="print the plan and each command's own plan; run nothing")
    p = sub.add_parser("report", help="render every table from whatever rows exist")
    for a in (r, p):
        a.add_argument("--root", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        raise SystemExit(run(args.table, args.variant, args.dry_run, args.root))
    out = write_report(args.root)
    for f in sorted(out.glob("*.md")):
        print(f)


if __name__ == "__main__":
    main()
