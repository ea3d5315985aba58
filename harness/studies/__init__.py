"""Studies of the harness itself (not the datasets: those are :mod:`harness.benchmarks`): the GPU
check, the speculator-depth sweep, scoring memory, RULER generation, front throughput and the
lm-eval cross-check; their figures go to ``results/reference/``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def options_of(options: Any) -> dict[str, Any]:
    """A row's method options as a dict: the store's JSON text, or a mapping already parsed;
    none (None, or NaN in a frame whose rows lack the column) is an empty dict."""
    if isinstance(options, float) and options != options:
        return {}
    return json.loads(options) if isinstance(options, str) else dict(options or {})


#: A sample of a study's eval rows: what two lines are paired by.
SAMPLE = ["task", "sample_id"]
#: The scope of a difference over all of a line's tasks (weighted equally).
ALL = "ALL"


def paired_scores(cand: Any, base: Any, scope: str, column: str = "score", means: bool = False) -> dict[str, Any]:
    """``cand``'s ``column`` (the score, 0-100, by default) minus ``base``'s on the samples both
    ran (eval rows of two lines of a study; ``scope``: one task, or :data:`ALL` of the tasks both
    ran, weighted equally): the difference with its 95 % interval
    (:func:`harness.analysis.quality.paired_difference`), the samples paired (both with a value)
    and how many ``cand`` won and lost; ``means``: with each side's mean over those samples too
    (``line_mean``, ``base_mean``)."""
    from harness.analysis.quality import Point, paired_difference

    tasks = sorted(set(cand["task"]) & set(base["task"]))
    parts = [tasks] if scope == ALL else [[scope]]
    diff, base_mean, cand_mean = paired_difference(Point(cand), Point(base), column, parts)
    c, b = (f if scope == ALL else f[f["task"] == scope] for f in (cand, base))
    c = c[c["task"].isin(tasks)].drop_duplicates(SAMPLE).set_index(SAMPLE)[column].astype(float)
    b = b.drop_duplicates(SAMPLE).set_index(SAMPLE)[column].astype(float)
    both = c.to_frame("c").join(b.rename("b"), how="inner").dropna()
    out = {"difference": diff.value, "lo": diff.lo, "hi": diff.hi, "n": len(both),
           "wins": int((both["c"] > both["b"]).sum()), "losses": int((both["c"] < both["b"]).sum())}  # fmt: skip
    return {**out, "line_mean": cand_mean, "base_mean": base_mean} if means else out


def varying(*frames: Any) -> list[str]:
    """The setup columns (model, length, budget) with more than one value across ``frames`` (a
    study's tables): the tables print them only then (one run of a study has one of each; full
    prefill's budget, none, does not count)."""

    def values(c: str) -> set[Any]:
        return {v for f in frames if c in f for v in f[c] if not (isinstance(v, float) and v != v)}

    return [c for c in ("model", "length", "budget") if len(values(c)) > 1]


def cell(r: Any, c: str) -> str:
    """A setup column of a table line as text (``-`` for none; a budget as a whole number)."""
    v = getattr(r, c)
    return "-" if isinstance(v, float) and v != v else f"{int(v)}" if c == "budget" else str(v)


def head_cells(setup: list[str]) -> str:
    """The setup columns' header cells (:func:`varying`)."""
    return "".join(f"| {'budget N' if c == 'budget' else c} " for c in setup)


def difference_tables(diff: Any, setup: list[str], word: str, names: Any) -> list[str]:
    """A study's paired score differences (:func:`paired_scores` rows, ``task`` :data:`ALL` or
    one task) as markdown: the over-all-tasks table, then the per-task one where there is one;
    ``word`` names a line (``method``, ``line``), ``names(r)`` gives a row's line and baseline."""
    from harness.rendering.tables import difference

    lines: list[str] = []
    if diff.empty:
        return lines
    for scope, title, note in (
        (diff["task"] == ALL, "", "tasks weighted equally"),
        (diff["task"] != ALL, "| task ", "one task's samples"),
    ):
        part = diff[scope]
        if part.empty:  # per-task lines exist only where a budget has several tasks
            continue
        h = head_cells(setup) + title + f"| {word} | against | score difference [95 %] | samples | wins / losses |"
        lines += ["", h, "|---" * (h.count("|") - 1) + "|"]
        for r in part.itertuples():
            line, against = names(r)
            lines.append("".join(f"| {cell(r, c)} " for c in setup) + (f"| {r.task} " if title else "") +
                         f"| {line} | {against} | {difference(r.difference, r.lo, r.hi)} | {r.n} | "
                         f"{r.wins} / {r.losses} |")  # fmt: skip
        lines += ["", f"Paired by sample: the {word}'s score minus the baseline's at the same budget (0-100 "
                  f"points), {note}, 95 % bootstrap."]  # fmt: skip
    return lines


def first_conflict(d: Any, keys: list[str], column: str) -> tuple[dict[str, Any], int] | None:
    """The first group of ``d`` by ``keys`` holding more than one value of ``column`` (two
    variants of what a study pairs as one line), with the most values any group holds; None
    where every group holds one: a study's refusal names it."""
    n = d.groupby(keys, dropna=False)[column].nunique()
    if not (n > 1).any():
        return None
    return dict(zip(keys, n[n > 1].index[0], strict=True)), int(n.max())


#: A benchmark's identity keys in ``benchmark_options``, not options a user set.
_BENCH_IDENTITY = ("name", "version", "length")


def bench_label(options: Any) -> str:
    """A row's benchmark options as a study's tables print them: ``vt_hops=8``; ``-`` where it
    ran at the benchmark's own settings."""
    opts = {k: v for k, v in options_of(options).items() if k not in _BENCH_IDENTITY}
    return ", ".join(f"{k}={v}" for k, v in sorted(opts.items())) or "-"


def labelled(rows: Any) -> Any:
    """``rows`` (a frame) with their benchmark options as a study's tables print them
    (:func:`bench_label`; ``-`` where the rows record none): one label per option set, so
    grouping by it groups by the options."""
    opts = rows["benchmark_options"] if "benchmark_options" in rows else [None] * len(rows)
    return rows.assign(benchmark_options=[bench_label(o) for o in opts])


def one_benchmark_setting(rows: Any, study: str) -> None:
    """Refuse, in one line, a study folder whose rows of one model, benchmark and length ran at
    two settings of the benchmark (vt at two chain lengths): sample 0 of one is not sample 0 of
    the other, and a study that pairs or pools by sample would mix them."""
    keys = [c for c in ("model", "benchmark", "length") if c in rows]
    if rows.empty or "benchmark_options" not in rows:
        return
    conflict = first_conflict(rows, keys, "benchmark_options")
    if conflict:
        where, most = conflict
        found = sorted({bench_label(o) for o in rows["benchmark_options"]})
        raise ValueError(
            f"{study}: rows of {where.get('model')} at length {where.get('length')} ran at {most} settings of the "
            f"benchmark ({found}); allowed: one per folder (run the other into another --out)"
        )


def run_job(cmd: list[str]) -> None:
    """Run one harness job of a study. A job that refuses (its one-line message already on
    stderr) or fails ends the study with the job's exit status, not a second traceback."""
    import subprocess

    done = subprocess.run(cmd)
    if done.returncode:
        raise SystemExit(done.returncode)


def require_runs(
    ap: Any,
    *folders: Path,
    flag: str = "--no-run",
    allowed: str = "the --out of a run of this study (or drop --no-run)",
) -> None:
    """``--no-run`` (or what ``flag`` names): each of ``folders`` must hold a run's rows (a run
    folder with its ``config.yaml``), else one line through ``ap.error`` naming the folder (not
    a traceback from the first reader)."""
    from harness.store import run_folders

    for f in folders:
        if not f.is_dir() or not run_folders(f):
            ap.error(f"{flag}: no run's rows under {f}; allowed: {allowed}")


def require_values(ap: Any, flag: str, values: list[Any], ok: Any, allowed: str) -> None:
    """Each of a flag's ``values`` must pass ``ok``, else one line naming the value and what
    is allowed, before any job starts."""
    for v in values:
        if not ok(v):
            ap.error(f"{flag} {v}: allowed: {allowed}")


#: A file name a study may write into its folder: letters, digits, ``_ . -``, not starting with
#: ``.`` or ``-`` (no folder, no ``..``, no hidden file).
FILE_NAME = re.compile(r"\w[\w.-]*")
FILE_NAME_ALLOWED = "a file name: letters, digits, _ . - (no folder; not starting with . or -), such as gaps_1024"


def require_file_name(ap: Any, flag: str, name: str) -> None:
    """``flag``'s value names files the study writes into its folder (``<name>.md`` /
    ``.csv``): one check for every study that takes one, else one line naming the value."""
    require_values(ap, flag, [name], lambda n: FILE_NAME.fullmatch(n) is not None, FILE_NAME_ALLOWED)


#: Rows of one setup share their samples' prompts: only they are paired by sample (the
#: benchmark's options too: vt at another chain length has other prompts under the same ids).
PAIRED_SETUP = ["model", "benchmark", "benchmark_options", "length"]


def setup_title(setup: tuple[Any, ...], samples: str | None = None) -> str:
    """A paired table's heading for one setup (its :data:`PAIRED_SETUP` values, benchmark options
    labelled: ``-`` where none): model, benchmark, length, the option in brackets, and the
    ``--samples`` read (None: all)."""
    title = ", ".join(f"{k} {v}" for k, v in zip(PAIRED_SETUP, setup, strict=True) if k != "benchmark_options")
    option = setup[PAIRED_SETUP.index("benchmark_options")]
    title += "" if option == "-" else f" ({option})"
    return title + (f", samples {samples} only" if samples else "")


def sample_range(text: str) -> tuple[int, int | None]:
    """``"15-44"`` -> (15, 44), ``"15-"`` -> (15, None): sample ids, both ends included (a
    study's ``--samples``); else a ValueError naming the value and the forms allowed."""
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), (int(last) if last else None)
    except ValueError:
        lo, hi = -1, None
    if not sep or lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"--samples {text!r}: allowed: FIRST-LAST or FIRST- (sample ids, FIRST <= LAST), e.g. 15-44")
    return lo, hi


def require_samples(ap: Any, text: str | None) -> tuple[int, int | None] | None:
    """A study's ``--samples`` as :func:`sample_range` reads it (None where not given); a bad
    value refused through ``ap.error`` in one line naming it and the forms allowed."""
    try:
        return sample_range(text) if text else None
    except ValueError as e:
        ap.error(str(e))
        raise  # ap.error exits; for the type checker


def in_samples(rows: Any, samples: tuple[int, int | None]) -> Any:
    """The rows whose ``sample_id`` lies in ``samples`` (:func:`sample_range`'s pair, both ends
    included; an open end: every id from the first)."""
    lo, hi = samples
    return rows[rows["sample_id"].between(lo, float("inf") if hi is None else hi)]


def write_reference(path: Path, benchmark: str, rows: list[dict[str, Any]], **meta: Any) -> None:
    """Write one benchmark's rows with the commit (``-dirty`` when tracked files differed from it),
    hardware and library versions they were measured at, as every row of a run records them."""
    from harness.provenance import (  # deferred: gpu_check imports this package on the GPU machine (torch, transformers, pandas only)
        git_sha,
        hardware,
        versions,
    )

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        **meta,
        "git_sha": git_sha(),
        "hardware": hardware(),
        "versions": versions(),
        "rows": rows,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
