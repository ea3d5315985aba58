"""The regression gate: quality and speedup of a candidate results folder against a baseline.

``python -m harness.regress compare --baseline DIR --candidate DIR`` compares two results
folders point by point (model, benchmark, length, task, method and its options, keep):

* **Quality**: the paired difference of per-sample scores, over the samples both folders
  ran (:func:`harness.analysis.quality.paired_difference`, seeded, 2000 resamples); per
  task, and ``ALL`` as the summary takes it (over categories where the benchmark has them,
  else over tasks; a stratified bootstrap). A point regresses when the drop's 95 %
  interval excludes 0 *and* the drop exceeds ``--quality-tol`` (2 points on the 0-100
  scale): one flipped sample among many is noise, not a regression.
* **Speed**: the speedup over the reference method measured inside each folder (never
  absolute seconds across folders), from the latency rows: the paired speedup per grid
  point (:mod:`harness.analysis.latency`: the methods timed side by side, order turned over
  every iteration, interval over pairs). A point regresses when the candidate's speedup
  falls by more than ``--speed-tol`` (15 %) of the baseline's, its bootstrap interval
  included. A point whose speed claim is unsafe in either folder (its ``flags``: a speedup
  above its FLOP ideal, a failed A/A check, too few pairs) is **not comparable**, never
  passed; a baseline timed under the older protocol (the reference always first, no A/A
  check) gives no speed baseline (``not compared``, exit 3, as with no baseline) until it
  is accepted again. ``run`` measures a candidate latency run flagged unsafe once more
  before comparing (``--remeasure``; the first measurement set aside and named in the
  verdict). Without latency rows in both folders the verdict says first that
  speed was not compared. The eval runs' TTFT ratios (the reference's mean TTFT over the
  method's on the same samples, timed minutes apart: between runs) drift ~15 % between
  runs on a shared CPU, so they are compared only with ``--eval-speed``.

The verdict (``--format``): ``text`` (default) is one screen: short point labels (only the
fields that tell the points apart; what all share on one line), regressions and
improvements listed, the unchanged points folded into one line (``--all`` lists every
point). ``markdown`` is the same in at most ~25 lines for a CI step summary (``--summary
FILE`` appends it to FILE, e.g. ``$GITHUB_STEP_SUMMARY``, whatever the format); ``json`` is
machine-readable (``exit_code`` and ``exit_codes`` in it); ``junit`` is one testcase per
point, a failure per regression.

Exit status (``compare`` and ``run``; :data:`EXIT_CODES`):

* **0** pass: nothing regressed;
* **1** regressed: at least one point (each named);
* **2** not comparable: no rows, no point in common, points in only one folder with
  ``--require-all``, a speed point flagged unsafe (anomaly, failed A/A check, too few
  pairs), or a suite command that failed (argparse's own usage errors exit 2 too);
* **3** not compared: ``run`` found no baseline for this machine's class (quality is still
  compared with another class's baseline, and a quality regression there exits 1), or the
  baseline's speed rows predate the paired protocol (quality compared as usual);
* **4** refused, before comparing, in one line naming the path: a baseline or candidate
  folder that does not exist, a corrupt file in one, a ``--candidate`` folder the gate did
  not make (it removes only folders carrying its marker file), a missing suite file.

``python -m harness.regress run`` runs the fixed quick suite (``conf/regress.yaml``) into a
candidate folder and compares it with the committed baseline for this machine's class
(``results/baseline/<class>/``), appending to its ``history.csv`` and plot beside the
baseline (nothing is committed: commit them with the baseline). ``python -m harness.regress
accept --reason '...'`` promotes the candidate to the baseline.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import pandas as pd

from harness.analysis.latency import summarize_latency
from harness.analysis.quality import (
    Point,
    all_parts,
    categories,
    paired_difference,
    paired_ratio,
    references,
    summarize,
)
from harness.analysis.rows import AA_METHOD, LATENCY_POINT, POINT, REFERENCE_OF, normalize
from harness.analysis.stats import Estimate
from harness.provenance import git_sha
from harness.store import DamagedRowFile, read_results

ROOT = Path(__file__).resolve().parents[1]
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
VERDICT_NAMES = {OK: "pass", REGRESSED: "regressed", INCOMPARABLE: "not comparable", NO_BASELINE: "no baseline",
                 REFUSED: "refused"}  # fmt: skip
FORMATS = ("text", "markdown", "json", "junit")
#: The file ``run`` writes into a candidate folder it makes; it removes only folders holding it.
MARKER = ".regress-candidate"
#: The file ``run`` writes into its candidate once every suite command has finished: the
#: suite file, its hash and the run folders it produced. ``accept`` takes only a folder
#: holding it, unchanged since (:func:`check_candidate`).
SUITE_RECORD = ".regress-suite.json"
#: Rows of a changed point the markdown verdict lists (the rest: "and N more").
MARKDOWN_ROWS = 10


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


def _label(r: dict) -> str:
    keep = r.get("keep_rate")
    keep_s = "" if keep is None or (isinstance(keep, float) and np.isnan(keep)) else f" keep={keep:g}"
    opts = {k: v for k, v in json.loads(r.get("method_options") or "{}").items() if k != "keep_rate"}
    extra = f" {json.dumps(opts, sort_keys=True)}" if opts else ""
    return f"{r['model']} {r['benchmark']}-{r['length']} {r['method']}{keep_s}{extra}{_speculator_s(r)}"


def _speculator_s(r: dict) -> str:
    """A point's speculator as its label shows it (none for the reference: see :func:`_ok`)."""
    spec = r.get("speculator")
    return f" speculator={spec}" if isinstance(spec, str) and spec else ""


def _fields(r: dict, reference: bool = False) -> dict[str, str]:
    """A point's identity field by field, as a short label shows it: the reference keeps
    everything (no keep) and runs no speculator (see :func:`_ok`); options without keep."""
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


def _quality_fields(key: tuple, reference: bool, where: str = "") -> dict[str, str]:
    r = dict(zip(POINT, key, strict=True))
    return _fields(r, reference) | {"kind": "quality", "benchmark": f"{r['benchmark']}-{r['length']}", "where": where}


def _latency_fields(key: tuple) -> dict[str, str]:
    r = dict(zip(LATENCY_POINT, key, strict=True))
    return _fields(r) | {
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


def _ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The ok rows of ``kind``, normalized (:mod:`harness.analysis.rows`)."""
    if df.empty:
        return df
    d = normalize(df)
    return d[(d["kind"] == kind) & (d["status"] == "ok")]


def _quality_verdict(delta: Estimate, tol: float) -> str:
    if delta.hi < 0 and -delta.value > tol:
        return "regressed"
    if delta.lo > 0 and delta.value > tol:
        return "improved"
    return "same"


def _speed_verdict(base: float, cand: Estimate, tol: float) -> str:
    """Regressed when the candidate's speedup, and its whole interval, fall more than ``tol``
    below the baseline's (a shared machine's noise in one run must not fail the gate)."""
    if not (base > 0 and cand.value > 0):
        return "same"
    if cand.value < base * (1 - tol) and not cand.hi >= base * (1 - tol):
        return "regressed"
    if cand.value > base * (1 + tol) and not cand.lo <= base * (1 + tol):
        return "improved"
    return "same"


def quality(
    base: pd.DataFrame, cand: pd.DataFrame, tol: float
) -> tuple[list[Comparison], set[tuple], list[dict[str, str]]]:
    """Per task and ``ALL`` (the summary's: over categories where the benchmark has them),
    the paired score difference over the samples both folders ran
    (:func:`harness.analysis.quality.paired_difference`), and the candidate's retention
    (:func:`harness.analysis.quality.paired_ratio`, as its summary shows it)."""
    out: list[Comparison] = []
    b, c = _ok(base, "eval"), _ok(cand, "eval")
    groups_b = {k: g for k, g in b.groupby(POINT, dropna=False)} if not b.empty else {}
    groups_c = {k: g for k, g in c.groupby(POINT, dropna=False)} if not c.empty else {}
    refs_c = references(c) if not c.empty else {}
    for key in sorted(groups_b.keys() & groups_c.keys(), key=str):
        gb, gc = groups_b[key], groups_c[key]
        point = dict(zip(POINT, key, strict=True))
        label = _label(point)
        reference = bool(gb["is_reference"].iloc[0])
        ref_rows = refs_c.get(tuple(point[k] for k in REFERENCE_OF))
        pb, pc = Point(gb), Point(gc)
        rc = Point(ref_rows) if ref_rows is not None else None
        tasks = sorted(set(pb.tasks) & set(pc.tasks))
        cats = {name: [t for t in ts if t in tasks] for name, ts in categories(gb).items()}
        wheres = [(t, [[t]]) for t in tasks] + ([("ALL", all_parts(tasks, {k: v for k, v in cats.items() if v}))]
                                                if len(tasks) > 1 else [])  # fmt: skip
        for where, parts in wheres:
            d, mb, mc = paired_difference(pc, pb, "score", parts)
            if d.n == 0:
                continue
            ret = None if reference or rc is None else paired_ratio(pc, "score", rc, "score", parts)
            fields = _quality_fields(key, reference, where)
            out.append(Comparison("quality", f"{label} {where}", mb, mc, d, _quality_verdict(d, tol), ret, fields))
    is_reference = {k: bool(g["is_reference"].iloc[0]) for groups in (groups_b, groups_c) for k, g in groups.items()}
    keys_b, keys_c = set(groups_b), set(groups_c)
    only = [_quality_fields(k, is_reference.get(k, False)) for k in keys_b ^ keys_c]
    return out, keys_b | keys_c, sorted(only, key=str)


@dataclass(frozen=True)
class SpeedPoint:
    """A point's speedup as the gate reads it, with what its summary flagged."""

    estimate: Estimate
    flags: str = ""  # the summary's words (harness.analysis.latency), "" for eval points
    comparable: bool = True  # False: a flag that makes its speed claim unsafe
    old_protocol: bool = False  # timed before the paired protocol (the reference always first)
    loaded: bool = False


def _estimates(s: pd.DataFrame, key: list[str]) -> dict[tuple, SpeedPoint]:
    """A summary's speedups (not the reference's own, not the A/A check's) by point key."""
    s = s[(s["method_name"] != s["reference"]) & (s["method_name"] != AA_METHOD) & s["speedup"].notna()]
    cols = [{"method": "method_name", "reference_method": "reference"}.get(k, k) for k in key]
    out = {}
    for _, r in s.iterrows():
        e = Estimate(float(r["speedup"]), float(r["speedup_lo"]), float(r["speedup_hi"]), int(r["n"]))
        flags = str(r["flags"]) if isinstance(r.get("flags"), str) else ""
        comparable = bool(r["comparable"]) if "comparable" in r and pd.notna(r["comparable"]) else True
        out[tuple(r[cols])] = SpeedPoint(
            e, flags, comparable, "order not balanced" in flags, bool(r.get("loaded", False) is True)
        )
    return out


def _aa_failures(d: pd.DataFrame) -> list[str]:
    """The A/A checks of a folder's latency rows that failed, in words."""
    if d.empty:
        return []
    s = summarize_latency(d)
    s = s[(s["method_name"] == AA_METHOD) & (s["aa_ok"] == False)]  # noqa: E712  (NaN: no A/A check)
    return [
        f"{int(r['batch'])}x{int(r['length'])} {r['model']}: {r['aa_speedup']:.3f}x "
        f"[{r['aa_speedup_lo']:.3f}, {r['aa_speedup_hi']:.3f}]"
        for _, r in s.iterrows()
    ]


def _eval_speedups(d: pd.DataFrame) -> dict[tuple, SpeedPoint]:
    """Per quality point: the summary's ``ALL`` speedup (the reference's TTFT over the
    method's on the samples both ran, on one machine)."""
    if d.empty:
        return {}
    s = summarize(d)
    return _estimates(s[s["task"] == "ALL"], POINT)


def _latency_speedups(d: pd.DataFrame) -> dict[tuple, SpeedPoint]:
    """Per latency point: the latency summary's speedup (interleaved in one run)."""
    return _estimates(summarize_latency(d), LATENCY_POINT) if not d.empty else {}


def speed(
    base: pd.DataFrame, cand: pd.DataFrame, tol: float, eval_speed: bool = False
) -> tuple[list[Comparison], set, list[dict[str, str]], list[str]]:
    """Speedups over the reference, compared point by point: from the latency rows (the
    methods timed side by side in one run), and with ``eval_speed`` from the eval rows'
    TTFTs too (between runs: timed minutes apart, so they drift with a shared machine's
    load). Returns the comparisons, the points seen, those in one folder only, and what the
    verdict says of speed before the points (see :class:`Verdict`)."""
    out: list[Comparison] = []
    seen: set = set()
    only: list[dict[str, str]] = []
    notes: list[str] = []
    lb, lc = _ok(base, "latency"), _ok(cand, "latency")
    if lb.empty or lc.empty:
        missing = " and ".join(w for w, d in (("baseline", lb), ("candidate", lc)) if d.empty)
        notes.append(f"Speed NOT compared: no latency rows in the {missing}" +
                     (" (eval TTFTs, between runs, compared below)" if eval_speed else " (quality only)"))  # fmt: skip
    failed_aa = _aa_failures(lc)
    if failed_aa:
        notes.append("A/A check FAILED in the candidate (the reference timed against itself must read 1.0): "
                     + "; ".join(failed_aa))  # fmt: skip
    sources = (("eval", _eval_speedups, POINT),) if eval_speed else ()
    for kind, fn, keys in (*sources, ("latency", _latency_speedups, LATENCY_POINT)):
        sb, sc = fn(_ok(base, kind)), fn(_ok(cand, kind))
        seen |= {(kind, k) for k in sb.keys() | sc.keys()}
        if kind == "latency" and sb and all(p.old_protocol for p in sb.values()):
            notes.append(
                "Speed NOT compared: the baseline's latency rows predate the paired, order-balanced protocol "
                "(the reference always timed first, no A/A check); accept a new baseline on this machine "
                "(make regress-accept reason='...')"
            )
            continue

        def fields(key: tuple, kind: str = kind) -> dict[str, str]:
            if kind == "latency":
                return _latency_fields(key)
            return _quality_fields(key, False, "speedup TTFT ALL") | {"kind": "speed"}

        only += [fields(k) for k in sorted(sb.keys() ^ sc.keys(), key=str)]
        for key in sorted(sb.keys() & sc.keys(), key=str):
            pb, pc = sb[key], sc[key]
            eb, ec = pb.estimate, pc.estimate
            r = dict(zip(keys, key, strict=True))
            where = "ALL TTFT (between runs)" if kind == "eval" else f"latency {int(r['batch'])}x{int(r['length'])}"
            label = f"{r['model']} {r['method']} keep={r['keep_rate']:g}{_speculator_s(r)} {where}"
            rel = Estimate(ec.value / eb.value - 1, ec.lo / eb.value - 1, ec.hi / eb.value - 1, ec.n)
            verdict = _speed_verdict(eb.value, ec, tol)
            unsafe = [
                (w, p) for w, p in (("baseline", pb), ("candidate", pc)) if not p.comparable and not p.old_protocol
            ]
            if pc.old_protocol:
                unsafe.append(("candidate", pc))
            if unsafe:
                verdict = "not comparable"
                notes.append(f"Not comparable: {label}: " + "; ".join(f"{w}: {p.flags}" for w, p in unsafe))
            elif pc.loaded or pb.loaded:
                notes.append(f"Loaded machine while timing {label} (its speedup is paired, but read it with care)")
            out.append(Comparison("speed", label, eb.value, ec.value, rel, verdict, None, fields(key)))
    return out, seen, only, notes


#: Columns the comparison reads, by row kind: a folder lacking one is refused naming it.
NEEDED = {
    "": ("kind", "status", "model", "method", "method_options", "keep_rate", "reference_method", "run_id"),
    "eval": ("benchmark", "length", "task", "sample_id", "score", "ttft_s", "hardware"),
    "latency": ("backend", "prompt_source", "batch", "length", "warmup", "ttft_s"),
}


def read_folder(folder: Path, role: str) -> pd.DataFrame:
    """Every row of a baseline or candidate folder, or :class:`Refused` in one line: the
    folder does not exist, a file in it is corrupt (named: the store's reader would skip
    it, and a baseline missing rows would pass as points in one folder only), or a column
    the gate reads is missing from all its rows."""
    folder = Path(folder)
    if not folder.is_dir():
        raise Refused(f"{role} folder {folder} does not exist")
    try:
        df = read_results(folder, strict=True)
    except DamagedRowFile as e:
        raise Refused(f"{role} file {e.path} is corrupt or unreadable ({e.reason})") from e
    except Exception as e:  # a file changed under us, or a reader's own error
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise Refused(f"{role} folder {folder} is unreadable ({type(e).__name__}: {why})") from e
    if not df.empty:
        kinds = set(df["kind"]) if "kind" in df else set()
        for kind, cols in NEEDED.items():
            missing = [c for c in cols if c not in df] if not kind or kind in kinds else []
            if missing:
                raise Refused(f"{role} folder {folder}: its rows have no {missing} column(s); not a results folder?")
    return df


def gate(
    base: pd.DataFrame,
    cand: pd.DataFrame,
    quality_tol: float = 2.0,
    speed_tol: float = 0.15,
    require_all: bool = False,
    skip_speed: bool = False,
    eval_speed: bool = False,
) -> Verdict:
    """The verdict on two folders' rows (paths and notes are the caller's to fill in)."""
    v = Verdict(OK, quality_tol=quality_tol, speed_tol=speed_tol)
    v.speed_from = "none (quality only)" if skip_speed else "latency and eval rows" if eval_speed else "latency rows"
    if base.empty or cand.empty:
        v.code, v.note = INCOMPARABLE, f"cannot compare: no rows in the {'baseline' if base.empty else 'candidate'}"
        return v
    base, cand = normalize(base), normalize(cand)  # once: every comparison below reads them
    q, _, q_only = quality(base, cand, quality_tol)
    s, _, s_only, v.speed_notes = ([], set(), [], []) if skip_speed else speed(base, cand, speed_tol, eval_speed)
    if not skip_speed and any(n.startswith("Speed NOT compared") for n in v.speed_notes):
        v.speed_from = "speed not compared (see above)"
    v.rows, v.only = q + s, q_only + s_only
    aa_failed = any(n.startswith("A/A check FAILED") for n in v.speed_notes)
    if not v.rows and not aa_failed:
        v.code, v.note = INCOMPARABLE, "cannot compare: the folders have no point in common"
    elif any(r.verdict == "regressed" for r in v.rows):
        v.code = REGRESSED
    elif aa_failed or any(r.verdict == "not comparable" for r in v.rows):
        n = sum(r.verdict == "not comparable" for r in v.rows)
        v.code = INCOMPARABLE
        v.note = "cannot compare speed: " + ("the candidate's A/A check failed" if aa_failed else
                                              f"{n} speed point{'s' if n != 1 else ''} flagged unsafe")  # fmt: skip
    elif v.only and require_all:
        v.code, v.note = INCOMPARABLE, "cannot compare: points present in only one folder (--require-all)"
    elif any("predate the paired" in n for n in v.speed_notes):
        v.code = NO_BASELINE
    return v


def compare(
    baseline: Path,
    candidate: Path,
    quality_tol: float = 2.0,
    speed_tol: float = 0.15,
    require_all: bool = False,
    skip_speed: bool = False,
    eval_speed: bool = False,
) -> tuple[int, list[Comparison], str]:
    """(exit status, comparisons, the text verdict); :class:`Refused` for a missing or
    corrupt folder."""
    v = compare_verdict(baseline, candidate, quality_tol, speed_tol, require_all, skip_speed, eval_speed)
    return v.code, v.rows, render(v, "text")


def compare_verdict(
    baseline: Path,
    candidate: Path,
    quality_tol: float = 2.0,
    speed_tol: float = 0.15,
    require_all: bool = False,
    skip_speed: bool = False,
    eval_speed: bool = False,
) -> Verdict:
    base, cand = read_folder(baseline, "baseline"), read_folder(candidate, "candidate")
    v = gate(base, cand, quality_tol, speed_tol, require_all, skip_speed, eval_speed)
    v.baseline, v.candidate = _shown(baseline), _shown(candidate)
    return v


def _shown(path: Path) -> str:
    """A path as the verdict prints it: relative to the repository when inside it."""
    path = Path(path).absolute()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --------------------------------------------------------------------------- the verdict


def _values(r: Comparison) -> tuple[str, str, str]:
    """(baseline, candidate, delta with its interval) as printed."""
    if r.kind == "speed":
        d = r.delta
        return f"{r.baseline:.2f}x", f"{r.candidate:.2f}x", f"{d.value:+.1%} [{d.lo:+.1%}, {d.hi:+.1%}]"
    d = r.delta
    return f"{r.baseline:.1f}", f"{r.candidate:.1f}", f"{d.value:+.1f} [{d.lo:+.1f}, {d.hi:+.1f}]"


def _labelled(v: Verdict) -> tuple[list[tuple[str, Comparison]], list[str], list[str]]:
    """(label and point, shared fields, labels of the one-folder points)."""
    labels, common = short_labels([r.fields or {"where": r.point} for r in v.rows])
    only, _ = short_labels(v.only) if v.only else ([], [])
    only = [f"{f.get('kind', '')} {lab}".strip() for f, lab in zip(v.only, only, strict=True)]
    return list(zip(labels, v.rows, strict=True)), common, only


def _tolerances(v: Verdict) -> str:
    source = v.speed_from if v.speed_from.startswith("speed not") else f"speed from the {v.speed_from}"
    return f"quality tolerance {v.quality_tol:g} points, speed tolerance {v.speed_tol:.0%} of the baseline's speedup, {source}"


def _speedups(pairs: list[tuple[str, Comparison]], most: int = 6) -> str:
    """The compared speedups on one line (baseline -> candidate)."""
    sp = [(lab, r) for lab, r in pairs if r.kind == "speed"]
    text = "; ".join(f"{lab} {r.baseline:.2f}x -> {r.candidate:.2f}x ({r.delta.value:+.1%})" for lab, r in sp[:most])
    return f"Speedups over the reference (baseline -> candidate): {text}" + (" ..." if len(sp) > most else "")


def _final(v: Verdict) -> str:
    if v.code == OK:
        return f"no regression ({_tolerances(v)}): exit 0"
    if v.code == REGRESSED:
        n = sum(r.verdict == "regressed" for r in v.rows)
        return f"REGRESSED: {n} point{'s' if n != 1 else ''} ({_tolerances(v)}): exit 1"
    return f"{VERDICT_NAMES[v.code].upper()}: {EXIT_CODES[v.code]}: exit {v.code}"


def render_text(v: Verdict, all_points: bool = False) -> str:
    """One screen: regressions and improvements listed, the unchanged points folded into
    one line (``all_points``: every point)."""
    lines = [f"Regression gate: {v.candidate} against {v.baseline}"] if v.candidate and v.baseline else []
    lines += [v.note] if v.note else []
    lines += v.remeasured
    lines += v.speed_notes
    pairs, common, only = _labelled(v)
    if pairs:
        lines.append("Shared by the points: " + ", ".join(common) if common else "")
        width = min(48, max(len(lab) for lab, _ in pairs))
        shown = [("Points", "regressed|improved|same|not comparable")] if all_points else [
            ("REGRESSED", "regressed"), ("NOT COMPARABLE", "not comparable"), ("Improved", "improved")
        ]  # fmt: skip
        for title, verdicts in shown:
            sel = [(lab, r) for lab, r in pairs if r.verdict in verdicts.split("|")]
            if sel:
                lines.append(f"{title} ({len(sel)}):")
            for lab, r in sel:
                b, c, d = _values(r)
                mark = "" if r.verdict == "same" else f"  {r.verdict}"
                lines.append(f"  {r.kind:<7} {lab:<{width}}  {b:>6} -> {c:<6}  {d}  n={r.delta.n}{mark}")
        same = sum(r.verdict == "same" for r in v.rows)
        if not all_points:
            lines.append(f"{same} point{'s' if same != 1 else ''} unchanged")
        if any(r.kind == "speed" for r in v.rows):
            lines.append(_speedups(pairs))
    if only:
        lines.append(f"In one folder only ({len(only)}): " + "; ".join(only))
    lines.append(_final(v))
    return "\n".join(ln for ln in lines if ln) + "\n"


def render_markdown(v: Verdict) -> str:
    """The verdict for a CI step summary (``$GITHUB_STEP_SUMMARY``): at most ~25 lines."""
    icon = {OK: "✅", REGRESSED: "❌"}.get(v.code, "⚠️")
    lines = [f"### {icon} Regression gate: {VERDICT_NAMES[v.code]} (exit {v.code})", ""]
    where = f"Candidate `{v.candidate}` against `{v.baseline}`." if v.candidate and v.baseline else ""
    pairs, common, only = _labelled(v)
    if common:
        where += f" Shared by the points: {', '.join(common)}."
    lines += [x for x in (where.strip(), v.note) if x]
    lines += [f"- {n}" for n in (v.remeasured + v.speed_notes)[:6]]
    changed = [(lab, r) for lab, r in pairs if r.verdict == "regressed"]
    changed += [(lab, r) for lab, r in pairs if r.verdict == "not comparable"]
    changed += [(lab, r) for lab, r in pairs if r.verdict == "improved"]
    if changed:
        lines += [
            "",
            "| verdict | point | baseline | candidate | delta [95 % interval] | n |",
            "|---|---|---|---|---|---|",
        ]
        for lab, r in changed[:MARKDOWN_ROWS]:
            b, c, d = _values(r)
            mark = {"regressed": "❌ regressed", "not comparable": "⚠️ not comparable"}.get(r.verdict, "⬆️ improved")
            lines.append(f"| {mark} | {r.kind} {lab} | {b} | {c} | {d} | {r.delta.n} |")
        if len(changed) > MARKDOWN_ROWS:
            lines.append(f"\n… and {len(changed) - MARKDOWN_ROWS} more (the job log lists every one).")
    if pairs:
        same = sum(r.verdict == "same" for r in v.rows)
        lines += ["", f"{same} point{'s' if same != 1 else ''} unchanged ({_tolerances(v)})."]
        if any(r.kind == "speed" for r in v.rows):
            lines.append(_speedups(pairs, most=4) + ".")
    if only:
        text = "; ".join(only[:4]) + (f"; … ({len(only) - 4} more)" if len(only) > 4 else "")
        lines.append(f"In one folder only ({len(only)}): {text}.")
    codes = " · ".join(f"{k} {name}" for k, name in VERDICT_NAMES.items())
    lines += ["", f"<sub>exit codes: {codes} (python -m harness.regress --help)</sub>"]
    return "\n".join(lines) + "\n"


def _number(x: float) -> float | None:
    """A float for JSON (which has no NaN or infinity: those are null)."""
    return float(x) if np.isfinite(x) else None


def render_json(v: Verdict) -> str:
    """Machine-readable: ``exit_code`` is the process's exit status, ``exit_codes`` says
    what each means; every point with its label, values and interval."""
    pairs, common, only = _labelled(v)
    points = [
        {
            "kind": r.kind,
            "label": lab,
            "point": r.point,
            "fields": r.fields,
            "baseline": _number(r.baseline),
            "candidate": _number(r.candidate),
            "delta": _number(r.delta.value),
            "delta_lo": _number(r.delta.lo),
            "delta_hi": _number(r.delta.hi),
            "n": int(r.delta.n),
            "verdict": r.verdict,
            "retention": None if r.retention is None else _number(r.retention.value),
        }
        for lab, r in pairs
    ]
    doc = {
        "verdict": VERDICT_NAMES[v.code],
        "exit_code": v.code,
        "exit_codes": {str(k): text for k, text in EXIT_CODES.items()},
        "baseline": v.baseline,
        "candidate": v.candidate,
        "note": v.note,
        "speed_notes": v.speed_notes,
        "remeasured": v.remeasured,
        "tolerances": {"quality_points": v.quality_tol, "speed_fraction": v.speed_tol, "speed_from": v.speed_from},
        "common": common,
        "counts": {k: sum(r.verdict == k for r in v.rows) for k in ("regressed", "improved", "same", "not comparable")}
        | {"one_folder_only": len(only)},
        "points": points,
        "one_folder_only": only,
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def render_junit(v: Verdict) -> str:
    """JUnit XML: one testcase per point (a failure per regression), one testcase for the
    gate itself when it could not compare (an error) or had no baseline (skipped)."""
    pairs, _, _ = _labelled(v)
    suite = ET.Element("testsuite", name="regression gate")
    for lab, r in pairs:
        case = ET.SubElement(suite, "testcase", classname=f"regress.{r.kind}", name=lab, time="0")
        b, c, d = _values(r)
        if r.verdict == "regressed":
            failure = ET.SubElement(case, "failure", message=f"regressed: {b} -> {c}, {d}, n={r.delta.n}")
            failure.text = r.point
        elif r.verdict == "not comparable":
            ET.SubElement(case, "error", message=f"not comparable (flagged): {b} -> {c}, n={r.delta.n}")
        else:
            ET.SubElement(case, "system-out").text = f"{r.verdict}: {b} -> {c}, {d}, n={r.delta.n}"
    if v.code in (INCOMPARABLE, NO_BASELINE, REFUSED):
        case = ET.SubElement(suite, "testcase", classname="regress", name="regression gate", time="0")
        message = v.note or EXIT_CODES[v.code]
        ET.SubElement(case, "skipped" if v.code == NO_BASELINE else "error", message=message)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    root = ET.Element("testsuites", name="regress")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render(v: Verdict, fmt: str, all_points: bool = False) -> str:
    if fmt == "markdown":
        return render_markdown(v)
    if fmt == "json":
        return render_json(v)
    if fmt == "junit":
        return render_junit(v)
    return render_text(v, all_points)


# --------------------------------------------------------------------------- the suite


def hardware_class() -> str:
    """The speed-baseline class of this machine: ``gpu-<name>``, or ``cpu-amx`` /
    ``cpu-avx512`` / ``cpu-avx2`` (CPUs differ in bf16 and matmul speed, not in float32
    results)."""
    import torch

    if torch.cuda.is_available():
        return "gpu-" + torch.cuda.get_device_name(0).lower().replace(" ", "-")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for flag, name in (("amx_bf16", "cpu-amx"), ("avx512f", "cpu-avx512"), ("avx2", "cpu-avx2")):
        if flag in flags:
            return name
    return "cpu-other"


SUITE = ROOT / "conf" / "regress.yaml"


def suite_commands(out: Path, suite_file: Path = SUITE) -> list[list[str]]:
    """The fixed quick suite (``conf/regress.yaml``, or another file of the same shape) as
    harness commands writing into ``out``."""
    import yaml

    if not suite_file.is_file():
        raise Refused(f"suite file {suite_file} does not exist (conf/regress*.yaml are the suites)")
    suite = yaml.safe_load(suite_file.read_text())
    return [
        [sys.executable, "-m", f"harness.{entry['module']}", *entry["args"], f"out={out}"]
        for entry in suite["commands"]
    ]


def append_history(history: Path, rows: list[Comparison], cls: str) -> None:
    """One row per compared point: git SHA, date, the candidate's value and interval."""

    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    new = pd.DataFrame(
        [
            {
                "git_sha": git_sha(),
                "date": stamp,
                "class": cls,
                "kind": r.kind,
                "point": r.point,
                "baseline": r.baseline,
                "candidate": r.candidate,
                "delta": r.delta.value,
                "delta_lo": r.delta.lo,
                "delta_hi": r.delta.hi,
                "n": r.delta.n,
                "verdict": r.verdict,
                "retention": r.retention.value if r.retention else np.nan,
                "retention_lo": r.retention.lo if r.retention else np.nan,
                "retention_hi": r.retention.hi if r.retention else np.nan,
            }
            for r in rows
        ]
    )
    old = pd.read_csv(history) if history.exists() else pd.DataFrame()
    pd.concat([old, new], ignore_index=True).to_csv(history, index=False)
    plot_history(history, history.with_suffix(".png"))


def _yerr(g: pd.DataFrame) -> np.ndarray:
    """Error bars of the candidate's values from the delta's interval (quality: points;
    speed: a fraction of the baseline)."""
    if (g["kind"] == "speed").all():
        lo = g["baseline"] * (1 + g["delta_lo"])
        hi = g["baseline"] * (1 + g["delta_hi"])
    else:
        lo = g["baseline"] + g["delta_lo"]
        hi = g["baseline"] + g["delta_hi"]
    return np.clip(np.vstack([g["candidate"] - lo, hi - g["candidate"]]).astype(float), 0, None)


def _plot_labels(points: list[str]) -> tuple[dict[str, str], str]:
    """(a short legend label per history point, the words they all share): the method
    options' JSON dropped, then every word all the points share (history rows written
    before short labels existed read the same)."""
    words = {p: re.sub(r" \{.*\}", "", p).split() for p in points}
    shared = set.intersection(*(set(w) for w in words.values())) if words else set()
    first = next(iter(words.values()), [])
    labels = {p: " ".join(x for x in w if x not in shared) or p for p, w in words.items()}
    return labels, " ".join(x for x in first if x in shared)


def plot_history(history: Path, path: Path) -> None:
    """Quality (ALL) and speedup per run, one line per point; the legends below the axes,
    their labels only what tells the points apart (the rest is in each panel's title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = pd.read_csv(history)
    runs = list(dict.fromkeys(zip(h["date"], h["git_sha"].astype(str), strict=True)))
    x_of = {r: i for i, r in enumerate(runs)}
    q = h[(h["kind"] == "quality") & h["point"].str.endswith(" ALL")]
    sp = h[h["kind"] == "speed"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    panels = ((axes[0], q, "score, all tasks (candidate)"), (axes[1], sp, "speedup over the reference (x)"))
    for ax, d, ylabel in panels:
        labels, shared = _plot_labels(sorted(set(d["point"])))
        for point, g in d.groupby("point"):
            xs = [x_of[r] for r in zip(g["date"], g["git_sha"].astype(str), strict=True)]
            ax.errorbar(xs, g["candidate"], yerr=_yerr(g), marker="o", capsize=3, label=labels[str(point)])
        ax.set_xticks(range(len(runs)), [sha[:7] for _, sha in runs], rotation=45, fontsize=8)
        ax.set_xlabel("run (git SHA; dates in history.csv)")
        ax.set_ylabel(ylabel)
        ax.set_title(shared, fontsize=9)
        ax.grid(alpha=0.3)
        if len(d):
            ncol = 1 if max(map(len, labels.values())) > 30 else 2
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def claim_candidate(folder: Path) -> None:
    """Make ``folder`` the suite's empty candidate folder: a folder the gate made before
    (holding :data:`MARKER`) is removed and made again; an empty one is taken; anything
    else is :class:`Refused`, left as it is."""
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise Refused(f"--candidate {folder} is not a folder the gate made (a file or a link); it is left alone")
    if folder.exists():
        if (folder / MARKER).is_file():
            shutil.rmtree(folder)
        elif any(folder.iterdir()):
            raise Refused(
                f"--candidate {folder} holds files the gate did not write (no {MARKER} in it); it is left alone: "
                f"give a new or empty folder, or remove it yourself"
            )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("Made by python -m harness.regress run, which removes and remakes this folder.\n")


def run_suite(
    candidate: Path,
    baselines: Path,
    quality_tol: float,
    speed_tol: float,
    suite_file: Path = SUITE,
    baseline: Path | None = None,
    eval_speed: bool = False,
    log: TextIO | None = None,
    remeasure: int = 1,
) -> Verdict:
    """Run the suite into ``candidate`` and compare it with this machine class's baseline
    (or ``baseline``). Everything that can be refused is refused before the suite runs:
    a missing suite file or baseline folder, a corrupt baseline, a candidate folder the
    gate did not make. A latency run whose measurement is flagged unsafe is measured again
    up to ``remeasure`` times (:func:`remeasure_unsafe`), the verdict saying so. The
    suite's own output goes to ``log`` (default: this process's stdout)."""
    commands = suite_commands(candidate, suite_file)
    cls = hardware_class()
    if baseline is not None:
        base_dir = baseline / "rows" if (baseline / "rows").is_dir() else baseline
        if read_folder(base_dir, "baseline").empty:  # refused now, not after the suite's minutes
            raise Refused(f"baseline folder {base_dir} holds no rows; give a folder of results (a candidate's, or "
                          f"results/baseline/<class>/rows)")  # fmt: skip
    elif not baselines.is_dir():
        raise Refused(f"baselines folder {baselines} does not exist")
    else:
        base_dir = baselines / cls / "rows"
        if base_dir.exists() and read_folder(base_dir, "baseline").empty:
            raise Refused(f"baseline folder {base_dir} holds no rows (a broken accept?); restore it from git, or "
                          f"remove it and accept a new baseline")  # fmt: skip
    claim_candidate(candidate)
    wrote: dict[str, list[str]] = {}  # run folder -> the suite command that wrote it
    for cmd in commands:
        failed = _run_command(cmd, candidate, wrote, log)
        if failed:
            return Verdict(INCOMPARABLE, candidate=_shown(candidate), note=failed)
    remeasured = []
    for _ in range(remeasure):
        again = remeasure_unsafe(candidate, wrote, log)
        if isinstance(again, str):  # the second measurement's command failed
            return Verdict(INCOMPARABLE, candidate=_shown(candidate), note=again)
        remeasured += again
        if not again:
            break
    write_suite_record(candidate, suite_file)
    if baseline is None and not base_dir.exists():
        others = sorted(p.parent.name for p in baselines.glob("*/rows"))
        note = (
            f"NOT COMPARED: no baseline for this machine's class {cls!r} in {_shown(baselines)} (have: {others}). "
            f"Accept this run as its baseline with `make regress-accept reason='first {cls} baseline'`."
        )
        if not others:
            return Verdict(NO_BASELINE, candidate=_shown(candidate), note=note)
        # float32 quality is the same on every CPU: compare it with another class's baseline
        v = compare_verdict(baselines / others[0] / "rows", candidate, quality_tol, speed_tol, skip_speed=True)
        v.note = f"{note} Quality only, against {others[0]}'s baseline."
        if v.code != REGRESSED:
            v.code = NO_BASELINE
        return v
    v = compare_verdict(base_dir, candidate, quality_tol, speed_tol, eval_speed=eval_speed)
    v.remeasured = remeasured
    if baseline is None:
        v.note = f"Against the {cls} baseline."
        if v.rows:
            append_history(baselines / cls / "history.csv", v.rows, cls)
    return v


def _run_command(cmd: list[str], candidate: Path, wrote: dict[str, list[str]], log: TextIO | None) -> str:
    """Run one suite command, noting which run folders it wrote; "" or why it failed."""
    print("+", " ".join(cmd[1:]), file=log or sys.stdout, flush=True)
    before = set(_run_folders(candidate))
    done = subprocess.run(cmd, cwd=ROOT, stdout=log)
    for rel in set(_run_folders(candidate)) - before:
        wrote[rel] = cmd
    if done.returncode:  # a suite that cannot run gives no candidate to compare
        return f"cannot compare: the suite command `{' '.join(cmd[1:3])} ...` failed (exit {done.returncode})"
    return ""


#: Where :func:`remeasure_unsafe` keeps a first measurement it set aside (hidden: not a run
#: folder of the candidate, so neither compared nor accepted).
SET_ASIDE = ".remeasured"


def unsafe_runs(candidate: Path) -> dict[str, str]:
    """The candidate's latency run folders whose speed claims are unsafe (a failed A/A
    check, a point flagged not comparable: harness.analysis.latency), with why."""
    out = {}
    for rel in _run_folders(candidate):
        d = _ok(read_results(candidate / rel), "latency")
        if d.empty:
            continue
        s = summarize_latency(d)
        bad = s[(s["aa_ok"] == False) | (s["comparable"] == False)]  # noqa: E712  (NaN: not checked)
        if not bad.empty:
            out[rel] = "; ".join(sorted({f for f in bad["flags"] if isinstance(f, str) and f})) or "flagged unsafe"
    return out


def remeasure_unsafe(candidate: Path, wrote: dict[str, list[str]], log: TextIO | None) -> list[str] | str:
    """Measure once more every latency run of the candidate whose first measurement is
    unsafe: the run folder is set aside under ``candidate/.remeasured/<n>/`` (kept, never
    compared) and the command that wrote it runs again (it measures only what is missing).
    A failed A/A check or a speedup above its FLOP ideal says the *measurement* is not to be
    trusted (a neighbour's burst on a shared machine), not that the code changed; measuring
    again is the gate's answer, said in the verdict with the first measurement's flags, and
    a second unsafe measurement stays not comparable. Returns what was measured again, in
    words, or why its command failed."""
    unsafe = {rel: why for rel, why in unsafe_runs(candidate).items() if rel in wrote}
    if not unsafe:
        return []
    tries = sorted(int(p.name) for p in (candidate / SET_ASIDE).glob("*") if p.name.isdigit())
    aside = candidate / SET_ASIDE / str((tries[-1] + 1) if tries else 1)
    for rel in unsafe:
        dest = aside / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        (candidate / rel).rename(dest)
    for cmd in {tuple(wrote[rel]): None for rel in unsafe}:
        failed = _run_command(list(cmd), candidate, wrote, log)
        if failed:
            return failed
    return [
        f"Measured again: {rel} (its first measurement, kept in {_shown(aside / rel)}, was flagged: {why})"
        for rel, why in unsafe.items()
    ]


def _run_folders(folder: Path) -> list[str]:
    """The run folders under ``folder`` (those holding a ``config.yaml``, outside hidden
    folders such as Hydra's), relative, sorted."""
    found = []
    for cfg in folder.rglob("config.yaml"):
        rel = cfg.parent.relative_to(folder)
        if not any(part.startswith(".") for part in rel.parts):
            found.append(rel.as_posix())
    return sorted(found)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_suite_record(candidate: Path, suite_file: Path) -> None:
    """Written by ``run`` once every suite command has finished: which suite (its file and
    hash) produced which run folders. :func:`accept` checks the candidate against it."""
    doc = {
        "suite": str(Path(suite_file).resolve()),
        "suite_sha256": _sha256(Path(suite_file)),
        "runs": _run_folders(candidate),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
    }
    (candidate / SUITE_RECORD).write_text(json.dumps(doc, indent=1) + "\n")


def check_candidate(candidate: Path) -> dict:
    """What ``accept`` takes, or :class:`Refused` in one line: a folder the gate made (its
    :data:`MARKER`), whose suite finished (its :data:`SUITE_RECORD`), holding the run
    folders the suite produced and no others, from a suite file unchanged since (a baseline
    must be the suite's points, or every later run compares against something else)."""
    candidate = Path(candidate)
    if not candidate.is_dir():
        raise Refused(f"candidate folder {candidate} does not exist; run make regress first")
    if not (candidate / MARKER).is_file():
        raise Refused(f"{candidate} is not a folder the gate made (no {MARKER} in it); only the suite's own output "
                      f"(make regress) can become a baseline")  # fmt: skip
    try:
        doc = json.loads((candidate / SUITE_RECORD).read_text())
        suite, sha, runs = Path(doc["suite"]), str(doc["suite_sha256"]), list(doc["runs"])
    except FileNotFoundError:
        raise Refused(f"{candidate}: the suite did not finish there (no {SUITE_RECORD}: a failed or killed "
                      f"make regress); run it again") from None  # fmt: skip
    except (ValueError, KeyError, TypeError) as e:
        raise Refused(f"{candidate / SUITE_RECORD} is damaged ({type(e).__name__}); run make regress again") from None
    if not suite.is_file() or _sha256(suite) != sha:
        raise Refused(f"{candidate} was made by a suite that has changed since ({suite}); run make regress again")
    have = _run_folders(candidate)
    if have != sorted(runs):
        extra, gone = sorted(set(have) - set(runs)), sorted(set(runs) - set(have))
        raise Refused(f"{candidate} no longer holds what the suite wrote (added {extra}, missing {gone}); run make "
                      f"regress again")  # fmt: skip
    for run in runs:
        if read_folder(candidate / run, "candidate").empty:
            raise Refused(f"candidate run folder {candidate / run} holds no rows; run make regress again")
    return doc


def _describe(target: Path) -> str:
    """What a baseline's rows folder holds, in a few words (what ``accept`` replaces)."""
    if not target.is_dir():
        return "no earlier baseline"
    df = read_results(target)
    runs = len(_run_folders(target))
    return f"the earlier baseline ({runs} run folder(s), {len(df)} rows)"


def accept(candidate: Path, baselines: Path, reason: str) -> None:
    """Promote the candidate's rows to this class's baseline, recording why. Only a folder
    :func:`check_candidate` takes; the new rows are written beside the old ones first and
    swapped in only once complete, so a failure midway leaves the old baseline as it was."""

    if not reason.strip():
        raise SystemExit("regress accept: give a reason (make regress-accept reason='...')")
    check_candidate(candidate)
    cls = hardware_class()
    target = baselines / cls / "rows"
    incoming, previous = target.with_name("rows.incoming"), target.with_name("rows.previous")
    for stale in (incoming, previous):
        shutil.rmtree(stale, ignore_errors=True)
    replaced = _describe(target)
    for rel in _run_folders(candidate):
        run, dest = candidate / rel, incoming / rel
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / "config.yaml", dest / "config.yaml")
        rows = read_results(run)
        rows.drop(columns=[c for c in ("prediction",) if c in rows]).to_parquet(dest / "rows.parquet", index=False)
    if target.exists():
        target.rename(previous)
    incoming.rename(target)
    shutil.rmtree(previous, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with (baselines / cls / "ACCEPTED.md").open("a") as f:
        f.write(f"- {stamp} at {git_sha()}: {reason.strip()}\n")
    print(
        f"accepted {candidate} as the {cls} baseline ({target}), replacing {replaced} (git keeps it until you "
        f"commit). Nothing is committed: commit {_shown(baselines / cls)}/ (rows/, ACCEPTED.md, and history.csv and "
        f"history.png, which every run appends to)."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    codes = "exit status:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())
    c = sub.add_parser(
        "compare",
        help="compare two results folders (e.g. the last candidate, without rerunning)",
        epilog=codes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--baseline", type=Path, required=True)
    c.add_argument("--candidate", type=Path, required=True)
    r = sub.add_parser(
        "run",
        help="run the quick suite and compare it with this machine class's baseline",
        epilog=codes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "--candidate",
        type=Path,
        default=ROOT / "results" / "regress" / "candidate",
        help=f"the folder the suite writes (made by the gate: one holding its {MARKER} is removed and remade; "
        "any other non-empty folder is refused)",
    )
    r.add_argument("--suite", type=Path, default=SUITE, help="the suite file (default conf/regress.yaml)")
    r.add_argument(
        "--remeasure",
        type=int,
        default=1,
        help="measure a latency run flagged unsafe (failed A/A check, above its ideal) again this many times, "
        "the first measurement kept aside and named in the verdict (default 1; 0: never)",
    )
    r.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="compare with this baseline folder instead of results/baseline/<class>/rows (no history appended)",
    )
    a = sub.add_parser(
        "accept",
        help="promote the candidate to this machine class's baseline",
        epilog=f"takes only a folder `run` made whose suite finished ({SUITE_RECORD}), unchanged since; refused in "
        "one line (exit 1) otherwise, the baseline untouched",
    )
    a.add_argument("--candidate", type=Path, default=ROOT / "results" / "regress" / "candidate")
    a.add_argument("--reason", required=True)
    for p in (c, r, a):
        p.add_argument("--baselines", type=Path, default=ROOT / "results" / "baseline")
    for p in (c, r):
        p.add_argument("--quality-tol", type=float, default=2.0, help="points on the 0-100 scale (default 2)")
        p.add_argument("--speed-tol", type=float, default=0.15, help="fraction of the baseline's speedup (0.15)")
        p.add_argument(
            "--eval-speed",
            action="store_true",
            help="also gate the eval runs' TTFT ratios (default: speed from the latency rows only)",
        )
        p.add_argument("--format", choices=FORMATS, default="text", help="the verdict's form on stdout (text)")
        p.add_argument("--all", action="store_true", help="text: list every point, not only the changed ones")
        p.add_argument(
            "--summary",
            type=Path,
            default=None,
            help="also append the markdown verdict to this file ($GITHUB_STEP_SUMMARY)",
        )
    c.add_argument("--require-all", action="store_true", help="points in only one folder make it exit 2")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] not in ("-h", "--help"):
        argv = ["compare", *argv]  # `python -m harness.regress --baseline A --candidate B`
    args = ap.parse_args(argv)
    if getattr(args, "remeasure", 0) < 0:
        ap.error(f"--remeasure {args.remeasure}: allowed: 0 (never) or more times")
    if args.cmd == "accept":
        try:
            accept(args.candidate, args.baselines, args.reason)
        except Refused as e:
            raise SystemExit(f"regress accept: {e}") from None
        return
    try:
        if args.cmd == "compare":
            v = compare_verdict(
                args.baseline,
                args.candidate,
                args.quality_tol,
                args.speed_tol,
                args.require_all,
                eval_speed=args.eval_speed,
            )
        else:
            log = None if args.format == "text" else sys.stderr  # stdout carries only the verdict
            v = run_suite(
                args.candidate, args.baselines, args.quality_tol, args.speed_tol, args.suite, args.baseline,
                args.eval_speed, log, args.remeasure,
            )  # fmt: skip
    except Refused as e:
        print(f"regress: {e}", file=sys.stderr)
        v = Verdict(REFUSED, note=f"refused: {e}", quality_tol=args.quality_tol, speed_tol=args.speed_tol)
        if args.format == "text":
            if args.summary:
                with args.summary.open("a") as f:
                    f.write(render_markdown(v))
            raise SystemExit(REFUSED) from None
    print(render(v, args.format, args.all), end="", flush=True)
    if args.summary:
        with args.summary.open("a") as f:
            f.write(render_markdown(v))
    raise SystemExit(v.code)


if __name__ == "__main__":
    main()
