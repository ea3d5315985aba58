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
``results/paper/<table>.md`` and its figure ``<table>.png``: three columns per compared
number, ours (with our 95 % interval and n), the paper's as printed, and Δ where our setting
is the paper's (else what differs); relative measures (retention: a method's score over full
prefill's on the same samples; speedup) beside absolute ones so a different model's run
compares in shape; for a cell with no run, the reason. ``baselines.md`` holds the rebuttal's
comparisons with other methods, ``headline.md`` the abstract's figures.

A run also writes the variant's point file (``rows.csv``: its rows, trimmed to the columns
the tables read). The run folders are git-ignored and the point files committed, so a clone
renders the committed tables byte for byte from them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import experiments
from harness.experiments import Experiment
from harness.paper.builders import write_report
from harness.paper.numbers import RESULTS, experiment_names, folder, load_experiment, write_points


def command_lines(exp: Experiment, variant: str, root: Path = RESULTS, dry_run: bool = False) -> list[list[str]]:
    return experiments.command_lines(exp, variant, folder(exp.table, variant, root), dry_run)


def describe(exp: Experiment, variant: str, root: Path = RESULTS, gpu_hour_usd: float | None = None) -> str:
    return experiments.describe(exp, variant, folder(exp.table, variant, root), "paper table", gpu_hour_usd)


def run(table: str, variant: str, dry_run: bool, root: Path = RESULTS, gpu_hour_usd: float | None = None) -> int:
    exp = load_experiment(table)
    print(describe(exp, variant, root, gpu_hour_usd), flush=True)
    if experiments.run_commands(exp, variant, folder(exp.table, variant, root), dry_run):
        return 1
    if not dry_run:
        kept = write_points(exp, variant, root)
        print(f"kept {kept}" if kept else "no rows to keep", flush=True)
        print(f"rendered {write_report(root)}")
    return 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one table's experiment")
    r.add_argument("--table", required=True, help=f"one of {experiment_names()}")
    r.add_argument("--variant", default="paper", help="paper (the paper's models and GPUs) | cpu")
    r.add_argument("--dry-run", action="store_true", help="print the plan and each command's own plan; run nothing")
    r.add_argument("--gpu-hour-usd", type=experiments.positive_usd, help="$ per GPU-hour: the plan states the cost")
    p = sub.add_parser("report", help="render every table from whatever rows exist")
    for a in (r, p):
        a.add_argument("--root", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        raise SystemExit(run(args.table, args.variant, args.dry_run, args.root, args.gpu_hour_usd))
    out = write_report(args.root)
    for f in sorted(out.glob("*.md")):
        print(f)


if __name__ == "__main__":
    main()
