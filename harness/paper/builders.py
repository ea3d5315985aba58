"""The paper's tables beside ours, one builder per table, and the report that writes them
all (``results/paper/<table>.md`` and ``.png``, ``headline.md``, ``baselines.md``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from harness.analysis.serving import NO_MATCHING_REFERENCE
from harness.analysis.stats import Estimate
from harness.experiments import Experiment, cannot_run
from harness.paper.cells import (
    LEGEND,
    REFERENCE,
    Cell,
    cell,
    columns,
    formatted,
    md_or_nothing,
    no_delta,
    not_run_note,
    retention_cell,
    slug,
)
from harness.paper.figures import Mark, figure
from harness.paper.numbers import (
    MODEL_OF,
    POINTS,
    RESULTS,
    SHORT,
    Ours,
    Published,
    category_of,
    experiment_names,
    folder,
    implied_ratio,
    load_experiment,
    load_ours,
    paper_number,
    published,
    variant_rows,
)
from harness.rendering.tables import flag_word

Built = tuple[str, list[Mark]]


def _longbench_405b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama405b")
    keeps = [0.1, 0.3, 0.5, 0.7]
    nd = no_delta(exp, variant, pub)
    ev = ours.eval(model)
    tasks = list(src[src["metric"] == "score"]["task"])
    if not ev.empty:  # a run on another benchmark (the CPU variant's RULER): its own tasks
        tasks = [t for t in tasks if t in set(ev["task"])] + sorted(set(ev["task"]) - set(tasks))
    rows = []
    for t in tasks:
        full = paper_number(src, task=t, method="full", metric="score")
        r = {
            "dataset": t,
            **columns("full score", cell(ours.score("full", 1.0, t, None, model), full, no_delta=nd)),
        }
        for k in keeps:
            r[f"retention keep {k:g} (ours)"] = retention_cell(ours, "specprefill", k, t, None, model)
        rows.append(r)
    speed, marks = [], []
    for k in keeps:
        sp, p = ours.ttft_speedup("specprefill", k, model), paper_number(src, metric="ttft_speedup", keep=k)
        speed.append(
            {
                "keep": f"{k:g}",
                **columns("TTFT speedup", cell(sp, p, no_delta=nd)),
                "score ALL (ours)": cell(ours.score("specprefill", k, "ALL", None, model), None, "{:.1f}")[0],
                "retention ALL (ours)": retention_cell(ours, "specprefill", k, "ALL", None, model),
            }
        )
        panel = "TTFT speedup over full prefill vs keep"
        if p is not None:
            marks.append(Mark(panel, "paper", "SpecPrefill", k, p.value))
        if sp is not None:
            marks.append(Mark(panel, variant, "SpecPrefill", k, sp.value, sp.lo, sp.hi))
        ret = ours.retention("specprefill", k, "ALL", None, model=model)
        if ret is not None:
            panel = "score retention (ALL) vs keep (the paper prints none)"
            marks.append(Mark(panel, variant, "SpecPrefill", k, ret.value, ret.lo, ret.hi))
    md = (
        "Full-prefill score per dataset and SpecPrefill's retention (its score over full prefill's "
        "on the same samples; the paper prints no per-dataset SpecPrefill numbers):\n\n"
        + md_or_nothing(rows)
        + "\nTTFT speedup over full prefill (ours: mean TTFT ratio on the same samples, between runs: each "
        "method's eval run timed on its own, so the interval covers the samples, not the drift between runs):\n\n"
        + md_or_nothing(speed)
    )
    return md, marks


def _qps(exp: Experiment, pub: pd.DataFrame, rows: pd.DataFrame, variant: str) -> tuple[str, str, list[Mark]]:
    src = pub[pub["source"] == exp.source]
    v = exp.variants[variant]
    nd = no_delta(exp, variant, pub)
    table, prov, marks = [], [], []
    for cat in dict.fromkeys(src["task"]):
        o = Ours.of(rows[rows["sub"] == slug(cat)] if not rows.empty else rows)
        if not o.empty:
            prov.append(f"{cat}: {o.provenance()}")
        q = o.qps()
        spec_keep = float(src[(src["task"] == cat) & (src["method"] == "specprefill")]["keep"].iloc[0])
        timeout = str(src[src["task"] == cat]["setting"].iloc[0]).removeprefix("timeout=")
        for base in dict.fromkeys(src["base"]):
            mine = v.models.get(MODEL_OF[base])
            short = SHORT[MODEL_OF[base]]
            got: dict[str, pd.Series | None] = {}
            for method in ("full", "specprefill"):
                m = q[(q["model"] == mine) & (q["method"] == method)] if mine is not None and not q.empty else q
                if method != "full" and len(m):
                    m = m[np.isclose(m["keep_rate"].astype(float), spec_keep)]
                got[method] = m.iloc[-1] if mine is not None and len(m) else None
            p_full = paper_number(src, base=base, task=cat, method="full", metric="max_qps")
            why = "not in this variant" if mine is None else ("not run" if o.empty else "no row")
            for method in ("full", "specprefill"):
                g = got[method]
                pq = paper_number(src, base=base, task=cat, method=method, metric="max_qps")
                ps = paper_number(src, base=base, task=cat, method=method, metric="score")
                max_qps = _max_qps_cell(g, pq, ps, why, nd)
                r = {
                    "category": cat,
                    "keep, timeout": f"{spec_keep:g}, {timeout}",
                    "paper's base": short,
                    "method": "full" if method == "full" else f"SpecPrefill {spec_keep:.0%}",
                    **columns("max QPS", max_qps),
                    "score at it: ours": f"({why})" if g is None else f"{g['score_at_max_qps']:.1f}",
                    "score at it: paper": "-" if ps is None else ps.text,
                }
                if method == "full":
                    r.update(columns("over full's max QPS", REFERENCE))
                else:
                    r.update(columns("over full's max QPS", _qps_ratio(g, pq, p_full, why, nd)))
                r["peak throughput over full's: ours"] = _peak_ratio(g, method, why)
                table.append(r)
                at, label = f"{cat}, {short}", "full" if method == "full" else "SpecPrefill"
                if pq is not None:
                    marks.append(Mark("max QPS", "paper", label, at, pq.value))
                if g is not None:
                    bound = max_qps[0].startswith(">=")
                    marks.append(Mark("max QPS", variant, label, at, float(g["max_qps"]), lower_bound=bound))
                if method != "full":
                    panel, ratio = "SpecPrefill's max QPS over full prefill's", implied_ratio(pq, p_full)
                    if ratio is not None:
                        marks.append(Mark(panel, "paper", "SpecPrefill", at, ratio))
                    if g is not None and g.get("qps_ratio_bound", "exact") in ("exact", "lower bound"):
                        bound = g.get("qps_ratio_bound") == "lower bound"
                        ours = float(g["qps_ratio_to_reference"])
                        marks.append(Mark(panel, variant, "SpecPrefill", at, ours, lower_bound=bound))
    note = (
        "Max QPS before more than 4 requests exceed the timeout, the task score at it, and the "
        "ratio to full prefill's max QPS on the same model (the paper's: the ratio of its two "
        "printed rates). `>=`: the highest rate the search tried still passed, so the true max "
        "QPS is higher (a lower bound); a ratio over a reference that is itself a lower bound is "
        "at most the printed value (`<=`) where the method's max is exact, unknown (`?`) where it is not. Peak throughput (ours only: the paper prints none): the most requests per "
        "second a method delivered at any rate tried (completed requests over the burst's "
        "duration), over full prefill's; where the server could not keep up with a rate this is "
        "what it sustains, whether or not the rate passed; one run each, no interval.\n\n"
    )
    return note + md_or_nothing(table), "; ".join(prov), marks


def _max_qps_cell(g: pd.Series | None, pq: Published | None, ps: Published | None, why: str, nd: str) -> Cell:
    """Our max QPS (``>=`` where the search never failed: a lower bound) beside the paper's
    (``times out`` where it prints neither a rate nor a score)."""
    ge = ">=" if g is not None and bool(g.get("max_qps_censored", False)) else ""
    o, p, d = cell(None if g is None else float(g["max_qps"]), pq, why=why, no_delta=nd)
    if pq is None and ps is None:
        p = "times out"
    return ge + o, p, (ge + d if d[0] in "+-" and d != "-" else d)


def _peak_ratio(g: pd.Series | None, method: str, why: str) -> str:
    """Our peak delivered throughput over full prefill's (the paper prints none)."""
    if method == "full":
        return "1 (reference)" if g is not None else f"({why})"
    if g is None:
        return f"({why})"
    v = g.get("peak_throughput_ratio", float("nan"))
    return "-" if v is None or pd.isna(v) else f"{float(v):.2f}"


def _qps_ratio(g: pd.Series | None, pq: Published | None, p_full: Published | None, why: str, nd: str) -> Cell:
    """SpecPrefill's max QPS over full prefill's: ours (bounds marked) beside the paper's."""
    paper = implied_ratio(pq, p_full)
    # The paper's full prefill timing out at every rate leaves its ratio unbounded.
    theirs = "- (full times out)" if pq is not None and p_full is None else None
    if g is None:
        o, p, d = cell(None, paper, why=why, no_delta=nd)
    elif g.get("qps_ratio_bound", "exact") == "unknown":
        o, p, d = "? (full's max is a lower bound)", formatted(paper, "{:.2f}"), "-"
    elif g.get("qps_ratio_bound") == NO_MATCHING_REFERENCE:
        o, p, d = "? (full ran only under other SLO settings)", formatted(paper, "{:.2f}"), "-"
    else:
        o, p, d = cell(float(g["qps_ratio_to_reference"]), paper, no_delta=nd)
        ge = {"lower bound": ">=", "upper bound": "<="}.get(str(g.get("qps_ratio_bound")), "")
        o, d = ge + o, (ge + d if d[0] in "+-" and d != "-" else d)
    return o, theirs or p, d


def _latency_grid(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    lat = ours.latency()
    nd = no_delta(exp, variant, pub)
    blocked = cannot_run(exp.variants[variant])
    grid = list(dict.fromkeys(src["task"]))
    if not lat.empty:  # our grid points (a CPU variant's differ from the paper's: its rows are ours)
        mine = sorted({(int(b), int(n)) for b, n in zip(lat["batch"], lat["length"], strict=True)}, key=lambda x: x[1])
        grid = [g for g in grid if tuple(int(x) for x in g.split("x")) in mine]
        grid += [f"{b}x{n}" for b, n in mine if f"{b}x{n}" not in grid]
    rows, marks = [], []
    for method, keep in dict.fromkeys(zip(src["method"], src["keep"], strict=True)):
        label = method if method != "specprefill" else f"specprefill {keep:.0%}"
        for g in grid:
            b, n = (int(x) for x in g.split("x"))
            p = paper_number(src, task=g, method=method, keep=float(keep), metric="latency_s")
            pf = paper_number(src, task=g, method="full", metric="latency_s")
            got = None
            if not lat.empty:
                m = lat[(lat["method_name"] == method) & (lat["batch"] == b) & (lat["length"] == n)]
                m = m[np.isclose(m["keep_rate"].astype(float), float(keep))] if method != "full" else m
                got = m.iloc[0] if len(m) and int(m.iloc[0]["n"]) > 0 else None
            reason = "not run" if got is not None else ours.why_missing("latency", method)
            if got is None and method in blocked:
                reason = "cannot run in this table: see below"
            med = None if got is None else Estimate(float(got["ttft_median_s"]), math.nan, math.nan, int(got["n"]))
            r = {"method": label, "batch x length": g, **columns("latency s", cell(med, p, why=reason, no_delta=nd))}
            if method == "full":
                r.update(columns("speedup", REFERENCE))
            else:
                est = None
                if got is not None:
                    est = Estimate(
                        float(got["speedup"]), float(got["speedup_lo"]), float(got["speedup_hi"]), int(got["n"])
                    )
                paper_speedup = implied_ratio(pf, p)
                r.update(columns("speedup", cell(est, paper_speedup, why=reason, no_delta=nd)))
                check = "ok" if got is None else flag_word(got.get("flags"))
                if check != "ok":  # an unsafe speed claim says so in its cell (the summary has the words)
                    r["speedup: ours"] += f" ({check})"
                if paper_speedup is not None:
                    marks.append(
                        Mark("paper: speedup over full prefill (70B, 8 GPUs)", "paper", label, g, paper_speedup)
                    )
                if est is not None:
                    panel = f"ours ({variant}): speedup over full prefill"
                    marks.append(Mark(panel, variant, label, g, est.value, est.lo, est.hi))
            rows.append(r)
    md = (
        "Batch latency in seconds (ours: median of the timed iterations, n of them) and the speedup "
        "over full prefill (ours: measured side by side in one run, the median of the per-iteration ratios "
        "with its 95 % interval over the pairs, none under 5 pairs; a cell marked `old protocol` was timed "
        "before the order-balanced protocol, the reference always first; `ANOMALY`, `A/A FAILED`: see the "
        "latency summary's flags; the paper's: its full-prefill latency over the method's):\n\n"
        + md_or_nothing(rows)
        + "".join(f"\n{m}: cannot run in this table: {r}.\n" for m, r in blocked.items())
    )
    return md, marks


#: The paper's LongBench category abbreviations and LongBench's own names (our rows' ``category``).
CATEGORY = {
    "SQA": "single-doc QA",
    "MQA": "multi-doc QA",
    "Sum": "summarization",
    "FSL": "few-shot",
    "Code": "code",
    "Synth": "synthetic",
}


def _categories_8b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> Built:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama8b")
    nd = no_delta(exp, variant, pub)
    ev = ours.eval(model)
    our_cats = sorted({category_of(r) for _, r in ev.iterrows()}) if not ev.empty else []
    paper_cats = [c for c in dict.fromkeys(src["task"]) if c != "Avg"]
    # The paper's categories where ours are LongBench's too (or nothing ran); a run on another
    # benchmark (the CPU variant's RULER) shows its own beside the paper's Avg.
    shown = paper_cats if not our_cats or "benchmark" not in nd else []
    groups = [(c, CATEGORY[c]) for c in shown]
    groups += [(c, c) for c in our_cats if c not in {CATEGORY[p] for p in shown}]
    groups.append(("Avg", "Avg"))
    methods = list(dict.fromkeys(zip(src["method"], src["keep"], strict=True)))
    rows, marks = [], []
    for theirs, mine in groups:
        full_p = paper_number(src, task=theirs, method="full", metric="score")
        for method, keep in methods:
            label = "full" if method == "full" else f"keep {keep:.0%}"
            p = paper_number(src, task=theirs, method=method, keep=float(keep), metric="score")
            sc = ours.score(method, float(keep), mine, category_of, model)
            r = {"category": theirs if theirs == mine else f"{theirs} ({mine})", "method": label}
            r.update(columns("score", cell(sc, p, no_delta=nd)))
            if method == "full":
                r.update(columns("retention", REFERENCE))
            else:
                ret = retention_cell(ours, method, float(keep), mine, category_of, model)
                paper_ret = implied_ratio(p, full_p)
                est = ours.retention(method, float(keep), mine, category_of, model=model)
                c = cell(est, paper_ret, "{:.3f}", no_delta=nd)
                r.update(columns("retention", (ret if est is None else c[0], c[1], c[2])))
                if theirs == "Avg":
                    panel = "retention of the Avg vs keep"
                    if paper_ret is not None:
                        marks.append(Mark(panel, "paper", "SpecPrefill", float(keep), paper_ret))
                    if est is not None:
                        marks.append(Mark(panel, variant, "SpecPrefill", float(keep), est.value, est.lo, est.hi))
            rows.append(r)
            if theirs != "Avg":
                if p is not None:
                    marks.append(Mark("score per category (LongBench)", "paper", label, theirs, p.value))
                if sc is not None:
                    panel = (
                        "score per category (LongBench)"
                        if "benchmark" not in nd
                        else f"ours ({variant}): score per category"
                    )
                    marks.append(Mark(panel, variant, label, theirs, sc.value, sc.lo, sc.hi))
    md = (
        "Category averages (macro means of the tasks in each category; Avg is the mean of the "
        "categories) and retention (a method's score over full prefill's on the same samples; "
        "the paper's: its two printed scores' ratio). Ours are per our categories (LongBench's, "
        "or RULER's task families on a RULER run):\n\n" + md_or_nothing(rows)
    )
    return md, marks


BUILDERS: dict[str, Callable[[Experiment, pd.DataFrame, Ours, str], Built]] = {
    "longbench_405b": _longbench_405b,
    "latency_grid": _latency_grid,
    "categories_8b": _categories_8b,
}


def _headline(pub: pd.DataFrame, root: Path) -> str:
    src = pub[pub["source"] == "abstract"]
    paper_model = MODEL_OF[str(src["base"].iloc[0])]
    best_ttft: tuple[float, str, str] | None = None  # (speedup, where, our model)
    for table in ("latency_grid", "longbench_405b"):
        for variant in ("paper", "cpu"):
            lat = load_ours(table, variant, root).latency()
            if not lat.empty and lat["speedup"].notna().any():
                i = lat["speedup"].astype(float).idxmax()
                where = f"{table}/{variant}: {lat.loc[i, 'model']} {lat.loc[i, 'method']}"
                cand = (float(lat.loc[i, "speedup"]), where, str(lat.loc[i, "model"]))
                best_ttft = cand if best_ttft is None or cand[0] > best_ttft[0] else best_ttft
    best_qps: tuple[float, str, str] | None = None
    qps_runs = False
    exp = load_experiment("qps")
    for variant in exp.variants:
        rows = variant_rows(exp, variant, root)
        for sub in dict.fromkeys(rows["sub"]) if not rows.empty else []:
            q = Ours.of(rows[rows["sub"] == sub]).qps()
            qps_runs = qps_runs or not q.empty
            q = q[q["method"] != q["reference"]] if not q.empty else q  # the reference's own 1.0 is no claim
            if not q.empty and q["qps_ratio_to_reference"].notna().any():
                i = q["qps_ratio_to_reference"].astype(float).idxmax()
                lower = q.loc[i, "qps_ratio_bound"] == "lower bound"
                where = f"qps/{variant}/{sub}: {q.loc[i, 'model']}" + (" (a lower bound)" if lower else "")
                cand = (float(q.loc[i, "qps_ratio_to_reference"]), where, str(q.loc[i, "model"]))
                best_qps = cand if best_qps is None or cand[0] > best_qps[0] else best_qps

    def nd(best: tuple[float, str, str] | None) -> str:
        return "" if best is None or best[2] == paper_model else "other model"

    rows = [
        {
            "claim": "up to x TTFT",
            **columns(
                "ratio",
                cell(
                    None if best_ttft is None else best_ttft[0],
                    paper_number(src, metric="ttft_speedup"),
                    no_delta=nd(best_ttft),
                ),
            ),
            "ours from": "-" if best_ttft is None else best_ttft[1],
        },
        {
            "claim": "up to x max QPS",
            **columns(
                "ratio",
                cell(
                    None if best_qps is None else best_qps[0],
                    paper_number(src, metric="max_qps_speedup"),
                    why="no exact ratio: see qps.md" if qps_runs else "not run",
                    no_delta=nd(best_qps),
                ),
            ),
            "ours from": "-" if best_qps is None else best_qps[1],
        },
    ]
    return (
        "The abstract's headline figures (Llama-3.1-405B-Instruct-FP8), against the best ratio in "
        "any of our runs (Δ only where that run is the 405B's):\n\n" + md_or_nothing(rows)
    )


def _baselines(pub: pd.DataFrame, root: Path, image: str | None = None) -> Built:
    """The rebuttal's comparisons with other methods, and what is known of RULER."""
    src = pub[pub["source"] == "rebuttal: claims"]
    exp = load_experiment("latency_grid")
    grid = pub[pub["source"] == exp.source]
    rows, marks = [], []
    quality = paper_number(src, metric="retention_vs_minference")
    rows.append(
        {
            "claim": "SpecPrefill keep 10 %'s LongBench score over MInference's (70B base)",
            "variant": "-",
            **columns(
                "ratio", cell(None, quality, "{:.3f}", why="not run: no experiment runs MInference on LongBench")
            ),
        }
    )
    for g in dict.fromkeys(grid["task"]):
        p = implied_ratio(
            paper_number(grid, task=g, method="minference", metric="latency_s"),
            paper_number(grid, task=g, method="specprefill", keep=0.1, metric="latency_s"),
        )
        if p is not None:
            marks.append(Mark("MInference latency over SpecPrefill 10 %'s", "paper", "70B", g, p))
    for variant in exp.variants:
        ours_rows = load_ours("latency_grid", variant, root)
        lat = ours_rows.latency()
        ratios: dict[str, float] = {}
        if not lat.empty:
            lat = lat.assign(point=lat["batch"].astype(int).astype(str) + "x" + lat["length"].astype(int).astype(str))
            ok = lat[lat["n"].astype(int) > 0]
            mi = ok[ok["method_name"] == "minference"].set_index("point")["ttft_median_s"]
            sp = ok[(ok["method_name"] == "specprefill") & np.isclose(ok["keep_rate"].astype(float), 0.1)]
            sp = sp.set_index("point")["ttft_median_s"]
            ratios = {g: float(mi[g] / sp[g]) for g in mi.index.intersection(sp.index)}
            for g, r in ratios.items():
                marks.append(Mark("MInference latency over SpecPrefill 10 %'s", variant, "ours", g, r))
        blocked = cannot_run(exp.variants[variant])
        why = (
            "cannot run in this table: see latency_grid.md"
            if "minference" in blocked
            else ours_rows.why_missing("latency", "minference")
        )
        nd = no_delta(exp, variant, pub)
        for name, metric, pick in (("lowest", "latency_reduction_min", min), ("highest", "latency_reduction_max", max)):
            ours = pick(ratios.values()) if ratios else None
            rows.append(
                {
                    "claim": f"MInference's batch latency over SpecPrefill keep 10 %'s, {name} over the grid",
                    "variant": variant,
                    **columns("ratio", cell(ours, paper_number(src, metric=metric), why=why, no_delta=nd)),
                }
            )
    md = (
        "# Baselines and RULER\n\n"
        "Published: the rebuttal's claims against other methods (`rebuttal: claims` in "
        "`conf/paper/published.csv`), Llama-3.1-70B-Instruct base with a Llama-3.1-8B-Instruct speculator.\n\n"
        + LEGEND
        + (f"\n![Baselines: ours beside the paper's]({image})\n" if image else "")
        + "\n## Against MInference\n\n"
        "Only these comparisons carry numbers. The latency ratios are over the batch x length grid "
        "of `latency_grid.md` (ours: the ratio of the two medians at each of our grid points, no "
        "interval; the figure shows each point).\n\n"
        + md_or_nothing(rows)
        + "\nClaims without a number, so without a table: SpecPrefill's LongBench score surpasses "
        "MInference's from keep 30 %; it beats RAG and LLMLingua-2 at an equal number of kept "
        "tokens (both run here: `method=rag_bm25`, `rag_dense`, `llmlingua2`).\n"
        "\n## RULER\n\n"
        "No RULER number is transcribed (`conf/paper/published.csv` holds the abstract, figures 2 "
        "and 3, the 8B category table and the rebuttal's latency grid and claims), so there is no "
        "RULER table: one would be a row per published number there, as the others are. Our CPU "
        "variants run RULER only as an offline stand-in for LongBench "
        "(`longbench_405b.md`, `categories_8b.md`, `qps.md`).\n"
    )
    return md, marks


def render_table(table: str, root: Path = RESULTS, image: str | None = None) -> Built:
    exp = load_experiment(table)
    pub = published()
    parts = [f"# {exp.title}\n", f"Published: {exp.source} of the SpecPrefill paper (ICML 2025).\n", LEGEND]
    if image:
        parts.append(f"![{exp.title}: ours beside the paper's]({image})\n")
    marks: list[Mark] = []
    for variant in exp.variants:
        v = exp.variants[variant]
        rows = variant_rows(exp, variant, root)
        parts.append(f"\n## Variant `{variant}`\n")
        if v.note:
            parts.append(v.note.strip() + "\n")
        if exp.table == "qps":
            body, prov, m = _qps(exp, pub, rows, variant)
        else:
            ours = Ours.of(rows)
            prov = "" if ours.empty else ours.provenance()
            body, m = BUILDERS[exp.table](exp, pub, ours, variant)
        marks += m
        points = folder(exp.table, variant, root) / POINTS
        kept = f"; kept in `{points.relative_to(root)}`" if prov and points.is_file() else ""
        parts.append(f"\nOur rows: {prov or not_run_note(exp, variant)}{kept}.\n\n" + body)
    return "\n".join(parts), list(dict.fromkeys(marks))


def render(table: str, root: Path = RESULTS) -> str:
    """One table's markdown: each variant that has an experiment, ours beside the paper's."""
    return render_table(table, root)[0]


def headline(root: Path = RESULTS) -> str:
    """The abstract's headline figures beside the best of our runs (markdown)."""
    return "# Headline figures\n\n" + _headline(published(), root)


def baselines(root: Path = RESULTS) -> str:
    """The rebuttal's comparisons with other methods beside ours, and RULER (markdown)."""
    return _baselines(published(), root)[0]


def write_report(root: Path = RESULTS) -> Path:
    """``results/paper/<table>.md`` and its figure ``<table>.png`` for every experiment,
    ``headline.md``, and ``baselines.md`` with ``baselines.png``."""
    root.mkdir(parents=True, exist_ok=True)
    for table in experiment_names():
        md, marks = render_table(table, root, image=f"{table}.png")
        (root / f"{table}.md").write_text(md)
        figure(marks, load_experiment(table).title, root / f"{table}.png")
    (root / "headline.md").write_text(headline(root))
    md, marks = _baselines(published(), root, image="baselines.png")
    (root / "baselines.md").write_text(md)
    figure(
        marks,
        "Against MInference: Llama-3.1-70B-Instruct base, Llama-3.1-8B-Instruct speculator",
        root / "baselines.png",
    )
    return root
