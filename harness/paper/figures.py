"""A table's figure: ours beside the paper's, one panel per compared measure."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.rendering.plots import panels, pyplot


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
    panel_names = list(dict.fromkeys(m.panel for m in marks))
    names = list(dict.fromkeys(m.series for m in marks))  # one colour per series in every panel
    fig, axes = panels(len(panel_names), width=5.6, height=4.2)
    for ax, panel in zip(axes, panel_names, strict=False):
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
    fig.suptitle(textwrap.fill(title, width=int(14 * 5.6 * len(panel_names))), fontsize=10)  # ~14 characters an inch
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No version in the file: the same marks give the same bytes wherever they are drawn.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
