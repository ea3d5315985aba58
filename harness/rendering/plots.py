"""The figures of a results folder, drawn only from its stored rows and their summaries.

Each function writes one PNG and returns its path, or ``None`` when the folder holds nothing
that figure shows. Intervals are the summaries' 95 % bootstrap intervals
(:mod:`harness.analysis`); every figure names its sample counts. Nothing here computes a
measure: each figure draws the summaries' columns.

- :func:`pareto`: quality retention vs measured TTFT speedup, one point per method and keep
  rate, over all tasks and per task, with the FLOP model's ideal speedup;
- :func:`score_vs_keep`: score vs keep rate per task and overall (``ALL``, bold);
- :func:`needle_vs_keep`: the fraction of needle (evidence) tokens kept vs keep rate;
- :func:`score_vs_length`: score vs context length per method (RULER's 4K -> 128K view);
- :func:`needle_heatmap`: score by needle depth x context length for the NIAH tasks;
- :func:`latency_vs_keep`: measured and ideal TTFT speedup vs keep rate per grid point;
- :func:`speedup_vs_length`: measured and ideal TTFT speedup vs prompt length per method and
  keep, the break-even lengths marked (where a method starts to pay);
- :func:`latency_grid`: TTFT vs length, one panel per batch size (the paper's grid), with
  the ideal TTFT (the reference's / the FLOP model's ideal speedup);
- :func:`qps_curves`: TTFT p90 vs request rate, passing and failing rates marked, the SLO line.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.folder import Analysis
from harness.rendering.tables import natural_key

#: Depth bins of the needle heatmap (fraction of the context before the needle).
DEPTH_BINS = np.linspace(0.0, 1.0, 6)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panels(n: int, width: float = 6.0, height: float = 4.5, rows: int = 1) -> tuple[Any, np.ndarray]:
    plt = pyplot()
    cols = int(np.ceil(n / rows))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def _yerr(v: pd.Series, lo: pd.Series, hi: pd.Series) -> np.ndarray | None:
    """Asymmetric error bars from an interval (``None`` where no point has one)."""
    if lo.isna().all():
        return None
    down = (v - lo).clip(lower=0).fillna(0).to_numpy(dtype=float)
    up = (hi - v).clip(lower=0).fillna(0).to_numpy(dtype=float)
    return np.vstack([down, up])


def _n_range(n: pd.Series) -> str:
    n = n[n > 0]
    if n.empty:
        return "n=0"
    return f"n={int(n.min())}" if n.min() == n.max() else f"n={int(n.min())}-{int(n.max())}"


def _quality_points(summary: pd.DataFrame) -> pd.DataFrame:
    """Task rows and ``ALL`` rows of the summary (no category, no length bucket rows)."""
    s = summary[~summary["task"].str.contains(" @", regex=False)]
    return s[~s["task"].str.startswith("[")]


def _partial(s: pd.DataFrame) -> pd.Series:
    """Points averaging fewer samples than the fullest point of their task."""
    return s["n"] < s.groupby(["model", "benchmark", "length", "task"])["n"].transform("max")


def score_vs_keep(summary: pd.DataFrame, path: Path) -> Path | None:
    """Score vs keep rate, one line per method and task, and a bold one per method for
    ``ALL``; the reference method at keep 1.0. Bars: the 95 % interval of each mean. A point
    averaging fewer samples than the fullest point of its task is hollow."""
    s = _quality_points(summary)
    s = s[s.groupby(["model", "benchmark", "length", "method"])["score"].transform("count") > 0]  # drawable
    if s.empty:
        return None
    s = s.assign(_partial=_partial(s))
    groups = list(s.groupby(["model", "benchmark", "length"]))
    fig, axes = panels(len(groups), 6.5)
    for ax, ((model, bench, length), g) in zip(axes, groups, strict=False):
        is_ref = g["method_name"] == g["reference"]
        ref = g[is_ref].drop_duplicates("task").set_index("task")
        tasks = sorted(set(g["task"]) - {"ALL"}) + (["ALL"] if "ALL" in set(g["task"]) else [])
        for method, gm in g[~is_ref].groupby("method"):
            for task in tasks:
                gt = gm[gm["task"] == task].sort_values("keep_rate")
                if task in ref.index:
                    gt = pd.concat([gt, ref.loc[[task]].reset_index().assign(keep_rate=1.0)], ignore_index=True)
                if gt.empty:
                    continue
                bold = task == "ALL"
                line = ax.errorbar(
                    gt["keep_rate"], gt["score"], yerr=_yerr(gt["score"], gt["score_lo"], gt["score_hi"]),
                    lw=2.6 if bold else 1.0, capsize=3 if bold else 0, alpha=1.0 if bold else 0.55,
                    label=f"{task} ({method})",
                )  # fmt: skip
                color = line[0].get_color()
                for x, y, h in zip(gt["keep_rate"], gt["score"], gt["_partial"], strict=True):
                    ax.plot(
                        [x], [y], marker="o", ms=6 if bold else 4, color=color, markerfacecolor="none" if h else color
                    )
        if is_ref.all():
            ax.errorbar([1.0] * len(ref), ref["score"], yerr=_yerr(ref["score"], ref["score_lo"], ref["score_hi"]),
                        fmt="o", label=f"{ref['method'].iloc[0]} (reference)")  # fmt: skip
        ax.set_xlabel("keep rate (fraction of prompt tokens prefilled; the reference at 1.0)")
        ax.set_ylabel("score (0-100), 95 % interval")
        title = f"{model} · {bench} {length} · {_n_range(g[g['task'] != 'ALL']['n'])} per task"
        if g["_partial"].any():
            title += "\nhollow: fewer samples than the fullest point (partial or failing run)"
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2 if len(tasks) > 6 else 1)
    return _save(fig, path)


def needle_vs_keep(summary: pd.DataFrame, path: Path) -> Path | None:
    """The mean fraction of needle (evidence) tokens each method kept vs keep rate, per task
    that has needles and over them (``ALL``); 1.0 means every evidence token was prefilled."""
    s = _quality_points(summary).dropna(subset=["needle_kept"])
    s = s[s["method_name"] != s["reference"]]
    if s.empty:
        return None
    groups = list(s.groupby(["model", "benchmark", "length"]))
    fig, axes = panels(len(groups), 6.5)
    for ax, ((model, bench, length), g) in zip(axes, groups, strict=False):
        for (method, task), gt in g.groupby(["method", "task"]):
            gt = gt.sort_values("keep_rate")
            bold = task == "ALL"
            ax.plot(gt["keep_rate"], gt["needle_kept"], marker="o", lw=2.6 if bold else 1.0,
                    alpha=1.0 if bold else 0.55, label=f"{task} ({method})")  # fmt: skip
        ax.plot([0, 1], [0, 1], ls=":", color="grey", lw=1, label="kept at random (= keep rate)")
        ax.set_xlabel("keep rate")
        ax.set_ylabel("needle tokens kept (fraction)")
        ax.set_title(f"{model} · {bench} {length} · {_n_range(g[g['task'] != 'ALL']['n'])} per task", fontsize=9)
        ax.set_xlim(0, 1.02)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return _save(fig, path)


def pareto_points(summary: pd.DataFrame, task: str = "ALL") -> pd.DataFrame:
    """The points of one :func:`pareto` panel: each non-reference method and keep rate on
    ``task`` (``ALL``: over all tasks) with a retention and a speedup (the summary's, with
    their intervals) and the summary's ideal speedup (the FLOP model's)."""
    s = summary[(summary["task"] == task) & (summary["method_name"] != summary["reference"])]
    return s.dropna(subset=["retention", "speedup"])


def pareto_dropped(summary: pd.DataFrame) -> str | None:
    """Why :func:`pareto` draws nothing (None when it draws): no point has both a retention
    and a speedup, and which is missing."""
    s = summary[(summary["task"] == "ALL") & (summary["method_name"] != summary["reference"])]
    if not pareto_points(summary).empty:
        return None
    if s.empty:
        return "only the reference ran: no method to place against it"
    if s["retention"].isna().all():
        ref = summary[(summary["task"] == "ALL") & (summary["method_name"] == summary["reference"])]
        if not ref.empty and (ref["score"] == 0).all():
            return "the reference scores 0 over all tasks, so retention (a score over the reference's) is undefined"
        return "no method shares samples with a reference run, so no retention exists"
    return "no TTFT ratio: no reference rows ran on the same machine with the same dtype and backend"


def _panel_pareto(ax: Any, g: pd.DataFrame, title: str, xmax: float) -> None:
    """One panel of :func:`pareto` (``g``: its points)."""
    offsets = itertools.cycle([(6, 6), (6, -12), (-18, 6), (-18, -12)])  # labels off the point and its bars
    for method, gm in sorted(g.groupby("method"), key=lambda x: natural_key(x[0])):
        gm = gm.sort_values("keep_rate")
        sp = gm["speedup"]
        line = ax.errorbar(sp, gm["retention"], xerr=_yerr(sp, gm["speedup_lo"], gm["speedup_hi"]),
                           yerr=_yerr(gm["retention"], gm["retention_lo"], gm["retention_hi"]),
                           fmt="o-", capsize=3, label=str(method), zorder=3)  # fmt: skip
        color = line[0].get_color()
        for x, xi, y, k in zip(sp, gm["ideal_speedup"], gm["retention"], gm["keep_rate"], strict=True):
            ax.annotate(f"{k:g}", (x, y), textcoords="offset points", xytext=next(offsets), fontsize=7,
                        color=color, bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                        zorder=4)  # fmt: skip
            if np.isfinite(xi):
                ax.plot([x, xi], [y, y], ls=":", color=color, lw=1)
                ax.plot([xi], [y], marker="o", mfc="none", color=color)
    ax.plot([1.0], [1.0], marker="*", ms=12, color="black", ls="none", label=f"{g['reference'].iloc[0]} (reference)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlim(min(0.9, float(g["speedup_lo"].min(skipna=True) or 0.9)) * 0.95, xmax)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def pareto(summary: pd.DataFrame, path: Path) -> Path | None:
    """Quality retention (score / the reference's on the same samples) vs TTFT speedup over
    the reference, one point per method and keep rate, both with their paired 95 %
    intervals: per model, benchmark and length a row of panels, ``ALL`` first and then one
    per task (small multiples; a task whose reference scores 0 has no retention and says
    so). The hollow marker joined to each point is its ideal speedup, the FLOP model's
    (the rows' own base and speculator: full prefill's FLOPs over the method's work);
    where the rows carry no FLOP counts (older runs), none is drawn and the legend says so."""
    s = summary[(summary["method_name"] != summary["reference"])]
    if pareto_points(summary).empty:
        return None
    groups = [(k, g) for k, g in s.groupby(["model", "benchmark", "length"]) if not pareto_points(g).empty]
    tasks = {k: ["ALL", *sorted(t for t in set(g["task"]) if t != "ALL" and not t.startswith("[") and " @" not in t)]
             for k, g in groups}  # fmt: skip
    cols = min(4, max(len(t) for t in tasks.values()))  # small multiples, wrapped at four a row
    rows_of = {k: -(-len(t) // cols) for k, t in tasks.items()}
    plt = pyplot()
    fig, axes = plt.subplots(sum(rows_of.values()), cols, figsize=(4.6 * cols, 4.0 * sum(rows_of.values())),
                             squeeze=False)  # fmt: skip
    first_row = 0
    for (model, bench, length), g in groups:
        names = tasks[(model, bench, length)]
        pts = {t: pareto_points(g, t) for t in names}
        drawn = pd.concat([p for p in pts.values() if not p.empty])
        xs = pd.concat([drawn["speedup_hi"], drawn["speedup"], drawn["ideal_speedup"]]).astype(float)
        xmax = max(1.1, float(np.nanmax(xs.to_numpy())) * 1.08)
        cells = [axes[first_row + i // cols, i % cols] for i in range(rows_of[(model, bench, length)] * cols)]
        for ax, task in zip(cells, names, strict=False):
            n = g[g["task"] == task]["n"]
            title = f"{model} · {bench} {length} · {task}" if task == "ALL" else task
            if pts[task].empty:
                ref = summary[(summary["task"] == task) & (summary["method_name"] == summary["reference"])]
                why = "reference scores 0:\nretention undefined" if (ref["score"] == 0).any() else "no paired point"
                ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")
                ax.set_title(title, fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            _panel_pareto(ax, pts[task], f"{title} · {_n_range(n)}", xmax)
            ax.set_ylabel("retention (score / reference's)")
            ax.set_xlabel("TTFT speedup over the reference")
        for ax in cells[len(names) :]:
            ax.set_visible(False)
        first_row += rows_of[(model, bench, length)]
    first = axes[0, 0]
    flops = bool(s["ideal_speedup"].notna().any())
    ideal = "ideal speedup (FLOP model)" if flops else "ideal: not drawn (these rows record no FLOP counts)"
    first.plot([], [], marker="o", mfc="none", color="grey", ls=":" if flops else "none", label=ideal)
    first.plot([], [], ls="none", label="labels: keep rate")
    first.legend(fontsize=7)
    return _save(fig, path)


def score_vs_length(summary: pd.DataFrame, path: Path) -> Path | None:
    """Score (``ALL``) vs context length, one line per method and keep rate, with 95 %
    intervals; drawn for each model and benchmark run at more than one length."""
    s = summary[summary["task"] == "ALL"].dropna(subset=["score"])
    s = s[s.groupby(["model", "benchmark"])["length"].transform("nunique") > 1]
    if s.empty:
        return None
    groups = list(s.groupby(["model", "benchmark"]))
    fig, axes = panels(len(groups), 6.5)
    for ax, ((model, bench), g) in zip(axes, groups, strict=False):
        for (method, keep), gm in g.groupby(["method", "keep_rate"], dropna=False):
            gm = gm.sort_values("length")
            is_ref = bool((gm["method_name"] == gm["reference"]).all())
            ax.errorbar(gm["length"], gm["score"], yerr=_yerr(gm["score"], gm["score_lo"], gm["score_hi"]),
                        fmt="o-", capsize=3, lw=2.4 if is_ref else 1.2, color="black" if is_ref else None,
                        label=str(method) if is_ref else f"{method} keep {keep:g}")  # fmt: skip
        ax.set_xscale("log", base=2)
        lengths = sorted(set(g["length"]))
        ax.set_xticks(lengths, [f"{x // 1024}K" if x >= 1024 else str(x) for x in lengths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("score (0-100), ALL, 95 % interval")
        ax.set_title(f"{model} · {bench} · {_n_range(g['n'])} samples per point", fontsize=9)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def needle_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """The cells of :func:`needle_heatmap`: NIAH rows (an :class:`Analysis`'s, so normalized)
    that are ok and carry a needle depth, by model, benchmark, method, keep rate (1.0 for the
    reference), depth bin (index into :data:`DEPTH_BINS`) and length: mean score and n."""
    cols = ["model", "benchmark", "method", "keep", "depth_bin", "length", "score", "n"]
    if rows.empty or "needle_depth" not in rows:
        return pd.DataFrame(columns=cols)
    r = rows[(rows["status"] == "ok") & rows["task"].astype(str).str.startswith("niah")]
    r = r.dropna(subset=["needle_depth", "score"])
    if r.empty:
        return pd.DataFrame(columns=cols)
    r = r.assign(
        depth_bin=pd.cut(r["needle_depth"].astype(float).clip(0, 1), DEPTH_BINS, include_lowest=True, labels=False),
        keep=r["keep_rate"].astype(float),
        length=r["length"].astype(int),
    )
    r = r.assign(method=r["label"])
    g = r.groupby(["model", "benchmark", "method", "keep", "depth_bin", "length"])["score"]
    return g.agg(score="mean", n="size").reset_index()[cols]


def needle_heatmap(rows: pd.DataFrame, path: Path) -> Path | None:
    """Mean score by needle depth (the needle's position in the context, binned) x context
    length for the NIAH tasks, one panel per method and keep rate; each cell prints its
    score and n. ``rows``: eval rows with a ``needle_depth`` column and ``method`` labels."""
    cells = needle_grid(rows)
    if cells.empty:
        return None
    cell_groups = list(cells.groupby(["model", "benchmark", "method", "keep"]))
    rows_n = int(np.ceil(len(cell_groups) / 4))
    cols_n = int(np.ceil(len(cell_groups) / rows_n))
    fig, axes = panels(len(cell_groups), 4.8, 4.2, rows=rows_n)
    lengths = sorted(set(cells["length"]))
    image = None
    for k, (ax, ((model, bench, method, keep), g)) in enumerate(zip(axes, cell_groups, strict=False)):
        grid = np.full((len(DEPTH_BINS) - 1, len(lengths)), np.nan)
        counts = np.zeros_like(grid, dtype=int)
        for c in g.itertuples():
            grid[int(c.depth_bin), lengths.index(int(c.length))] = c.score
            counts[int(c.depth_bin), lengths.index(int(c.length))] = c.n
        image = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="upper")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if counts[i, j]:
                    ax.text(j, i, f"{grid[i, j]:.0f}\nn={counts[i, j]}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [f"{x // 1024}K" if x >= 1024 else str(x) for x in lengths])
        ax.set_yticks(range(len(DEPTH_BINS) - 1),
                      [f"{a:.0%}-{b:.0%}" for a, b in itertools.pairwise(DEPTH_BINS)])  # fmt: skip
        ax.set_xlabel("context length")
        if k % cols_n == 0:
            ax.set_ylabel("needle depth in the context")
        label = method if keep >= 1.0 else f"{method} keep {keep:g}"
        ax.set_title(f"{model} · {bench}\n{label} (NIAH tasks)", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=list(axes[: len(cell_groups)]), shrink=0.8, label="score")
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def latency_vs_keep(lat: pd.DataFrame, path: Path) -> Path | None:
    """Measured TTFT speedup over the reference (95 % interval) and the FLOP model's ideal
    (dashed) vs keep rate, per grid point and method."""
    lines = lat[~lat["is_reference"].astype(bool)].dropna(subset=["speedup"])
    if lines.empty:
        return None
    fig, axes = panels(1, 6.5)
    ax = axes[0]
    for (method, b, n), g in lines.groupby(["method", "batch", "length"]):
        _speedup_curve(ax, g.sort_values("keep_rate"), "keep_rate", f"{method} {b}x{n}", f"ideal {b}x{n}")
    ax.set_xlabel("keep rate")
    return _finish_speedup(fig, ax, lines, path)


def _speedup_curve(ax: Any, g: pd.DataFrame, x: str, label: str, ideal_label: str) -> str:
    """One line's measured speedup (95 % interval) against ``x``, its FLOP ideal dashed in the
    same colour; returns the colour."""
    line = ax.errorbar(g[x], g["speedup"], yerr=_yerr(g["speedup"], g["speedup_lo"], g["speedup_hi"]), fmt="o-",
                       capsize=3, label=label)  # fmt: skip
    color = str(line[0].get_color())
    if g["ideal_speedup"].notna().any():
        ax.plot(g[x], g["ideal_speedup"], ls="--", color=color, label=ideal_label)
    return color


def _finish_speedup(fig: Any, ax: Any, lines: pd.DataFrame, path: Path) -> Path | None:
    """A speedup figure's common frame: the 1.0 line, the reference, the model and the
    iterations per point; saved to ``path``."""
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel(f"TTFT speedup over {lines['reference'].iloc[0]}")
    ax.set_title(f"{lines['model'].iloc[0]} ({', '.join(sorted(set(lines['backend'])))}) · "
                 f"{_n_range(lines['n'])} timed iterations per point", fontsize=9)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def speedup_vs_length(lat: pd.DataFrame, path: Path) -> Path | None:
    """Measured TTFT speedup over the reference (95 % interval) and the FLOP model's ideal
    (dashed) vs prompt length (log2 axis), one line per method and keep, each break-even
    length (:func:`harness.analysis.speed.break_even`: its interval first above 1) marked
    with a dotted vertical. Drawn where a line has two lengths or more."""
    from harness.analysis.speed import BREAK_EVEN_LINE, break_even

    lines = lat[~lat["is_reference"].astype(bool)].dropna(subset=["speedup"])
    lines = lines[lines.groupby(BREAK_EVEN_LINE, dropna=False)["length"].transform("nunique") >= 2]
    if lines.empty:
        return None
    be = break_even(lat).drop_duplicates(BREAK_EVEN_LINE, keep=False).set_index(BREAK_EVEN_LINE)  # one per line
    fig, axes = panels(1, 6.5)
    ax = axes[0]
    for key, g in lines.groupby(BREAK_EVEN_LINE, dropna=False):
        label = f"{key[4]}" + ("" if pd.isna(key[5]) else f" keep {float(key[5]):g}")
        color = _speedup_curve(ax, g.sort_values("length"), "length", label, f"ideal {label}")
        at = be["break_even_tokens"].get(key, float("nan")) if key in be.index else float("nan")
        if pd.notna(at):
            ax.axvline(float(at), ls=":", color=color, lw=1.0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt length (tokens; dotted: break-even, the interval first above 1)")
    return _finish_speedup(fig, ax, lines, path)


def latency_grid(lat: pd.DataFrame, path: Path) -> Path | None:
    """TTFT vs prompt length, one panel per batch size (the paper's batch x length grid):
    the median over timed iterations with the p90 as the upper whisker, one line per method
    and keep rate, the reference in black, and each method's ideal TTFT (the reference's
    median / the FLOP model's ideal speedup) dashed."""
    s = lat.dropna(subset=["ttft_median_s"])
    if s.empty:
        return None
    batches = sorted(set(s["batch"].astype(int)))
    fig, axes = panels(len(batches), 5.0)
    for ax, b in zip(axes, batches, strict=False):
        g = s[s["batch"] == b]
        for (method, keep, is_ref), gm in g.groupby(["method", "keep_rate", "is_reference"], dropna=False):
            gm = gm.sort_values("length")
            up = (gm["ttft_p90_s"] - gm["ttft_median_s"]).clip(lower=0).to_numpy(dtype=float)
            label = str(method) if is_ref else f"{method} keep {keep:g}"
            line = ax.errorbar(gm["length"], gm["ttft_median_s"], yerr=np.vstack([np.zeros_like(up), up]),
                               fmt="o-", capsize=3, color="black" if is_ref else None, lw=2 if is_ref else 1.2,
                               label=label)  # fmt: skip
            if not is_ref and gm["ideal_ttft_s"].notna().any():
                ax.plot(gm["length"], gm["ideal_ttft_s"].to_numpy(dtype=float), ls="--", lw=1, marker="_",
                        ms=16, mew=2, color=line[0].get_color(), label=f"ideal, keep {keep:g}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(pyplot().matplotlib.ticker.FormatStrFormatter("%.3g"))
        ax.yaxis.set_minor_formatter(pyplot().matplotlib.ticker.FormatStrFormatter("%.3g"))
        lengths = sorted(set(g["length"].astype(int)))
        ax.set_xticks(lengths, [f"{x // 1024}K" if x >= 1024 else str(x) for x in lengths])
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("TTFT (s): median, whisker to p90")
        ax.set_title(f"batch {b} · {_n_range(g['n'])} timed iterations per point", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(f"{s['model'].iloc[0]} ({', '.join(sorted(set(s['backend'])))})", fontsize=10)
    return _save(fig, path)


def qps_curves(rates: pd.DataFrame, path: Path) -> Path | None:
    """Per model and benchmark, two panels. Left: TTFT p90 vs request rate, one line per
    serving run (method and keep rate); a filled marker is a rate that passed both rules
    (timeouts and the TTFT SLO), a cross one that failed; the dashed line is the run's TTFT
    p90 SLO (``ttft_p90_slo_s`` column). Right: the throughput delivered against the rate
    offered, the diagonal where a server keeps up; a hollow marker is a rate whose queue
    grew during its burst (``queue_grows``), whether or not the rate passed."""
    if rates.empty:
        return None
    groups = list(rates.groupby(["model", "benchmark", "length"], dropna=False))
    fig, axes = panels(2 * len(groups), 6.5)
    for i, ((model, bench, length), g) in enumerate(groups):
        ax, thru = axes[2 * i], axes[2 * i + 1]
        for (method, keep, _run), gm in g.groupby(["method", "keep_rate", "run_id"], dropna=False):
            gm = gm.sort_values("rate")
            label = str(method) if gm["is_reference"].all() else f"{method} keep {keep:g}"
            line = ax.plot(gm["rate"], gm["ttft_p90_s"], "-", label=f"{label} ({_n_range(gm['requests'])} req/rate)")
            color = line[0].get_color()
            ok = gm["passed"].astype(bool)
            ax.plot(gm.loc[ok, "rate"], gm.loc[ok, "ttft_p90_s"], "o", color=color)
            ax.plot(gm.loc[~ok, "rate"], gm.loc[~ok, "ttft_p90_s"].fillna(0), "x", ms=9, mew=2, color=color)
            grew = gm["queue_grows"].eq(True) if "queue_grows" in gm else pd.Series(False, index=gm.index)
            thru.plot(gm["rate"], gm["request_throughput"], "-", color=color, label=label)
            thru.plot(gm.loc[~grew, "rate"], gm.loc[~grew, "request_throughput"], "o", color=color)
            thru.plot(gm.loc[grew, "rate"], gm.loc[grew, "request_throughput"], "o", mfc="white", color=color)
        top = float(g["rate"].max())
        thru.plot([0, top], [0, top], ":", color="grey", lw=1, label="keeps up (delivered = offered)")
        thru.plot([], [], "o", mfc="white", color="grey", label="queue grew during the burst")
        thru.set_xlabel("request rate offered (req/s)")
        thru.set_ylabel("requests delivered per second")
        thru.set_title(f"{model} · {bench} {length}: throughput", fontsize=9)
        thru.grid(alpha=0.3)
        thru.legend(fontsize=7)
        for slo in sorted(set(g["ttft_p90_slo_s"].dropna())) if "ttft_p90_slo_s" in g else []:
            ax.axhline(slo, ls="--", color="red", lw=1, label=f"TTFT p90 SLO {slo:g} s")
        ax.plot([], [], "o", color="grey", label="rate passed")
        ax.plot([], [], "x", color="grey", mew=2, label="rate failed (timeouts or SLO)")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("TTFT p90 (s)")
        ax.set_title(f"{model} · {bench} {length}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def pareto_costs(summary: pd.DataFrame, path: Path) -> Path | None:
    """Quality retention against the two costs a KV press and a prompt compressor trade
    differently, over all tasks: the KV cache the base holds after the prefill (fraction of
    the prompt's, ``kv_fraction``; the reference at 1.0) and the end-to-end speedup (TTFT +
    decode at the benchmark's output length, ``e2e_speedup``). One point per method and
    keep rate, 95 % intervals where the measure has one. None where no row records its KV
    cache (rows written before it was recorded)."""
    s = _quality_points(summary)
    s = s[(s["task"] == "ALL") & (s["method_name"] != s["reference"])].dropna(subset=["retention", "kv_fraction"])
    if s.empty:
        return None
    fig, axes = panels(2, width=5.6, height=4.4)
    for ax, x, lo, hi, label, ref_x in (
        (axes[0], "kv_fraction", None, None, "KV cache after the prefill (fraction of the prompt's)", 1.0),
        (axes[1], "e2e_speedup", "e2e_speedup_lo", "e2e_speedup_hi", "end-to-end speedup (TTFT + decode)", 1.0),
    ):
        for method, gm in sorted(s.groupby("method"), key=lambda m: natural_key(m[0])):
            gm = gm.sort_values("keep_rate").dropna(subset=[x])
            if gm.empty:
                continue
            xerr = _yerr(gm[x], gm[lo], gm[hi]) if lo else None
            line = ax.errorbar(gm[x], gm["retention"], xerr=xerr,
                               yerr=_yerr(gm["retention"], gm["retention_lo"], gm["retention_hi"]),
                               fmt="o-", capsize=3, label=str(method))  # fmt: skip
            for xv, y, k in zip(gm[x], gm["retention"], gm["keep_rate"], strict=True):
                ax.annotate(f"{k:g}", (xv, y), textcoords="offset points", xytext=(5, 5), fontsize=7,
                            color=line[0].get_color())  # fmt: skip
        ax.plot([ref_x], [1.0], marker="*", ms=12, color="black", ls="none", label=f"{s['reference'].iloc[0]}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("retention (score / reference's)")
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{s['model'].iloc[0]} · {s['benchmark'].iloc[0]} · ALL · {_n_range(s['n'])}", fontsize=9)
    axes[1].legend(fontsize=7)
    return _save(fig, path)


def turn_points(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's per-turn rows of a multi-turn benchmark (tasks ``<task>/turn<k>``,
    :func:`harness.analysis.rows.normalize`), with the turn as a column."""
    s = summary[summary["task"].str.contains("/turn", regex=False)].copy()
    s["turn"] = s["task"].str.rsplit("/turn", n=1).str[1].astype(int)
    return s


def by_turn(summary: pd.DataFrame, path: Path) -> Path | None:
    """A conversation, turn by turn, one line per method (its multi-turn policy): the score
    (95 % intervals), the TTFT of the turn (the method's own work and the base's prefill of
    that turn) and the KV memory held after the turn's prefill against full prefill's same
    turn (``kv_memory_ratio``: the base's cache plus any the method keeps beside it, KV
    revival's speculator cache; the token share ``kv_fraction`` where rows lack the bytes);
    one line per method and keep rate (the lowest keep solid, others dashed). None without
    multi-turn rows."""
    s = turn_points(summary)
    if s.empty:
        return None
    fig, axes = panels(3, width=4.8, height=4.0)
    has_bytes = "kv_memory_ratio" in s and s["kv_memory_ratio"].notna().any()
    memory = "kv_memory_ratio" if has_bytes else "kv_fraction"
    if has_bytes:  # the reference holds what it holds: 1.0 by definition
        s = s.assign(kv_memory_ratio=s["kv_memory_ratio"].where(s["method_name"] != s["reference"], 1.0))
    lowest = s.loc[s["method_name"] != s["reference"], "keep_rate"].min()
    lines = s.groupby(["method", "keep_rate"])
    for (method, keep), g in sorted(lines, key=lambda m: (natural_key(m[0][0]), m[0][1])):
        g = g.sort_values("turn")
        ref = g["method_name"].iloc[0] == g["reference"].iloc[0]
        name = str(method) if ref else f"{method} keep {keep:g}"
        style = "o-" if ref or keep == lowest else "s--"
        line = axes[0].errorbar(g["turn"], g["score"], yerr=_yerr(g["score"], g["score_lo"], g["score_hi"]),
                                fmt=style, capsize=3, label=name)  # fmt: skip
        color = line[0].get_color()
        axes[1].plot(g["turn"], g["ttft_s"], style, color=color, label=name)
        axes[2].plot(g["turn"], g[memory], style, color=color, label=name)
    kv_label = (
        "KV memory held / full prefill's (both caches)"
        if memory == "kv_memory_ratio"
        else "KV held / conversation (tokens)"
    )
    for ax, label in zip(axes, ("score (0-100)", "TTFT of the turn (s)", kv_label), strict=True):
        ax.set_xlabel("turn")
        ax.set_ylabel(label)
        ax.set_xticks(sorted(s["turn"].unique()))
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].set_title(f"{s['model'].iloc[0]} · {s['benchmark'].iloc[0]}-{s['length'].iloc[0]} · {_n_range(s['n'])}",
                      fontsize=9)  # fmt: skip
    axes[0].legend(fontsize=7)
    return _save(fig, path)


def draw_all(a: Analysis, figs: Path) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """Every figure of a folder's analysis under ``figs``: (the drawn ones as (title,
    path); the ones left out as (title, why), for the page to say)."""
    out: list[tuple[str, Path | None, str | None]] = []
    s, lat, rates = a.summary, a.latency, a.qps_rates
    if not s.empty:
        ev = a.rows[a.rows["kind"] == "eval"]
        out += [
            ("Quality vs speed: retention vs TTFT speedup, over all tasks and per task", pareto(s, figs / "pareto.png"),
             pareto_dropped(s)),
            ("Quality vs KV memory and end-to-end latency", pareto_costs(s, figs / "pareto_costs.png"), None),
            ("Score vs keep rate", score_vs_keep(s, figs / "score_vs_keep.png"), None),
            ("Needle tokens kept vs keep rate", needle_vs_keep(s, figs / "needle_vs_keep.png"), None),
            ("Score vs context length", score_vs_length(s, figs / "score_vs_length.png"), None),
            ("NIAH: score by needle depth and context length", needle_heatmap(ev, figs / "needle_heatmap.png"),
             None),
            ("Conversations: score, TTFT and KV held by turn", by_turn(s, figs / "by_turn.png"), None),
        ]  # fmt: skip
    if not lat.empty:
        out += [
            ("TTFT speedup vs keep rate", latency_vs_keep(lat, figs / "latency.png"), None),
            (
                "TTFT speedup vs prompt length (break-even)",
                speedup_vs_length(lat, figs / "speedup_vs_length.png"),
                None,
            ),
            ("TTFT over the batch x length grid", latency_grid(lat, figs / "latency_grid.png"), None),
        ]
    if not rates.empty:
        out.append(("Serving: TTFT p90 vs request rate", qps_curves(rates, figs / "qps.png"), None))
    drawn = [(t, p) for t, p, _ in out if p is not None]
    dropped = [(t, why) for t, p, why in out if p is None and why]
    return drawn, dropped
