"""One job lifecycle for every runner: ``make eval``, ``make latency``, ``make qps`` and ``make lm-eval``.

A job kind says what differs (:class:`Job`): the kind of its rows, its folder and results
folder, the ``config.yaml`` it records, its plan text, whether a unit with a failed row is
measured again on resume, and a session (:class:`Session`): what it loads (a tokenizer and
samples, a model, servers), the row prefix every row of the job shares, its units (each
with its key) and how to measure one into rows. :func:`execute` owns what is the same for
every kind: the store, a job-level error recorded in the folder (``job_error.txt``), the
config written once the session is open, resume (units and rows already stored are
skipped), the progress bar, timestamps, compaction, then the refresh its caller hands it (the
report: the lifecycle does not import rendering). A unit's failure becomes a row through
:func:`harness.failures.measured` (``unsupported`` or ``failed``, with its error) so the run
goes on; :func:`main` prints the dry run or executes and gives the exit status
(:mod:`harness.failures` holds every failure's handling).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from tqdm.auto import tqdm

from harness.dryrun import priced
from harness.failures import finish, recording_errors
from harness.models.placement import Placement
from harness.store import RunStore, record
from specprefill.plan import Method


class Session(Protocol):
    """A job's open session: what it loaded, its rows' shared prefix, its units."""

    #: Fields every row of the job shares (run id, config hash, provenance, method, ...).
    common: dict[str, Any]

    @property
    def progress(self) -> str:
        """The progress bar's label."""
        ...

    @property
    def unit_name(self) -> str:
        """What the progress bar counts: sample, point, rate."""
        ...

    def units(self) -> Iterable[tuple[str, Any]]:
        """Every unit as (its key, the unit); the key is its rows' ``unit``. A list, or a
        generator read lazily, so a unit may depend on the rows stored before it (QPS's rate
        search)."""
        ...

    def measure(self, unit: Any) -> list[dict[str, Any]]:
        """The rows of one unit (without the shared prefix); a failure inside a unit is a
        row (:func:`harness.failures.measured`), never an exception that ends the run."""
        ...


class Job(Protocol):
    """A validated job, nothing loaded yet."""

    kind: ClassVar[str]  # the kind of its rows: eval | latency | qps
    #: Whether a unit with a failed row is measured again on resume (not where a failure is
    #: itself the measurement: a served request, a document lm-eval scored without a value).
    retry_failed: ClassVar[bool]

    @property
    def folder(self) -> Path:
        """The run folder its rows go to."""
        ...

    @property
    def out(self) -> Path:
        """The results folder whose summaries the job refreshes."""
        ...

    def config(self) -> dict[str, Any]:
        """What ``config.yaml`` records."""
        ...

    def describe(self) -> str:
        """The dry run's plan."""
        ...

    def session(self, store: RunStore) -> AbstractContextManager[Session]:
        """Load what the job needs; leave it (servers stopped) on exit."""
        ...


@dataclass(frozen=True)
class ModelJob:
    """What the eval, latency and QPS jobs hold alike: the validated config (its ``out`` is
    the results folder), the method measured, the run's identity and folder, and the
    placement planned for the model. Each kind adds what it measures on."""

    cfg: Any
    method: Method
    config_hash: str
    folder: Path
    placement: Placement

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)


#: What a job kind refreshes once its rows are stored, given the results folder (the entry
#: points pass :func:`harness.report.summary.write_all`: the lifecycle does not render).
Refresh = Callable[[Path], object]


def execute(job: Job, refresh: Refresh | None = None) -> Path:
    """Run ``job`` to completion, resuming, then ``refresh`` its results folder (the summaries
    and report)."""
    store = RunStore(job.folder)
    with recording_errors(store.folder):
        with job.session(store) as session:
            store.write_config(job.config())
            done = store.done_units(ok_only=job.retry_failed)
            units = session.units()
            todo = (
                [(k, u) for k, u in units if k not in done]
                if isinstance(units, list)
                else ((k, u) for k, u in units if k not in done)
            )
            for _, unit in tqdm(todo, desc=session.progress, unit=session.unit_name):
                rows = [r for r in session.measure(unit) if r.get("unit") not in done]  # stored ones stay
                store.append([record(job.kind, **{**session.common, "timestamp": time.time(), **r}) for r in rows])
        store.compact()
    if refresh is not None:
        refresh(job.out)
    return job.folder


def main(
    job: Job,
    dry_run: bool,
    allow_failures: bool | None,
    refresh: Refresh | None = None,
    gpu_hour_usd: float | None = None,
) -> dict[str, Any] | None:
    """The dry run's plan (its cost at ``gpu_hour_usd`` dollars per GPU-hour where given), or
    the job run (then ``refresh``); then its outcome (``allow_failures`` None: the rows'
    failures are measurements, QPS's failed requests, and never fail the command)."""
    if dry_run:
        with priced(gpu_hour_usd):
            print(job.describe())
        return None
    folder = execute(job, refresh)
    return None if allow_failures is None else finish(folder, allow_failures)
