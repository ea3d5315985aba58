"""Generated samples cached as parquet, keyed by everything that shapes them (task, length,
prompt format, tokenizer, generator version and notes, sentence splitter)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from harness.benchmarks.base import TokenizerInfo
from harness.benchmarks.ruler.generators import task_args
from harness.benchmarks.ruler.length import generate
from harness.benchmarks.ruler.tasks import GENERATOR_NOTES, SEED, TASK_TEMPLATES, TASKS, VERSION
from harness.benchmarks.text import sentence_splitter_name
from harness.integrity import problems, write_manifest
from harness.models.catalog import cache_root
from harness.parquet import read_parquet
from harness.types import PromptFormat, Sample

#: The files whose every edit regenerates cached sets (a sample's fields, its answer budget included,
#: come from them).
SOURCES = ("cache.py", "generators.py", "length.py", "tasks.py", "data.py")


def cache_key(task: str, length: int, fmt: PromptFormat, tokenizer_id: str, args: dict[str, Any] | None = None) -> str:
    """Everything that shapes a generated set, hashed (``args``: settings replaced, as
    :func:`generate` takes them)."""
    payload = json.dumps(
        {
            "version": VERSION,
            "task": task,
            "args": task_args(task, args),
            "templates": TASK_TEMPLATES[TASKS[task][0]],
            "length": length,
            "seed": SEED,
            "format": [fmt.name, fmt.head, fmt.tail],
            "tokenizer": tokenizer_id,
            "splitter": sentence_splitter_name() if TASKS[task][1].get("type_haystack") == "essay" else None,
            "notes": GENERATOR_NOTES,
            # Any edit to the generator (this file, the task generators, the length search, the
            # task table, the data readers) invalidates cached sets (results carry VERSION).
            "source": hashlib.sha256(b"".join((Path(__file__).parent / f).read_bytes() for f in SOURCES)).hexdigest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _cache_dir() -> Path:

    return cache_root() / "ruler"


def cached_samples(
    task: str, length: int, limit: int, tok: TokenizerInfo, args: dict[str, Any] | None = None
) -> list[Sample]:
    """Samples from the parquet cache, generating (and saving) them when missing or too few.

    The sample stream is sequential, so a file holding M samples is a prefix of any
    longer set: a larger ``limit`` regenerates, a smaller one reads the prefix."""
    import pandas as pd

    path = _cache_dir() / f"{task}-{length}-{cache_key(task, length, tok.fmt, tok.id, args)}.parquet"
    if path.exists():
        bad = problems(path)  # a truncated or edited file is regenerated, not read
        if bad:
            print(f"[integrity] RULER cache: {bad[0]}; regenerating {path.name}", file=sys.stderr)
        else:
            df = read_parquet(path)
            if len(df) >= limit:
                return [_row_to_sample(r) for r in df.head(limit).to_dict("records")]
    samples = generate(task, length, limit, tok.fmt, tok.count, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pd.DataFrame([_sample_to_row(s) for s in samples]).to_parquet(tmp, index=False)
    tmp.replace(path)
    write_manifest(path)
    return samples


def _sample_to_row(s: Sample) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["references"] = list(s.references)
    d["spans"] = [list(x) for x in s.spans]
    d["distractor_spans"] = [list(x) for x in s.distractor_spans]
    d["stop"], d["all_classes"] = list(s.stop), list(s.all_classes)
    return d


def _row_to_sample(r: dict[str, Any]) -> Sample:
    r = dict(r)
    r["references"] = tuple(str(x) for x in r["references"])
    r["spans"] = tuple((int(a), int(b)) for a, b in r["spans"])
    r["distractor_spans"] = tuple((int(a), int(b)) for a, b in r.get("distractor_spans", ()))
    r["stop"] = tuple(str(x) for x in r["stop"])
    r["all_classes"] = tuple(str(x) for x in r["all_classes"])
    r["add_special_tokens"] = bool(r["add_special_tokens"])
    r["label_json"] = str(r.get("label_json") or "")
    r["sample_id"] = int(r["sample_id"])
    r["length"] = int(r["length"])
    r["max_new_tokens"] = int(r["max_new_tokens"])
    return Sample(**r)
