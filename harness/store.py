"""The results store: one parquet row per measurement, append-only, resumable, for every kind.

Quality (``kind=eval``: one row per benchmark sample), latency (``kind=latency``: one row
per grid point, iteration and method) and serving (``kind=qps``: one row per request and
request rate) are written by one :class:`RunStore` and read back by one
:func:`read_results`.

A run folder (derived from the run's config, so results are a function of the config)
holds ``config.yaml`` (the resolved config), its rows, and ``job_error.txt`` when the
job as a whole failed. Rows are written at once as small part files (to a temporary
name, then renamed: a killed run leaves either the whole part or nothing); at the end of
a run the parts are compacted into ``rows.parquet``. Readers deduplicate by
``(run_id, row_key)``, keeping the newest row, so a crash between compaction and
cleanup cannot duplicate rows, and a retried failure replaces its failed row. A run
resumes by ``unit`` (a sample, a grid point, a request rate): units already written
are skipped.

A damaged row file (truncated, garbled, not parquet) is named in one ``[store]`` line: the
run that owns the folder moves it aside (``rows.parquet.corrupt-<time>``) and runs its units
again; readers (``make report``, the regression gate) skip it. A resuming run removes the
temporary files a killed writer left (:meth:`RunStore.remove_orphans`). A run folder whose
layout is blocked (a file where a folder goes, or the reverse) is refused in one line
before anything runs (:func:`check_layout`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from harness.parquet import read_parquet

try:
    from hydra.errors import CompactHydraException
except ImportError:  # the GPU machine's bare check (harness.studies.gpu_check) has no Hydra; it needs only rows

    class CompactHydraException(Exception):  # type: ignore[no-redef]
        """Stands in for Hydra's (printed as one line there) where Hydra is absent."""


KINDS = ("eval", "latency", "qps")


class StoreWriteError(CompactHydraException, OSError):
    """Rows could not be written (disk full, read-only folder): one line, the run stops."""


class StoreLayoutError(CompactHydraException, ValueError):
    """A run folder's path is blocked (a file where a folder goes, or the reverse): one line,
    before anything runs."""


#: When this process started writing: temporary files older than it are orphans of a
#: killed writer (:meth:`RunStore.remove_orphans`).
STARTED = time.time()
#: The store's own temporary names: a part being written (``parts/.<timestamp>-<hex8>.tmp``),
#: ``rows.parquet`` being compacted (``.rows.parquet.tmp``), an atomic write
#: (``.<name>.<hex8>.tmp``, e.g. ``config.yaml``).
PART_TMP = re.compile(r"\.\d+\.\d+-[0-9a-f]{8}\.tmp")
FOLDER_TMP = re.compile(r"\.rows\.parquet\.tmp|\..+\.[0-9a-f]{8}\.tmp")


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What every row carries, whatever its kind. Times in seconds."""

    kind: str  # eval | latency | qps
    run_id: str  # the run folder's name
    config_hash: str
    row_key: str  # unique within the run
    unit: str  # what a resumed run skips as a whole (a sample, a grid point, a request rate)
    timestamp: float
    status: str  # "ok" | "failed" | "unsupported"
    error: str | None
    # Provenance (harness.provenance.provenance)
    git_sha: str
    versions: str  # JSON
    hardware: str
    #: The CPU's kernel-picking features (harness.provenance.CPU_FLAGS: "avx512_bf16 avx512f
    #: avx2", ...), which ``hardware``'s model name does not tell; None in rows before
    #: 2026-12-07 and where /proc/cpuinfo is not readable.
    cpu_flags: str | None = None
    model: str
    model_weights: str
    weights_hash: str | None  # harness.models.loading.weights_hash: the verified checkpoint the row ran
    #: The model settings that change results without changing its name (rows before
    #: 2026-12-05 lack them): whether prompts went through its chat template, the hub
    #: revision and path it loaded, and the seed of random weights
    #: (harness.analysis.rows.MODEL_SETTINGS: one folder may not mix them at a point).
    chat_template: bool | None = None
    model_revision: str | None = None
    model_path: str | None = None
    model_seed: int | None = None
    dtype: str
    speculator: str | None
    #: A speculator with another tokenizer than the base's (another family): that tokenizer,
    #: and the rule carrying its scores onto the base's tokens (specprefill.token_map); None otherwise.
    speculator_tokenizer: str | None = None
    token_map: str | None = None
    backend: str
    quantization: str | None  # the checkpoint's own, as the engine applied it (None: unquantized)
    gpu_memory_utilization: float | None  # the engine's planned share of each GPU (vLLM on GPUs)
    #: The context window the run had (tokens): vLLM's max_model_len, the model's max_context
    #: unless the placement lowered it to fit the KV cache (harness.models.placement.place).
    max_model_len: int | None
    #: The model runner the engine built (vLLM: the workers' class, V1 or not, hook in or
    #: absent; specprefill.backends.vllm), None on the transformers backend.
    engine_runner: str | None
    #: The vLLM position canary at engine start (PositionCheck.describe), None on transformers.
    position_check: str | None
    # The method and what it is compared against
    method: str
    scope: str | None  # prompt | context | query_aware_context
    method_options: str  # JSON of every option of the method
    reference_method: str  # the method ratios are taken against (config ``reference``)
    #: The method's budget as a fraction of the prompt (None: a method without one, the
    #: reference, or a budget in tokens); every other option is in ``method_options`` only
    #: (rows before 2026-12-04 also copied SpecPrefill's into their own columns).
    keep_rate: float | None
    #: The method's budget in tokens where one was asked (``keep_tokens=``, or SpecPC's / SpecKV's
    #: own ``max_capacity_prompt``: :func:`token_budget`; None otherwise): the requested; what it
    #: achieved is ``kept_tokens`` (prompt methods) or ``kv_tokens`` (KV).
    keep_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class EvalRecord(RunRecord):
    """One benchmark sample: prediction, score, and TTFT with its parts."""

    benchmark: str
    benchmark_version: str
    benchmark_options: str  # JSON
    metrics_version: str
    #: The benchmark's deliberate differences from its official code (Benchmark.notes; None in
    #: rows before 2026-12-05 and where there is none).
    benchmark_notes: str | None = None
    task: str
    category: str | None
    bucket: str | None
    length: int
    sample_id: int
    prompt_tokens: int | None
    kept_tokens: int | None
    kept_fraction: float | None
    prediction: str | None
    references: list[str]
    score: float | None
    needle_kept: float | None  # the asked evidence's tokens kept (harness.diagnostics)
    needle_depth: float | None  # mean position of the evidence in the context, 0..1 (harness.diagnostics)
    sample_hash: str | None  # SHA-256 (16 hex) of the prompt and references the sample had
    ttft_s: float | None
    method_s: float | None
    speculator_s: float | None
    selection_s: float | None
    method_timings: str | None  # JSON: every part of the method's own cost (retriever_s, filter_s, ...)
    base_prefill_s: float | None
    #: The FLOP model's (:mod:`specprefill.flops`) full prefill of this prompt and the
    #: method's own work (its model calls plus the base prefill of what it kept; NaN where a
    #: method rewrote the text): the ideal speedup of a point is their ratio of means.
    flops_full: float | None
    flops_method: float | None
    decode_s: float | None
    timing_source: str | None  # wall | engine | none (Generation.timing_source)
    output_tokens: int | None
    max_new_tokens: int | None  # the decode budget this sample had (the same for every method)
    #: The base model's KV cache after the prefill (``Generation.kv_tokens`` / ``kv_bytes``):
    #: what a KV press leaves, or what a shortened prompt fills; None where the backend
    #: cannot see its cache (vLLM).
    kv_tokens: int | None = None
    kv_bytes: int | None = None
    #: A conversation's turn (a multi-turn benchmark; None elsewhere): its index from 1, the
    #: method's policy over turns (:mod:`specprefill.conversation`), the tokens the base
    #: prefilled this turn and those of them revived from earlier turns. On these rows
    #: ``prompt_tokens`` is the conversation so far and ``kept_tokens`` what the base holds.
    turn: int | None = None
    turn_policy: str | None = None
    prefilled_tokens: int | None = None
    revived_tokens: int | None = None
    #: The method's place among the methods run in this turn (several methods in one job,
    #: config ``also``: harness.timing.iteration_order); None where a job runs one method.
    order: int | None = None
    #: Memory a method keeps beside the base's cache (KV revival: the speculator's cache of
    #: the whole conversation), bytes; 0 where it keeps none, None in older rows.
    speculator_kv_bytes: int | None = None
    #: A conversation turn's needle: its place among the context's needles in document
    #: order (1 = the first), recording the turn order the benchmark drew.
    turn_needle: int | None = None
    #: The share of look-alike needles the question does not ask that was kept (RULER
    #: niah_multikey_1's other keys; Sample.distractor_spans); None without any, or in older
    #: rows, whose ``needle_kept`` on niah_multikey_1 counted them with the asked one.
    distractor_kept: float | None = None
    #: The share of the evidence's pieces (each needle, each statement of a variable-tracking
    #: chain, qa_1's paragraph, each of qa_2's supporting sentences, in rows before 2026-12-07 each of
    #: its example's ten paragraphs: Sample.spans) kept whole, every token of the piece
    #: (:func:`harness.diagnostics.pieces_whole`); None where ``needle_kept`` is, and in rows
    #: before 2026-12-06.
    needle_whole: float | None = None
    #: The share of the prompt's tokens after its context (the question, the chat template's
    #: closing, the answer prefix: :func:`harness.diagnostics.question_kept`) the method kept; None
    #: where ``needle_kept`` is, in a conversation's turns, without a question, and in older rows.
    question_kept: float | None = None
    #: Which prompt tokens the base prefilled (:func:`harness.diagnostics.kept_hash`: SHA-256, 16
    #: hex, of the kept indices; a conversation turn's: those the base holds); None where no token
    #: maps back to the prompt (a rewritten text, a KV press) and in rows before 2026-12-05.
    kept_hash: str | None = None
    #: ``make lm-eval``: whether the prompt was cut to its last tokens to fit the window with
    #: the output budget (as lm-eval's own HF model does), and the most prompts planned
    #: together with this document's (lm-eval ``batch_size``; a method that plans a batch in
    #: one call, SpecPrefill's one speculator forward, gives each document an equal share of
    #: its seconds: ``speculator_s``, and so ``method_s`` and ``ttft_s``, are that share, not
    #: the document's own). None elsewhere and in older rows.
    truncated: bool | None = None
    plan_batch_size: int | None = None
    #: The machine's load while the sample (or turn) ran, plan to last decoded token
    #: (harness.timing.machine_load, as latency rows record it): the share of this process's
    #: CPUs busy with other work, the 1-minute load average, the CPUs, their clock. None in
    #: rows before 2026-12-06 and where /proc is not readable.
    foreign_cpu: float | None = None
    loadavg_1m: float | None = None
    cpus: int | None = None
    cpu_mhz: float | None = None


@dataclass(frozen=True, kw_only=True)
class LatencyRecord(RunRecord):
    """One method on one batch of one grid point, one iteration: TTFT and its parts.

    ``prompt_tokens``/``kept_tokens`` are means over the batch. ``flops_*`` and
    ``ideal_speedup`` come from :mod:`specprefill.flops` (NaN where a method rewrote the
    text, so no FLOPs model of its base prefill exists)."""

    batch: int
    length: int
    iteration: int
    warmup: bool
    prompt_source: str  # random | benchmark:<name>/<task>
    prompt_tokens: float | None
    kept_tokens: float | None
    kept_fraction: float | None
    ttft_s: float | None
    method_s: float | None
    speculator_s: float | None
    selection_s: float | None
    method_timings: str | None
    base_prefill_s: float | None
    flops_full: float | None
    flops_method: float | None
    ideal_speedup: float | None
    prefix_cache: bool
    #: The KV cache one prompt leaves after the prefill (a KV press's eviction included; a
    #: left-padded batch counts its padding); None where the backend cannot measure it (vLLM).
    kv_tokens: int | None = None
    kv_bytes: int | None = None
    #: ``decode_tokens`` greedy tokens decoded after the prefill (config ``decode_tokens``) and the
    #: seconds they took, outside TTFT; None when the run times the prefill only.
    decode_tokens: int | None = None
    decode_s: float | None = None
    #: The method's place among the methods timed in this iteration (0: first), rotated from
    #: one iteration to the next (harness.jobs.latency.iteration_order); None in rows
    #: written before the order-balanced protocol (the reference always first).
    order: int | None = None
    #: The machine's load while the row was timed (harness.timing.machine_load): the share of
    #: this process's CPUs busy with other work, the 1-minute load average, the CPUs, their clock.
    foreign_cpu: float | None = None
    loadavg_1m: float | None = None
    cpus: int | None = None
    cpu_mhz: float | None = None
    #: FLOPs of the method's own model calls through the backend (the speculator's, for
    #: SpecPrefill), part of ``flops_method``; and, where the speculator runs on another
    #: engine than the base (vLLM), its measured rate at this grid point (FLOP/s, a
    #: calibration pass: harness.jobs.latency.speculator_rate), for the ideal per engine.
    flops_speculator: float | None = None
    speculator_flop_rate: float | None = None
    #: The batch's joules over the TTFT window and over the decode after it, from the
    #: hardware's counter (harness.energy: NVML on NVIDIA GPUs, RAPL on CPUs that expose it),
    #: and what was read; None with ``energy_source`` "not measurable here: <why>" elsewhere.
    energy_j: float | None = None
    decode_energy_j: float | None = None
    energy_source: str | None = None


@dataclass(frozen=True, kw_only=True)
class QPSRecord(RunRecord):
    """One served request at one request rate, with the rate's verdicts. ``status`` is
    the request's outcome (a failed request is a measurement, not a lost row)."""

    benchmark: str
    benchmark_version: str
    benchmark_options: str
    metrics_version: str
    benchmark_notes: str | None = None  # as EvalRecord's
    task: str
    category: str | None
    length: int
    sample_id: int
    arrival: str
    rate: float
    request: int
    prompt_tokens: int
    kept_tokens: int | None  # None where the front logged nothing for the request
    kept_source: str  # front (the front's log) | prompt (served whole, no front) | missing
    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    output_tokens: int | None
    timed_out: bool
    prediction: str | None
    references: list[str]
    score: float | None
    front_queue_s: float | None
    speculator_s: float | None
    selection_s: float | None
    front_plan_s: float | None
    front_batch_size: int | None  # requests the front planned together with this one
    start_time: float | None
    pass_timeout_rule: bool
    pass_ttft_slo: bool
    passed: bool
    request_throughput: float | None
    duration_s: float | None
    prefix_cache: bool
    #: The serving settings that decide the rate's verdicts (``qps.<setting>``,
    #: harness.analysis.serving.SETTINGS: ``warmup_requests`` is ``qps.warmups``,
    #: ``arrival_seed`` ``qps.seed``) and the planning front's (JSON; None without a front).
    #: None in rows written before they were recorded.
    timeout_s: float | None = None
    max_timeouts: int | None = None
    ttft_p90_slo_s: float | None = None
    warmup_requests: int | None = None
    arrival_seed: int | None = None
    front_options: str | None = None


#: Options that set a method's budget in tokens instead of its fraction ``keep_rate``: the
#: harness's ``keep_tokens`` (every budgeted method), and SpecPC's / SpecKV's own
#: ``max_capacity_prompt`` (the authors' budget; the two together are refused).
TOKEN_BUDGETS = ("keep_tokens", "max_capacity_prompt")


def token_budget(options: Mapping[str, Any]) -> Any:
    """The budget in tokens a method's options set in place of ``keep_rate`` (None: none, the
    budget is the fraction): :data:`TOKEN_BUDGETS` of the method, or of a composed method's
    first part (``first_options``: the part ``keep_rate`` is the budget of). With one, the
    run's keep fraction is 1 (harness.config.method_spec: a ``keep`` sweep beside it is one
    run), rows record it as ``keep_tokens`` with no ``keep_rate``, and labels name it."""
    first = options.get("first_options")
    for opts in (options, first if isinstance(first, Mapping) else {}):
        for key in TOKEN_BUDGETS:
            if opts.get(key) is not None:
                return opts[key]
    return None


def method_columns(method: Any, reference: str) -> dict[str, Any]:
    """The method fields of a row: name, scope, every option (JSON; the budget, which every
    budgeted method has, in its own column too: ``keep_rate``, or ``keep_tokens`` where a budget
    in tokens replaces it, :func:`token_budget`), and the reference method ratios are taken
    against."""
    opts = method.options()
    tokens = token_budget(opts)
    return {
        "method": method.name,
        "scope": method.scope,
        "method_options": json.dumps(opts, sort_keys=True),
        "reference_method": reference,
        "keep_rate": opts.get("keep_rate") if tokens is None else None,
        "keep_tokens": tokens,
    }


RECORDS: dict[str, type[RunRecord]] = {"eval": EvalRecord, "latency": LatencyRecord, "qps": QPSRecord}


def record(kind: str, **values: Any) -> RunRecord:
    """A record of ``kind`` from keyword values; fields not given are None."""
    cls = RECORDS[kind]
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{kind} record has no field(s) {unknown}")
    return cls(**{**dict.fromkeys(names), **values, "kind": kind})


class RunStore:
    """One run folder: its config, its rows, its job error."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.parts = self.folder / "parts"

    def write_config(self, config: Mapping[str, Any]) -> None:
        """``config.yaml``: the resolved config of the run (JSON-able values)."""
        from omegaconf import OmegaConf

        self.folder.mkdir(parents=True, exist_ok=True)
        plain = json.loads(json.dumps(config, default=str))
        _atomic_write(self.folder / "config.yaml", OmegaConf.to_yaml(plain))

    def read(self) -> pd.DataFrame:
        """The folder's rows; a damaged row file is moved aside (its units run again)."""
        return read_rows([self.folder], quarantine=True)

    def remove_orphans(self) -> list[Path]:
        """Remove the temporary files a killed writer left here: only the store's own
        temporary names (:data:`PART_TMP`, :data:`FOLDER_TMP`), and only those older than
        this process (a live writer's are newer). Returns what was removed."""
        found = [(self.parts, PART_TMP), (self.folder, FOLDER_TMP)]
        gone = []
        for where, pattern in found:
            if not where.is_dir():
                continue
            for p in where.iterdir():
                with contextlib.suppress(OSError):
                    if pattern.fullmatch(p.name) and p.is_file() and p.stat().st_mtime < STARTED:
                        p.unlink()
                        gone.append(p)
        return gone

    def done_units(self, ok_only: bool = True) -> set[str]:
        """Units with rows; with ``ok_only``, only units whose rows are all ``ok`` (a unit
        with a failed row is retried, whole, on resume). A resuming writer calls it: the
        orphans of a killed one are removed first."""
        self.remove_orphans()
        df = self.read()
        if df.empty:
            return set()
        if not ok_only:
            return {str(u) for u in df["unit"]}
        ok = df.groupby("unit")["status"].agg(lambda s: bool((s == "ok").all()))
        return {str(u) for u, good in ok.items() if good}

    def append(self, records: Sequence[RunRecord]) -> None:
        """Write ``records`` as one part file (all of them or none)."""
        if not records:
            return
        name = f"{records[0].timestamp:.6f}-{uuid.uuid4().hex[:8]}"
        tmp = self.parts / f".{name}.tmp"
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
            pd.DataFrame([asdict(r) for r in records]).to_parquet(tmp, index=False)
            os.replace(tmp, self.parts / f"{name}.parquet")
        except OSError as e:  # disk full, read-only, gone: nothing half-written stays behind
            with contextlib.suppress(OSError):  # `parts` itself may be what failed (a file there)
                tmp.unlink(missing_ok=True)
            raise StoreWriteError(
                f"cannot write rows to {self.parts} ({e.strerror or e}); the rows written before are kept "
                f"and the next run resumes after them"
            ) from e

    def compact(self) -> None:
        """Merge part files into ``rows.parquet`` (atomic), then remove them."""
        parts = sorted(self.parts.glob("*.parquet")) if self.parts.exists() else []
        if not parts:
            return
        df = self.read()
        tmp = self.folder / ".rows.parquet.tmp"
        try:
            df.to_parquet(tmp, index=False)
            os.replace(tmp, self.folder / "rows.parquet")
        except OSError as e:  # the parts stay: they hold every row, and the next run compacts them
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StoreWriteError(f"cannot compact {self.folder} ({e.strerror or e}); its part files are kept") from e
        for p in parts:
            p.unlink(missing_ok=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _files(folders: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for f in folders:
        f = Path(f)
        if (f / "rows.parquet").is_file():
            files.append(f / "rows.parquet")
        if (f / "parts").is_dir():
            files.extend(p for p in sorted((f / "parts").glob("*.parquet")) if p.is_file())
    return files


def check_layout(folder: Path, out: Path | None = None) -> None:
    """A run folder (and its place under ``out``) that the store can write: no file where a
    folder goes (the folder itself, a parent below ``out``, ``parts``), no folder where a
    file goes (``rows.parquet``, ``config.yaml``). A :class:`StoreLayoutError` naming the
    path, before anything runs."""
    folder = Path(folder)
    below = [folder, *folder.parents]
    if out is not None and folder.is_relative_to(Path(out)):
        below = below[: len(folder.relative_to(Path(out)).parts)]
    for p in reversed(below):
        if p.exists() and not p.is_dir():
            raise StoreLayoutError(
                f"{p} is a file where the run folder {folder} needs a folder; allowed: move that file away or delete it"
            )
    if (folder / "parts").exists() and not (folder / "parts").is_dir():
        raise StoreLayoutError(
            f"{folder / 'parts'} is a file where the run's part files go; allowed: move it away or delete it"
        )
    for name in ("rows.parquet", "config.yaml"):
        if (folder / name).exists() and not (folder / name).is_file():
            raise StoreLayoutError(
                f"{folder / name} is a folder where the run's {name} goes; allowed: move it away or delete it"
            )


#: Damaged files already named by this process (readers name each once).
_NAMED: set[tuple[str, float]] = set()


class DamagedRowFile(ValueError):
    """A row file that does not read as parquet, raised by a strict reader (the regression
    gate: a baseline missing rows must not pass as points in one folder only)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} is not a readable parquet file ({reason})")
        self.path, self.reason = path, reason


def _damaged(path: Path, error: BaseException, quarantine: bool, strict: bool = False) -> None:
    """One ``[store]`` line for a row file that cannot be read; the owning run moves it
    aside; a ``strict`` reader raises :class:`DamagedRowFile` instead."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".replace(" '<Buffer>'", "")
    if strict:
        raise DamagedRowFile(path, reason[:200]) from error
    if quarantine:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}")
        try:
            os.replace(path, aside)
        except OSError as e:
            raise StoreWriteError(
                f"{path} is not a readable parquet file ({reason[:200]}) and cannot be moved aside ({e.strerror or e}); "
                f"move it away or delete it"
            ) from e
        print(f"[store] {path}: not a readable parquet file ({reason[:200]}); moved aside to {aside.name}, "
              f"its units run again", file=sys.stderr)  # fmt: skip
        return
    with contextlib.suppress(OSError):
        mark = (str(path), path.stat().st_mtime)
        if mark in _NAMED:
            return
        _NAMED.add(mark)
    print(f"[store] {path}: not a readable parquet file ({reason[:200]}); skipped (the next run of its folder "
          f"moves it aside and runs its units again)", file=sys.stderr)  # fmt: skip


def _read_file(path: Path, quarantine: bool, strict: bool = False) -> pd.DataFrame | None:
    """One row file, or None when it is damaged (named, and moved aside with ``quarantine``;
    :class:`DamagedRowFile` when ``strict``)."""
    import pyarrow as pa

    try:
        return _upgrade(read_parquet(path))
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:  # pyarrow's errors on a damaged file vary
        _damaged(path, e, quarantine, strict)
        return None


def _upgrade(df: pd.DataFrame) -> pd.DataFrame:
    """Rows written before a column existed, read as they would be written today: eval
    rows had no ``kind``/``row_key``/``unit`` (their key was task and sample id) and
    were always compared against full prefill."""
    if "kind" not in df:
        df["kind"] = "eval"
    if "row_key" not in df:
        df["row_key"] = df["task"].astype(str) + "/" + df["sample_id"].astype(str)
    if "unit" not in df:
        df["unit"] = df["row_key"]
    if "reference_method" not in df:
        df["reference_method"] = "full"
    return df


def _read_frames(
    folders: list[Path], attempts: int = 5, quarantine: bool = False, strict: bool = False
) -> list[pd.DataFrame]:
    """Every row file of the folders, read while a run may be writing them: a run that
    compacts its parts between our listing and our reading has put their rows in
    ``rows.parquet`` before unlinking them, so a part gone missing means: list again. A
    damaged file is skipped with one line (moved aside with ``quarantine``)."""
    for attempt in range(attempts):
        try:
            frames = [_read_file(p, quarantine, strict) for p in _files(folders)]
            return [f for f in frames if f is not None]
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    return []


def read_rows(folders: Iterable[Path], quarantine: bool = False, strict: bool = False) -> pd.DataFrame:
    """All rows of the given run folders, newest row per (run, row key); safe to call
    while a run is writing them (a part compacted away while reading is read again from
    ``rows.parquet``). A damaged row file is skipped with one ``[store]`` line; with
    ``quarantine`` (the run that owns the folder) it is also moved aside; with ``strict``
    it raises :class:`DamagedRowFile`."""
    frames = _read_frames([Path(f) for f in folders], quarantine=quarantine, strict=strict)
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=[f.name for f in fields(RunRecord)])
    with warnings.catch_warnings():
        # Columns that are all None in some part files (e.g. needle_kept on cwe) are expected.
        warnings.simplefilter("ignore", FutureWarning)
        df = pd.concat(frames, ignore_index=True)
    df = df.sort_values("timestamp", kind="stable")
    return df.drop_duplicates(subset=["run_id", "row_key"], keep="last").reset_index(drop=True)


def run_folders(out: Path) -> list[Path]:
    """Every run folder under a results folder (those with a config.yaml)."""
    out = Path(out)
    return sorted(
        p.parent for p in out.rglob("config.yaml") if not any(x.startswith(".") for x in p.relative_to(out).parts)
    )


def read_results(out: Path, kind: str | None = None, strict: bool = False) -> pd.DataFrame:
    """Every row under a results folder, of every kind (a ``kind`` column: eval, latency,
    qps), or of one ``kind``; ``strict``: a damaged row file raises :class:`DamagedRowFile`
    instead of being skipped."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {list(KINDS)}")
    df = read_rows(run_folders(out), strict=strict)
    if kind is not None:
        df = df[df["kind"] == kind].reset_index(drop=True)
        own = {f.name for f in fields(RECORDS[kind])}
        # Columns only other kinds fill (all empty here) are dropped.
        df = df[[c for c in df.columns if c in own or df[c].notna().any()]]
    return df


def copy_run(src: Path, dest: Path, drop: Iterable[str] = ()) -> None:
    """Copy the run folder ``src`` to ``dest``: its ``config.yaml`` and its rows in one
    ``rows.parquet`` (the newest row per key, as read), without the columns ``drop``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "config.yaml", dest / "config.yaml")
    rows = read_rows([src])
    rows.drop(columns=[c for c in drop if c in rows]).to_parquet(dest / "rows.parquet", index=False)
