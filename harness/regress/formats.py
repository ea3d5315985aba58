"""The verdict's forms (``--format``): one screen of text, markdown for a CI step summary,
JSON, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np

from harness.regress.verdict import (
    EXIT_CODES,
    INCOMPARABLE,
    NO_BASELINE,
    OK,
    REFUSED,
    REGRESSED,
    VERDICT_NAMES,
    Comparison,
    Verdict,
    short_labels,
)

#: Rows of a changed point the markdown verdict lists (the rest: "and N more").
MARKDOWN_ROWS = 10
FORMATS = ("text", "markdown", "json", "junit")


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
        shown = (
            [("Points", "regressed|improved|same|not comparable")]
            if all_points
            else [("REGRESSED", "regressed"), ("NOT COMPARABLE", "not comparable"), ("Improved", "improved")]
        )
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
