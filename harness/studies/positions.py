"""Study: does it matter that the kept tokens keep their original positions?

SpecPrefill (Liu et al., ICML 2025) prefills the tokens it keeps at their original position ids,
so RoPE sees the gaps it dropped, and decoding goes on from position N (the prompt's length).
SpecPC (Galim et al., arXiv 2506.08373), choosing tokens by the same kind of draft attention,
re-numbers them 0..K-1 and decodes from K, as GemFilter does. Ports of SpecPrefill have lost
needle recall to position bugs. Which choice keeps more of the answer has not been measured
with the selection held fixed. This study holds it fixed: each method chooses its tokens once
per sample, and the two arms differ only in the positions the base gives them
(``method.position_mode=original`` or ``contiguous``; :func:`specprefill.plan.kept_plan`).
Every row records which tokens the base prefilled (``kept_hash``), so the study checks that the
two arms of a sample kept the same tokens before it pairs them. The work is the same in both
arms (the same tokens are prefilled), so the study measures quality only.

The base and its speculator are a model config's pair (default Qwen2.5-Coder-1.5B with its 0.5B
sibling: a separate draft of the paper's kind; ``make fetch-models`` first). RULER at
``--length`` on ``--tasks``, ``--limit`` samples each. Jobs: full prefill once, then one sweep
per method over ``--keeps`` x both position modes. Per arm: the score and its retention against
full prefill with 95 % intervals, and the needle kept. Per method and keep: contiguous minus
original, paired by sample (0-100 points, the tasks weighted equally, 95 % bootstrap), with the
samples won and lost and the share of pairs that kept the same tokens; the same per task, by
whether the selection kept the asked evidence whole, and by the third of the context it sits in; and the methods against each other at the
same positions (the selections alone); where a method ran at two or more budgets (keeps or tokens), the
change in its position cost from one budget to another, per sample (at one length the original
positions span the same N at every budget, and only the share of them left empty changes). Runs of one method under other options in one folder
(SpecPrefill by chunks and token by token) are arms of their own, named by the options that
differ (:func:`variants`). A figure: retention against keep, one line
per method and position mode.

    python -m harness.studies.positions [--model qwen2.5-coder-1.5b] [--length 2048]
        [--tasks niah_single_2 niah_multikey_1 vt qa_1] [--limit 15] [--keeps 0.1 0.3]
        [--methods specprefill specpc] [--out results/positions] [--no-run] [--dry-run]
        [--samples 20-39] [--name positions]

``--samples`` reads only the samples with those ids (a replication on samples no choice was made
on, named at the top of the table); ``--name`` the files' name (``<name>.md``, ``<name>.png``,
``<name>_differences.csv``, ...), so a folder can hold several readings of its rows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.folder import Analysis, analyze, analyze_rows
from harness.analysis.quality import Point, paired_difference, paired_difference_of_differences, unit_mean
from harness.analysis.stats import NAN
from harness.rendering.tables import ci, difference, fewer, num, short_paired
from harness.studies import (
    in_samples,
    labelled,
    options_of,
    require_file_name,
    require_runs,
    require_samples,
    require_values,
    run_job,
)

TASKS = ["niah_single_2", "niah_multikey_1", "vt", "qa_1"]
#: The methods whose kept tokens can take either position mode (an option of theirs), in the
#: tables' order; the study runs the first two by default.
METHODS = ["specprefill", "specpc", "gemfilter", "random", "truncate"]
MODES = ["original", "contiguous"]
ALL = "ALL"
PRESETS = Path(__file__).resolve().parents[2] / "conf" / "method"


def own_mode(method: str) -> str | None:
    """The method's own choice, its preset's ``position_mode`` (``conf/method/<method>.yaml``)."""
    import yaml

    path = PRESETS / f"{method}.yaml"
    mode = (yaml.safe_load(path.read_text()) or {}).get("position_mode") if path.is_file() else None
    return None if mode is None else str(mode)


def position_mode(options: Any) -> str | None:
    """A row's ``position_mode`` from its method options (None: a method without one)."""
    opts = options_of(options)
    mode = opts.get("position_mode")
    return None if mode is None else str(mode)


def eval_commands(
    out: Path,
    model: str,
    length: int,
    tasks: list[str],
    limit: int,
    methods: list[str],
    keeps: list[float],
    keep_tokens: int | None = None,
    overrides: list[str] | None = None,
    method_overrides: list[str] | None = None,
) -> list[list[str]]:
    """Full prefill first (every arm's retention pairs with it), then one sweep per method over
    the keeps (or one budget of ``keep_tokens``) and both position modes: the same samples
    everywhere. ``overrides`` go to every job (``benchmark.options.vt_hops=8``: full prefill
    reads the same prompts), ``method_overrides`` to the methods' jobs only
    (``method.chunk_size=null``, an option full prefill does not have)."""
    common = [sys.executable, "-m", "harness.jobs.eval", f"model={model}", "benchmark=ruler", f"length={length}",
              f"tasks=[{','.join(tasks)}]", f"limit={limit}", f"out={out}", *(overrides or [])]  # fmt: skip
    budget = f"keep_tokens={keep_tokens}" if keep_tokens is not None else f"keep={','.join(f'{k:g}' for k in keeps)}"
    return [[*common, "method=full"]] + [
        [*common, f"method={m}", budget, f"method.position_mode={','.join(MODES)}", *(method_overrides or [])]
        for m in methods
    ]


#: Method options that do not make a variant: the positions (what the study varies) and the
#: budget (a column of its own).
NOT_VARIANT = ("position_mode", "keep_rate")
#: The options that set how many tokens an arm prefills: the position cost is compared across
#: them (:func:`between_budgets`), never across the others.
BUDGET_OPTIONS = ("keep_tokens", "random_fill")


def variants(rows: pd.DataFrame, method: str = "method") -> pd.Series:
    """Each row's variant: the method options, other than :data:`NOT_VARIANT`, that differ among
    the rows of its setup and method (``chunk_size=None`` beside ``chunk_size=32`` where a folder
    holds SpecPrefill token by token and by chunks), ``""`` where the method ran one way. Runs
    of one method under other options are arms of their own: never pooled, never paired across."""
    opts = [{k: v for k, v in options_of(o).items() if k not in NOT_VARIANT} for o in rows["method_options"]]
    out = [""] * len(rows)
    cols = [*(c for c in SETUP if c in rows), method]
    for _, g in rows.reset_index(drop=True).groupby(cols, sort=False, dropna=False):
        mine = [opts[i] for i in g.index]
        keys = sorted({k for o in mine for k in o})
        vary = [k for k in keys if len({json.dumps(o.get(k), sort_keys=True) for o in mine}) > 1]
        for i, o in zip(g.index, mine, strict=True):
            out[i] = ", ".join(f"{k}={o.get(k)}" for k in vary)
    return pd.Series(out, index=rows.index, dtype=object)


def table(a: Analysis) -> pd.DataFrame:
    """One line per arm (method and its variant, keep, position mode) and full prefill: the
    summary's ``ALL`` row."""
    s = a.summary
    s = s[s["task"] == ALL]
    df = pd.DataFrame({
        "model": s["model"].astype(str), "length": s["length"].astype(int),
        "benchmark_options": labelled(s)["benchmark_options"],
        "method": s["method_name"].astype(str),
        "variant": variants(s, "method_name"),
        "keep": s["keep_rate"].astype(float),
        "budget": [_budget(float(k), _tokens(o)) for k, o in zip(s["keep_rate"], s["method_options"], strict=True)],
        "position_mode": [position_mode(o) for o in s["method_options"]],
        "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "retention_n", "needle_kept", "kept_fraction")},
    })  # fmt: skip
    order = {m: i for i, m in enumerate(["full", *METHODS])}
    df["_m"] = df["method"].map(lambda m: order.get(m, len(order)))
    df["_p"] = df["position_mode"].map(lambda p: MODES.index(p) if p in MODES else -1)
    by = ["model", "length", "benchmark_options", "_m", "variant", "keep", "_p"]
    return df.sort_values(by).drop(columns=["_m", "_p"]).reset_index(drop=True)


#: What a pair must share besides the sample: two rows of one sample id from another model,
#: speculator, length, dtype or benchmark option (one --out holding two runs of the study, or
#: vt at two chain lengths: ``benchmark.options.vt_hops``) are not a pair.
SETUP = ["model", "speculator", "backend", "dtype", "benchmark", "benchmark_options", "length"]


KEY = ["task", "sample_id"]
#: Needle-depth bins of :func:`by_depth`: the context's thirds (0 = its start, 1 = its end).
DEPTH_EDGES = (0.0, 1 / 3, 2 / 3, 1.0)
DEPTH_LABELS = ("first third", "middle third", "last third")


def _in_modes(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a method run in either position mode at a keep, each tagged with its mode
    (benchmark options labelled: :func:`harness.studies.labelled`)."""
    rows = labelled(rows)
    d = rows.assign(position_mode=[position_mode(o) for o in rows["method_options"]])
    d = d[d["position_mode"].isin(MODES) & d["keep_rate"].notna()]
    return d.assign(variant=variants(d), keep_tokens=[_tokens(o) for o in d["method_options"]])


def _arms(rows: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]]:
    """Per setup, method and keep with both modes: (what they share, the original rows, the
    contiguous rows). ``rows``: eval rows with status ok (:meth:`Analysis.ok`)."""
    d = _in_modes(rows)
    cols = [*(c for c in SETUP if c in d), "method", "variant", "keep_rate", "keep_tokens"]
    for key, g in d.groupby(cols, sort=True, dropna=False):
        where = dict(zip(cols, key, strict=True))
        orig, cont = g[g["position_mode"] == "original"], g[g["position_mode"] == "contiguous"]
        if not orig.empty and not cont.empty:
            yield where, orig, cont


def _joined(orig: pd.DataFrame, cont: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The samples both modes scored, one line each: ``<column>_o`` and ``<column>_c``."""
    o, c = (f.drop_duplicates(KEY).set_index(KEY)[columns] for f in (orig, cont))
    return o.join(c, lsuffix="_o", rsuffix="_c", how="inner").dropna(subset=["score_o", "score_c"])


def _label(where: dict[str, Any]) -> dict[str, Any]:
    """A table line's setup columns, with the method (its variant named) and keep under the
    study's names."""
    out = {k: v for k, v in where.items() if k not in ("method", "variant", "keep_rate", "keep_tokens", "budget")}
    keep, tokens = float(where["keep_rate"]), float(where.get("keep_tokens", float("nan")))
    method = _named(str(where["method"]), str(where.get("variant", "")))
    return {**out, "method": method, "keep": keep, "budget": _budget(keep, tokens)}


def _tokens(options: Any) -> float:
    """A row's budget in tokens (``keep_tokens``; NaN where it has a keep rate instead)."""
    n = options_of(options).get("keep_tokens")
    return float("nan") if n is None else float(n)


def _budget(keep: float, tokens: float) -> str:
    """The budget as the tables print it: ``512 tokens``, else the keep rate (``0.1``)."""
    return f"{int(tokens)} tokens" if tokens == tokens else f"{keep:g}"


def _named(method: str, variant: str) -> str:
    """The method with its variant, where it has one: ``specprefill (chunk_size=None)``."""
    return f"{method} ({variant})" if variant else method


def differences(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, method, keep), over all tasks and per task: contiguous minus original on the
    same samples (:func:`harness.analysis.quality.paired_difference`: 0-100 points, tasks
    weighted equally, 95 % bootstrap), the samples won and lost by contiguous, and
    ``same_selection``, the share of pairs whose two rows kept the same tokens (``kept_hash``;
    NaN where the rows do not record it). Only where it is 1 is the difference the positions'
    alone. ``rows``: eval rows with status ok (:meth:`Analysis.ok`)."""
    out = []
    for where, orig, cont in _arms(rows):
        tasks = sorted(set(orig["task"]) & set(cont["task"]))
        for scope in [ALL, *tasks]:
            parts = [tasks] if scope == ALL else [[scope]]
            diff, base_mean, cand_mean = paired_difference(Point(cont), Point(orig), "score", parts)
            o, c = (f if scope == ALL else f[f["task"] == scope] for f in (orig, cont))
            both = _joined(o, c, ["score", "kept_hash"])
            hashed = both["kept_hash_o"].notna() & both["kept_hash_c"].notna()
            same = (
                float((both["kept_hash_o"] == both["kept_hash_c"]).mean())
                if hashed.all() and len(both)
                else float("nan")
            )
            out.append({
                **_label(where), "task": scope, "n": len(both), "original": base_mean, "contiguous": cand_mean,
                "difference": diff.value, "lo": diff.lo, "hi": diff.hi,
                "wins": int((both["score_c"] > both["score_o"]).sum()),
                "losses": int((both["score_c"] < both["score_o"]).sum()),
                "same_selection": same,
            })  # fmt: skip
    return pd.DataFrame(out)


def between_budgets(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, method) run in both modes at two or more budgets, for each two budgets: the
    position cost (contiguous minus original) at the larger minus the cost at the smaller, on the
    samples all four arms ran, per sample
    (:func:`harness.analysis.quality.paired_difference_of_differences`: 0-100 points, tasks
    weighted equally, 95 % bootstrap), over all tasks and per task; ``same_samples``, the share
    of those samples whose four rows prompted the same text (``sample_hash``; NaN where a row
    does not record it). At one prompt length the original positions span the same N at every
    budget, and only the share of them left empty changes, so this tells whether the cost moves
    with that share. A selection topped up with ``random_fill`` tokens (``512 tokens + 512
    random``) is a budget of its own, sorted by the tokens it prefills (after the selection of the
    same size): set beside the selection of that size, it tells what the extra tokens buy by
    filling the span from what they buy by what they say. ``rows``: eval rows with status ok
    (:meth:`Analysis.ok`)."""
    arms: dict[tuple, list[tuple[tuple[float, float], dict[str, Any], pd.DataFrame, pd.DataFrame]]] = {}
    for where, orig, cont in _arms(rows):
        tokens, keep = float(where.get("keep_tokens", float("nan"))), float(where["keep_rate"])
        opts = options_of(orig["method_options"].iloc[0])
        fill = float(opts.get("random_fill") or 0)
        # the variant without the budget: runs at two budgets differ in keep_tokens (and a
        # random fill in random_fill), which :func:`variants` names as variants of their own
        same = {k: v for k, v in opts.items() if k not in (*NOT_VARIANT, *BUDGET_OPTIONS)}
        key = (*((k, v) for k, v in where.items() if k not in ("keep_rate", "keep_tokens", "variant")),
               json.dumps(same, sort_keys=True, default=str))  # fmt: skip
        budget = _label(where)["budget"] + (f" + {int(fill)} random" if fill else "")
        size = tokens + fill if tokens == tokens else keep
        arms.setdefault(key, []).append(((size, fill), {**where, "budget": budget}, orig, cont))
    out = []
    for budgets in arms.values():
        budgets.sort(key=lambda b: b[0])
        for i, (_, small, o1, c1) in enumerate(budgets):
            for _, large, o2, c2 in budgets[i + 1 :]:
                tasks = sorted(set(o1["task"]) & set(c1["task"]) & set(o2["task"]) & set(c2["task"]))
                for scope in [ALL, *tasks]:
                    parts = [tasks] if scope == ALL else [[scope]]
                    diff, cost_small, cost_large = paired_difference_of_differences(
                        (Point(c2), Point(o2)), (Point(c1), Point(o1)), "score", parts
                    )
                    frames = [f if scope == ALL else f[f["task"] == scope] for f in (o1, c1, o2, c2)]
                    out.append({
                        **_label(large), "budget": large["budget"], "against": small["budget"], "task": scope, "n": diff.n,
                        "cost_against": cost_small, "cost": cost_large, "difference": diff.value,
                        "lo": diff.lo, "hi": diff.hi, "same_samples": _same_samples(frames),
                    })  # fmt: skip
    return pd.DataFrame(out)


def _same_samples(frames: list[pd.DataFrame]) -> float:
    """The share of the samples all ``frames`` ran whose rows agree on ``sample_hash`` (NaN where
    any row lacks one)."""
    if any("sample_hash" not in f for f in frames):
        return float("nan")
    hashes = [f.drop_duplicates(KEY).set_index(KEY)["sample_hash"] for f in frames]
    both = pd.concat(hashes, axis=1, join="inner")
    if both.empty or both.isna().any().any():
        return float("nan")
    return float(both.nunique(axis=1).eq(1).mean())


def by_depth(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, method, keep) and third of the context the asked evidence sits in (its
    ``needle_depth``, the same in both modes): contiguous minus original over the pairs there,
    pooled over the tasks (each sample weighs the same), 95 % bootstrap over those pairs.
    Where re-numbering costs, this says whether it costs more for evidence far from the
    question (the prompt's end), whose distance to it re-numbering shrinks most."""
    out = []
    for where, orig, cont in _arms(rows):
        both = _joined(orig, cont, ["score", "needle_depth"]).dropna(subset=["needle_depth_o"])
        bins = pd.cut(both["needle_depth_o"], DEPTH_EDGES, labels=DEPTH_LABELS, include_lowest=True)
        for label in DEPTH_LABELS:
            out.append({**_label(where), "depth": label, **_pooled(both[bins == label], f"depth:{label}")})
    return pd.DataFrame(out)


def _pooled(g: pd.DataFrame, seed: str) -> dict[str, Any]:
    """Contiguous minus original over the joined pairs ``g`` (:func:`_joined`), each sample
    weighing the same: n, both means, the difference and its 95 % bootstrap (seeded by ``seed``)."""
    d = (g["score_c"] - g["score_o"]).to_numpy(dtype=float)
    e = unit_mean(d, range(len(d)), seed) if len(d) else NAN
    return {"n": len(d),
            "original": float(g["score_o"].mean()) if len(d) else float("nan"),
            "contiguous": float(g["score_c"].mean()) if len(d) else float("nan"),
            "difference": e.value, "lo": e.lo, "hi": e.hi}  # fmt: skip


#: What full prefill shares with an arm it is set beside (not the speculator: it has none).
FULL_SETUP = ("model", "backend", "dtype", "benchmark", "benchmark_options", "length")
#: The groups of :func:`by_whole`: a pair's evidence kept whole (every piece to its last token) or not.
WHOLE_LABELS = ("kept whole", "not kept whole")


def by_whole(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, method, keep), the pairs whose asked evidence the selection kept whole
    (``needle_whole`` 1: every needle, every statement of a chain, to its last token; the same
    in both modes, which keep the same tokens) and the others: contiguous minus original over
    each group, pooled over the tasks (each sample weighing the same), 95 % bootstrap over those
    pairs, with full prefill's mean on the same samples where the folder has it. Where the
    evidence survives, a gap between the modes is the positions' answer to a prompt that holds
    it; where it does not, both modes answer without it."""
    if "needle_whole" not in rows:  # rows before 2026-12-06: no group to tell
        rows = rows.assign(needle_whole=np.nan)
    full_rows = labelled(rows[rows["method"] == "full"])
    out = []
    for where, orig, cont in _arms(rows):
        mine = full_rows
        for c in FULL_SETUP:  # full prefill of this arm's setup only (a folder may hold two lengths)
            if c in mine and c in where:
                mine = mine[mine[c].astype(str) == str(where[c])]
        full = mine.drop_duplicates(KEY).set_index(KEY)["score"]
        both = _joined(orig, cont, ["score", "needle_whole"]).dropna(subset=["needle_whole_o"])
        whole = both["needle_whole_o"] >= 1.0 - 1e-9
        for label, g in zip(WHOLE_LABELS, (both[whole], both[~whole]), strict=True):
            f = full.reindex(g.index).dropna()
            out.append({**_label(where), "evidence": label, **_pooled(g, f"whole:{label}"),
                        "full": float(f.mean()) if len(f) else float("nan"), "full_n": len(f)})  # fmt: skip
    return pd.DataFrame(out)


def between_methods(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, keep, position mode): each method minus the first of :data:`METHODS` run
    (SpecPrefill by default), paired by sample (:func:`paired_difference`, tasks weighted
    equally, 95 % bootstrap): the two selections compared at the same positions, the part of
    a gap between the methods that is not the positions'."""
    d = _in_modes(rows)
    d = d[d["method"].isin(METHODS)]
    d = d.assign(arm=[_named(m, v) for m, v in zip(d["method"], d["variant"], strict=True)])
    cols = [*(c for c in SETUP if c in d), "keep_rate", "keep_tokens", "position_mode"]
    out = []
    for key, g in d.groupby(cols, sort=True, dropna=False):
        where = dict(zip(cols, key, strict=True))
        arms = g.drop_duplicates("arm")
        present = [a for _, a in sorted(zip(arms["method"].map(METHODS.index), arms["arm"], strict=True))]
        base = g[g["arm"] == present[0]]
        for method in present[1:]:
            other = g[g["arm"] == method]
            tasks = sorted(set(base["task"]) & set(other["task"]))
            diff, _, _ = paired_difference(Point(other), Point(base), "score", [tasks])
            keep = float(where["keep_rate"])
            out.append({**{c: where[c] for c in cols[:-3]}, "keep": keep,
                        "budget": _budget(keep, float(where["keep_tokens"])),
                        "position_mode": where["position_mode"], "method": method, "against": present[0],
                        "n": diff.n, "difference": diff.value, "lo": diff.lo, "hi": diff.hi})  # fmt: skip
    return pd.DataFrame(out)


def _arm_name(method: str, mode: str | None, variant: str = "") -> str:
    if method == "full":
        return "full prefill"
    own = " (its own)" if own_mode(method) == mode else ""
    return f"{_named(method, variant)}, {mode}{own}"


def _varying(*frames: pd.DataFrame) -> list[str]:
    """The setup columns (model, length, benchmark options) with more than one value across
    ``frames``: the tables print them only then (one run of the study has one of each)."""
    cols = ("model", "length", "benchmark_options")
    return [c for c in cols if len({v for f in frames if c in f for v in f[c]}) > 1]


def _section(setup: list[str], head: str, frame: pd.DataFrame, cells: Callable[[Any], str], note: str) -> list[str]:
    """One markdown table: the ``setup`` columns first, then ``head``'s; a line per row of
    ``frame`` (``cells`` writes the rest of it); the note under it."""
    head = "".join(f"| {c} " for c in setup) + head
    rows = ["".join(f"| {getattr(r, c)} " for c in setup) + cells(r) for r in frame.itertuples()]
    return ["", head, "|---" * (head.count("|") - 1) + "|", *rows, "", note]


#: Under the arms' table where some retention pairs fewer samples than its arm ran.
FEWER = " Retention `(n=K)`: on the K samples full prefill ran too, fewer than the arm's n."


def _arm_cells(r: Any) -> str:
    full = r.method == "full"
    return (
        f"| {_arm_name(str(r.method), r.position_mode, str(r.variant))} | {'1' if full else r.budget} | {r.n} | "
        f"{ci(r.score, r.score_lo, r.score_hi)} | "
        f"{'1' if full else ci(r.retention, r.retention_lo, r.retention_hi, '.2f') + fewer(r.n, r.retention_n)} | "
        f"{num(r.needle_kept, '.2f')} | {num(r.kept_fraction, '.2f')} |"
    )  # fmt: skip


def _difference_cells(r: Any) -> str:
    return (
        f"| {r.method} | {r.budget} | {r.task} | {r.n} | {num(r.original, '.1f')} | {num(r.contiguous, '.1f')} | "
        f"{difference(r.difference, r.lo, r.hi)} | {r.wins} / {r.losses} | "
        f"{'not recorded' if pd.isna(r.same_selection) else f'{r.same_selection:.0%}'} |"
    )  # fmt: skip


def _between_cells(r: Any) -> str:
    return (f"| {r.method} | {r.against} | {r.budget} | {r.position_mode} | {r.n} | "
            f"{difference(r.difference, r.lo, r.hi)} |")  # fmt: skip


def _budgets_cells(r: Any) -> str:
    same = "not recorded" if pd.isna(r.same_samples) else f"{r.same_samples:.0%}"
    return (
        f"| {r.method} | {r.budget} | {r.against} | {r.task} | {r.n} | {num(r.cost_against, '+.1f')} | "
        f"{num(r.cost, '+.1f')} | {difference(r.difference, r.lo, r.hi)} | {same} |"
    )  # fmt: skip


def _whole_cells(r: Any) -> str:
    full = "-" if pd.isna(r.full) else f"{r.full:.1f}" + ("" if r.full_n == r.n else f" (n={r.full_n})")
    return (
        f"| {r.method} | {r.budget} | {r.evidence} | {r.n} | {num(r.original, '.1f')} | {num(r.contiguous, '.1f')} | "
        f"{difference(r.difference, r.lo, r.hi)} | {full} |"
    )  # fmt: skip


def _depth_cells(r: Any) -> str:
    return (
        f"| {r.method} | {r.budget} | {r.depth} | {r.n} | {num(r.original, '.1f')} | {num(r.contiguous, '.1f')} | "
        f"{difference(r.difference, r.lo, r.hi)} |"
    )  # fmt: skip


def markdown(
    df: pd.DataFrame,
    diff: pd.DataFrame,
    depth: pd.DataFrame | None = None,
    between: pd.DataFrame | None = None,
    whole: pd.DataFrame | None = None,
    budgets: pd.DataFrame | None = None,
) -> str:
    setup = _varying(df, diff)
    lines = _section(
        setup, "| arm | keep | n | score | retention vs full | needle kept | prefilled (of prompt) |", df, _arm_cells,
        "Score (0-100) and retention (score over full prefill's on the same samples): 95 % bootstrap over samples. "
        "Needle kept: the share of the asked evidence's tokens the base prefilled (the same in both position modes "
        "where the selection is)."
        + (FEWER if short_paired(df, ("retention",)) else ""),
    )[1:]  # fmt: skip
    if diff.empty:
        return "\n".join(lines)
    lines += _section(
        setup, "| method | keep | tasks | n | original | contiguous | contiguous - original [95 %] | wins / losses | "
        "same tokens kept |", diff, _difference_cells,
        "Paired by sample: the score with the kept tokens re-numbered 0..K-1 (decoding from K) minus the score with "
        "them at their original positions (decoding from N), 0-100 points, tasks weighted equally in ALL, 95 % "
        "bootstrap; wins / losses: samples where contiguous scored higher / lower. Same tokens kept: the share of "
        "pairs whose two rows prefilled the same tokens (kept_hash); below 100 % the difference is not the "
        "positions' alone.",
    )  # fmt: skip
    if budgets is not None and not budgets.empty:
        lines += _section(
            setup, "| method | budget | against | tasks | n | cost there | cost here | change [95 %] | "
            "same samples |", budgets, _budgets_cells,
            "The position cost (contiguous minus original, as above) at one budget minus its cost at a smaller one, "
            "per sample on the samples all four arms ran (0-100 points, tasks weighted equally, 95 % bootstrap). At "
            "one length the original positions span the same N at every budget; only the share left empty changes. "
            "Same samples: the share whose four rows prompted the same text (sample_hash).",
        )  # fmt: skip
    if between is not None and not between.empty:
        lines += _section(
            setup, "| method | against | keep | both at positions | n | difference [95 %] |", between,
            _between_cells,
            "The selections compared with the positions held the same: the method's score minus the other's on the "
            "same samples, both prefilling at the positions named (0-100 points, tasks weighted equally, 95 % "
            "bootstrap).",
        )  # fmt: skip
    if whole is not None and not whole.empty and whole["n"].sum():
        lines += _section(
            setup, "| method | keep | asked evidence | n | original | contiguous | contiguous - original [95 %] | "
            "full prefill, same samples |", whole[whole["n"] > 0], _whole_cells,
            "By whether the selection kept the asked evidence whole (needle_whole 1: every needle, every statement "
            "of a chain, to its last token; the same tokens in both modes), every task's pairs pooled, each sample "
            "weighing the same, 95 % bootstrap over the pairs in the group; full prefill's mean on those samples.",
        )  # fmt: skip
    if depth is not None and not depth.empty and depth["n"].sum():
        lines += _section(
            setup, "| method | keep | evidence in the context's | n | original | contiguous | "
            "contiguous - original [95 %] |", depth[depth["n"] > 0], _depth_cells,
            "By where the asked evidence sits in the context (needle_depth: 0 its start, 1 its end; the question "
            "follows the context), every task's pairs pooled, each sample weighing the same, 95 % bootstrap over the "
            "pairs in the bin.",
        )  # fmt: skip
    return "\n".join(lines)


def figure(df: pd.DataFrame, path: Path) -> None:
    """Retention against the share prefilled (the keep rate; a budget in tokens at its measured share:
    :func:`_prefilled`), one panel per model, length and benchmark option, one line per method and
    position mode with 95 % intervals (original solid, contiguous dashed, the method's own
    mode opaque); full prefill's 1 as a reference line. In a folder without full prefill (no
    retention) the score (0-100) instead, and the title says so: never an empty figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = df[df["method"] != "full"]
    by_retention = bool(arms["retention"].notna().any()) if "retention" in arms else False
    measure = "retention" if by_retention else "score"
    # a line per method, variant and mode across budgets: a budget in tokens is a variant of its
    # own in the tables (keep_tokens=N), but here its points join one line, at the share prefilled
    arms = arms.assign(line=[re.sub(r"(, )?keep_tokens=\d+", "", str(v)).lstrip(", ") for v in arms["variant"]])
    setups = zip(arms["model"], arms["length"], arms["benchmark_options"], strict=True)
    panels = sorted({(str(m), int(n), str(b)) for m, n, b in setups}) or [("", 0, "-")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), sharey=True, squeeze=False)
    for ax, (model, length, bench) in zip(axes[0], panels, strict=True):
        here = arms[(arms["model"] == model) & (arms["length"] == length) & (arms["benchmark_options"] == bench)]
        for i, ((method, variant, mode), g) in enumerate(here.groupby(["method", "line", "position_mode"], sort=False)):
            g = g.assign(x=_prefilled(g)).sort_values("x")
            r, lo, hi = (g[c].to_numpy(dtype=float) for c in (measure, f"{measure}_lo", f"{measure}_hi"))
            ax.errorbar(g["x"].to_numpy(dtype=float) + 0.004 * (i - 1.5), r, yerr=np.vstack([r - lo, hi - r]),
                        fmt="-o" if mode == "original" else "--s", capsize=3,
                        color=f"C{METHODS.index(method) if method in METHODS else len(METHODS)}",
                        alpha=1.0 if own_mode(str(method)) == mode else 0.7,
                        label=_arm_name(str(method), str(mode), str(variant)))  # fmt: skip
        if by_retention:
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("share of the prompt prefilled")
        ax.set_title((f"{model}, {length} tokens" + ("" if bench == "-" else f", {bench}")) if model else "no arms")
        if len(here):
            ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel(
        "retention (score / full prefill's, 95 % interval)" if by_retention else "score (0-100, 95 % interval)"
    )
    fig.suptitle(
        "The same kept tokens at their original positions or re-numbered"
        + ("" if by_retention else "\n(no full prefill on these samples: scores, not retention)")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _prefilled(g: pd.DataFrame) -> pd.Series:
    """Where an arm sits on the figure's x axis: its keep rate, or where it has a budget in tokens
    (``keep_tokens``, recorded as keep rate 1) the share of the prompt it prefilled (``kept_fraction``)."""
    by_tokens = g["budget"].astype(str).str.endswith("tokens")
    return g["kept_fraction"].where(by_tokens, g["keep"]).astype(float)


def _setup_text(column: str, value: Any) -> str:
    """A setup value as a figure's label says it ("-", no benchmark option set, in words)."""
    return "the benchmark's own settings" if column == "benchmark_options" and value == "-" else str(value)


def difference_figure(diff: pd.DataFrame, path: Path) -> None:
    """Contiguous minus original over all tasks, one line per arm (its setup where the folder
    holds several: model, length, benchmark option), 95 % intervals, zero marked: where the
    position cost is, at a glance. Nothing is drawn where no arm ran in both modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = diff[diff["task"] == ALL] if not diff.empty else diff
    if d.empty:
        return
    setup = _varying(d)
    budgets = [b if str(b).endswith("tokens") else f"keep {b}" for b in d["budget"]]
    labels = [
        ", ".join([*(_setup_text(c, getattr(r, c)) for c in setup), str(r.method), b])
        for r, b in zip(d.itertuples(), budgets, strict=True)
    ]
    y = np.arange(len(d))[::-1]
    v, lo, hi = (d[c].to_numpy(dtype=float) for c in ("difference", "lo", "hi"))
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.45 * len(d)))
    ax.errorbar(v, y, xerr=np.vstack([v - lo, hi - v]), fmt="o", capsize=3, color="C0")
    ax.axvline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("contiguous - original, points (0-100), paired by sample, 95 % interval")
    ax.set_title("What re-numbering the same kept tokens gains (> 0) or loses")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a conf/model name (its speculator is the draft)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--limit", type=int, default=15, help="samples per task")
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--methods", nargs="+", default=METHODS[:2], help=f"of {METHODS}")
    ap.add_argument("--keep-tokens", type=int, help="one budget in tokens of each prompt, instead of --keeps")
    ap.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every job, full prefill's too (benchmark.options.vt_hops=8)",
    )
    ap.add_argument("--method-set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides for the methods' jobs only (method.chunk_size=null)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("results/positions"))
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs' plans, load nothing")
    ap.add_argument("--samples", help="read only the samples with these ids: FIRST-LAST or FIRST- (e.g. 20-39)")
    ap.add_argument("--name", default="positions",
                    help="the files written: <out>/<name>.md, .csv, _differences.csv, ... (a file name)")  # fmt: skip
    a = ap.parse_args(argv)
    require_file_name(ap, "--name", a.name)
    samples = require_samples(ap, a.samples)
    require_values(ap, "--keeps", a.keeps, lambda k: 0 < k < 1, "a fraction in (0, 1): keep 1 has no positions to move")
    require_values(ap, "--limit", [a.limit], lambda n: n >= 1, "1 or more samples a task")
    require_values(ap, "--methods", a.methods, lambda m: m in METHODS, f"one of {METHODS}")
    if a.keep_tokens is not None:
        require_values(ap, "--keep-tokens", [a.keep_tokens], lambda n: n >= 1, "1 or more tokens")
    require_values(
        ap,
        "--set",
        a.set,
        lambda o: "=" in o and not o.startswith("method."),
        "KEY=VALUE overrides outside method.* (those go to --method-set: full prefill has none)",
    )
    require_values(ap, "--method-set", a.method_set, lambda o: "=" in o, "KEY=VALUE overrides")  # fmt: skip
    if a.no_run:
        require_runs(ap, a.out)
    cmds = eval_commands(a.out, a.model, a.length, a.tasks, a.limit, a.methods, a.keeps, a.keep_tokens, a.set,
                         a.method_set)  # fmt: skip
    if a.dry_run:
        for cmd in cmds:
            run_job([*cmd, "dry_run=true"])
        return
    if not a.no_run:
        for cmd in cmds:
            run_job(cmd)
    found = analyze(a.out)
    if samples is not None:
        found = analyze_rows(a.out, in_samples(found.rows, samples))
    rows = found.ok("eval")
    if rows.empty:
        ap.error(f"{a.out}: no eval rows that ran" + (f" among samples {a.samples}" if a.samples else ""))
    df, diff, depth, between = table(found), differences(rows), by_depth(rows), between_methods(rows)
    whole, budgets = by_whole(rows), between_budgets(rows)
    name = a.name
    df.to_csv(a.out / f"{name}.csv", index=False)
    diff.to_csv(a.out / f"{name}_differences.csv", index=False)
    depth.to_csv(a.out / f"{name}_by_depth.csv", index=False)
    between.to_csv(a.out / f"{name}_between_methods.csv", index=False)
    whole.to_csv(a.out / f"{name}_by_whole.csv", index=False)
    if not budgets.empty:
        budgets.to_csv(a.out / f"{name}_between_budgets.csv", index=False)
    text = markdown(df, diff, depth, between, whole, budgets)
    if a.samples:
        text = f"Samples {a.samples} only (their ids, both ends included: `--samples {a.samples}`).\n\n" + text
    (a.out / f"{name}.md").write_text(text + "\n")
    figure(df, a.out / f"{name}.png")
    difference_figure(diff, a.out / f"{name}_differences.png")
    print(text)


if __name__ == "__main__":
    main()
