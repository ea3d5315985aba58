"""Studies of the harness itself (not the datasets: those are :mod:`harness.benchmarks`): the GPU
check, the speculator-depth sweep, scoring memory, RULER generation, front throughput and the
lm-eval cross-check; their figures go to ``results/reference/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
