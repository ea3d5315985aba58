"""The results store: every kind of row through one writer and one reader; resume, dedupe,
failures replaced on retry, the job error beside the results, rows written before a
column existed."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from harness.failures import recording_errors
from harness.store import RECORDS, RunStore, read_results, record, run_folders


def _eval(task: str, i: int, ts: float, status: str = "ok", run_id: str = "r1"):
    key = f"{task}/{i}"
    return record(
        "eval", run_id=run_id, row_key=key, unit=key, task=task, sample_id=i, timestamp=ts, status=status,
        references=["x"], score=100.0 if status == "ok" else None, method="m", reference_method="full",
    )  # fmt: skip


def _folder(tmp_path, name: str) -> RunStore:
    store = RunStore(tmp_path / name)
    store.write_config({"kind": name})
    return store


def test_append_resume_and_compact(tmp_path):
    store = _folder(tmp_path, "run")
    store.append([_eval("a", 0, 1.0)])
    store.append([_eval("a", 1, 2.0, status="failed")])
    assert store.done_units() == {"a/0"}  # failed rows are retried
    assert store.done_units(ok_only=False) == {"a/0", "a/1"}
    store.append([_eval("a", 1, 3.0)])  # the retry supersedes the failure
    df = store.read()
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    store.compact()
    assert not list((tmp_path / "run" / "parts").glob("*.parquet"))
    assert len(store.read()) == 2
    # A crash between compaction and part cleanup leaves rows twice on disk: still 2 rows.
    store.append([_eval("a", 0, 1.0)])
    assert len(store.read()) == 2
    assert run_folders(tmp_path) == [tmp_path / "run"]
    assert len(read_results(tmp_path)) == 2


def test_a_reader_racing_the_runs_compaction_reads_every_row(tmp_path, monkeypatch):
    """A reader (make report, a test polling a live run) lists the part files, then the run
    compacts them into rows.parquet and unlinks them before the reader opens them: the
    reader lists again and gets every row once, not a FileNotFoundError."""
    import harness.store as store_mod

    store = _folder(tmp_path, "run")
    store.append([_eval("a", 0, 1.0)])
    store.append([_eval("a", 1, 2.0)])
    real_files = store_mod._files
    calls = []

    def files_then_compact(folders):
        listed = real_files(folders)
        calls.append(len(listed))
        if len(calls) == 1:  # the first listing sees the parts; the run compacts them right after
            store.compact()
        return listed

    monkeypatch.setattr(store_mod, "_files", files_then_compact)
    df = read_results(tmp_path)
    assert sorted(df["row_key"]) == ["a/0", "a/1"] and calls[0] == 2 and calls[-1] == 1


def test_a_unit_is_done_only_when_every_row_of_it_is_ok(tmp_path):
    """A latency grid point has one row per method: one failed method retries the point."""
    store = _folder(tmp_path, "lat")
    rows = [
        record("latency", run_id="l", row_key=f"b1-n8/0/{m}", unit="b1-n8", status=s, timestamp=1.0, method=m,
               reference_method="full", batch=1, length=8, iteration=0, warmup=False, ttft_s=1.0)
        for m, s in (("full", "ok"), ("x", "failed"))
    ]  # fmt: skip
    store.append(rows)
    assert store.done_units() == set()
    store.append([dataclasses.replace(rows[1], status="ok", timestamp=2.0)])
    assert store.done_units() == {"b1-n8"}


def test_one_reader_for_eval_latency_and_qps_rows(tmp_path):
    _folder(tmp_path, "e").append([_eval("a", 0, 1.0, run_id="e")])
    _folder(tmp_path, "l").append(
        [record("latency", run_id="l", row_key="b1-n8/0/full", unit="b1-n8", status="ok", timestamp=1.0,
                method="full", reference_method="full", batch=1, length=8, iteration=0, warmup=False, ttft_s=0.5)]
    )  # fmt: skip
    _folder(tmp_path, "q").append(
        [record("qps", run_id="q", row_key="0.1/0", unit="rate-0.1", status="failed", timestamp=1.0, method="full",
                reference_method="full", rate=0.1, request=0, timed_out=True, passed=False)]
    )  # fmt: skip
    df = read_results(tmp_path)
    assert sorted(df["kind"]) == ["eval", "latency", "qps"]
    lat = read_results(tmp_path, kind="latency")
    assert len(lat) == 1 and lat["ttft_s"].iloc[0] == 0.5
    assert "score" not in lat.columns and "rate" not in lat.columns  # other kinds' empty columns are dropped
    with pytest.raises(ValueError, match=r"kind='evals'; allowed: \['eval', 'latency', 'qps'\]"):
        read_results(tmp_path, kind="evals")


def test_rows_written_before_kind_and_row_key_existed_read_as_eval(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.yaml").write_text("x: 1\n")
    old = {"run_id": "old", "task": "vt", "sample_id": 3, "timestamp": 1.0, "status": "ok", "method": "full"}
    pd.DataFrame([old, {**old, "timestamp": 2.0}]).to_parquet(folder / "rows.parquet")
    df = read_results(tmp_path)
    assert len(df) == 1
    row = df.iloc[0]
    assert (row["kind"], row["row_key"], row["unit"], row["reference_method"]) == ("eval", "vt/3", "vt/3", "full")


def test_a_half_written_part_is_ignored(tmp_path):
    store = RunStore(tmp_path)
    store.append([_eval("a", 0, 1.0)])
    (tmp_path / "parts" / ".partial.tmp").write_bytes(b"PAR1 garbage")  # a killed write
    assert len(store.read()) == 1


def test_the_job_error_is_written_beside_the_results_and_cleared_by_a_finished_job(tmp_path):
    store = RunStore(tmp_path / "run")
    with pytest.raises(RuntimeError, match="model missing"), recording_errors(store.folder):
        raise RuntimeError("model missing")
    assert "RuntimeError: model missing" in (tmp_path / "run" / "job_error.txt").read_text()
    with recording_errors(store.folder):
        pass
    assert not (tmp_path / "run" / "job_error.txt").exists()


def test_records_are_frozen_and_refuse_unknown_fields():
    r = _eval("a", 0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.score = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"eval record has no field\(s\) \['scroe'\]"):
        record("eval", scroe=1.0)
    assert set(RECORDS) == {"eval", "latency", "qps"}
