"""Summary tables and plots, read only from the results store (every kind of row).

``python -m harness.report results/default`` rewrites, in that folder, ``summary.md``
(one section per kind of row present: quality, latency, serving) with ``summary.csv``
(quality), ``latency_summary.csv`` and ``qps_summary.csv``, the figures under
``<folder>/plots/`` (:mod:`harness.rendering.plots`) and ``report.html``, one self-contained page of
all of it (:mod:`harness.report.html`). Every number comes from :mod:`harness.analysis`;
this module and the renderers it calls only format and draw. Nothing here knows a method
by name: ratios are taken against each row's ``reference_method`` (the config's
``reference``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.failures import MixedModels
from harness.rendering import plots
from harness.rendering.tables import by_task_markdown, latency_markdown, numbers_md, speculator_note, to_markdown
from harness.report.html import write_html


@dataclass
class Report:
    """A folder's analysis and the figures drawn from it."""

    analysis: Analysis
    figures: list[tuple[str, Path]] = field(default_factory=list)  # (title, png)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (title, why it was not drawn)


def build(out: Path, plots_dir: Path | None = None) -> Report:
    """Summaries and figures of ``out``; figures go to ``plots_dir`` (``<out>/plots``)."""
    a = analyze(Path(out))
    drawn, dropped = plots.draw_all(a, Path(plots_dir) if plots_dir is not None else Path(out) / "plots")
    return Report(a, drawn, dropped)


def write_all(out: Path, plots_dir: Path | None = None, html: bool = True) -> pd.DataFrame:
    """Rewrite ``out``'s summaries (one section per kind of row present), its figures (under
    ``<out>/plots/``) and ``report.html``; print the summaries. Returns the quality summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = build(out, plots_dir)
    r = report.analysis
    sections = []
    if not r.summary.empty:
        md = to_markdown(r.summary)
        wide = by_task_markdown(r.summary)
        if wide:
            md += "\nScore per task (`(n=K)`: fewer samples than the fullest point for that task):\n\n" + wide
        if note := speculator_note(r.rows):
            md += "\n" + note
        for title, why in report.dropped:
            md += f"\nNot drawn: {title}: {why}.\n"
        sections.append("## Quality\n\n" + md)
        r.summary.to_csv(out / "summary.csv", index=False)
    if not r.latency.empty:
        sections.append(
            "## Latency (TTFT; speedups side by side in one run, paired by iteration)\n\n" + latency_markdown(r.latency)
        )
        r.latency.to_csv(out / "latency_summary.csv", index=False)
    if not r.qps.empty:
        sections.append("## Serving (max QPS under the SLOs)\n\n" + numbers_md(r.qps.drop(columns=["run_id"])))
        r.qps.to_csv(out / "qps_summary.csv", index=False)
        r.qps_rates.to_csv(out / "qps_rates.csv", index=False)
    text = "\n".join(sections) if sections else "(no results)\n"
    (out / "summary.md").write_text(text)
    written = [str(p) for _, p in report.figures]
    if html:
        written.insert(0, str(write_html(r, report.figures, dropped=report.dropped)))
    print(f"\nSummary of {out} (also {out / 'summary.md'}{'; ' + ', '.join(written) if written else ''}):\n")
    print(text)
    return r.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path, help="results folder (the out= of a run)")
    ap.add_argument("--plots", type=Path, default=None, help="folder of the figures (default: <out>/plots)")
    ap.add_argument("--no-html", action="store_true", help="skip report.html")
    a = ap.parse_args()
    problem = report_problem(a.out, a.plots)
    if problem:
        sys.exit(problem)  # one line on stderr, exit status 1
    try:
        write_all(a.out, a.plots, html=not a.no_html)
    except MixedModels as e:
        sys.exit(str(e))  # one line: the folder mixes a model's settings at one point


def report_problem(out: Path, plots: Path | None = None) -> str | None:
    """Why ``make report out=...`` cannot report ``out`` (one line), or None: it must be an
    existing results folder (a typo must not become an empty report in a new folder), and
    its figures folder must not be a file."""
    if not out.exists():
        return f"out={str(out)!r} does not exist; allowed: a results folder (the out= of a run)"
    if not out.is_dir():
        return f"out={str(out)!r} is a file; allowed: a results folder (the out= of a run)"
    figs = plots if plots is not None else out / "plots"
    if figs.exists() and not figs.is_dir():
        return f"{figs} is a file where the report's figures go; allowed: move it away or delete it"
    return None


if __name__ == "__main__":
    main()
