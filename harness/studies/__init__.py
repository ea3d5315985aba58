"""Studies of the harness itself (not the datasets: those are :mod:`harness.benchmarks`): the GPU
check, the speculator-depth sweep, scoring memory, RULER generation, front throughput and the
lm-eval cross-check; their figures go to ``results/reference/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_job(cmd: list[str]) -> None:
    """Run one harness job of a study. A job that refuses (its one-line message already on
    stderr) or fails ends the study with the job's exit status, not a second traceback."""
    import subprocess

    done = subprocess.run(cmd)
    if done.returncode:
        raise SystemExit(done.returncode)


def write_reference(path: Path, benchmark: str, rows: list[dict[str, Any]], **meta: Any) -> None:
    """Write one benchmark's rows with the hardware and library versions they were measured on."""
    from harness.provenance import (  # deferred: gpu_check imports this package on the GPU machine (torch, transformers, pandas only)
        hardware,
        versions,
    )

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": benchmark, **meta, "hardware": hardware(), "versions": versions(), "rows": rows}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
