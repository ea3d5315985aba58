"""Experiments: named presets of harness commands, ``conf/experiment/<name>.yaml``.

An experiment has variants (``paper``: the published models and GPUs; ``cpu``: a small real
model on offline data, the shape kept), each a list of harness commands (``module`` under
``harness.``, Hydra ``args``) and, for a GPU variant, an ``estimate`` of the prompts each
command prefills (``{architecture, prompts, tokens}``) from which the dry run gives GPU-hours
on the FLOP model every dry run uses (:func:`harness.dryrun.prefill_gpu_hours`). A command
that cannot run in its setting says why (``cannot_run``): it is printed, never launched, and
its GPU-hours are not counted.

The SpecPrefill paper's tables are experiments named ``paper_<table>``, run and rendered by
:mod:`harness.paper` (``make paper table=T``). Every other experiment (the kvpress
leaderboard's setting, ``kvpress_ruler4k``) runs here::

    python -m harness.experiments run kvpress_ruler4k [--variant cpu] [--dry-run]
    make experiment name=kvpress_ruler4k [variant=cpu] [dry_run=true]

writing each command's rows under ``results/experiments/<name>/<variant>/`` (every command
refreshes that folder's summaries and plots, ``summary.md`` and ``report.html``). A failed
command is recorded and the others still run; a killed run resumes (each command resumes).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.dryrun import MFU, PEAK_FLOPS, cost_text, prefill_gpu_hours
from harness.models.placement import architecture

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "conf" / "experiment"
RESULTS = ROOT / "results" / "experiments"
PAPER_PREFIX = "paper_"


@dataclass(frozen=True)
class Command:
    module: str
    args: list[str]
    sub: str = ""  # a subfolder of the variant's folder (one per QPS category)
    estimate: list[dict[str, Any]] = field(default_factory=list)  # [{architecture, prompts, tokens}]
    #: Why this command cannot run in its setting ("" when it can): it is printed, never
    #: launched, and its GPU-hours are not counted.
    cannot_run: str = ""

    @property
    def method(self) -> str | None:
        return next((a.split("=", 1)[1] for a in self.args if a.startswith("method=")), None)


@dataclass(frozen=True)
class Variant:
    name: str
    gpus: int
    models: dict[str, str]  # our model config standing for each published model config
    commands: list[Command]
    note: str = ""


@dataclass(frozen=True)
class Experiment:
    name: str  # the file's stem
    table: str  # a paper table's name (its yaml's ``table``); the experiment's name otherwise
    title: str
    source: str
    variants: dict[str, Variant]


def names(prefix: str = "") -> list[str]:
    """The experiments whose name starts with ``prefix``."""
    return sorted(p.stem for p in EXPERIMENTS.glob(f"{prefix}*.yaml"))


def load(name: str) -> Experiment:
    """``conf/experiment/<name>.yaml``, or an error naming the value and the allowed ones."""
    path = EXPERIMENTS / f"{name}.yaml"
    if not path.is_file():
        raise SystemExit(f"experiment {name!r} has no {path.relative_to(ROOT)}; allowed: {names()}")
    raw = yaml.safe_load(path.read_text())
    variants = {
        vname: Variant(
            name=vname,
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
        for vname, v in raw["variants"].items()
    }
    return Experiment(name, str(raw.get("table") or name), raw["title"], str(raw.get("source", "")), variants)


def variant_of(exp: Experiment, variant: str) -> Variant:
    """The named variant, or a one-line error naming the value and the allowed ones."""
    if variant not in exp.variants:
        what = f"paper: table {exp.table!r}" if exp.name.startswith(PAPER_PREFIX) else f"experiment {exp.name!r}"
        raise SystemExit(f"{what} has no variant {variant!r}; allowed: {sorted(exp.variants)}")
    return exp.variants[variant]


def command_lines(exp: Experiment, variant: str, out: Path, dry_run: bool = False) -> list[list[str]]:
    """Each command that can run, as an argv writing under ``out`` (``out/<sub>`` where it has one)."""
    return [
        [sys.executable, "-m", f"harness.{c.module}", *c.args, f"out={out / c.sub if c.sub else out}"]
        + (["dry_run=true"] if dry_run else [])
        for c in variant_of(exp, variant).commands
        if not c.cannot_run
    ]


def cannot_run(v: Variant) -> dict[str, str]:
    """Method -> why it cannot run in this variant (its commands are not launched)."""
    return {c.method or c.module: c.cannot_run for c in v.commands if c.cannot_run}


def gpu_hours(v: Variant) -> float | None:
    """Prefill FLOPs of every prompt the variant's commands run, on the FLOP model's GPU
    (:func:`harness.dryrun.prefill_gpu_hours`, the estimate every dry run prints too); None
    for a CPU variant. An estimate: decode is left out, every prompt is taken at the
    command's stated mean length."""

    if v.gpus == 0:
        return None
    return sum(
        prefill_gpu_hours(architecture(str(e["architecture"])) or {}, [(float(e["prompts"]), int(e["tokens"]))])
        for c in v.commands
        for e in ([] if c.cannot_run else c.estimate)
    )


def describe(
    exp: Experiment, variant: str, out: Path, kind: str = "experiment", gpu_hour_usd: float | None = None
) -> str:
    """What a run of the variant does: its GPUs, the GPU-hours estimate (and its cost at
    ``gpu_hour_usd`` dollars per GPU-hour), each command line and each command that cannot
    run with its reason."""
    v = variant_of(exp, variant)
    what = f"{exp.table} ({exp.source})" if exp.source else exp.table
    lines = [f"{kind} {what}: {exp.title}", f"variant {variant}: {v.note}".rstrip(": ")]
    lines.append(f"  GPUs: {v.gpus}" if v.gpus else "  GPUs: none (CPU)")
    hours = gpu_hours(v)
    if hours is not None:
        lines.append(
            f"  estimate: {hours:.1f} GPU-hours (prefill FLOPs at the stated prompt counts and mean lengths, "
            f"{PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 per GPU at {MFU:.0%} utilisation; decode left out)"
        )
        if gpu_hour_usd:
            lines.append(f"  cost: {cost_text(hours, gpu_hour_usd)}")
    for cmd in command_lines(exp, variant, out):
        lines.append("  " + " ".join(cmd[1:]))
    for method, why in cannot_run(v).items():
        lines.append(f"  {method}: cannot run in this {kind.split()[-1]} (not launched, no GPU-hours counted): {why}")
    return "\n".join(lines)


def run_commands(exp: Experiment, variant: str, out: Path, dry_run: bool) -> list[str]:
    """Run the variant's commands one after another (each a dry run with ``dry_run``); the
    command lines that failed. A failed command is recorded and the others still run."""
    failed = []
    for cmd in command_lines(exp, variant, out, dry_run):
        print("+", " ".join(cmd[1:]), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode:
            failed.append(" ".join(cmd[2:]))
    if failed:
        print(f"{exp.name}: {len(failed)} command(s) failed:\n  " + "\n  ".join(failed), flush=True)
    return failed


def run(name: str, variant: str, dry_run: bool, root: Path = RESULTS, gpu_hour_usd: float | None = None) -> int:
    if name.startswith(PAPER_PREFIX):
        raise SystemExit(f"experiment {name!r} is a paper table: make paper table={name.removeprefix(PAPER_PREFIX)}")
    exp = load(name)
    out = root / exp.name / variant
    print(describe(exp, variant, out, gpu_hour_usd=gpu_hour_usd), flush=True)
    return 1 if run_commands(exp, variant, out, dry_run) else 0


def positive_usd(text: str) -> float:
    """A ``--gpu-hour-usd`` value: dollars per GPU-hour, above 0."""
    try:
        usd = float(text)
    except ValueError:
        usd = math.nan
    if not usd > 0 or math.isinf(usd):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: dollars per GPU-hour, a number above 0, e.g. 2.5")
    return usd


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one experiment's variant")
    r.add_argument("name", help=f"one of {[n for n in names() if not n.startswith(PAPER_PREFIX)]}")
    r.add_argument("--variant", default="paper", help="paper (the published models and GPUs) | cpu")
    r.add_argument("--dry-run", action="store_true", help="print the plan and each command's own plan; run nothing")
    r.add_argument("--root", type=Path, default=RESULTS)
    r.add_argument("--gpu-hour-usd", type=positive_usd, default=None, help="$ per GPU-hour: the plan states the cost")
    sub.add_parser("list", help="the experiments and their variants")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for n in names():
            e = load(n)
            print(f"{n}: {e.title} (variants: {', '.join(e.variants)})")
        return
    raise SystemExit(run(args.name, args.variant, args.dry_run, args.root, args.gpu_hour_usd))


if __name__ == "__main__":
    main()
