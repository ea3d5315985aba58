"""Loading benchmark rows from a local folder or the hub, and splitting truncated prompts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException

from harness.hub import hub_offline, hub_unreachable
from harness.parquet import read_parquet


@dataclass(frozen=True)
class Source:
    """Where one task's rows come from: ``data_dir`` if set, else the hub.

    ``config`` names a hub configuration (LongBench: one per dataset) and ``split`` the
    split (InfiniteBench: one per task); ``local_name`` is the file stem in ``data_dir``."""

    hub_id: str
    config: str | None
    split: str
    revision: str | None
    data_dir: str | None
    local_name: str

    def describe(self) -> str:
        where = f"config {self.config!r}" if self.config else f"split {self.split!r}"
        return f"{self.hub_id} ({where}, revision {self.revision or 'unpinned'})"


class DataFileError(CompactHydraException, ValueError):
    """A user's data file (``data_dir``) that cannot be read: named, with the line, in one line
    (it is not ours to rebuild)."""


class MissingDataError(CompactHydraException, FileNotFoundError):
    """A task's file is not in ``data_dir``: one line naming the file and the folder."""


class DataSourceError(CompactHydraException, RuntimeError):
    """A benchmark's hub copy cannot be loaded (no network, ``HF_HUB_OFFLINE``, not in the
    cache): one line naming the dataset and how to point at a local copy."""


def read_local(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` rows of a ``.jsonl`` or ``.parquet`` file; a truncated or damaged
    file is a :class:`DataFileError` naming it (and the line, for JSON lines)."""
    how = "it cannot be rebuilt here: replace it with the official file"
    if path.suffix == ".parquet":
        try:
            return [dict(r) for r in read_parquet(path).head(limit).to_dict("records")]
        except Exception as e:  # pyarrow's errors on a damaged file are several types
            raise DataFileError(f"{path}: not a readable parquet file ({type(e).__name__}); {how}") from e
    rows: list[dict[str, Any]] = []
    n = 0
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):  # noqa: B007 (n names the line in errors)
                if line.strip():
                    rows.append(json.loads(line))
                    if len(rows) >= limit:
                        break
    except json.JSONDecodeError as e:
        raise DataFileError(f"{path}:{n}: not a JSON line ({e.msg}); truncated or damaged? {how}") from e
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not UTF-8 text after line {n}; damaged? {how}") from e
    return rows


def local_file(src: Source) -> Path | None:
    """The task's file in ``data_dir`` (``<local_name>.jsonl``, else ``.parquet``), or None."""
    assert src.data_dir
    return next(
        (p for ext in ("jsonl", "parquet") if (p := Path(src.data_dir) / f"{src.local_name}.{ext}").exists()), None
    )


def check_local(sources: list[Source]) -> None:
    """Every source with a ``data_dir`` has its file there, else one :class:`MissingDataError`
    naming the files missing and the folder: checked before any work (a dry run too)."""
    missing = [s for s in sources if s.data_dir and local_file(s) is None]
    if missing:
        names = ", ".join(f"{s.local_name}.jsonl / .parquet" for s in missing)
        raise MissingDataError(
            f"no {names} in data_dir={missing[0].data_dir} (for {missing[0].describe()}"
            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); put the official files there, or drop "
            f"data_dir= (benchmark.options.data_dir) to load from the hub"
        )


def load_rows(src: Source, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` rows, from the local folder if one is set, else from the hub;
    either failure names the dataset, its revision and how to point at a local copy."""
    if src.data_dir:
        path = local_file(src)
        if path is None:
            check_local([src])  # raises, naming the file and the folder
        assert path is not None
        return read_local(path, limit)

    local = (
        f"point data_dir=<folder> (benchmark.options.data_dir) at a local copy holding {src.local_name}.jsonl "
        f"(the official files) or {src.local_name}.parquet"
    )
    why = None if hub_offline() else hub_unreachable()  # offline: the datasets cache answers at once
    if why:  # not minutes of datasets' retries against a hub that cannot answer
        raise DataSourceError(
            f"cannot load {src.describe()}: {why}; {local}, or set HF_HUB_OFFLINE=1 to read it from the datasets cache"
        )
    try:
        from datasets import load_dataset

        ds = load_dataset(src.hub_id, src.config, split=src.split, revision=src.revision)
    except Exception as e:
        offline = "HF_HUB_OFFLINE is set and it is not in the datasets cache; " if hub_offline() else ""
        raise DataSourceError(
            f"cannot load {src.describe()} from the hub ({offline}{type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}); {local}"
        ) from e
    return [dict(r) for r in ds.select(range(min(limit, len(ds))))]


def split_parts(text: str, head: str, tail: str) -> tuple[str, str, str]:
    """(instruction, context, question) of a possibly truncated ``head + context + tail``.

    When truncation reached into the instruction or the question, the whole text is
    returned as context (methods that compress only the context then see all of it)."""
    if text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail):
        return head, text[len(head) : len(text) - len(tail)], tail
    return "", text, ""
