"""The comparison: two folders' rows point by point, quality (paired score differences)
and speed (the paired speedups inside each folder), into a :class:`~harness.regress.verdict.Verdict`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.analysis.quality import (
    Point,
    all_parts,
    categories,
    paired_difference,
    paired_ratio,
    references,
    timed_loaded,
)
from harness.analysis.rows import AA_METHOD, GATE_COLUMNS, LATENCY_POINT, POINT, REFERENCE_OF
from harness.analysis.stats import Estimate
from harness.regress.formats import render
from harness.regress.verdict import (
    INCOMPARABLE,
    NO_BASELINE,
    OK,
    REGRESSED,
    Comparison,
    Refused,
    Verdict,
    latency_fields,
    point_label,
    quality_fields,
    shown,
    speculator_words,
)
from harness.store import DamagedRowFile


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


def quality(base: Analysis, cand: Analysis, tol: float) -> tuple[list[Comparison], set[tuple], list[dict[str, str]]]:
    """Per task and ``ALL`` (the summary's: over categories where the benchmark has them),
    the paired score difference over the samples both folders ran
    (:func:`harness.analysis.quality.paired_difference`), and the candidate's retention
    (:func:`harness.analysis.quality.paired_ratio`, as its summary shows it)."""
    out: list[Comparison] = []
    b, c = base.ok("eval"), cand.ok("eval")
    groups_b = {k: g for k, g in b.groupby(POINT, dropna=False)} if not b.empty else {}
    groups_c = {k: g for k, g in c.groupby(POINT, dropna=False)} if not c.empty else {}
    refs_c = references(c) if not c.empty else {}
    for key in sorted(groups_b.keys() & groups_c.keys(), key=str):
        gb, gc = groups_b[key], groups_c[key]
        point = dict(zip(POINT, key, strict=True))
        label = point_label(point)
        reference = bool(gb["is_reference"].iloc[0])
        ref_rows = refs_c.get(tuple(point[k] for k in REFERENCE_OF))
        pb, pc = Point(gb), Point(gc)
        rc = Point(ref_rows) if ref_rows is not None else None
        tasks = sorted(set(pb.tasks) & set(pc.tasks))
        cats = {name: [t for t in ts if t in tasks] for name, ts in categories(gb).items()}
        wheres = [(t, [[t]]) for t in tasks] + (
            [("ALL", all_parts(tasks, {k: v for k, v in cats.items() if v}))] if len(tasks) > 1 else []
        )
        for where, parts in wheres:
            d, mb, mc = paired_difference(pc, pb, "score", parts)
            if d.n == 0:
                continue
            ret = None if reference or rc is None else paired_ratio(pc, "score", rc, "score", parts)
            fields = quality_fields(key, reference, where)
            out.append(Comparison("quality", f"{label} {where}", mb, mc, d, _quality_verdict(d, tol), ret, fields))
    is_reference = {k: bool(g["is_reference"].iloc[0]) for groups in (groups_b, groups_c) for k, g in groups.items()}
    keys_b, keys_c = set(groups_b), set(groups_c)
    only = [quality_fields(k, is_reference.get(k, False)) for k in keys_b ^ keys_c]
    return out, keys_b | keys_c, sorted(only, key=str)


@dataclass(frozen=True)
class SpeedPoint:
    """A point's speedup as the gate reads it, with what its summary flagged."""

    estimate: Estimate
    flags: str = ""  # the summary's words (harness.analysis.speed), "" for eval points
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
        # loaded: the latency summary's flag, or an eval summary's timing (its rows' load)
        loaded = r.get("loaded", False) is True or timed_loaded(r.get("speedup_timing"))
        out[tuple(r[cols])] = SpeedPoint(e, flags, comparable, "order not balanced" in flags, bool(loaded))
    return out


def _aa_failures(a: Analysis) -> list[str]:
    """The A/A checks of a folder's latency rows that failed, in words."""
    if a.ok("latency").empty:
        return []
    s = a.latency
    s = s[(s["method_name"] == AA_METHOD) & (s["aa_ok"] == False)]  # noqa: E712  (NaN: no A/A check)
    return [
        f"{int(r['batch'])}x{int(r['length'])} {r['model']}: {r['aa_speedup']:.3f}x "
        f"[{r['aa_speedup_lo']:.3f}, {r['aa_speedup_hi']:.3f}]"
        for _, r in s.iterrows()
    ]


def _eval_speedups(a: Analysis) -> dict[tuple, SpeedPoint]:
    """Per quality point: the summary's ``ALL`` speedup (the reference's TTFT over the
    method's on the samples both ran, on one machine)."""
    if a.ok("eval").empty:
        return {}
    s = a.summary
    return _estimates(s[s["task"] == "ALL"], POINT)


def _latency_speedups(a: Analysis) -> dict[tuple, SpeedPoint]:
    """Per latency point: the latency summary's speedup (interleaved in one run)."""
    return _estimates(a.latency, LATENCY_POINT) if not a.ok("latency").empty else {}


def speed(
    base: Analysis, cand: Analysis, tol: float, eval_speed: bool = False
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
    lb, lc = base.ok("latency"), cand.ok("latency")
    if lb.empty or lc.empty:
        missing = " and ".join(w for w, d in (("baseline", lb), ("candidate", lc)) if d.empty)
        notes.append(
            f"Speed NOT compared: no latency rows in the {missing}"
            + (" (eval TTFTs, between runs, compared below)" if eval_speed else " (quality only)")
        )
    failed_aa = _aa_failures(cand)
    if failed_aa:
        notes.append(
            "A/A check FAILED in the candidate (the reference timed against itself must read 1.0): "
            + "; ".join(failed_aa)
        )
    sources = (("eval", _eval_speedups, POINT),) if eval_speed else ()
    for kind, fn, keys in (*sources, ("latency", _latency_speedups, LATENCY_POINT)):
        sb, sc = fn(base), fn(cand)
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
                return latency_fields(key)
            return quality_fields(key, False, "speedup TTFT ALL") | {"kind": "speed"}

        only += [fields(k) for k in sorted(sb.keys() ^ sc.keys(), key=str)]
        for key in sorted(sb.keys() & sc.keys(), key=str):
            pb, pc = sb[key], sc[key]
            eb, ec = pb.estimate, pc.estimate
            r = dict(zip(keys, key, strict=True))
            where = "ALL TTFT (between runs)" if kind == "eval" else f"latency {int(r['batch'])}x{int(r['length'])}"
            label = f"{r['model']} {r['method']} keep={r['keep_rate']:g}{speculator_words(r)} {where}"
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


def read_folder(folder: Path, role: str) -> Analysis:
    """The analysis of a baseline or candidate folder, or :class:`Refused` in one line: the
    folder does not exist, a file in it is corrupt (named: the store's reader would skip
    it, and a baseline missing rows would pass as points in one folder only), or a column
    the gate reads is missing from all its rows."""
    folder = Path(folder)
    if not folder.is_dir():
        raise Refused(f"{role} folder {folder} does not exist")
    try:
        a = analyze(folder, strict=True)
    except DamagedRowFile as e:
        raise Refused(f"{role} file {e.path} is corrupt or unreadable ({e.reason})") from e
    except Exception as e:  # a file changed under us, or a reader's own error
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise Refused(f"{role} folder {folder} is unreadable ({type(e).__name__}: {why})") from e
    stored = a.stored_columns
    if not a.rows.empty:
        kinds = set(a.rows["kind"]) if "kind" in a.rows else set()
        for kind, cols in GATE_COLUMNS.items():
            missing = [c for c in cols if c not in stored] if not kind or kind in kinds else []
            if missing:
                raise Refused(f"{role} folder {folder}: its rows have no {missing} column(s); not a results folder?")
    return a


def gate(
    base: Analysis,
    cand: Analysis,
    quality_tol: float = 2.0,
    speed_tol: float = 0.15,
    require_all: bool = False,
    skip_speed: bool = False,
    eval_speed: bool = False,
) -> Verdict:
    """The verdict on two folders' analyses (paths and notes are the caller's to fill in)."""
    v = Verdict(OK, quality_tol=quality_tol, speed_tol=speed_tol)
    v.speed_from = "none (quality only)" if skip_speed else "latency and eval rows" if eval_speed else "latency rows"
    if base.rows.empty or cand.rows.empty:
        empty = "baseline" if base.rows.empty else "candidate"
        v.code, v.note = INCOMPARABLE, f"cannot compare: no rows in the {empty}"
        return v
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
        v.note = "cannot compare speed: " + (
            "the candidate's A/A check failed"
            if aa_failed
            else f"{n} speed point{'s' if n != 1 else ''} flagged unsafe"
        )
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
    v.baseline, v.candidate = shown(baseline), shown(candidate)
    return v
