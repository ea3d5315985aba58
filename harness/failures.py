"""Failures, in one place: what the job lifecycle, the store and the readers share.

A run goes on past a bad unit and says so afterwards, in three layers:

* **a unit** (one sample, one timed iteration, one rate): :func:`measured` turns its
  exception into the row's ``status`` (``failed`` with the error and the end of its
  traceback, or ``unsupported`` where the method cannot run on the hardware) and the run
  goes on; :func:`failed_rows` counts a folder's failed rows (``unsupported`` is a result);
* **a job** (an exception that ends it: a model that will not load, a full disk):
  :func:`recording_errors` writes it to ``job_error.txt`` beside the rows and re-raises; a
  job that finishes removes an earlier one's; :func:`job_errors` lists them for the report;
* **the command**: :func:`finish` (one run) and the sweeper (a sweep, after its last job)
  exit 1 with :func:`failure_message` naming the runs with failed rows, unless
  ``allow_failures=true`` (:class:`RunFailures`, one line through Hydra).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    from hydra.errors import CompactHydraException
except ImportError:  # the GPU check's bare machine has no Hydra (it reads rows, raises none of these)
    CompactHydraException = Exception  # type: ignore[misc,assignment]

from harness.store import RunStore, run_folders
from specprefill.plan import Unsupported

#: A job's error, beside its rows.
JOB_ERROR = "job_error.txt"


class MixedModels(ValueError, CompactHydraException):
    """A folder's rows put runs of one model under different settings that change results
    (:data:`harness.analysis.rows.MODEL_SETTINGS`) at one point: pooling them would drop one
    run's samples as duplicates of the other's. One line through Hydra."""


class RunFailures(CompactHydraException):
    """Rows of a finished run (or sweep) failed: the exit status is 1 unless ``allow_failures=true``."""


def measured(row: dict[str, Any], fn: Callable[[], dict[str, Any]], hardware: str | None = None) -> dict[str, Any]:
    """``row`` with ``fn()``'s fields and status ``ok``; where ``fn`` raises, the failure
    instead: :class:`~specprefill.plan.Unsupported` (the method cannot run on this hardware,
    named with ``hardware``) is ``unsupported``, anything else ``failed`` with its error and
    the end of its traceback. Stamped with the time it ended."""
    try:
        row.update(fn(), status="ok")
    except Unsupported as e:
        row.update(status="unsupported", error=f"{e} (hardware: {hardware})" if hardware else str(e))
    except Exception as e:  # one bad unit must not end the run: recorded, the run goes on
        row.update(status="failed", error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
    row["timestamp"] = time.time()
    return row


def failed_rows(folder: Path) -> int:
    """How many of a run folder's rows failed (``unsupported`` is a result, not a failure)."""
    df = RunStore(folder).read()
    return 0 if df.empty else int((df["status"] == "failed").sum())


@contextlib.contextmanager
def recording_errors(folder: Path) -> Iterator[None]:
    """Run a job: an exception that ends it is written to ``job_error.txt`` in ``folder``
    (and re-raised); a job that finishes removes an earlier one's."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):  # the folder may be what failed (disk full, read-only)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / JOB_ERROR).write_text(traceback.format_exc())
        raise
    (folder / JOB_ERROR).unlink(missing_ok=True)


def job_errors(out: Path) -> list[tuple[str, str]]:
    """Run folders whose job failed as a whole (``job_error.txt``), with the error's last lines."""
    found = []
    for folder in sorted({*run_folders(out), *(p.parent for p in Path(out).rglob(JOB_ERROR))}):
        f = folder / JOB_ERROR
        if f.exists():
            lines = f.read_text(errors="replace").strip().splitlines()
            found.append((str(folder.relative_to(out)) if folder != Path(out) else ".", "\n".join(lines[-6:])))
    return found


def finish(folder: Path, allow_failures: bool) -> dict[str, Any]:
    """A job's outcome for the sweeper (``{"folder", "failed"}``); in a single run (not a
    sweep) failed rows raise :class:`RunFailures` here unless ``allow_failures``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    n = failed_rows(folder)
    outcome = {"folder": str(folder), "failed": n}
    sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if n and not allow_failures and not sweep:  # a sweep's sweeper decides after its last job
        raise RunFailures(failure_message([outcome]))
    return outcome


def failure_message(outcomes: list[dict[str, Any]]) -> str:
    """One message for the runs (``{"folder", "failed"}``) with failed rows."""
    bad = [o for o in outcomes if o.get("failed")]
    total = sum(int(o["failed"]) for o in bad)
    where = "".join(f"\n  {o['failed']} in {o['folder']}" for o in bad)
    return (
        f"{total} failed row(s) in {len(bad)} run(s) (status=failed, with the error in the row's `error`; "
        f"`make report` lists them):{where}\nRun the same command again to retry them, or pass "
        f"allow_failures=true to exit 0 anyway."
    )
