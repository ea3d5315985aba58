"""The gate's history beside a baseline: one row per compared point and run
(``history.csv``) and its plot (``history.png``)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import numpy as np
import pandas as pd

from harness.provenance import git_sha
from harness.regress.verdict import Comparison


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


def plot_labels(points: list[str]) -> tuple[dict[str, str], str]:
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
        labels, shared = plot_labels(sorted(set(d["point"])))
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
