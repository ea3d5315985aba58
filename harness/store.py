"""The results store: one parquet row per sample, append-only, resumable.

A run folder holds ``config.yaml`` (the resolved config) and its rows. Each finished
sample is written at once as its own small part file (written to a temporary name,
then renamed: a killed run leaves either the whole row or nothing). At the end of a
run the parts are compacted into ``rows.parquet``. Readers deduplicate by sample key,
keeping the newest row, so a crash between compaction and cleanup cannot duplicate
rows, and a retried failure replaces its failed row.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

KEY = ["task", "sample_id"]


@dataclass(frozen=True)
class RunRecord:
    """One row of the store. Times in seconds; scores on the benchmark's own scale."""

    run_id: str
    config_hash: str
    git_sha: str
    timestamp: float
    model: str
    model_weights: str
    dtype: str
    speculator: str | None
    backend: str
    method: str
    scope: str | None  # prompt | context | query_aware_context
    method_options: str  # JSON of every option of the method
    keep_rate: float | None
    lookahead: int | None
    pool_kernel: int | None
    chunk_size: int | None
    position_mode: str | None
    force_keep_first: int | None
    force_keep_last: int | None
    benchmark: str
    benchmark_version: str
    benchmark_options: str  # JSON
    metrics_version: str
    task: str
    category: str | None
    bucket: str | None
    length: int
    sample_id: int
    status: str  # "ok" | "failed" | "unsupported"
    error: str | None
    prompt_tokens: int | None
    kept_tokens: int | None
    kept_fraction: float | None
    prediction: str | None
    references: list[str]
    score: float | None
    needle_kept: float | None
    ttft_s: float | None
    method_s: float | None
    speculator_s: float | None
    selection_s: float | None
    method_timings: str | None  # JSON: every part of the method's own cost (retriever_s, filter_s, ...)
    base_prefill_s: float | None
    decode_s: float | None
    output_tokens: int | None
    versions: str  # JSON
    hardware: str


class RunStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.parts = self.folder / "parts"

    def read(self) -> pd.DataFrame:
        return read_rows([self.folder])

    def done_keys(self) -> set[tuple[str, int]]:
        """Samples with an ``ok`` row; failed ones are retried on resume."""
        df = self.read()
        if df.empty:
            return set()
        ok = df[df["status"] == "ok"]
        return {(str(t), int(i)) for t, i in zip(ok["task"], ok["sample_id"], strict=True)}

    def append(self, record: RunRecord) -> None:
        self.parts.mkdir(parents=True, exist_ok=True)
        name = f"{record.timestamp:.6f}-{uuid.uuid4().hex[:8]}"
        tmp = self.parts / f".{name}.tmp"
        pd.DataFrame([asdict(record)]).to_parquet(tmp, index=False)
        os.replace(tmp, self.parts / f"{name}.parquet")

    def compact(self) -> None:
        """Merge part files into ``rows.parquet`` (atomic), then remove them."""
        parts = sorted(self.parts.glob("*.parquet")) if self.parts.exists() else []
        if not parts:
            return
        df = self.read()
        tmp = self.folder / ".rows.parquet.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.folder / "rows.parquet")
        for p in parts:
            p.unlink(missing_ok=True)


def _files(folders: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for f in folders:
        f = Path(f)
        if (f / "rows.parquet").exists():
            files.append(f / "rows.parquet")
        if (f / "parts").exists():
            files.extend(sorted((f / "parts").glob("*.parquet")))
    return files


def read_rows(folders: Iterable[Path]) -> pd.DataFrame:
    """All rows of the given run folders, newest row per (run, task, sample)."""
    frames = [pd.read_parquet(p) for p in _files(folders)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(RunRecord.__dataclass_fields__))
    with warnings.catch_warnings():
        # Columns that are all None in some part files (e.g. needle_kept on cwe) are expected.
        warnings.simplefilter("ignore", FutureWarning)
        df = pd.concat(frames, ignore_index=True)
    df = df.sort_values("timestamp", kind="stable")
    return df.drop_duplicates(subset=["run_id", *KEY], keep="last").reset_index(drop=True)


def run_folders(out: Path) -> list[Path]:
    """Every run folder under a results folder (those with a config.yaml)."""
    out = Path(out)
    return sorted(
        p.parent for p in out.rglob("config.yaml") if not any(x.startswith(".") for x in p.relative_to(out).parts)
    )


def read_results(out: Path) -> pd.DataFrame:
    return read_rows(run_folders(out))
