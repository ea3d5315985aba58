"""The paper's tables beside ours.

The published numbers of Liu et al., "Speculative Prefill: Turbocharging TTFT with
Lightweight and Training-Free Token Importance Estimation" (ICML 2025) and of its OpenReview
rebuttal are data (``conf/paper/published.csv``, one row per number). Each table has an
experiment (``conf/experiment/paper_<table>.yaml``) with a ``paper`` variant (the paper's
models, GPUs) and a ``cpu`` variant (SmolLM2 on offline data, the table's shape kept), each a
list of harness commands writing under ``results/paper/<table>/<variant>/``.

``python -m harness.paper run --table T [--variant cpu] [--dry-run]`` (``make paper
table=T``) runs one; the dry run prints the commands, the GPUs and an estimate of GPU-hours
from the FLOP model, then each command's own plan. ``python -m harness.paper report``
(``make paper-report``) renders every table from whatever rows exist into
``results/paper/<table>.md``: the paper's layout, each cell ``ours | paper | delta`` with our
95 % interval and n, relative measures (retention: a method's score over full prefill's on
the same samples; speedup) beside absolute ones so a different model's run compares in
shape, and for a cell with no run the reason.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from harness.dryrun import MFU, PEAK_FLOPS  # the FLOP model's GPU, shared with every dry run's estimate
from harness.stats import Estimate, estimate, mean_draws, task_seed
from harness.store import read_results

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "conf" / "paper" / "published.csv"
EXPERIMENTS = ROOT / "conf" / "experiment"
RESULTS = ROOT / "results" / "paper"
#: The paper's checkpoints and the model configs (conf/model) that run them.
MODEL_OF = {
    "meta-llama/Llama-3.1-405B-Instruct-FP8": "llama405b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama8b",
}
SHORT = {"llama405b": "405B", "llama70b": "70B", "llama8b": "8B"}


# --------------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class Command:
    module: str
    args: list[str]
    sub: str = ""  # a subfolder of the variant's folder (one per QPS category)
    estimate: list[dict[str, Any]] = field(default_factory=list)  # [{architecture, prompts, tokens}]
    #: Why this command cannot run in its table ("" when it can): it is printed, never
    #: launched, and its GPU-hours are not counted.
    cannot_run: str = ""

    @property
    def method(self) -> str | None:
        return next((a.split("=", 1)[1] for a in self.args if a.startswith("method=")), None)


@dataclass(frozen=True)
class Variant:
    name: str
    gpus: int
    models: dict[str, str]  # our model config standing for each paper model config
    commands: list[Command]
    note: str = ""


@dataclass(frozen=True)
class Experiment:
    table: str
    title: str
    source: str
    variants: dict[str, Variant]


def experiment_names() -> list[str]:
    return sorted(p.stem.removeprefix("paper_") for p in EXPERIMENTS.glob("paper_*.yaml"))


def load_experiment(table: str) -> Experiment:
    table = table.removeprefix("paper_")
    path = EXPERIMENTS / f"paper_{table}.yaml"
    if not path.is_file():
        raise SystemExit(f"paper: table {table!r} has no {path.relative_to(ROOT)}; allowed: {experiment_names()}")
    raw = yaml.safe_load(path.read_text())
    variants = {
        name: Variant(
            name=name,
            gpus=int(v.get("gpus", 0)),
            models=dict(v.get("models") or {}),
            note=str(v.get("note", "")),
            commands=[
                Command(
                    c["module"],
                    [str(a) for a in c["args"]],
                    str(c.get("sub", "")),
                    list(c.get("estimate") or []),
                    " ".join(str(c.get("cannot_run") or "").split()),
                )
                for c in v["commands"]
            ],
        )
        for name, v in raw["variants"].items()
    }
    return Experiment(raw["table"], raw["title"], raw["source"], variants)


def folder(table: str, variant: str, root: Path = RESULTS) -> Path:
    return root / table / variant


def command_lines(exp: Experiment, variant: str, root: Path = RESULTS, dry_run: bool = False) -> list[list[str]]:
    if variant not in exp.variants:
        raise SystemExit(f"paper: table {exp.table!r} has no variant {variant!r}; allowed: {sorted(exp.variants)}")
    out = folder(exp.table, variant, root)
    return [
        [sys.executable, "-m", f"harness.{c.module}", *c.args, f"out={out / c.sub if c.sub else out}"]
        + (["dry_run=true"] if dry_run else [])
        for c in exp.variants[variant].commands
        if not c.cannot_run
    ]


def cannot_run(v: Variant) -> dict[str, str]:
    """Method -> why it cannot run in this variant (its commands are not launched)."""
    return {c.method or c.module: c.cannot_run for c in v.commands if c.cannot_run}


def gpu_hours(v: Variant) -> float | None:
    """Prefill FLOPs of every prompt the variant's commands run, on the FLOP model's GPU
    (:func:`harness.dryrun.prefill_gpu_hours`, the estimate every dry run prints too); None
    for a CPU variant. An estimate: decode and the speculator are left out, every prompt is
    taken at the command's stated mean length."""
    from harness.dryrun import prefill_gpu_hours
    from harness.placement import architecture

    if v.gpus == 0:
        return None
    return sum(
        prefill_gpu_hours(architecture(str(e["architecture"])) or {}, [(float(e["prompts"]), int(e["tokens"]))])
        for c in v.commands
        for e in ([] if c.cannot_run else c.estimate)
    )


def plan_text(exp: Experiment, variant: str, root: Path = RESULTS) -> str:
    v = exp.variants[variant]
    lines = [f"paper table {exp.table} ({exp.source}): {exp.title}", f"variant {variant}: {v.note}".rstrip(": ")]
    lines.append(f"  GPUs: {v.gpus}" if v.gpus else "  GPUs: none (CPU)")
    hours = gpu_hours(v)
    if hours is not None:
        lines.append(
            f"  estimate: {hours:.1f} GPU-hours (prefill FLOPs at the stated prompt counts and mean lengths, "
            f"{PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 per GPU at {MFU:.0%} utilisation; decode left out)"
        )
    for cmd in command_lines(exp, variant, root):
        lines.append("  " + " ".join(cmd[1:]))
    for method, why in cannot_run(v).items():
        lines.append(f"  {method}: cannot run in this table (not launched, no GPU-hours counted): {why}")
    return "\n".join(lines)


def run(table: str, variant: str, dry_run: bool, root: Path = RESULTS) -> int:
    exp = load_experiment(table)
    print(plan_text(exp, variant, root), flush=True)
    failed = []
    for cmd in command_lines(exp, variant, root, dry_run):
        print("+", " ".join(cmd[1:]), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode:
            failed.append(" ".join(cmd[2:]))  # one failed command is recorded; the others still run
    if failed:
        print(f"paper: {len(failed)} command(s) failed:\n  " + "\n  ".join(failed))
        return 1
    if not dry_run:
        print(f"rendered {write_report(root)}")
    return 0


# --------------------------------------------------------------------------- our numbers


def category_of(row: pd.Series) -> str:
    """A sample's category: the benchmark's own (LongBench), else RULER's task family."""
    if isinstance(row.get("category"), str) and row["category"]:
        return str(row["category"])
    from harness.benchmarks.ruler.tasks import TASKS

    return TASKS[row["task"]][0] if row["task"] in TASKS else str(row["task"])


@dataclass
class Ours:
    """Our rows of one variant, with the lookups the tables need."""

    rows: pd.DataFrame

    @property
    def empty(self) -> bool:
        return self.rows.empty

    def eval(self, model: str | None = None) -> pd.DataFrame:
        if self.rows.empty or "keep_rate" not in self.rows:
            cols = ["model", "method", "keep_rate", "task", "sample_id", "score", "ttft_s", "reference_method"]
            return pd.DataFrame(columns=[*cols, "category"])
        d = self.rows[(self.rows["kind"] == "eval") & (self.rows["status"] == "ok")]
        d = d.assign(keep_rate=d["keep_rate"].astype(float).fillna(1.0))
        return d if model is None else d[d["model"] == model]

    def provenance(self) -> str:
        r = self.rows
        parts = []
        for col in ("model", "backend", "hardware", "dtype", "git_sha"):
            if col in r:
                vals = sorted({str(v) for v in r[col].dropna() if str(v)})
                parts.append(f"{col} {', '.join(v[:12] if col == 'git_sha' else v for v in vals)}")
        return "; ".join(parts)

    def groups(self, method: str, keep: float, key: Callable[[pd.Series], str], model: str | None) -> dict[str, Any]:
        """Per group (a task, a category): the per-sample scores of each task in it, keyed
        by (task, sample_id) so pairs line up with the reference."""
        d = self.eval(model)
        d = d[(d["method"] == method) & np.isclose(d["keep_rate"].astype(float), keep)]
        out: dict[str, dict[str, pd.Series]] = {}
        for task, g in d.groupby("task"):
            s = g.drop_duplicates("sample_id").set_index("sample_id")["score"].astype(float)
            out.setdefault(key(g.iloc[0]), {})[str(task)] = s
        return out

    def score(self, method: str, keep: float, group: str, key: Callable[[pd.Series], str], model: str | None = None):
        """The macro mean over a group's tasks (``ALL``/``Avg``: over the groups), with a
        bootstrap interval resampling each task's samples."""
        gs = self.groups(method, keep, key, model)
        names = list(gs) if group in ("ALL", "Avg") else [group]
        if not names or any(n not in gs for n in names):
            return None
        tasks = {(g, t): s for g in names for t, s in gs[g].items()}
        draws = {k: mean_draws(s.to_numpy(), task_seed(k[1])) for k, s in tasks.items()}
        means = {k: float(s.mean()) for k, s in tasks.items()}
        cat_val = {g: np.mean([means[(g, t)] for t in gs[g]]) for g in names}
        cat_draws = {g: np.mean([draws[(g, t)] for t in gs[g]], axis=0) for g in names}
        value = float(np.mean(list(cat_val.values())))
        return estimate(value, np.mean(list(cat_draws.values()), axis=0), sum(len(s) for s in tasks.values()))

    def retention(self, method: str, keep: float, group: str, key, reference: str = "full", model=None):
        """score(method) / score(reference) on the samples both ran, each task resampled
        with the same indices for both (paired)."""
        m, r = self.groups(method, keep, key, model), self.groups(reference, 1.0, key, model)
        names = list(m) if group in ("ALL", "Avg") else [group]
        if not names or any(n not in m or n not in r for n in names):
            return None
        num_v, den_v, num_d, den_d, n = [], [], [], [], 0
        for g in names:
            tv, td, rv, rd = [], [], [], []
            for t, s in m[g].items():
                if t not in r[g]:
                    return None
                common = s.index.intersection(r[g][t].index)
                if not len(common):
                    return None
                a, b = s.loc[common].to_numpy(), r[g][t].loc[common].to_numpy()
                seed = task_seed(t)
                tv.append(a.mean())
                rv.append(b.mean())
                td.append(mean_draws(a, seed))  # the same seed for both: the same resampled indices
                rd.append(mean_draws(b, seed))
                n += len(common)
            num_v.append(np.mean(tv))
            den_v.append(np.mean(rv))
            num_d.append(np.mean(td, axis=0))
            den_d.append(np.mean(rd, axis=0))
        den = float(np.mean(den_v))
        if den == 0:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = np.mean(num_d, axis=0) / np.mean(den_d, axis=0)
        draws[~np.isfinite(draws)] = np.nan
        return estimate(float(np.mean(num_v)) / den, draws, n)

    def ttft_speedup(self, method: str, keep: float, model: str | None = None) -> Estimate | None:
        """From eval rows: the reference's mean TTFT over the method's on the same samples."""
        from harness.stats import paired_ratio_ci

        d = self.eval(model)
        m = d[(d["method"] == method) & np.isclose(d["keep_rate"].astype(float), keep)]
        r = d[d["method"] == d["reference_method"]]
        if m.empty or r.empty:
            return None
        mi = m.drop_duplicates(["task", "sample_id"]).set_index(["task", "sample_id"])["ttft_s"]
        ri = r.drop_duplicates(["task", "sample_id"]).set_index(["task", "sample_id"])["ttft_s"]
        common = mi.index.intersection(ri.index)
        if not len(common):
            return None
        return paired_ratio_ci(ri.loc[common].to_numpy(float), mi.loc[common].to_numpy(float))

    def why_missing(self, kind: str, method: str) -> str:
        """Why a method has no usable row: its rows' status and first error (``unsupported:
        minference needs a CUDA GPU ...``), or ``not run``."""
        if self.rows.empty:
            return "not run"
        d = self.rows[(self.rows["kind"] == kind) & (self.rows["method"] == method)]
        bad = d[d["status"] != "ok"]
        if d.empty or len(bad) < len(d):
            return "not run"
        err = str(bad["error"].dropna().iloc[0]) if "error" in bad and bad["error"].notna().any() else ""
        err = err.split(" (")[0].split(";")[0][:70]  # the error's first clause
        return f"{bad['status'].iloc[0]}: {err}" if err else str(bad["status"].iloc[0])

    def latency(self) -> pd.DataFrame:
        from harness.report import summarize_latency

        d = self.rows[self.rows["kind"] == "latency"] if not self.rows.empty else self.rows
        if d.empty:
            return pd.DataFrame()
        s = summarize_latency(d)
        s["method_name"] = s["method"].str.split(" (", regex=False).str[0]
        return s

    def qps(self) -> pd.DataFrame:
        from harness.report import summarize_qps

        d = self.rows[self.rows["kind"] == "qps"] if not self.rows.empty else self.rows
        return summarize_qps(d) if not d.empty else pd.DataFrame()


def load_ours(table: str, variant: str, root: Path = RESULTS) -> Ours:
    f = folder(table, variant, root)
    return Ours(read_results(f) if f.exists() else pd.DataFrame(columns=["kind", "status"]))


# --------------------------------------------------------------------------- cells


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def cell(ours: Estimate | float | None, paper: float | None, fmt: str = "{:.2f}", why: str = "not run") -> str:
    """``ours [lo, hi] n=K | paper | delta``; ``why`` stands in for a missing run."""
    if isinstance(ours, Estimate):
        o = _fmt(ours.value, fmt)
        if not math.isnan(ours.lo):
            o += f" [{_fmt(ours.lo, fmt)}, {_fmt(ours.hi, fmt)}]"
        o += f" n={ours.n}"
        value: float | None = ours.value
    elif ours is None or (isinstance(ours, float) and math.isnan(ours)):
        o, value = f"({why})", None
    else:
        o, value = _fmt(float(ours), fmt), float(ours)
    p = _fmt(paper, fmt)
    d = "-" if value is None or paper is None or math.isnan(paper) else _fmt(value - paper, "{:+" + fmt[2:])
    return f"{o} \\| {p} \\| {d}"


def published() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED, keep_default_na=False, na_values={"value": [""], "keep": [""]})


def _paper(pub: pd.DataFrame, **where: Any) -> float | None:
    d = pub
    for k, v in where.items():
        d = d[np.isclose(d[k], v)] if isinstance(v, float) else d[d[k] == v]
    return None if d.empty or pd.isna(d["value"].iloc[0]) else float(d["value"].iloc[0])


def _md(rows: list[dict[str, str]]) -> str:
    from harness.report import md_table

    return md_table(pd.DataFrame(rows)) if rows else "(nothing)\n"


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def _missing(exp: Experiment, variant: str) -> str:
    v = exp.variants[variant]
    need = f"needs {v.gpus} GPU(s)" if v.gpus else "runs on CPU"
    return f"not run: {need}; `make paper table={exp.table}{'' if variant == 'paper' else ' variant=' + variant}`"


# --------------------------------------------------------------------------- tables


def _longbench_405b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> str:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama405b")
    keeps = [0.1, 0.3, 0.5, 0.7]
    why = "not run"  # the variant's header says why, once
    ev = ours.eval(model)
    tasks = list(src[src["metric"] == "score"]["task"])
    if not ev.empty:  # a run on another benchmark (the CPU variant's RULER): its own tasks
        tasks = [t for t in tasks if t in set(ev["task"])] + sorted(set(ev["task"]) - set(tasks))

    def by_task(r: pd.Series) -> str:
        return str(r["task"])

    rows = []
    for t in tasks:
        r = {"dataset": t, "full score: ours \\| paper \\| Δ": cell(
            ours.score("full", 1.0, t, by_task, model), _paper(src, task=t, method="full", metric="score"), "{:.1f}", why
        )}  # fmt: skip
        for k in keeps:
            r[f"retention keep {k:g} (ours)"] = cell(
                ours.retention("specprefill", k, t, by_task, model=model), None, "{:.2f}", why
            ).split(" \\| ")[0]
        rows.append(r)
    speed = [
        {
            "keep": f"{k:g}",
            "TTFT speedup: ours \\| paper \\| Δ": cell(
                ours.ttft_speedup("specprefill", k, model),
                _paper(src, metric="ttft_speedup", keep=k),
                "{:.2f}",
                why,
            ),
            "score ALL (ours)": cell(ours.score("specprefill", k, "ALL", by_task, model), None, "{:.1f}", why).split(
                " \\| "
            )[0],
            "retention ALL (ours)": cell(
                ours.retention("specprefill", k, "ALL", by_task, model=model), None, "{:.2f}", why
            ).split(" \\| ")[0],
        }
        for k in keeps
    ]
    return (
        "Full-prefill score per dataset and SpecPrefill's retention (its score over full prefill's "
        "on the same samples; the paper prints no per-dataset SpecPrefill numbers):\n\n"
        + _md(rows)
        + "\nTTFT speedup over full prefill (ours: mean TTFT ratio on the same samples):\n\n"
        + _md(speed)
    )


def _qps(exp: Experiment, pub: pd.DataFrame, ours_root: Path, variant: str) -> tuple[str, str]:
    src = pub[pub["source"] == exp.source]
    v = exp.variants[variant]
    rows, prov = [], []
    for cat in dict.fromkeys(src["task"]):
        sub = ours_root / _slug(cat)
        o = Ours(read_results(sub) if sub.exists() else pd.DataFrame(columns=["kind", "status"]))
        if not o.empty:
            prov.append(f"{cat}: {o.provenance()}")
        q = o.qps()
        spec_keep = float(src[(src["task"] == cat) & (src["method"] == "specprefill")]["keep"].iloc[0])
        timeout = str(src[src["task"] == cat]["setting"].iloc[0])
        r = {"category": cat, "keep, timeout": f"{spec_keep:g}, {timeout.removeprefix('timeout=')}"}
        for base in dict.fromkeys(src["base"]):
            mine = v.models.get(MODEL_OF[base])
            for method in ("full", "specprefill"):
                name = f"{'SpecPrefill ' if method == 'specprefill' else ''}{SHORT[MODEL_OF[base]]}"
                k = 1.0 if method == "full" else spec_keep
                pq = _paper(src, base=base, task=cat, method=method, metric="max_qps")
                ps = _paper(src, base=base, task=cat, method=method, metric="score")
                got = None
                if mine is not None and not q.empty:
                    m = q[(q["model"] == mine) & (q["method"] == method)]
                    if method != "full":
                        m = m[np.isclose(m["keep_rate"].astype(float), k)]
                    got = m.iloc[-1] if len(m) else None
                why = "not in this variant" if mine is None else ("not run" if o.empty else "no row")
                timed_out = pq is None and ps is None
                paper_s = "times out" if timed_out else f"{_fmt(pq, '{:.1f}')} ({_fmt(ps, '{:.2f}')})"
                ours_s = f"({why})" if got is None else _qps_cell(got)
                r[f"{name}: ours \\| paper"] = f"{ours_s} \\| {paper_s}"
        rows.append(r)
    note = (
        "Max QPS before more than 4 requests exceed the timeout (task score at it in brackets; "
        "ours also gives the ratio to full prefill's max QPS on the same model). `>=`: the highest "
        "rate the search tried still passed, so the true max QPS is higher (a lower bound); a ratio "
        "over a reference that is itself a lower bound is unknown (`x?`).\n\n"
    )
    return note + _md(rows), "; ".join(prov)


def _qps_cell(q: pd.Series) -> str:
    """``max QPS (score), x ratio`` of one serving run, lower bounds marked ``>=``."""
    ge = ">=" if bool(q.get("max_qps_censored", False)) else ""
    bound = q.get("qps_ratio_bound", "exact")
    ratio = (
        "x?" if bound == "unknown" else f"x{'>=' if bound == 'lower bound' else ''}{q['qps_ratio_to_reference']:.2f}"
    )
    return f"{ge}{q['max_qps']:.2f} ({q['score_at_max_qps']:.1f}), {ratio}"


def _latency_grid(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> str:
    src = pub[pub["source"] == exp.source]
    lat = ours.latency()
    why = "not run"  # the variant's header says why, once
    blocked = cannot_run(exp.variants[variant])
    grid = list(dict.fromkeys(src["task"]))
    if not lat.empty:  # our grid points (a CPU variant's differ from the paper's: its columns are ours)
        mine = sorted({(int(b), int(n)) for b, n in zip(lat["batch"], lat["length"], strict=True)}, key=lambda x: x[1])
        grid = [g for g in grid if tuple(int(x) for x in g.split("x")) in mine]
        grid += [f"{b}x{n}" for b, n in mine if f"{b}x{n}" not in grid]
    methods = list(dict.fromkeys(zip(src["method"], src["keep"], strict=True)))
    lat_rows, sp_rows = [], []
    for method, keep in methods:
        label = method if method != "specprefill" else f"specprefill {keep:.0%}"
        lr, sr = {"method": label}, {"method": label}
        for g in grid:
            b, n = (int(x) for x in g.split("x"))
            p = _paper(src, task=g, method=method, keep=float(keep), metric="latency_s")
            pf = _paper(src, task=g, method="full", metric="latency_s")
            got = None
            if not lat.empty:
                m = lat[(lat["method_name"] == method) & (lat["batch"] == b) & (lat["length"] == n)]
                m = m[np.isclose(m["keep_rate"].astype(float), float(keep))] if method != "full" else m
                got = m.iloc[0] if len(m) and int(m.iloc[0]["n"]) > 0 else None
            reason = why if got is not None else ours.why_missing("latency", method)
            if got is None and method in blocked:
                reason = "cannot run in this table: see below"
            lr[g] = cell(None if got is None else float(got["ttft_median_s"]), p, "{:.2f}", reason)
            if method != "full":
                est = (
                    None
                    if got is None
                    else Estimate(got["speedup"], got["speedup_lo"], got["speedup_hi"], int(got["n"]))
                )
                sr[g] = cell(est, None if p is None or pf is None else pf / p, "{:.2f}", reason)
        lat_rows.append(lr)
        if method != "full":
            sp_rows.append(sr)
    return (
        "Batch latency in seconds (ours: median of the timed iterations):\n\n"
        + _md(lat_rows)
        + "\nSpeedup over full prefill (ours: measured side by side in one run, 95 % interval):\n\n"
        + _md(sp_rows)
        + "".join(f"\n{m}: cannot run in this table: {r}.\n" for m, r in blocked.items())
    )


def _categories_8b(exp: Experiment, pub: pd.DataFrame, ours: Ours, variant: str) -> str:
    src = pub[pub["source"] == exp.source]
    model = exp.variants[variant].models.get("llama8b")
    why = "not run"  # the variant's header says why, once
    paper_cats = [c for c in dict.fromkeys(src["task"]) if c != "Avg"]
    ev = ours.eval(model)
    our_cats = sorted({category_of(r) for _, r in ev.iterrows()}) if not ev.empty else []
    rows = []
    for method, keep in dict.fromkeys(zip(src["method"], src["keep"], strict=True)):
        label = "full" if method == "full" else f"keep {keep:.0%}"
        r = {"method": label}
        for c in paper_cats:
            r[c] = cell(
                None, _paper(src, task=c, method=method, keep=float(keep), metric="score"), "{:.2f}", "LongBench"
            )
        for c in our_cats:
            r[f"{c} (ours)"] = cell(ours.score(method, float(keep), c, category_of, model), None, "{:.1f}").split(
                " \\| "
            )[0]
        avg_p = _paper(src, task="Avg", method=method, keep=float(keep), metric="score")
        full_p = _paper(src, task="Avg", method="full", metric="score")
        r["Avg: ours \\| paper \\| Δ"] = cell(
            ours.score(method, float(keep), "Avg", category_of, model), avg_p, "{:.2f}", why
        )
        if method == "full":  # the reference's own retention is 1 by definition, where it ran
            full_sc = ours.score("full", 1.0, "Avg", category_of, model)
            ret = None if full_sc is None else Estimate(1.0, math.nan, math.nan, full_sc.n)
        else:
            ret = ours.retention(method, float(keep), "Avg", category_of, model=model)
        r["retention Avg: ours \\| paper \\| Δ"] = cell(
            ret,
            None if avg_p is None or full_p is None else avg_p / full_p,
            "{:.3f}",
            why,
        )
        rows.append(r)
    return (
        "Category averages (macro means of the tasks in each category; Avg is the mean of the "
        "categories) and retention (Avg over full prefill's Avg on the same samples). Ours are "
        "per our categories (LongBench's, or RULER's task families on a RULER run):\n\n" + _md(rows)
    )


def _headline(pub: pd.DataFrame, root: Path) -> str:
    src = pub[pub["source"] == "abstract"]
    best_ttft: tuple[float, str] | None = None
    for table in ("latency_grid", "longbench_405b"):
        for variant in ("paper", "cpu"):
            o = load_ours(table, variant, root)
            lat = o.latency()
            if not lat.empty and lat["speedup"].notna().any():
                i = lat["speedup"].astype(float).idxmax()
                cand = (
                    float(lat.loc[i, "speedup"]),
                    f"{table}/{variant}: {lat.loc[i, 'model']} {lat.loc[i, 'method']}",
                )
                best_ttft = cand if best_ttft is None or cand[0] > best_ttft[0] else best_ttft
    best_qps: tuple[float, str] | None = None
    qps_runs = False
    for sub in sorted((root / "qps").glob("*/*")) if (root / "qps").exists() else []:
        q = Ours(read_results(sub)).qps()
        qps_runs = qps_runs or not q.empty
        q = q[q["method"] != q["reference"]] if not q.empty else q  # the reference's own 1.0 is no claim
        if not q.empty and q["qps_ratio_to_reference"].notna().any():
            i = q["qps_ratio_to_reference"].astype(float).idxmax()
            lower = q.loc[i, "qps_ratio_bound"] == "lower bound"
            where = f"qps/{sub.parent.name}/{sub.name}: {q.loc[i, 'model']}" + (" (a lower bound)" if lower else "")
            cand = (float(q.loc[i, "qps_ratio_to_reference"]), where)
            best_qps = cand if best_qps is None or cand[0] > best_qps[0] else best_qps
    rows = [
        {
            "claim": "up to x TTFT",
            "ours \\| paper \\| Δ": cell(
                None if best_ttft is None else best_ttft[0], _paper(src, metric="ttft_speedup")
            ),
            "ours from": "-" if best_ttft is None else best_ttft[1],
        },
        {
            "claim": "up to x max QPS",
            "ours \\| paper \\| Δ": cell(
                None if best_qps is None else best_qps[0],
                _paper(src, metric="max_qps_speedup"),
                why="no exact ratio: see qps.md" if qps_runs else "not run",
            ),
            "ours from": "-" if best_qps is None else best_qps[1],
        },
    ]
    return (
        "The abstract's headline figures (Llama-3.1-405B-Instruct-FP8), against the best ratio in "
        "any of our runs:\n\n" + _md(rows)
    )


def render(table: str, root: Path = RESULTS) -> str:
    """One table's markdown: each variant that has an experiment, ours beside the paper's."""
    exp = load_experiment(table)
    pub = published()
    parts = [f"# {exp.title}\n", f"Published: {exp.source} of the SpecPrefill paper (ICML 2025).\n"]
    parts.append("Cells: `ours [95 % interval] n=K | paper | Δ (ours - paper)`.\n")
    for variant in exp.variants:
        v = exp.variants[variant]
        ours_root = folder(exp.table, variant, root)
        parts.append(f"\n## Variant `{variant}`\n")
        if v.note:
            parts.append(v.note.strip() + "\n")
        if exp.table == "qps":
            body, prov = _qps(exp, pub, ours_root, variant)
        else:
            ours = load_ours(exp.table, variant, root)
            prov = "" if ours.empty else ours.provenance()
            body = {"longbench_405b": _longbench_405b, "latency_grid": _latency_grid, "categories_8b": _categories_8b}[
                exp.table
            ](exp, pub, ours, variant)
        parts.append(f"\nOur rows: {prov or _missing(exp, variant)}.\n\n" + body)
    return "\n".join(parts)


def headline(root: Path = RESULTS) -> str:
    """The abstract's headline figures beside the best of our runs (markdown)."""
    return "# Headline figures\n\n" + _headline(published(), root)


def write_report(root: Path = RESULTS) -> Path:
    """``results/paper/<table>.md`` for every experiment, and ``headline.md``."""
    root.mkdir(parents=True, exist_ok=True)
    for table in experiment_names():
        (root / f"{table}.md").write_text(render(table, root))
    (root / "headline.md").write_text(headline(root))
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one table's experiment")
    r.add_argument("--table", required=True, help=f"one of {experiment_names()}")
    r.add_argument("--variant", default="paper", help="paper (the paper's models and GPUs) | cpu")
    r.add_argument("--dry-run", action="store_true", help="print the plan and each command's own plan; run nothing")
    p = sub.add_parser("report", help="render every table from whatever rows exist")
    for a in (r, p):
        a.add_argument("--root", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        raise SystemExit(run(args.table, args.variant, args.dry_run, args.root))
    out = write_report(args.root)
    for f in sorted(out.glob("*.md")):
        print(f)


if __name__ == "__main__":
    main()
