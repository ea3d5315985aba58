"""The regression gate: quality and speedup of a candidate results folder against a baseline.

``python -m harness.regress compare --baseline DIR --candidate DIR`` compares two results
folders point by point (model, benchmark, length, task, method and its options, keep):

* **Quality**: the paired difference of per-sample scores, over the samples both folders
  ran (:func:`harness.stats.paired_diff_ci`, seeded, 2000 resamples); per task, and
  ``ALL`` (a stratified bootstrap over the tasks). A point regresses when the drop's 95 %
  interval excludes 0 *and* the drop exceeds ``--quality-tol`` (2 points on the 0-100
  scale): one flipped sample among many is noise, not a regression.
* **Speed**: the speedup over the reference method measured inside each folder (never
  absolute seconds across folders): from latency rows, the ratio of median TTFTs per
  grid point within each run; from quality rows, the reference's mean TTFT over the
  method's on the same samples (``ALL``). A point regresses when the candidate's speedup
  falls by more than ``--speed-tol`` (15 %) of the baseline's, its bootstrap interval
  included.

It prints one table (point, baseline, candidate, delta, interval, verdict), improvements
too, and exits **0** when nothing regressed, **1** when something did (naming each point),
**2** when the folders cannot be compared (no rows, nothing in common, or points present in
only one folder with ``--require-all``).

``python -m harness.regress run`` runs the fixed quick suite (``conf/regress.yaml``) into a
candidate folder and compares it with the committed baseline for this machine's class
(``results/baseline/<class>/``), appending to its ``history.csv`` and plot; exit **3** when
there is no baseline for the class (``.ci/run`` reports "not compared"). ``python -m
harness.regress accept --reason '...'`` promotes the candidate to the baseline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.stats import Estimate, macro_mean_ci, paired_diff_ci, paired_ratio_ci, ratio_of_medians_ci
from harness.store import read_results

ROOT = Path(__file__).resolve().parents[1]
# The speculator is part of a point: SpecPrefill with another speculator is another method,
# never compared with the baseline's (a deeper one scores better and runs slower).
QUALITY_KEY = ["model", "benchmark", "length", "method", "method_options", "keep_rate", "speculator"]
LATENCY_KEY = [
    "model", "backend", "prompt_source", "batch", "length", "method", "method_options", "keep_rate", "speculator"
]  # fmt: skip
OK, REGRESSED, INCOMPARABLE, NO_BASELINE = 0, 1, 2, 3


@dataclass(frozen=True)
class Comparison:
    """One compared point."""

    kind: str  # quality | speed
    point: str
    baseline: float
    candidate: float
    delta: Estimate  # quality: candidate - baseline (points); speed: candidate / baseline - 1
    verdict: str  # regressed | improved | same
    retention: Estimate | None = None  # quality: the candidate's score / its reference's, same samples


def _label(r: dict) -> str:
    keep = r.get("keep_rate")
    keep_s = "" if keep is None or (isinstance(keep, float) and np.isnan(keep)) else f" keep={keep:g}"
    opts = {k: v for k, v in json.loads(r.get("method_options") or "{}").items() if k != "keep_rate"}
    extra = f" {json.dumps(opts, sort_keys=True)}" if opts else ""
    return f"{r['model']} {r['benchmark']}-{r['length']} {r['method']}{keep_s}{extra}{_speculator_s(r)}"


def _speculator_s(r: dict) -> str:
    """A point's speculator as its label shows it (none for the reference: see :func:`_ok`)."""
    spec = r.get("speculator")
    return f" speculator={spec}" if isinstance(spec, str) and spec else ""


def _ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    d = df[(df["kind"] == kind) & (df["status"] == "ok")].copy() if not df.empty else df
    if "keep_rate" in d:  # the reference keeps everything (NaN would never equal itself as a key)
        d["keep_rate"] = d["keep_rate"].astype(float).fillna(1.0)
    if not d.empty:  # the reference runs no speculator: its points are the same whatever the model's is
        spec = d["speculator"] if "speculator" in d else pd.Series(None, index=d.index, dtype=object)
        d["speculator"] = spec.where(d["method"] != d["reference_method"]).fillna("").astype(str)
    return d


def _quality_verdict(delta: Estimate, tol: float) -> str:
    if delta.hi < 0 and -delta.value > tol:
        return "regressed"
    if delta.lo > 0 and delta.value > tol:
        return "improved"
    return "same"


def _speed_verdict(base: float, cand: Estimate, tol: float) -> str:
    """Regressed when the candidate's speedup, and its whole interval, fall more than ``tol``
    below the baseline's (a shared machine's noise in one run must not fail the gate)."""
    if not (base > 0 and cand.value > 0):
        return "same"
    if cand.value < base * (1 - tol) and not cand.hi >= base * (1 - tol):
        return "regressed"
    if cand.value > base * (1 + tol) and not cand.lo <= base * (1 + tol):
        return "improved"
    return "same"


def _retention(d: pd.DataFrame, g: pd.DataFrame, task: str | None) -> Estimate | None:
    """The point's score over its reference's (``reference_method``) in the same folder, on
    the samples both ran (one task, or every task pooled for ``ALL``), paired."""
    ref_name = g["reference_method"].iloc[0]
    if g["method"].iloc[0] == ref_name:
        return None
    first = g.iloc[0]
    ref = d[(d["method"] == ref_name) & (d["model"] == first["model"]) & (d["benchmark"] == first["benchmark"])]
    ref = ref[ref["length"] == first["length"]]
    if task is not None:
        g, ref = g[g["task"] == task], ref[ref["task"] == task]
    m = g.drop_duplicates(["task", "sample_id"]).set_index(["task", "sample_id"])["score"]
    r = ref.drop_duplicates(["task", "sample_id"]).set_index(["task", "sample_id"])["score"]
    common = m.index.intersection(r.index)
    if not len(common):
        return None
    return paired_ratio_ci(m.loc[common].to_numpy(dtype=float), r.loc[common].to_numpy(dtype=float))


def quality(base: pd.DataFrame, cand: pd.DataFrame, tol: float) -> tuple[list[Comparison], set[str], set[str]]:
    """Per task and ``ALL``: the paired score difference over the samples both ran."""
    out: list[Comparison] = []
    b, c = _ok(base, "eval"), _ok(cand, "eval")
    keys_b = {k for k, _ in b.groupby(QUALITY_KEY, dropna=False)} if not b.empty else set()
    keys_c = {k for k, _ in c.groupby(QUALITY_KEY, dropna=False)} if not c.empty else set()
    for key in sorted(keys_b & keys_c, key=str):
        gb = b.loc[b.groupby(QUALITY_KEY, dropna=False).groups[key]]
        gc = c.loc[c.groupby(QUALITY_KEY, dropna=False).groups[key]]
        label = _label(dict(zip(QUALITY_KEY, key, strict=True)) | {"benchmark": key[1], "length": key[2]})
        diffs, means = [], []
        for task in sorted(set(gb["task"]) & set(gc["task"])):
            sb = gb[gb["task"] == task].drop_duplicates("sample_id").set_index("sample_id")["score"]
            sc = gc[gc["task"] == task].drop_duplicates("sample_id").set_index("sample_id")["score"]
            common = sorted(set(sb.index) & set(sc.index))
            if not common:
                continue
            xb, xc = sb.loc[common].to_numpy(dtype=float), sc.loc[common].to_numpy(dtype=float)
            d = paired_diff_ci(xc, xb)
            diffs.append(xc - xb)
            means.append((float(xb.mean()), float(xc.mean())))
            out.append(
                Comparison(
                    "quality",
                    f"{label} {task}",
                    means[-1][0],
                    means[-1][1],
                    d,
                    _quality_verdict(d, tol),
                    _retention(c, gc, task),
                )
            )
        if len(diffs) > 1:  # ALL: the macro mean over tasks, resampled within each task
            d = macro_mean_ci(diffs)
            mb, mc = (float(np.mean([m[i] for m in means])) for i in (0, 1))
            out.append(
                Comparison("quality", f"{label} ALL", mb, mc, d, _quality_verdict(d, tol), _retention(c, gc, None))
            )
    only = {_label(dict(zip(QUALITY_KEY, k, strict=True))) for k in keys_b ^ keys_c}
    return out, keys_b | keys_c, only


def _eval_speedups(d: pd.DataFrame) -> dict[tuple, Estimate]:
    """Per quality point: the reference's mean TTFT over the method's, on the samples both ran
    in this folder, on one machine."""
    out: dict[tuple, Estimate] = {}
    if d.empty:
        return out
    for key, g in d.groupby(QUALITY_KEY, dropna=False):
        ref = d[
            (d["method"] == g["reference_method"].iloc[0])
            & (d["model"] == key[0])
            & (d["benchmark"] == key[1])
            & (d["length"] == key[2])
            & (d["hardware"] == g["hardware"].iloc[0])
        ]
        if ref.empty or g["method"].iloc[0] == g["reference_method"].iloc[0]:
            continue
        m = g.set_index(["task", "sample_id"])["ttft_s"]
        r = ref.drop_duplicates(["task", "sample_id"]).set_index(["task", "sample_id"])["ttft_s"]
        common = m.index.intersection(r.index)
        if len(common):
            out[key] = paired_ratio_ci(r.loc[common].to_numpy(), m.loc[common].to_numpy())
    return out


def _latency_speedups(d: pd.DataFrame) -> dict[tuple, Estimate]:
    """Per latency point: median reference TTFT / median method TTFT within each run (timed
    iterations only), the median over runs when several share a point."""
    out: dict[tuple, Estimate] = {}
    if d.empty:
        return out
    d = d[~d["warmup"].astype(bool)]
    for key, g in d[d["method"] != d["reference_method"]].groupby(LATENCY_KEY, dropna=False):
        ests = []
        for run, gr in g.groupby("run_id"):
            ref = d[
                (d["run_id"] == run)
                & (d["method"] == gr["reference_method"].iloc[0])
                & (d["batch"] == key[3])
                & (d["length"] == key[4])
            ]
            if not ref.empty:
                ests.append(ratio_of_medians_ci(ref["ttft_s"].to_numpy(), gr["ttft_s"].to_numpy()))
        if ests:
            out[key] = sorted(ests, key=lambda e: e.value)[len(ests) // 2]
    return out


def speed(base: pd.DataFrame, cand: pd.DataFrame, tol: float) -> tuple[list[Comparison], set, set]:
    out: list[Comparison] = []
    seen: set = set()
    only: set = set()
    for kind, fn, keys in (("eval", _eval_speedups, QUALITY_KEY), ("latency", _latency_speedups, LATENCY_KEY)):
        sb, sc = fn(_ok(base, kind)), fn(_ok(cand, kind))
        seen |= {(kind, k) for k in sb.keys() | sc.keys()}
        only |= {f"{kind} {k}" for k in sb.keys() ^ sc.keys()}
        for key in sorted(sb.keys() & sc.keys(), key=str):
            eb, ec = sb[key], sc[key]
            r = dict(zip(keys, key, strict=True))
            where = "ALL TTFT" if kind == "eval" else f"latency {int(r['batch'])}x{int(r['length'])}"
            label = f"{r['model']} {r['method']} keep={r['keep_rate']:g}{_speculator_s(r)} {where}"
            rel = Estimate(ec.value / eb.value - 1, ec.lo / eb.value - 1, ec.hi / eb.value - 1, ec.n)
            out.append(Comparison("speed", label, eb.value, ec.value, rel, _speed_verdict(eb.value, ec, tol)))
    return out, seen, only


def compare(
    baseline: Path,
    candidate: Path,
    quality_tol: float = 2.0,
    speed_tol: float = 0.15,
    require_all: bool = False,
    skip_speed: bool = False,
) -> tuple[int, list[Comparison], str]:
    """(exit status, comparisons, the printed report)."""
    lines: list[str] = []
    base, cand = read_results(baseline), read_results(candidate)
    if base.empty or cand.empty:
        which = baseline if base.empty else candidate
        return INCOMPARABLE, [], f"cannot compare: no rows in {which}\n"
    q, _, q_only = quality(base, cand, quality_tol)
    s, _, s_only = ([], set(), set()) if skip_speed else speed(base, cand, speed_tol)
    rows = q + s
    if not rows:
        return INCOMPARABLE, [], "cannot compare: the folders have no point in common\n"
    table = pd.DataFrame(
        [
            {
                "kind": r.kind,
                "point": r.point,
                "baseline": f"{r.baseline:.3g}" if r.kind == "speed" else f"{r.baseline:.1f}",
                "candidate": f"{r.candidate:.3g}" if r.kind == "speed" else f"{r.candidate:.1f}",
                "delta": f"{r.delta.value:+.1%}" if r.kind == "speed" else f"{r.delta.value:+.1f}",
                "95% interval": (
                    f"[{r.delta.lo:+.1%}, {r.delta.hi:+.1%}]"
                    if r.kind == "speed"
                    else f"[{r.delta.lo:+.1f}, {r.delta.hi:+.1f}]"
                ),
                "n": r.delta.n,
                "verdict": r.verdict,
            }
            for r in rows
        ]
    )
    from harness.report import md_table

    lines.append(md_table(table))
    only = sorted(q_only | s_only)
    if only:
        lines.append(f"\nIn one folder only ({len(only)}): " + "; ".join(only) + "\n")
    regressed = [r.point for r in rows if r.verdict == "regressed"]
    improved = [r.point for r in rows if r.verdict == "improved"]
    if improved:
        lines.append(f"\nImproved: {'; '.join(improved)}\n")
    if regressed:
        lines.append(f"\nREGRESSED ({len(regressed)}): {'; '.join(regressed)}\n")
        return REGRESSED, rows, "".join(lines)
    if only and require_all:
        lines.append("\ncannot compare: points present in only one folder (--require-all)\n")
        return INCOMPARABLE, rows, "".join(lines)
    lines.append(f"\nno regression (quality tolerance {quality_tol:g} points, speed tolerance {speed_tol:.0%})\n")
    return OK, rows, "".join(lines)


# --------------------------------------------------------------------------- the suite


def hardware_class() -> str:
    """The speed-baseline class of this machine: ``gpu-<name>``, or ``cpu-amx`` /
    ``cpu-avx512`` / ``cpu-avx2`` (CPUs differ in bf16 and matmul speed, not in float32
    results)."""
    import torch

    if torch.cuda.is_available():
        return "gpu-" + torch.cuda.get_device_name(0).lower().replace(" ", "-")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for flag, name in (("amx_bf16", "cpu-amx"), ("avx512f", "cpu-avx512"), ("avx2", "cpu-avx2")):
        if flag in flags:
            return name
    return "cpu-other"


SUITE = ROOT / "conf" / "regress.yaml"


def suite_commands(out: Path, suite_file: Path = SUITE) -> list[list[str]]:
    """The fixed quick suite (``conf/regress.yaml``, or another file of the same shape) as
    harness commands writing into ``out``."""
    import yaml

    if not suite_file.is_file():
        raise SystemExit(f"regress: suite file {suite_file} does not exist (conf/regress*.yaml are the suites)")
    suite = yaml.safe_load(suite_file.read_text())
    return [
        [sys.executable, "-m", f"harness.{entry['module']}", *entry["args"], f"out={out}"]
        for entry in suite["commands"]
    ]


def append_history(history: Path, rows: list[Comparison], cls: str) -> None:
    """One row per compared point: git SHA, date, the candidate's value and interval."""
    from harness.provenance import git_sha

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


def plot_history(history: Path, path: Path) -> None:
    """Quality (ALL) and speedup per commit, one line per method and keep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = pd.read_csv(history)
    runs = list(dict.fromkeys(zip(h["date"], h["git_sha"].astype(str), strict=True)))
    x_of = {r: i for i, r in enumerate(runs)}
    q = h[(h["kind"] == "quality") & h["point"].str.endswith(" ALL")]
    sp = h[h["kind"] == "speed"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, d, ylabel in ((axes[0], q, "score ALL (candidate)"), (axes[1], sp, "speedup over the reference")):
        for point, g in d.groupby("point"):
            xs = [x_of[r] for r in zip(g["date"], g["git_sha"].astype(str), strict=True)]
            ax.errorbar(
                xs,
                g["candidate"],
                yerr=_yerr(g),
                marker="o",
                capsize=2,
                label=point[-60:],
            )
        ax.set_xticks(range(len(runs)), [sha[:7] for _, sha in runs], rotation=45, fontsize=7)
        ax.set_xlabel("run (git SHA; dates in history.csv)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_suite(candidate: Path, baselines: Path, quality_tol: float, speed_tol: float, suite_file: Path = SUITE) -> int:
    commands = suite_commands(candidate, suite_file)
    shutil.rmtree(candidate, ignore_errors=True)
    for cmd in commands:
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    cls = hardware_class()
    mine = baselines / cls
    if not (mine / "rows").exists():
        others = sorted(p.parent.name for p in baselines.glob("*/rows"))
        print(
            f"\nNOT COMPARED: no baseline for this machine's class {cls!r} in {baselines} (have: {others}). "
            f"Accept this run as its baseline with `make regress-accept reason='first {cls} baseline'`."
        )
        if others:  # float32 quality is the same on every CPU: compare it with another class's baseline
            code, rows, text = compare(
                baselines / others[0] / "rows", candidate, quality_tol, speed_tol, skip_speed=True
            )
            print(f"\nQuality only, against {others[0]}'s baseline:\n\n{text}")
            if code == REGRESSED:
                return REGRESSED
        return NO_BASELINE
    code, rows, text = compare(mine / "rows", candidate, quality_tol, speed_tol)
    print(f"\nCandidate {candidate} against the {cls} baseline:\n\n{text}")
    if rows:
        append_history(mine / "history.csv", rows, cls)
    return code


def accept(candidate: Path, baselines: Path, reason: str) -> None:
    """Promote the candidate's rows to this class's baseline, recording why."""
    from harness.provenance import git_sha

    if not reason.strip():
        raise SystemExit("regress accept: give a reason (make regress-accept reason='...')")
    if read_results(candidate).empty:
        raise SystemExit(f"regress accept: no rows in {candidate}; run make regress first")
    cls = hardware_class()
    target = baselines / cls / "rows"
    shutil.rmtree(target, ignore_errors=True)
    for cfg in candidate.rglob("config.yaml"):
        if any(part.startswith(".") for part in cfg.relative_to(candidate).parts):
            continue
        run = cfg.parent
        dest = target / run.relative_to(candidate)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cfg, dest / "config.yaml")
        rows = read_results(run)
        rows.drop(columns=[c for c in ("prediction",) if c in rows]).to_parquet(dest / "rows.parquet", index=False)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with (baselines / cls / "ACCEPTED.md").open("a") as f:
        f.write(f"- {stamp} at {git_sha()}: {reason.strip()}\n")
    print(f"accepted {candidate} as the {cls} baseline ({target})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="compare two results folders")
    c.add_argument("--baseline", type=Path, required=True)
    c.add_argument("--candidate", type=Path, required=True)
    r = sub.add_parser("run", help="run the quick suite and compare it with this machine class's baseline")
    r.add_argument("--candidate", type=Path, default=ROOT / "results" / "regress" / "candidate")
    r.add_argument("--suite", type=Path, default=SUITE, help="the suite file (default conf/regress.yaml)")
    a = sub.add_parser("accept", help="promote the candidate to this machine class's baseline")
    a.add_argument("--candidate", type=Path, default=ROOT / "results" / "regress" / "candidate")
    a.add_argument("--reason", required=True)
    for p in (c, r, a):
        p.add_argument("--baselines", type=Path, default=ROOT / "results" / "baseline")
    for p in (c, r):
        p.add_argument("--quality-tol", type=float, default=2.0, help="points on the 0-100 scale (default 2)")
        p.add_argument("--speed-tol", type=float, default=0.15, help="fraction of the baseline's speedup (0.15)")
    c.add_argument("--require-all", action="store_true", help="points in only one folder make it exit 2")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] not in ("-h", "--help"):
        argv = ["compare", *argv]  # `python -m harness.regress --baseline A --candidate B`
    args = ap.parse_args(argv)
    if args.cmd == "compare":
        code, _, text = compare(args.baseline, args.candidate, args.quality_tol, args.speed_tol, args.require_all)
        print(text)
        raise SystemExit(code)
    if args.cmd == "run":
        raise SystemExit(run_suite(args.candidate, args.baselines, args.quality_tol, args.speed_tol, args.suite))
    accept(args.candidate, args.baselines, args.reason)


if __name__ == "__main__":
    main()
