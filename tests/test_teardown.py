"""A job that finished ends without the interpreter's teardown (harness.command_line).

CI once saw ``make lm-eval`` write everything and then abort in teardown ("terminate called
without an active exception", a C++ destructor failing while Python frees what was left).
Here an object whose destructor aborts the process stands for that destructor: the job's
entry point must still exit 0, after its threads finished (an executor left running is
stopped, as Python's own exit does) and its ``atexit`` handlers ran."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    from harness import command_line

    OUT = Path(os.environ["TEARDOWN_OUT"])

    class AbortsWhenFreed:  # a C++ destructor that fails in the interpreter's teardown
        def __del__(self, abort=os.abort):  # bound now: teardown may have cleared the module
            abort()

    def late_write():
        time.sleep(0.3)
        (OUT / "thread").write_text("finished")

    def job():
        global held
        held = AbortsWhenFreed()  # alive until teardown, as the model and Arrow's pools are
        atexit.register(lambda: (OUT / "atexit").write_text("ran"))
        threading.Thread(target=late_write).start()
        global executor
        executor = ThreadPoolExecutor(max_workers=1)  # never shut down: its idle worker must not hang the exit
        executor.submit(time.sleep, 0)
        print("job done", flush=True)
        if os.environ.get("TEARDOWN_FAIL"):
            sys.exit(3)

    command_line.main(job, "config")
    """
)


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", JOB], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TEARDOWN_OUT": str(tmp_path), **env})  # fmt: skip


def test_a_finished_job_exits_zero_after_its_threads_and_atexit_handlers(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "job done"
    assert (tmp_path / "thread").read_text() == "finished"  # a non-daemon thread was waited for
    assert (tmp_path / "atexit").read_text() == "ran"


def test_a_failing_job_keeps_its_exit_status(tmp_path):
    r = _run(tmp_path, TEARDOWN_FAIL="1")
    assert r.returncode != 0
    assert r.stdout.strip() == "job done"


def test_every_parquet_read_goes_through_arrows_own_file_system():
    """``pandas.read_parquet(path)`` reads through a Python file object, and a process that did
    aborted at exit in about a third of the runs on a loaded machine (harness/parquet.py): every
    read in the project and its tests is :func:`harness.parquet.read_parquet`."""
    import re

    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    direct = re.compile(r"\b(pd|pandas)\.read_parquet\(|\bpq\.read_table\([^)]*\bopen\(")
    found = [
        f"{name}:{i}"
        for name in files.stdout.split()
        if name not in ("harness/parquet.py", "tests/test_teardown.py")  # the helper; this test's pattern
        for i, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if direct.search(line)
    ]
    assert not found, f"read parquet with harness.parquet.read_parquet instead: {found}"


def test_read_parquet_returns_pandas_own_frame(tmp_path):
    """The same frame as ``pandas.read_parquet``, dtypes included; a missing file is FileNotFoundError."""
    import pandas as pd
    import pytest

    from harness.parquet import read_parquet

    df = pd.DataFrame({"a": [1, 2], "b": ["x", None], "c": [0.5, float("nan")], "d": [[1], [2, 3]]})
    df.to_parquet(tmp_path / "f.parquet", index=False)
    got = read_parquet(tmp_path / "f.parquet")
    pd.testing.assert_frame_equal(got, pd.read_parquet(tmp_path / "f.parquet"))
    assert list(read_parquet(tmp_path / "f.parquet", columns=["c", "a"]).columns) == ["c", "a"]
    os.chdir(tmp_path)  # a relative path reads as pandas reads it
    try:
        pd.testing.assert_frame_equal(read_parquet("f.parquet"), got)
    finally:
        os.chdir(ROOT)
    with pytest.raises(FileNotFoundError):
        read_parquet(tmp_path / "missing.parquet")
