"""Study: the draft-based family side by side. At one token budget, how much does each way of
using the same draft model keep, and what does it cost in TTFT, KV memory and decoding?

The base and its speculator are a model config's pair (default: Qwen2.5-Coder-1.5B with its
0.5B sibling, the family the draft-based papers use), RULER at ``--length`` on ``--tasks``,
``--limit`` samples each (n = limit x tasks per method). Every method keeps the same budget
of ``--keep-tokens`` N tokens of each prompt (``keep_tokens=N``):

* ``full``: full prefill, the reference;
* ``specprefill``: SpecPrefill (Liu et al., ICML 2025) keeps N prompt tokens;
* ``specpc``: SpecPC (Galim et al., arXiv 2506.08373) keeps N prompt tokens;
* ``speckv``: SpecKV (same paper) prefills everything and keeps N KV entries per layer and head;
* ``speckvpc``: SpecKV-PC, SpecPC keeping N tokens, then SpecKV keeping half of them;
* ``compose`` of SpecPrefill keeping N tokens, then the press KeyDiff keeping half of them
  (KeyDiff: the best press of ``results/reference/kv_compare_smollm2_cpu/`` from keep 0.25 up).

So the prompt-side budget is matched (N tokens prefilled or held), and the two cascades hold
N/2 KV entries after the prefill; every row says what it held (``kv_fraction``, ``kv_mib``).

Quality: one ``make eval`` run per method on the same samples; per method the score and the
retention against full prefill with 95 % intervals, the needle kept, the KV held, the decode
time per token; each method against SpecPrefill by paired score differences (the same
samples; :func:`differences`). Speed: one ``make latency`` job timing every method beside full
prefill in the same iterations (paired, order-balanced; RULER's ``--latency-task`` prompts at
``--length``, so SpecKV drafts the task's answer length as in the eval; niah_single_2 by
default, whose prompts all reach the length: RULER's qa generator drops ten documents at a
time from a sample that overflows, as its official code does, so 3 of qa_1's first 11 prompts
at 2K have under 500 tokens and the latency job refuses them), its TTFT speedup with
its interval, the FLOP model's ideal and a decode of ``--decode-tokens`` tokens after each
prefill. A figure: retention against the side-by-side speedup.

One ``--out`` may hold the study run at several budgets (or lengths, models: an experiment's
sweep read with ``--no-run``): every line, pair and figure point is one setup's and one
budget's, and full prefill pairs with each budget of its setup (:func:`differences`, also per
task). Two variants of one method at one budget (an ablation in the same folder) are refused
(:func:`one_variant`): run them into another ``--out``.

    python -m harness.studies.draft_family [--model qwen2.5-coder-1.5b] [--length 2048]
        [--tasks niah_single_2 niah_multikey_1 qa_1] [--limit 10] [--keep-tokens 512]
        [--iters 10] [--out results/draft-family] [--no-latency] [--no-run] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.rendering.tables import ci, num
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

TASKS = ["niah_single_2", "niah_multikey_1", "qa_1"]
PRESS = "keydiff"
#: (line, the method's command-line arguments): every line at the budget ``keep_tokens``.
METHODS: list[tuple[str, list[str]]] = [
    ("full", ["method=full"]),
    ("specprefill", ["method=specprefill"]),
    ("specpc", ["method=specpc"]),
    ("speckv", ["method=speckv"]),
    ("speckvpc", ["method=speckvpc", "method.then_keep_rate=0.5"]),
    (f"specprefill+{PRESS}", ["method=compose", "method.first=specprefill", f"method.then={PRESS}",
                              "method.then_keep_rate=0.5"]),
]  # fmt: skip
KIND = {
    "full": "full prefill",
    "specprefill": "SpecPrefill: N prompt tokens",
    "specpc": "SpecPC: N prompt tokens",
    "speckv": "SpecKV: N KV entries",
    "speckvpc": "SpecKV-PC: SpecPC N tokens, SpecKV N/2 entries",
    f"specprefill+{PRESS}": f"SpecPrefill N tokens, then {PRESS} N/2 entries",
}
BASELINE = "specprefill"


def line_of(method: str, options: Any) -> str:
    """A row's line in the study: the method, a composition by its parts."""
    opts = options_of(options)
    if method != "compose":
        return method
    return (
        "speckvpc"
        if (opts.get("first"), opts.get("then")) == ("specpc", "speckv")
        else f"{opts['first']}+{opts['then']}"
    )


def eval_commands(
    out: Path, model: str, length: int, tasks: list[str], limit: int, keep_tokens: int
) -> list[list[str]]:
    """One ``make eval`` job per method, full prefill first (the others' retention pairs with it)."""
    common = [sys.executable, "-m", "harness.jobs.eval", f"model={model}", "benchmark=ruler", f"length={length}",
              f"tasks=[{','.join(tasks)}]", f"limit={limit}", f"out={out}"]  # fmt: skip
    return [[*common, *args, *([] if name == "full" else [f"keep_tokens={keep_tokens}"])] for name, args in METHODS]


def latency_command(
    out: Path, model: str, length: int, task: str, keep_tokens: int, iters: int, decode_tokens: int
) -> list[str]:
    """SpecPrefill, SpecPC and SpecKV timed beside full prefill in the same iterations
    (``also``: each at its preset and the budget); the cascades get a job each (below)."""
    also = ["specpc", "speckv"]
    return [sys.executable, "-m", "harness.jobs.latency", f"model={model}", f"grid=[[1,{length}]]", "warmup=1",
            f"iters={iters}", "prompts=benchmark", f"prompt_task={task}", "method=specprefill",
            f"keep_tokens={keep_tokens}", f"also=[{','.join(also)}]", f"decode_tokens={decode_tokens}",
            f"out={out}"]  # fmt: skip


def run(a: argparse.Namespace, dry_run: bool = False) -> None:
    extra = ["dry_run=true"] if dry_run else []
    for cmd in eval_commands(a.out, a.model, a.length, a.tasks, a.limit, a.keep_tokens):
        run_job([*cmd, *extra])
    if not a.no_latency:
        run_job([*latency_command(a.out / "latency", a.model, a.length, a.latency_task, a.keep_tokens, a.iters,
                                  a.decode_tokens), *extra])  # fmt: skip
        # the cascades: each its own latency job (its own split), full prefill beside it
        for _name, args in METHODS[4:]:
            cmd = latency_command(a.out / "latency", a.model, a.length, a.latency_task, a.keep_tokens, a.iters,
                                  a.decode_tokens)  # fmt: skip
            cmd = [c for c in cmd if not c.startswith(("method=", "also="))] + args
            run_job([*cmd, *extra])


#: What a line shares besides its method: one ``--out`` may hold the study run at two budgets,
#: lengths or models (or an experiment's sweep, ``conf/experiments/draft_family.yaml``); their
#: rows never meet in a line or a pair.
SETUP = ["model", "speculator", "backend", "dtype", "benchmark", "length"]


def budget_of(options: Any) -> float:
    """A row's budget N: its ``keep_tokens`` (the tokens of each prompt every method keeps); NaN
    for full prefill and for a run with a budget in fractions, which this study does not make."""
    opts = options_of(options)
    v = opts.get("keep_tokens")
    return float(v) if v is not None else float("nan")


def _setup(frame: pd.DataFrame, options: pd.Series) -> dict[str, Any]:
    """The setup columns a table line carries, and its budget."""
    return {**{c: frame[c] for c in SETUP if c in frame}, "budget": [budget_of(o) for o in options]}


#: Options that are the budget, not the variant: two rows differing only in these are one line's.
BUDGET_KEYS = ("keep_rate", "keep_tokens")


def _variant(options: Any) -> str:
    """A row's method options less its budget, canonical (two variants of one method differ here)."""
    opts = options_of(options)
    return json.dumps({k: v for k, v in opts.items() if k not in BUDGET_KEYS}, sort_keys=True, default=str)


def one_variant(rows: pd.DataFrame) -> None:
    """Refuse, in one line, rows that hold two variants of a method at one budget (an ablation
    run into the study's ``--out``, or an experiment sweeping another option at one budget, such
    as SpecKV-PC's ``then_keep_rate``): a line and its pairs would mix them silently."""
    if rows.empty:
        return
    one_benchmark_setting(rows, "draft-family")
    d = rows.assign(line=[line_of(m, o) for m, o in zip(rows["method"], rows["method_options"], strict=True)],
                    budget=[budget_of(o) for o in rows["method_options"]],
                    variant=[_variant(o) for o in rows["method_options"]])  # fmt: skip
    conflict = first_conflict(d, [*(c for c in SETUP if c in d), "budget", "line"], "variant")
    if conflict:
        where, most = conflict
        raise ValueError(
            f"draft-family: {where['line']} at budget {where['budget']:g} ({where.get('model')}, length "
            f"{where.get('length')}) has {most} variants of its options in one folder; allowed: one "
            "variant of each method per budget (run an ablation into another --out)"
        )


def quality(a: Analysis) -> pd.DataFrame:
    """One line per setup, budget and method: the summary's ``ALL`` row (score, retention
    against full prefill on the same samples, needle kept, KV held, decode time per token).
    Full prefill's line has no budget (NaN): every budget of its setup pairs with it."""
    s = a.summary
    s = s[s["task"] == ALL]
    return pd.DataFrame({
        **_setup(s, s["method_options"]),
        "line": [line_of(m, o) for m, o in zip(s["method_name"], s["method_options"], strict=True)],
        "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "needle_kept", "kept_fraction", "kv_fraction", "kv_mib", "speculator_s", "ttft_s",
                             "decode_s_per_token")},
    }).reset_index(drop=True)  # fmt: skip


def speed(a: Analysis) -> pd.DataFrame:
    """One line per model, length, budget and method timed beside full prefill: the
    side-by-side TTFT speedup with its interval, the ideal from FLOPs, and the decode time per
    token after its prefill (the latest job's where one was timed twice)."""
    s = a.latency
    if s.empty:
        return pd.DataFrame(columns=["model", "length", "budget", "line"])
    s = s[~s["is_reference"].astype(bool)]
    cols = {c: s[c] for c in ("speedup", "speedup_lo", "speedup_hi", "ideal_speedup", "efficiency") if c in s}
    return pd.DataFrame({
        "model": s["model"], "length": s["length"], "budget": [budget_of(o) for o in s["method_options"]],
        "line": [line_of(m, o) for m, o in zip(s["method_name"], s["method_options"], strict=True)],
        "lat_n": s["n"].astype(int), **{f"lat_{k}": v for k, v in cols.items()},
    }).drop_duplicates(["model", "length", "budget", "line"], keep="last").reset_index(drop=True)  # fmt: skip


def table(a: Analysis) -> pd.DataFrame:
    """:func:`quality` with :func:`speed`'s columns, per setup: full prefill, then each budget's
    methods in :data:`METHODS` order."""
    one_variant(a.ok("eval"))
    q, sp = quality(a), speed(a)
    keys = ["model", "length", "budget", "line"]
    df = q.merge(sp.astype({"length": q["length"].dtype}) if len(sp) else sp, on=keys, how="left")
    order = {name: i for i, (name, _) in enumerate(METHODS)}
    df["_m"] = df["line"].map(lambda x: order.get(x, len(order)))
    by = [c for c in SETUP if c in df]
    return (df.sort_values([*by, "budget", "_m"], na_position="first")
            .drop(columns="_m").reset_index(drop=True))  # fmt: skip


def differences(a: Analysis, baseline: str = BASELINE) -> pd.DataFrame:
    """Per setup and budget, each method against ``baseline`` at that budget on the same
    samples, over all tasks and (where there are several) per task: the score difference
    (0-100 points, method minus baseline; :func:`harness.analysis.quality.paired_difference`,
    the tasks weighted equally) with its 95 % interval and the samples won and lost. Full
    prefill (no budget) is compared with the baseline at each budget of its setup."""
    d = a.ok("eval")
    one_variant(d)
    d = d.assign(line=[line_of(m, o) for m, o in zip(d["method"], d["method_options"], strict=True)],
                 budget=[budget_of(o) for o in d["method_options"]])  # fmt: skip
    # full prefill has no draft: it pairs with every draft's lines of its setup
    d = d.assign(draft=d["speculator"].fillna("").astype(str) if "speculator" in d else "")
    cols = [c for c in SETUP if c in d and c != "speculator"]
    out = []
    for key, g in d.groupby(cols, sort=True, dropna=False):
        where = dict(zip(cols, key, strict=True))
        for draft, budget in sorted(set(map(tuple, g.loc[g["line"] == baseline, ["draft", "budget"]].to_numpy()))):
            at = g[((g["draft"] == draft) & (g["budget"] == budget)) | (g["line"] == "full")]
            base = at[at["line"] == baseline]
            for line in [name for name, _ in METHODS if name != baseline]:
                c = at[at["line"] == line]
                if c.empty:
                    continue
                tasks = sorted(set(c["task"]) & set(base["task"]))
                for scope in [ALL, *tasks] if len(tasks) > 1 else [ALL]:  # one task: ALL is it
                    out.append({**where, "speculator": draft, "budget": budget, "task": scope, "line": line,
                                "baseline": baseline, **paired_scores(c, base, scope)})  # fmt: skip
    return pd.DataFrame(out)


def markdown(df: pd.DataFrame, diff: pd.DataFrame) -> str:
    setup = varying(df, diff)
    lead = head_cells(setup)
    head = (lead + "| method | n | score | retention vs full | needle kept | prefilled (of prompt) | KV held | KV MiB | "
            "TTFT s (eval) | speedup, side by side | ideal | decode s/token |")  # fmt: skip
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in df.itertuples():
        full = r.line == "full"
        sp = "1.00x" if full else ci(getattr(r, "lat_speedup", np.nan), getattr(r, "lat_speedup_lo", np.nan),
                                     getattr(r, "lat_speedup_hi", np.nan), ".2f")  # fmt: skip
        ideal = 1.0 if full else getattr(r, "lat_ideal_speedup", np.nan)
        lines.append(
            "".join(f"| {cell(r, c)} " for c in setup) +
            f"| {KIND.get(str(r.line), r.line)} | {r.n} | {ci(r.score, r.score_lo, r.score_hi)} | "
            f"{'1' if full else ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | {num(r.needle_kept, '.2f')} | "
            f"{num(r.kept_fraction, '.2f')} | {num(r.kv_fraction, '.2f')} | {num(r.kv_mib, '.1f')} | "
            f"{num(r.ttft_s, '.2f')} | {sp} | {num(ideal, '.2f')}{'' if pd.isna(ideal) else 'x'} | "
            f"{num(r.decode_s_per_token, '.3f')} |"
        )  # fmt: skip
    lines += ["", "Score (0-100) and retention (score over full prefill's on the same samples): 95 % bootstrap over "
              "samples. Speedup: TTFT of full prefill over the method's, timed side by side in the same iterations "
              "(paired, order-balanced), 95 % interval; ideal: the FLOP model's (the draft's work included). KV held: "
              "the base's cache after the prefill over the prompt's tokens. SpecKV prefills the prompt and its "
              "draft (prefilled 1.00)."]  # fmt: skip
    lines += difference_tables(
        diff, setup, "method", lambda r: (KIND.get(str(r.line), r.line), KIND.get(str(r.baseline), r.baseline))
    )
    return "\n".join(lines)


def figure(df: pd.DataFrame, path: Path) -> None:
    """Retention against the side-by-side TTFT speedup, one point per method with both intervals;
    where no latency job has run yet, retention against the KV held (the title says so), so the
    figure never comes out empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = "lat_speedup" in df and df["lat_speedup"].notna().any()
    d = df[(df["line"] != "full") & df["lat_speedup"].notna()] if timed else df[df["line"] != "full"]
    setup = varying(d)  # a folder of several budgets (or lengths, models): each point says which
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in d.itertuples():
        x, xerr = (
            (r.lat_speedup, [[r.lat_speedup - r.lat_speedup_lo], [r.lat_speedup_hi - r.lat_speedup]])
            if timed
            else (r.kv_fraction, None)
        )
        ax.errorbar(x, r.retention, xerr=xerr, yerr=[[r.retention - r.retention_lo], [r.retention_hi - r.retention]],
                    fmt="o", capsize=3, label=KIND.get(str(r.line), r.line) +
                    "".join(f", {c} {cell(r, c)}" for c in setup))  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    if timed:
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("TTFT speedup over full prefill (side by side, 95 % interval)")
        ax.set_title("Draft-based methods at one token budget")
    else:
        ax.set_xlabel("KV held after the prefill (over the prompt's tokens; full prefill: 1)")
        ax.set_title("Draft-based methods at one token budget (no side-by-side speed yet)")
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
    ap.add_argument("--limit", type=int, default=10, help="samples per task")
    ap.add_argument("--keep-tokens", type=int, default=512, help="the budget N, tokens of each prompt")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per latency job")
    ap.add_argument(
        "--latency-task", default="niah_single_2", help="the RULER task whose prompts the latency jobs time"
    )
    ap.add_argument("--decode-tokens", type=int, default=16, help="tokens decoded after each timed prefill")
    ap.add_argument("--out", type=Path, default=Path("results/draft-family"))
    ap.add_argument("--no-latency", action="store_true", help="quality only")
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs' plans, load nothing")
    a = ap.parse_args(argv)
    require_values(ap, "--limit", [a.limit], lambda n: n >= 1, "1 or more samples a task")
    require_values(ap, "--keep-tokens", [a.keep_tokens], lambda n: n >= 1, "a budget of 1 or more tokens")
    if a.no_run:
        require_runs(ap, a.out)
    if a.dry_run:
        run(a, dry_run=True)
        return
    if not a.no_run:
        run(a)
    found = analyze(a.out)
    try:
        df, diff = table(found), differences(found)
    except ValueError as e:  # a folder the tables cannot read: one line, no traceback
        raise SystemExit(str(e)) from None
    df.to_csv(a.out / "draft_family.csv", index=False)
    diff.to_csv(a.out / "draft_family_differences.csv", index=False)
    text = markdown(df, diff)
    (a.out / "draft_family.md").write_text(text + "\n")
    figure(df, a.out / "draft_family.png")
    print(text)


if __name__ == "__main__":
    main()
