"""The one job lifecycle (harness/jobs/lifecycle.py): resume, failure rows, the shared row prefix, the
report refresh, for every runner."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness.failures import measured
from harness.jobs import lifecycle as jobs
from harness.report.summary import write_all
from harness.store import RunStore
from specprefill.plan import Unsupported

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ["harness/jobs/eval.py", "harness/jobs/latency.py", "harness/jobs/qps.py", "harness/jobs/lm_eval.py"]


@dataclass
class FakeSession:
    units_: list[str]
    fail: dict[str, BaseException]
    calls: list[str]
    common: dict[str, Any] = field(default_factory=lambda: {"run_id": "r", "config_hash": "h", "model": "m",
                                                             "method": "x", "method_options": "{}",
                                                             "reference_method": "x", "backend": "b"})  # fmt: skip
    progress = "fake"
    unit_name = "unit"

    def units(self):
        return [(u, u) for u in self.units_]

    def measure(self, unit):
        self.calls.append(unit)

        def fn():
            if unit in self.fail:
                raise self.fail[unit]
            return {"ttft_s": 1.0}

        row = {"row_key": unit, "unit": unit, "batch": 1, "length": 8, "iteration": 0, "warmup": False,
               "prompt_source": "random", "prefix_cache": False}  # fmt: skip
        return [measured(row, fn)]


@dataclass(frozen=True)
class FakeJob:
    kind: ClassVar[str] = "latency"
    retry_failed: ClassVar[bool] = True
    folder: Path
    session_: FakeSession

    @property
    def out(self) -> Path:
        return self.folder.parent

    def config(self):
        return {"kind": "fake"}

    def describe(self):
        return "plan"

    @contextlib.contextmanager
    def session(self, store):
        yield self.session_


def test_the_lifecycle_records_failures_resumes_and_refreshes_the_report(tmp_path):
    calls: list[str] = []
    s = FakeSession(["a", "b", "c"], {"b": RuntimeError("boom"), "c": Unsupported("no GPU")}, calls)
    job = FakeJob(tmp_path / "res" / "run", s)
    refreshed: list[Path] = []
    jobs.execute(job, lambda out: refreshed.append(out) or write_all(out))
    assert refreshed == [tmp_path / "res"]  # the refresh the caller handed it, on the results folder
    rows = RunStore(job.folder).read().set_index("unit")
    assert rows.loc["a", "status"] == "ok" and rows.loc["a", "run_id"] == "r"  # the shared prefix
    assert rows.loc["b", "status"] == "failed" and rows.loc["b", "error"].startswith("RuntimeError: boom")
    assert rows.loc["c", "status"] == "unsupported" and rows.loc["c", "error"] == "no GPU"
    assert (tmp_path / "res" / "summary.md").exists() and (job.folder / "config.yaml").exists()
    # resume: the ok unit is skipped, the failed ones measured again (retry_failed)
    s.fail.clear()
    calls.clear()
    jobs.execute(job)
    assert calls == ["b", "c"]
    assert set(RunStore(job.folder).read()["status"]) == {"ok"} and len(RunStore(job.folder).read()) == 3


def test_a_kind_whose_failures_are_measurements_does_not_redo_them(tmp_path):
    calls: list[str] = []
    s = FakeSession(["a", "b"], {"b": RuntimeError("boom")}, calls)

    @dataclass(frozen=True)
    class Kept(FakeJob):
        retry_failed: ClassVar[bool] = False

    job = Kept(tmp_path / "res" / "run", s)
    jobs.execute(job)
    calls.clear()
    jobs.execute(job)
    assert calls == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_no_runner_writes_its_own_lifecycle(runner):
    """Resume, failure rows, appending and the report refresh live in harness/jobs/lifecycle.py alone."""
    text = (ROOT / runner).read_text()
    for own in ("done_units(", "except Unsupported", "format_exc(", "store.append(", "write_all(", "recording_errors("):
        assert own not in text, (runner, own)
    assert "jobs.execute(job, write_all)" in text


def test_the_lifecycle_does_not_render():
    """The job lifecycle takes the report refresh from its caller: it imports nothing of
    harness.rendering or harness.report (the read side), so the write path never returns to it."""
    import ast

    tree = ast.parse((ROOT / "harness" / "jobs" / "lifecycle.py").read_text())
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    read_side = ("harness.rendering", "harness.report")
    assert imported and not [m for m in imported if m and m.startswith(read_side)], imported
