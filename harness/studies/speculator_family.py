"""Study: does a cheaper speculator from another family keep the needle as well as a same-family one?

The paper's setting at CPU scale, on real models offline (``make fetch-models`` first): the base
Qwen2.5-Coder-1.5B-Instruct, speculated by

* ``model:qwen2.5-coder-0.5b``: a separate, smaller model of the same family (the same
  tokenizer), the paper's own kind of pairing (~30 % of the base's prefill FLOPs);
* ``model:smollm2-135m``: a model of another family with another tokenizer (~9 % of the
  base's FLOPs), its scores carried onto Qwen's tokens by character offsets
  (:mod:`specprefill.token_map`, rule ``max_overlap``);
* ``self_layers:3``: the base's own first 3 of 28 layers, an early exit of about SmolLM2's
  cost (the stand-in used where no second model exists).

RULER at ``--length`` (2K by default: a 4K prefill of the 1.5B base takes ~70 s on two cores,
and the study's 210 samples would take hours), the NIAH single/multikey tasks and qa_1, n =
``--limit`` x 5 per point. One ``make eval`` sweep (full prefill once, SpecPrefill per
speculator x keep), then one ``make latency`` job per speculator x keep (SpecPrefill and full
prefill interleaved on the same prompts), and per point: score and retention with 95 %
intervals (paired with full prefill on the same samples), needle kept, the speculator's
seconds, the interleaved TTFT speedup with its interval, the ideal speedup from FLOPs and the
efficiency; the Pareto plot (retention against the interleaved speedup).

    python -m harness.studies.speculator_family [--limit 6] [--length 2048] [--keeps 0.1 0.3]
        [--iters 10] [--out results/speculator-family] [--no-latency] [--no-run]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.folder import Analysis, analyze
from harness.rendering import plots
from harness.rendering.tables import ci, num
from harness.studies import require_runs, require_values, run_job
from harness.studies import speculator_depth as depth

BASE = "qwen2.5-coder-1.5b"
SPECULATORS = ["model:qwen2.5-coder-0.5b", "model:smollm2-135m", "self_layers:3"]
TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "qa_1"]
KIND = {
    "model:qwen2.5-coder-0.5b": "same family (Qwen2.5-Coder-0.5B)",
    "model:smollm2-135m": "other family (SmolLM2-135M, token map)",
    "self_layers:3": "early exit (base's first 3 of 28 layers)",
}


def run_sweep(out: Path, limit: int, length: int, speculators: list[str], keeps: list[float]) -> None:
    common = [sys.executable, "-m", "harness.jobs.eval", f"model={BASE}", f"length={length}", f"limit={limit}",
              f"tasks=[{','.join(TASKS)}]", f"out={out}"]  # fmt: skip
    run_job([*common, "method=full", "keep=1"])
    keep = ",".join(f"{k:g}" for k in keeps)
    run_job([*common, "method=specprefill", f"model.speculator={','.join(speculators)}", f"keep={keep}"])


def run_latency(out: Path, length: int, speculators: list[str], keeps: list[float], iters: int) -> None:
    """Speedups where drift cannot skew them: SpecPrefill and full prefill interleaved
    iteration by iteration on the same prompts, one job per speculator x keep. The prompts
    are RULER's (niah_single_1 at ``length``), not random ids: a speculator from another
    family reads the prompt's text in its own tokens, and random ids decode to text it
    splits into several times as many tokens as a real prompt's."""
    keep = ",".join(f"{k:g}" for k in keeps)
    run_job([sys.executable, "-m", "harness.jobs.latency", f"model={BASE}", f"grid=[[1,{length}]]",
                    "warmup=1", f"iters={iters}", "prompts=benchmark", "prompt_task=niah_single_1",
                    "method=specprefill", f"keep={keep}", f"model.speculator={','.join(speculators)}",
                    "decode_tokens=0", f"out={out}"])  # fmt: skip


def _same(speculator: Any) -> Any:
    """A line's name: the speculator spec itself."""
    return speculator


def latency_speedups(a: Analysis) -> pd.DataFrame:
    """Per (speculator, keep): the interleaved speedup over full prefill with its 95 %
    interval, the ideal speedup from FLOPs and the efficiency (the depth study's, keyed by
    the speculator)."""
    return depth.latency_speedups(a, "speculator", _same)


def table(a: Analysis, latency: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per (speculator, keep) and the full prefill reference: the summary's ``ALL``
    row; with ``latency``, each line's interleaved speedup beside it."""
    s = a.summary
    s = s[s["task"] == "ALL"]
    ref = s["method_name"] == s["reference"]
    df = pd.DataFrame({
        "method": s["method_name"], "speculator": s["speculator"].where(~ref, None),
        "keep": s["keep_rate"].astype(float), "n": s["n"].astype(int),
        **{c: s[c] for c in ("score", "score_lo", "score_hi", "retention", "retention_lo", "retention_hi",
                             "needle_kept", "speculator_s", "ttft_s", "speedup", "ideal_speedup", "efficiency")},
    })  # fmt: skip
    if latency is not None and not latency.empty:
        df = df.merge(latency, on=["speculator", "keep"], how="left")
    df["_keep"] = df["keep"].where(df["method"] != "full", -1.0)  # the reference first
    return df.sort_values(["_keep", "speculator"], na_position="first").drop(columns="_keep").reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:

    lat = "lat_speedup" in df
    head = "| speculator | keep | n | score | retention | needle kept | speculator s | TTFT s |"
    head += " speedup (interleaved) | ideal | efficiency |" if lat else " speedup (eval run) | ideal | efficiency |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in df.itertuples():
        full = r.method == "full"
        name = "full prefill" if full else f"`{r.speculator}`: {KIND.get(str(r.speculator), '')}".rstrip(": ")
        line = (
            f"| {name} | {r.keep:g} | {r.n} | {ci(r.score, r.score_lo, r.score_hi)} | "
            f"{ci(r.retention, r.retention_lo, r.retention_hi, '.2f')} | {num(r.needle_kept, '.2f')} | "
            f"{num(r.speculator_s, '.2f')} | {r.ttft_s:.2f} |"
        )
        if lat:
            sp = "1.00x" if full else ci(r.lat_speedup, r.lat_speedup_lo, r.lat_speedup_hi, ".2f")
            ideal, eff = (1.0, 1.0) if full else (r.lat_ideal, r.lat_efficiency)
        else:
            sp, ideal, eff = f"{r.speedup:.2f}x", r.ideal_speedup, r.efficiency
        lines.append(line + f" {sp} | {num(ideal, '.2f') + ('' if pd.isna(ideal) else 'x')} | {num(eff, '.2f')} |")
    return "\n".join(lines)


def with_latency_speedups(summary: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The summary's overall SpecPrefill lines with the interleaved speedups, for the Pareto
    plot (the depth study's, keyed by the speculator)."""
    return depth.with_latency_speedups(summary, df, "speculator", _same)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=6, help="samples per task (5 tasks)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--speculators", nargs="+", default=SPECULATORS)
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--out", type=Path, default=Path("results/speculator-family"))
    ap.add_argument("--iters", type=int, default=10, help="timed pairs per latency point (the protocol's default)")
    ap.add_argument("--no-latency", action="store_true", help="speedups from the eval run only")
    ap.add_argument("--no-run", action="store_true", help="only read the rows already under --out")
    a = ap.parse_args(argv)
    require_values(ap, "--keeps", a.keeps, lambda k: 0 < k <= 1, "a fraction in (0, 1]")
    require_values(ap, "--limit", [a.limit], lambda n: n >= 1, "1 or more samples a task")
    require_values(ap, "--iters", [a.iters], lambda n: n >= 1, "1 or more timed pairs (5 or more for an interval)")
    if a.no_run:
        require_runs(ap, a.out)
    if not a.no_run:
        run_sweep(a.out, a.limit, a.length, a.speculators, a.keeps)
        if not a.no_latency:
            run_latency(a.out / "latency", a.length, a.speculators, a.keeps, a.iters)
    found = analyze(a.out)
    df = table(found, latency_speedups(found) if not found.of_kind("latency").empty else None)
    df.to_csv(a.out / "speculator_family.csv", index=False)
    text = markdown(df)
    (a.out / "speculator_family.md").write_text(text + "\n")
    summary = found.summary
    if "lat_speedup" in df:
        summary = with_latency_speedups(summary, df)
    plots.pareto(summary, a.out / "speculator_family_pareto.png")
    print(text)


if __name__ == "__main__":
    main()
