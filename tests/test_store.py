"""The results store: append, resume, dedupe, failures replaced on retry."""

from __future__ import annotations

import dataclasses

import pytest

from harness.store import RunRecord, RunStore, read_results, run_folders


def _record(task: str, i: int, ts: float, status: str = "ok", run_id: str = "r1") -> RunRecord:
    fields = {f.name: None for f in dataclasses.fields(RunRecord)}
    fields.update(
        run_id=run_id,
        task=task,
        sample_id=i,
        timestamp=ts,
        status=status,
        references=["x"],
        score=100.0 if status == "ok" else None,
    )
    return RunRecord(**fields)


def test_append_resume_and_compact(tmp_path):
    store = RunStore(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("x: 1\n")
    store.append(_record("a", 0, 1.0))
    store.append(_record("a", 1, 2.0, status="failed"))
    assert store.done_keys() == {("a", 0)}  # failed rows are retried
    store.append(_record("a", 1, 3.0))  # the retry supersedes the failure
    df = store.read()
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    store.compact()
    assert not list((tmp_path / "run" / "parts").glob("*.parquet"))
    assert len(store.read()) == 2
    # A crash between compaction and part cleanup leaves rows twice on disk: still 2 rows.
    store.append(_record("a", 0, 1.0))
    assert len(store.read()) == 2
    assert run_folders(tmp_path) == [tmp_path / "run"]
    assert len(read_results(tmp_path)) == 2


def test_a_half_written_part_is_ignored(tmp_path):
    store = RunStore(tmp_path)
    store.append(_record("a", 0, 1.0))
    (tmp_path / "parts" / ".partial.tmp").write_bytes(b"PAR1 garbage")  # a killed write
    assert len(store.read()) == 1


def test_rows_are_frozen():
    r = _record("a", 0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.score = 1.0  # type: ignore[misc]
