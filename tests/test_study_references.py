"""The benchmarks that write results/reference/*.json record the commit they ran at, as a run's
rows do (harness.provenance.git_sha: the SHA, ``-dirty`` when tracked files differed from it)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from harness.provenance import git_sha
from harness.studies import ruler_generation, scoring_memory


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (ruler_generation, ["--lengths", "1024", "--samples", "2", "--tasks", "niah_single_1"]),
        (scoring_memory, ["--lengths", "256"]),
    ],
    ids=["ruler_generation", "scoring_memory"],
)
def test_a_reference_benchmark_records_its_commit(module, args, tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["study", *args, "--out", str(out)])
    module.main()
    written = json.loads(out.read_text())
    assert written["git_sha"] == git_sha() and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", written["git_sha"]), written
    assert written["rows"] and written["hardware"] and written["versions"]
