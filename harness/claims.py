"""Every interval the documentation quotes, found in a committed summary.

A number a user may publish is computed once, by the analysis layer, and written to a
summary (``summary.md`` / ``.csv``, a study's tables) beside its rows; the READMEs only quote
it. This module checks that they do: every ``value [lo, hi]`` in the README files (the
project's, ``docs/``, each results folder's) must appear, to the digits the README prints,
as a value with its interval in a committed summary file under ``results/`` (markdown
``v [lo, hi]`` cells, or CSV columns ``c``, ``c_lo``, ``c_hi``). A quote that is no longer
in any summary (a re-rendered interval, a hand-computed one, a typo) is listed with its file
and line.

A sentence that quotes an interval no summary holds on purpose (a superseded number, named
as such) marks it ``(superseded)`` right after the interval.

``python -m harness.claims`` lists the quotes not found (exit 1 if any), each with the
intervals the summaries hold for the same value (what a re-rendered interval now reads).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
_NUM = r"[-+]?\d+(?:\.\d+)?"
#: ``1.40x [1.30, 1.52]``, ``0.73 [0.57, 0.87]``, ``-13.3 [-26.5, -2.9]`` (an ``x`` after any number;
#: any white space, a wrapped and indented line's included, between the parts).
TRIPLE = re.compile(rf"(?<![\w.+\-])({_NUM})x?\s+\[({_NUM})x?,\s+({_NUM})x?\]")
SUPERSEDED = "(superseded)"


@dataclass(frozen=True)
class Quote:
    """One interval quoted in a document."""

    path: str
    line: int
    text: str
    numbers: tuple[str, str, str]


def committed(pattern: str) -> list[Path]:
    """Files git tracks matching ``pattern`` (a pathspec), under the project root."""
    out = subprocess.run(["git", "ls-files", "-z", "--", pattern], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split("\0") if p]


def documents() -> list[Path]:
    """The documents whose quotes are checked: the README files and ``docs/``."""
    return sorted({*committed("README.md"), *committed("docs/*.md"), *committed("results/**/README.md")})


def quotes(path: Path) -> list[Quote]:
    """Every interval quoted in ``path``, less those marked :data:`SUPERSEDED`."""
    text = path.read_text()
    flat = text.replace("\n", " ")  # a quote may wrap: ``1.030x\n[0.960, 1.084]``
    found = []
    for m in TRIPLE.finditer(flat):
        if flat[m.end() :].lstrip().startswith(SUPERSEDED):
            continue
        line = text.count("\n", 0, m.start()) + 1
        name = str(path.relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
        found.append(Quote(name, line, m.group(0), (m.group(1), m.group(2), m.group(3))))
    return found


def summary_files() -> list[Path]:
    """The committed summaries: every markdown or CSV file under ``results/`` but the READMEs."""
    return sorted(p for p in [*committed("results/**.md"), *committed("results/**.csv")] if p.name != "README.md")


def intervals(path: Path) -> set[tuple[float, float, float]]:
    """Every value with its interval in one summary file."""
    if path.suffix == ".md":
        return {(float(a), float(b), float(c)) for a, b, c in TRIPLE.findall(path.read_text())}
    try:
        df = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError):
        return set()
    out = set()
    for col in df.columns:
        lo, hi = f"{col}_lo", f"{col}_hi"
        if lo not in df or hi not in df:
            continue
        sub = df[[col, lo, hi]].apply(pd.to_numeric, errors="coerce").dropna()
        out |= {(float(a), float(b), float(c)) for a, b, c in sub.itertuples(index=False)}
    return out


def _matches(numbers: tuple[str, str, str], have: tuple[float, float, float]) -> bool:
    """The quote is ``have`` as printed to the quote's own digits (each number rounded)."""
    for text, value in zip(numbers, have, strict=True):
        digits = len(text.split(".")[1]) if "." in text else 0
        if abs(float(text) - value) > 0.5 * 10**-digits + 1e-9:
            return False
    return True


def pool(summaries: list[Path] | None = None) -> set[tuple[float, float, float]]:
    """Every value with its interval in the committed summaries (default :func:`summary_files`)."""
    out: set[tuple[float, float, float]] = set()
    for s in summary_files() if summaries is None else summaries:
        out |= intervals(s)
    return out


def summaries_for(doc: Path) -> list[Path]:
    """Where a document's quotes must come from: a results folder's README from that
    folder's own summaries; the project's README and ``docs/`` from any committed one."""
    every = summary_files()
    if doc.resolve().is_relative_to(ROOT / "results") and doc.parent.resolve() != ROOT / "results":
        return [p for p in every if p.resolve().is_relative_to(doc.parent.resolve())]
    return every


def unfound(docs: list[Path] | None = None) -> list[Quote]:
    """The quotes of ``docs`` (default :func:`documents`) that no summary holds."""
    out = []
    for d in documents() if docs is None else docs:
        have = pool(summaries_for(d))
        out += [q for q in quotes(d) if not any(_matches(q.numbers, h) for h in have)]
    return out


def same_value(q: Quote, have: set[tuple[float, float, float]]) -> list[str]:
    """The summaries' intervals whose value is the quote's (to its digits), printed to the
    quote's digits: what the quote would read from them."""
    digits = [len(t.split(".")[1]) if "." in t else 0 for t in q.numbers]
    return sorted({f"{h[0]:.{digits[0]}f} [{h[1]:.{digits[1]}f}, {h[2]:.{digits[2]}f}]" for h in have
                   if _matches((q.numbers[0], "0", "0"), (h[0], 0.0, 0.0))})  # fmt: skip


def main() -> None:
    missing = unfound()
    for q in missing:
        near = same_value(q, pool(summaries_for(ROOT / q.path)))
        print(f"{q.path}:{q.line}: {q.text}" + (f"  (summaries: {'; '.join(near[:4])})" if near else ""))
    print(f"{len(missing)} quoted interval(s) not found in a committed summary", file=sys.stderr)
    raise SystemExit(1 if missing else 0)


if __name__ == "__main__":
    main()
