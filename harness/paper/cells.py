"""A table's cells: ours (value, interval, n), the paper's as printed, and Δ or why there is
none."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pandas as pd

from harness.analysis.stats import Estimate
from harness.experiments import Experiment, variant_of
from harness.paper.numbers import Ours, Published
from harness.rendering.tables import md_table


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


def formatted(v: float | None, fmt: str) -> str:
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
        o = formatted(ours.value, fmt)
        if not math.isnan(ours.lo):
            o += f" [{formatted(ours.lo, fmt)}, {formatted(ours.hi, fmt)}]"
        o += f" n={ours.n}"
        value: float | None = None if math.isnan(ours.value) else ours.value
    elif ours is None or (isinstance(ours, float) and math.isnan(ours)):
        o, value = f"({why})", None
    else:
        o, value = formatted(float(ours), fmt), float(ours)
    if isinstance(paper, Published):
        p, theirs = paper.text, paper.value
    elif paper is None or math.isnan(paper):
        p, theirs = "-", None
    else:
        p, theirs = formatted(paper, fmt), float(paper)
    if value is None or theirs is None:
        d = "-"
    elif no_delta:
        d = f"— ({no_delta})"
    else:
        d = formatted(value - theirs, "{:+" + fmt[2:])
    return o, p, d


def columns(name: str, c: Cell) -> dict[str, str]:
    """A cell triple as three columns: ``<name>: ours``, ``<name>: paper``, ``<name>: Δ``."""
    return {f"{name}: ours": c[0], f"{name}: paper": c[1], f"{name}: Δ": c[2]}


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


def md_or_nothing(rows: list[dict[str, str]]) -> str:
    return md_table(pd.DataFrame(rows)) if rows else "(nothing)\n"


def slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def not_run_note(exp: Experiment, variant: str) -> str:
    v = exp.variants[variant]
    need = f"needs {v.gpus} GPU(s)" if v.gpus else "runs on CPU"
    return f"not run: {need}; `make paper table={exp.table}{'' if variant == 'paper' else ' variant=' + variant}`"
