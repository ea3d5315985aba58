"""Study: what a draft-based method's look-ahead buys and what it costs, at one token budget.

SpecPrefill (Liu et al., ICML 2025) scores the prompt's tokens by the attention of the
speculator's queries: with look-ahead L, those of the last prompt token and of L - 1 tokens the
speculator decodes after it. The paper's tables use L = 1 ("full") and report L = 8
("full_lah8") beside it; the official code's default is 8. Each extra step is one decode step
of the speculator, so look-ahead moves quality and TTFT together, and a deployer picks a point
on that line. SpecPC (Galim et al., arXiv 2506.08373) scores by the attention of the prompt's
last 64 tokens, and its ``lookahead_tokens`` adds its draft's decode steps the same way (1 in
the authors' SpecPC configs, 20 in SpecKV-PC's): ``--methods specprefill specpc`` varies both,
and asks whether a window of queries makes looking ahead unnecessary.

The base and its speculator are a model config's pair (default: Qwen2.5-Coder-1.5B with its
0.5B sibling), RULER at ``--length`` on ``--tasks`` (variable tracking, ``vt``, included: a
chained task, where one look-ahead token scores the prompt mostly from the question, which
names only the chain's last value), ``--limit`` samples each. Every line keeps the same budget
of ``--keep-tokens`` N tokens of each prompt, and differs from its method's smallest of
``--lookaheads`` (the baseline, 1 by default) in the look-ahead alone.

Quality: one ``make eval`` run per method and look-ahead on the same samples, full prefill
beside them: score and retention against full prefill with 95 % intervals, the needle kept;
each look-ahead (and full prefill) against its method's baseline by paired score differences
on the same samples, over all tasks and per task, and with several methods each against
SpecPrefill at the same look-ahead (:func:`differences`). Speed: one ``make latency`` job
timing every line beside full prefill in the same iterations (paired, order-balanced:
``also`` with ``{name: specprefill, lookahead: L}`` and ``{name: specpc, lookahead_tokens: L}``
entries), on ``--latency-task``'s prompts at ``--length``: each line's TTFT speedup over full
prefill with its interval, the FLOP model's ideal, the draft's own time, and its TTFT over its
baseline's, paired by iteration (:func:`cost`). A figure: retention against the side-by-side
speedup, one point per look-ahead.

One ``--out`` may hold the study at several budgets, lengths or models: every line and pair is
one setup's and one budget's, and full prefill pairs with each budget of its setup. Rows of
one method whose other options differ (pooling, chunks: an ablation in the same folder) are
refused in one line (:func:`one_setting`); rows of other methods are left out.

    python -m harness.studies.lookahead [--model qwen2.5-coder-1.5b] [--length 2048]
        [--tasks niah_single_2 niah_multikey_1 vt qa_1] [--limit 15] [--keep-tokens 256]
        [--lookaheads 1 2 4 8] [--methods specprefill [specpc]] [--iters 10]
        [--out results/lookahead] [--no-latency] [--no-run] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from baselines.specpc import GENERATE_DEFAULT
from harness.analysis.folder import Analysis, analyze
from harness.analysis.speed import paired_ttft_ratio
from harness.rendering.tables import ci, difference, num
from harness.studies import (
    ALL,
    cell,
    difference_tables,
    first_conflict,
    head_cells,
    one_benchmark_setting,
    options_of,
    paired_scores,
    require_runs,
    require_values,
    run_job,
    varying,
)

TASKS = ["niah_single_2", "niah_multikey_1", "vt", "qa_1"]
LOOKAHEADS = [1, 2, 4, 8]
METHOD = "specprefill"
#: The draft-based methods whose look-ahead the study varies (``--methods``), each with the option
#: that sets it. With look-ahead L both score the prompt by the queries of the prompt's end (its
#: last token; SpecPC: its last ``window_size`` tokens) and of the L - 1 tokens the draft decodes
#: after it: SpecPC's ``lookahead_tokens`` counts the tokens its draft's ``generate`` writes, the
#: last of which is never fed back, so L - 1 decode steps as for SpecPrefill's ``lookahead``.
LOOKAHEAD_OPTION = {"specprefill": "lookahead", "specpc": "lookahead_tokens"}
#: A line's method as the tables write it (full prefill: ``full``).
NAMES = {"full": "full prefill", "specprefill": "SpecPrefill", "specpc": "SpecPC"}
#: The order lines are listed in: full prefill, then SpecPrefill's look-aheads, then SpecPC's.
ORDER = {m: i for i, m in enumerate(NAMES)}
#: What a line shares besides its look-ahead and budget.
SETUP = ["model", "speculator", "backend", "dtype", "benchmark", "length"]
#: What the base prefilled, per sample (:mod:`harness.diagnostics`): the share of the needle's
#: tokens (on a chained task, the chain's) and of a look-alike distractor's the base kept.
KEPT = ("needle_kept", "distractor_kept")
#: The options that are the budget or the look-ahead, not a method's setting.
VARYING = ("keep_rate", "keep_tokens", *LOOKAHEAD_OPTION.values())


def budget_of(options: Any) -> float:
    """A row's budget N (``keep_tokens``); NaN for full prefill."""
    v = options_of(options).get("keep_tokens")
    return float(v) if v is not None else float("nan")


def line_of(method: str, options: Any) -> float | None:
    """A row's look-ahead: its method's look-ahead option (:data:`LOOKAHEAD_OPTION`; SpecPC's
    ``null`` is ``generate``'s default length), NaN (full prefill), None (another method: left
    out)."""
    if method == "full":
        return float("nan")
    if method not in LOOKAHEAD_OPTION:
        return None
    v = options_of(options).get(LOOKAHEAD_OPTION[method], 1)
    return float(GENERATE_DEFAULT if v is None else v)


def line_name(lookahead: float, method: str = METHOD) -> str:
    return "full prefill" if np.isnan(lookahead) else f"{NAMES[method]}, look-ahead {int(lookahead)}"


def _lines(frame: pd.DataFrame, method: str = "method") -> pd.DataFrame:
    """``frame``'s rows of this study's lines, with their ``lookahead`` (NaN: full prefill),
    ``line_method`` (``full`` for full prefill) and ``budget`` columns."""
    if frame.empty:
        return frame.assign(lookahead=pd.Series(dtype=float), line_method=pd.Series(dtype=object),
                            budget=pd.Series(dtype=float))  # fmt: skip
    ls = [line_of(m, o) for m, o in zip(frame[method], frame["method_options"], strict=True)]
    keep = [x is not None for x in ls]
    d = frame[keep]
    return d.assign(lookahead=[x for x in ls if x is not None], line_method=d[method].astype(str),
                    budget=[budget_of(o) for o in d["method_options"]])  # fmt: skip


def _ordered(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``df`` sorted by ``by``, then budget (full prefill first), method (:data:`ORDER`) and
    look-ahead."""
    o = df.assign(_order=df["line_method"].map(ORDER))
    o = o.sort_values([*by, "budget", "_order", "lookahead"], na_position="first", kind="stable")
    return o.drop(columns="_order").reset_index(drop=True)


def _setting(options: Any) -> str:
    opts = options_of(options)
    return json.dumps({k: v for k, v in opts.items() if k not in VARYING}, sort_keys=True, default=str)


def one_setting(rows: pd.DataFrame) -> None:
    """Refuse, in one line, rows of one method and setup that differ in more than the budget
    and the look-ahead (pooling, chunk size, positions: an ablation run into the study's
    ``--out``): the pairs would compare more than the look-ahead."""
    one_benchmark_setting(rows, "lookahead")
    d = _lines(rows)
    d = d[~d["lookahead"].isna()]
    if d.empty:
        return
    d = d.assign(setting=[_setting(o) for o in d["method_options"]])
    conflict = first_conflict(d, [*(c for c in SETUP if c in d), "line_method"], "setting")
    if conflict:
        where, most = conflict
        raise ValueError(
            f"lookahead: {NAMES[where['line_method']]} rows of {where.get('model')} at length {where.get('length')} "
            f"hold {most} settings of its options besides the budget and the look-ahead; allowed: one setting per "
            "method and folder (run an ablation into another --out)"
        )


def _look(method: str, lookahead: int) -> str:
    """The override or ``also`` key that sets ``method``'s look-ahead on a job's command line."""
    return f"lookahead={lookahead}" if method == METHOD else f"method.{LOOKAHEAD_OPTION[method]}={lookahead}"


def eval_commands(
    out: Path, model: str, length: int, tasks: list[str], limit: int, keep_tokens: int, lookaheads: list[int],
    methods: tuple[str, ...] = (METHOD,),
) -> list[list[str]]:  # fmt: skip
    """One ``make eval`` job for full prefill, then one per method and look-ahead at the budget."""
    common = [sys.executable, "-m", "harness.jobs.eval", f"model={model}", "benchmark=ruler", f"length={length}",
              f"tasks=[{','.join(tasks)}]", f"limit={limit}", f"out={out}"]  # fmt: skip
    return [[*common, "method=full"]] + [
        [*common, f"method={m}", f"keep_tokens={keep_tokens}", _look(m, la)] for m in methods for la in lookaheads
    ]


def latency_command(
    out: Path, model: str, length: int, task: str, keep_tokens: int, iters: int, decode_tokens: int,
    lookaheads: list[int], methods: tuple[str, ...] = (METHOD,),
) -> list[str]:  # fmt: skip
    """Every method's look-aheads timed beside full prefill in the same iterations: the first
    method's smallest look-ahead as the job's method, every other line an ``also`` entry naming
    its method and look-ahead."""
    first, *rest = sorted(lookaheads)
    lead, *others = methods
    entries = [(lead, la) for la in rest] + [(m, la) for m in others for la in sorted(lookaheads)]
    also = [f"also=[{','.join(f'{{name:{m},{LOOKAHEAD_OPTION[m]}:{la}}}' for m, la in entries)}]"] if entries else []
    return [sys.executable, "-m", "harness.jobs.latency", f"model={model}", f"grid=[[1,{length}]]", "warmup=1",
            f"iters={iters}", "prompts=benchmark", f"prompt_task={task}", f"method={lead}", _look(lead, first),
            f"keep_tokens={keep_tokens}", *also, f"decode_tokens={decode_tokens}", f"out={out}"]  # fmt: skip


def run(a: argparse.Namespace, dry_run: bool = False) -> None:
    extra = ["dry_run=true"] if dry_run else []
    methods = tuple(a.methods)
    for cmd in eval_commands(a.out, a.model, a.length, a.tasks, a.limit, a.keep_tokens, a.lookaheads, methods):
        run_job([*cmd, *extra])
    if not a.no_latency:
        run_job([*latency_command(a.out / "latency", a.model, a.length, a.latency_task, a.keep_tokens, a.iters,
                                  a.decode_tokens, a.lookaheads, methods), *extra])  # fmt: skip


#: What tells a table's lines apart within a setup: the budget, the method and the look-ahead.
LINE = ["budget", "line_method", "lookahead"]


def quality(a: Analysis) -> pd.DataFrame:
    """One line per setup, budget, method and look-ahead (full prefill: no budget, no
    look-ahead): the summary's over-all-tasks row."""
    s = a.summary
    s = _lines(s[s["task"] == ALL], "method_name")
    # no eval timings: each look-ahead's eval ran on its own, minutes apart (the cost is the
    # latency job's, side by side)
    cols = ("n", "score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi", "needle_kept",
            "kept_fraction")  # fmt: skip
    line = {**{c: s[c] for c in SETUP if c in s}, **{c: s[c] for c in LINE}}
    return pd.DataFrame({**line, **{c: s[c] for c in cols}}).reset_index(drop=True)


def per_task(a: Analysis) -> pd.DataFrame:
    """One line per setup, budget, method, look-ahead and task: the score and the needle kept
    (on a chained task, the share of the chain's tokens the base prefilled)."""
    s = a.summary
    s = _lines(s[s["task"] != ALL], "method_name")
    line = {**{c: s[c] for c in SETUP if c in s}, **{c: s[c] for c in LINE}}
    return pd.DataFrame({**line, **{c: s[c] for c in ("task", "n", "score", "needle_kept")}}).reset_index(drop=True)


def speed(a: Analysis) -> pd.DataFrame:
    """One line per model, length, budget, method and look-ahead timed beside full prefill: the
    side-by-side TTFT speedup with its interval, the FLOP model's ideal, the draft's own time
    (the latest job's where one was timed twice)."""
    s = a.latency
    keys = ["model", "length", *LINE]
    if s.empty:
        return pd.DataFrame(columns=keys)
    s = _lines(s[~s["is_reference"].astype(bool)], "method_name")
    s = s[~s["lookahead"].isna()]
    cols = ("speedup", "speedup_lo", "speedup_hi", "ideal_speedup", "efficiency", "method_median_s", "aa_speedup",
            "comparable")  # fmt: skip
    return (
        pd.DataFrame({**{k: s[k] for k in keys}, **{f"lat_{c}": s[c] for c in cols if c in s}})
        .drop_duplicates(keys, keep="last")
        .reset_index(drop=True)
    )


def cost(a: Analysis) -> pd.DataFrame:
    """Each look-ahead's TTFT over the baseline's (its method's smallest look-ahead timed in the
    same job), paired by iteration within a run as the speedup is
    (:func:`harness.analysis.speed.paired_ttft_ratio`): above 1, slower than the baseline."""
    d = _lines(a.ok("latency"))
    out = []
    d = d[~d["lookahead"].isna() & ~d["warmup"].astype(bool)] if not d.empty else d
    for (model, length, budget, method), g in d.groupby(["model", "length", "budget", "line_method"], dropna=False):
        base_l = g["lookahead"].min()
        for la in sorted(set(g["lookahead"]) - {base_l}):
            e = paired_ttft_ratio(g[g["lookahead"] == la], g[g["lookahead"] == base_l])
            if e is not None:
                out.append({"model": model, "length": length, "budget": budget, "line_method": method,
                            "lookahead": la, "baseline": base_l, "ttft_ratio": e.value, "ttft_ratio_lo": e.lo,
                            "ttft_ratio_hi": e.hi, "pairs": e.n})  # fmt: skip
    return pd.DataFrame(out, columns=["model", "length", *LINE, "baseline", "ttft_ratio", "ttft_ratio_lo",
                                      "ttft_ratio_hi", "pairs"])  # fmt: skip


def table(a: Analysis) -> pd.DataFrame:
    """:func:`quality` with :func:`speed`'s and :func:`cost`'s columns, per setup: full prefill,
    then each budget's methods and look-aheads in order."""
    one_setting(a.ok("eval"))
    q, sp, c = quality(a), speed(a), cost(a)
    keys = ["model", "length", *LINE]
    df = q
    for part in (sp, c.drop(columns=["baseline", "pairs"])):
        if len(part):
            df = df.merge(part.astype({"length": q["length"].dtype}), on=keys, how="left")
    return _ordered(df, [c for c in ("model", "length") if c in df])  # each setup's lines together


def differences(a: Analysis) -> pd.DataFrame:
    """Per setup, budget and method, each look-ahead, and full prefill, against the baseline (the
    method's smallest look-ahead run at that budget) on the same samples, over all tasks and
    (where there are several) per task: :func:`harness.studies.paired_scores` (``measure``
    score). Where a folder holds several methods, each other method against SpecPrefill at the
    same look-ahead, the same way. Then, per task that has them, what each line's base prefilled
    against the baseline's: the needle and distractor kept (``measure`` :data:`KEPT`), in points
    of their tokens (0-100)."""
    d = a.ok("eval")
    one_setting(d)
    d = _lines(d)
    cols = [c for c in SETUP if c in d and c != "speculator"]  # full prefill has no speculator
    out = []

    def pair(c: pd.DataFrame, base: pd.DataFrame, line: dict[str, Any]) -> None:
        tasks = sorted(set(c["task"]) & set(base["task"]))
        for scope in [ALL, *tasks] if len(tasks) > 1 else [ALL]:  # one task: ALL is it
            out.append({**line, "task": scope, "measure": "score", **paired_scores(c, base, scope)})
        if np.isnan(line["lookahead"]):
            return  # full prefill keeps every token
        for measure in KEPT:  # per task, where the task has the measure (in points of its tokens)
            for task in tasks:
                has = [f[(f["task"] == task)][measure].notna().any() if measure in f else False for f in (c, base)]
                if all(has):
                    p = paired_scores(c, base, task, measure)
                    out.append({**line, "task": task, "measure": measure, **p,
                                **{k: p[k] * 100 for k in ("difference", "lo", "hi")}})  # fmt: skip

    for key, g in d.groupby(cols, sort=True, dropna=False):
        where = dict(zip(cols, key, strict=True))
        spec, full = g[~g["lookahead"].isna()], g[g["lookahead"].isna()]
        for (draft, budget), gb in spec.groupby(["speculator", "budget"], dropna=False):
            at = {m: gm for m, gm in gb.groupby("line_method")}
            for m in sorted(at, key=ORDER.__getitem__):
                gm = at[m]
                base_l = gm["lookahead"].min()
                base = gm[gm["lookahead"] == base_l]
                line = {**where, "speculator": draft, "budget": budget, "baseline": base_l, "baseline_method": m}
                for la in sorted(set(gm["lookahead"]) - {base_l}):
                    pair(gm[gm["lookahead"] == la], base, {**line, "line_method": m, "lookahead": la})
                if not full.empty:
                    pair(full, base, {**line, "line_method": "full", "lookahead": float("nan")})
            ref = at.get(METHOD)  # each other method against SpecPrefill, look-ahead by look-ahead
            if ref is None:
                continue
            for m in sorted(set(at) - {METHOD}, key=ORDER.__getitem__):
                for la in sorted(set(at[m]["lookahead"]) & set(ref["lookahead"])):
                    line = {**where, "speculator": draft, "budget": budget, "line_method": m, "lookahead": la,
                            "baseline": la, "baseline_method": METHOD}  # fmt: skip
                    pair(at[m][at[m]["lookahead"] == la], ref[ref["lookahead"] == la], line)
    return pd.DataFrame(out)


def _names(r: Any) -> tuple[str, str]:
    """A difference row's line and the line it is paired against."""
    return line_name(r.lookahead, r.line_method), line_name(r.baseline, r.baseline_method)


def _get(r: Any, c: str) -> float:
    return float(getattr(r, c, np.nan))


def markdown(df: pd.DataFrame, diff: pd.DataFrame, tasks: pd.DataFrame | None = None) -> str:
    setup = varying(df, diff)
    lead = head_cells(setup)
    head = (lead + "| line | n | score | retention vs full | needle kept | speedup, side by side | ideal | "
            "draft s | TTFT over the baseline's |")  # fmt: skip
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in df.itertuples():
        full = np.isnan(r.lookahead)
        sp = "1.00x" if full else ci(_get(r, "lat_speedup"), _get(r, "lat_speedup_lo"), _get(r, "lat_speedup_hi"),
                                     ".2f")  # fmt: skip
        ideal = 1.0 if full else _get(r, "lat_ideal_speedup")
        ratio = ci(_get(r, "ttft_ratio"), _get(r, "ttft_ratio_lo"), _get(r, "ttft_ratio_hi"), ".2f")
        base = not full and np.isnan(_get(r, "ttft_ratio")) and not np.isnan(_get(r, "lat_speedup"))
        lines.append(
            "".join(f"| {cell(r, c)} " for c in setup) +
            f"| {line_name(r.lookahead, r.line_method)} | {r.n} | {ci(r.score, r.score_lo, r.score_hi)} | "
            f"{'1' if full else ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | {num(r.needle_kept, '.2f')} | "
            f"{sp} | "
            f"{num(ideal, '.2f')}{'' if np.isnan(ideal) else 'x'} | "
            f"{'-' if full else num(_get(r, 'lat_method_median_s'), '.2f')} | "
            f"{'the baseline' if base else '-' if full else ratio + ('x' if ratio != '-' else '')} |"
        )  # fmt: skip
    lines += ["", "Score (0-100) and retention (score over full prefill's on the same samples): 95 % bootstrap over "
              "samples. Speedup: TTFT of full prefill over the line's, timed side by side in the same iterations (paired, "
              "order-balanced), 95 % interval; ideal: the FLOP model's (the draft's work included). Draft s: the "
              "speculator's time in the timed prefill (its prompt pass and look-ahead steps), median. TTFT over the "
              "baseline's: the line's TTFT over that of the smallest look-ahead, paired by iteration in the same job "
              "(above 1: slower), 95 % interval."]  # fmt: skip
    if tasks is not None and not tasks.empty:
        lines += ["", *_task_table(tasks, setup)]
    kept = diff[diff["measure"] != "score"] if "measure" in diff else diff.iloc[0:0]
    diff = diff[diff["measure"] == "score"] if "measure" in diff else diff
    lines += difference_tables(diff, setup, "line", _names)
    if not kept.empty:
        h = lead + "| task | what the base prefilled | line | against | difference [95 %] | samples | more / less |"
        lines += ["", h, "|---" * (h.count("|") - 1) + "|"]
        kept = kept.assign(_m=kept["line_method"].map(ORDER), _b=kept["baseline_method"].map(ORDER))
        by = ["task", "measure", *(c for c in ("model", "length", "budget") if c in kept), "_b", "_m", "lookahead"]
        for r in kept.sort_values(by, kind="stable").itertuples():  # each setup's lines together
            what = {"needle_kept": "needle kept", "distractor_kept": "distractor kept"}[r.measure]
            lines.append("".join(f"| {cell(r, c)} " for c in setup) + f"| {r.task} | {what} | "
                         f"{' | '.join(_names(r))} | {difference(r.difference, r.lo, r.hi)} | "
                         f"{r.n} | {r.wins} / {r.losses} |")  # fmt: skip
        lines += ["", "Paired by sample: the share of the needle's tokens (on variable tracking, the chain's) and "
                  "of a look-alike distractor's (niah_multikey_1's other keys) the base prefilled, the line's minus "
                  "the baseline's, in points of those tokens (0-100), 95 % bootstrap; more / less: samples where the "
                  "line kept more or less of them."]  # fmt: skip
    return "\n".join(lines)


def _task_table(tasks: pd.DataFrame, setup: list[str]) -> list[str]:
    """Per task, each line's score and needle kept, the lines side by side (a column per method
    and look-ahead; the method named where the folder holds several)."""
    spec = tasks[~tasks["lookahead"].isna()]
    methods = sorted(set(spec["line_method"]), key=ORDER.__getitem__)
    cols = [("full", float("nan"))] + [
        (m, la) for m in methods for la in sorted(spec[spec["line_method"] == m]["lookahead"].unique())
    ]

    def head(m: str, la: float) -> str:
        return "full prefill" if np.isnan(la) else line_name(la, m) if len(methods) > 1 else f"look-ahead {int(la)}"

    h = head_cells(setup) + "| task | n | " + " | ".join(head(m, la) for m, la in cols) + " |"
    out = [h, "|---" * (h.count("|") - 1) + "|"]
    keys = [c for c in setup if c != "budget"]
    for key, g in tasks.groupby([*keys, "task"] if keys else ["task"], sort=True):
        for b in sorted(g["budget"].dropna().unique()) or [float("nan")]:  # this setup's budgets
            at = g[(g["budget"] == b) | g["lookahead"].isna()]
            cells = []
            for m, la in cols:
                r = (
                    at[at["lookahead"].isna()]
                    if np.isnan(la)
                    else at[(at["line_method"] == m) & (at["lookahead"] == la)]
                )
                cells.append("-" if r.empty else f"{r['score'].iloc[0]:.1f} ({r['needle_kept'].iloc[0]:.2f})")
            where = dict(zip([*keys, "task"], key if isinstance(key, tuple) else (key,), strict=True))
            lead = "".join(f"| {('-' if np.isnan(b) else int(b)) if c == 'budget' else where[c]} " for c in setup)
            out.append(f"{lead}| {where['task']} | {int(at['n'].max())} | " + " | ".join(cells) + " |")
    out += ["", "Per task: score (needle kept: on variable tracking, the share of the chain's tokens the base "
            "prefilled)."]  # fmt: skip
    return out


def figure(df: pd.DataFrame, path: Path) -> None:
    """Retention against the side-by-side TTFT speedup, one point per look-ahead (``L=n``) with
    both intervals, joined in look-ahead order per setup, budget and method (one colour each);
    without a latency job, retention against the look-ahead (the title says so), so the figure
    never comes out empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = "lat_speedup" in df and df["lat_speedup"].notna().any()
    d = df[~df["lookahead"].isna()]
    if timed:
        d = d[d["lat_speedup"].notna()]
    setup = varying(d)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    group = [c for c in ("model", "length", "budget", "line_method") if c in d]
    methods = sorted(set(d["line_method"]), key=ORDER.__getitem__) if len(d) else [METHOD]
    groups = sorted(
        d.groupby(group, dropna=False) if len(d) else [], key=lambda kg: ORDER[kg[1]["line_method"].iloc[0]]
    )
    for i, (_, g) in enumerate(groups):  # SpecPrefill's lines first, then SpecPC's (squares)
        g = g.sort_values("lookahead")
        color = f"C{i}"  # one colour per setup, budget and method; each point says its look-ahead
        marker = "s" if g["line_method"].iloc[0] == "specpc" else "o"
        x = g["lat_speedup"] if timed else g["lookahead"]
        first = next(g.itertuples())
        where = ", ".join([*([NAMES[first.line_method]] if len(methods) > 1 else []),
                           *(f"{c} {cell(first, c)}" for c in setup)])  # fmt: skip
        ax.plot(x, g["retention"], color=color, lw=0.8, alpha=0.6, label=where or "look-ahead, in order")
        for r in g.itertuples():
            xv = r.lat_speedup if timed else r.lookahead
            xerr = [[r.lat_speedup - r.lat_speedup_lo], [r.lat_speedup_hi - r.lat_speedup]] if timed else None
            ax.errorbar(xv, r.retention, xerr=xerr, color=color, fmt=marker, capsize=3,
                        yerr=[[r.retention - r.retention_lo], [r.retention_hi - r.retention]])  # fmt: skip
            ax.annotate(f"L={int(r.lookahead)}", (xv, r.retention), textcoords="offset points", xytext=(5, 5),
                        fontsize=8, color=color)  # fmt: skip
    whose = " and ".join(NAMES[m] for m in methods)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    if timed:
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("TTFT speedup over full prefill (side by side, 95 % interval)")
        ax.set_title(f"{whose}'s look-ahead at one token budget")
    else:
        if len(d):
            ax.set_xticks(sorted(set(d["lookahead"])))
        ax.set_xlabel("look-ahead steps")
        ax.set_title(f"{whose}'s look-ahead at one token budget (no side-by-side speed yet)")
    ax.set_ylabel("retention (score / full prefill's, 95 % interval)")
    if len(d):
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a conf/model name (its speculator is the draft)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--limit", type=int, default=15, help="samples per task")
    ap.add_argument("--keep-tokens", type=int, default=256, help="the budget N, tokens of each prompt")
    ap.add_argument("--lookaheads", type=int, nargs="+", default=LOOKAHEADS,
                    help="look-ahead steps; the smallest is the baseline the others are paired with")  # fmt: skip
    ap.add_argument("--methods", nargs="+", default=[METHOD], choices=list(LOOKAHEAD_OPTION),
                    help="the draft-based methods whose look-ahead is varied (each paired with its own smallest "
                    "look-ahead; with several, each against SpecPrefill at the same look-ahead too)")  # fmt: skip
    ap.add_argument("--iters", type=int, default=10, help="timed iterations of the latency job")
    ap.add_argument("--latency-task", default="niah_single_2", help="the RULER task whose prompts are timed")
    ap.add_argument("--decode-tokens", type=int, default=16, help="tokens decoded after each timed prefill")
    ap.add_argument("--out", type=Path, default=Path("results/lookahead"))
    ap.add_argument("--no-latency", action="store_true", help="quality only")
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs' plans, load nothing")
    a = ap.parse_args(argv)
    require_values(ap, "--limit", [a.limit], lambda n: n >= 1, "1 or more samples a task")
    require_values(ap, "--keep-tokens", [a.keep_tokens], lambda n: n >= 1, "a budget of 1 or more tokens")
    require_values(ap, "--lookaheads", a.lookaheads, lambda n: n >= 1, "look-ahead steps of 1 or more")
    if len(set(a.lookaheads)) != len(a.lookaheads):
        ap.error(f"--lookaheads {' '.join(map(str, a.lookaheads))}: allowed: each look-ahead once")
    if len(set(a.methods)) != len(a.methods):
        ap.error(f"--methods {' '.join(a.methods)}: allowed: each method once")
    if a.no_run:
        require_runs(ap, a.out)
    if a.dry_run:
        run(a, dry_run=True)
        return
    if not a.no_run:
        run(a)
    found = analyze(a.out)
    try:
        df, diff, tasks = table(found), differences(found), per_task(found)
    except ValueError as e:  # a folder the tables cannot read: one line, no traceback
        raise SystemExit(str(e)) from None
    df.to_csv(a.out / "lookahead.csv", index=False)
    diff.to_csv(a.out / "lookahead_differences.csv", index=False)
    text = markdown(df, diff, tasks)
    (a.out / "lookahead.md").write_text(text + "\n")
    figure(df, a.out / "lookahead.png")
    print(text)


if __name__ == "__main__":
    main()
