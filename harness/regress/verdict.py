"""The gate's verdict as data: exit codes, one compared point (:class:`Comparison`), the
verdict (:class:`Verdict`), and a point's identity field by field with the short labels the
formats print (:func:`short_labels`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.analysis.rows import LATENCY_POINT, POINT
from harness.analysis.stats import Estimate

ROOT = Path(__file__).resolve().parents[2]
# A point is the analysis layer's (harness.analysis.rows.POINT, LATENCY_POINT): the speculator
# is part of it, so SpecPrefill with another speculator is another method, never compared
# with the baseline's (a deeper one scores better and runs slower).
OK, REGRESSED, INCOMPARABLE, NO_BASELINE, REFUSED = 0, 1, 2, 3, 4
EXIT_CODES = {
    OK: "pass: nothing regressed",
    REGRESSED: "regressed: at least one point regressed (each named)",
    INCOMPARABLE: "not comparable: no rows, no point in common, points in one folder only (--require-all), "
    "a speed point flagged unsafe (anomaly, failed A/A check, too few pairs), or a suite command failed",
    NO_BASELINE: "not compared: no baseline for this machine class, or its speed rows predate the paired protocol "
    "(quality still checked)",
    REFUSED: "refused before comparing: a missing or empty folder, a corrupt file or a candidate folder the gate did not "
    "make",
}
VERDICT_NAMES = {
    OK: "pass",
    REGRESSED: "regressed",
    INCOMPARABLE: "not comparable",
    NO_BASELINE: "no baseline",
    REFUSED: "refused",
}


class Refused(Exception):
    """The gate refuses before comparing (exit 4): one line naming the folder or file."""


@dataclass(frozen=True)
class Comparison:
    """One compared point."""

    kind: str  # quality | speed
    point: str
    baseline: float
    candidate: float
    delta: Estimate  # quality: candidate - baseline (points); speed: candidate / baseline - 1
    verdict: str  # regressed | improved | same | not comparable (speed: a flagged point)
    retention: Estimate | None = None  # quality: the candidate's score / its reference's, same samples
    #: What the point is, field by field (model, benchmark, setup, method, keep, speculator,
    #: options, where), for short labels: :func:`short_labels`.
    fields: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass
class Verdict:
    """What the gate decided, in every ``--format``."""

    code: int
    rows: list[Comparison] = field(default_factory=list)
    #: Points in one folder only, each as a dict of fields (:func:`short_labels`).
    only: list[dict[str, str]] = field(default_factory=list)
    baseline: str = ""
    candidate: str = ""
    quality_tol: float = 2.0
    speed_tol: float = 0.15
    speed_from: str = "latency rows"
    #: One line said before the points (why not compared, what they were compared with).
    note: str = ""
    #: What the gate says of speed before the points: not compared (and why), the flagged
    #: points, the machine's load; empty when every speed point was compared cleanly.
    speed_notes: list[str] = field(default_factory=list)
    #: Latency runs the suite measured a second time because their first measurement was
    #: flagged unsafe (:func:`remeasure_unsafe`), each with what flagged it.
    remeasured: list[str] = field(default_factory=list)


def shown(path: Path) -> str:
    """A path as the verdict prints it: relative to the repository when inside it."""
    path = Path(path).absolute()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def point_label(r: dict) -> str:
    keep = r.get("keep_rate")
    keep_s = "" if keep is None or (isinstance(keep, float) and np.isnan(keep)) else f" keep={keep:g}"
    opts = {k: v for k, v in json.loads(r.get("method_options") or "{}").items() if k != "keep_rate"}
    extra = f" {json.dumps(opts, sort_keys=True)}" if opts else ""
    return f"{r['model']} {r['benchmark']}-{r['length']} {r['method']}{keep_s}{extra}{speculator_words(r)}"


def speculator_words(r: dict) -> str:
    """A point's speculator as its label shows it (none for the reference: see :func:`ok_rows`)."""
    spec = r.get("speculator")
    return f" speculator={spec}" if isinstance(spec, str) and spec else ""


def point_fields(r: dict, reference: bool = False) -> dict[str, str]:
    """A point's identity field by field, as a short label shows it: the reference keeps
    everything (no keep) and runs no speculator (see :func:`ok_rows`); options without keep."""
    keep = r.get("keep_rate")
    keep_f = float(keep) if keep is not None else float("nan")
    no_keep = reference or bool(np.isnan(keep_f))
    opts = {k: v for k, v in json.loads(r.get("method_options") or "{}").items() if k != "keep_rate"}
    spec = r.get("speculator")
    return {
        "model": str(r["model"]),
        "method": str(r["method"]),
        "keep": "" if no_keep else f"keep={keep_f:g}",
        "speculator": f"speculator={spec}" if isinstance(spec, str) and spec else "",
        "options": json.dumps(opts, sort_keys=True) if opts else "",
    }


def quality_fields(key: tuple, reference: bool, where: str = "") -> dict[str, str]:
    r = dict(zip(POINT, key, strict=True))
    return point_fields(r, reference) | {
        "kind": "quality",
        "benchmark": f"{r['benchmark']}-{r['length']}",
        "where": where,
    }


def latency_fields(key: tuple) -> dict[str, str]:
    r = dict(zip(LATENCY_POINT, key, strict=True))
    return point_fields(r) | {
        "kind": "speed",
        "setup": f"{r['backend']}, {r['prompt_source']} prompts",
        "where": f"speedup {int(r['batch'])}x{int(r['length'])}",
    }


LABEL_FIELDS = ("model", "benchmark", "setup", "method", "keep", "speculator", "options", "where")


def _varying_options(fields_list: list[dict[str, str]]) -> list[str]:
    """Per point, its method options that differ between points of the same method, as
    ``k=v`` (options every point of a method shares are the method's configuration, not
    what tells its points apart)."""
    parsed = [json.loads(f.get("options") or "{}") for f in fields_list]
    by_method: dict[str, list[dict]] = {}
    for f, opts in zip(fields_list, parsed, strict=True):
        by_method.setdefault(f.get("method", ""), []).append(opts)
    varying = {
        method: {k for k in set().union(*group) if len({json.dumps(o.get(k), sort_keys=True) for o in group}) > 1}
        for method, group in by_method.items()
    }
    return [
        " ".join(f"{k}={opts[k]}" for k in sorted(varying.get(f.get("method", ""), set())) if k in opts)
        for f, opts in zip(fields_list, parsed, strict=True)
    ]


def short_labels(fields_list: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """(a short label per point, what every point shares). Method, keep and where (task,
    grid point) always show; model, benchmark, setup and speculator show only where the
    points differ in them (what all share is said once); of the method options only those
    that differ between points of the same method."""
    common: list[str] = []
    show = {"method", "keep", "where", "options"}
    for name in ("model", "benchmark", "setup", "speculator"):
        values = sorted({f.get(name, "") for f in fields_list} - {""})
        if len(values) == 1:
            common.append(values[0])
        elif values:
            show.add(name)
    options = _varying_options(fields_list)
    labels = []
    for f, opts in zip(fields_list, options, strict=True):
        parts = [opts if name == "options" else f.get(name, "") for name in LABEL_FIELDS if name in show]
        labels.append(" ".join(p for p in parts if p))
    return labels, common
