"""Reading a parquet file through Arrow's own local file system, never a Python file object.

``pandas.read_parquet(path)`` opens a local path as a Python file object and hands it to
Arrow, whose reader threads then call back into Python through it. With pyarrow 22 a process
that did so aborted at exit, after all its work was done ("terminate called without an active
exception", SIGABRT, exit 134), in 7 to 17 of each 30 runs on a 2-core machine with an eval
running beside it (2026-12-06, an AMD EPYC); apache/arrow#34314 is this report. The same read
through ``pyarrow.fs.LocalFileSystem`` never aborted there: 0 of 60, 30 of them run in turn
with the default read, which aborted in 12 of its 30. Every parquet read of the project, its
tests included, goes through :func:`read_parquet` (``tests/test_teardown.py`` finds any that
does not). Writing has no such path (``DataFrame.to_parquet`` to a local path: 0 of 30).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd


def read_parquet(path: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """``pandas.read_parquet(path, columns=...)``, the same frame, read by Arrow's own file
    system (the module's note); a missing file raises FileNotFoundError as pandas does."""
    import pyarrow.fs

    cols = list(columns) if columns is not None else None
    return pd.read_parquet(os.path.abspath(path), columns=cols, filesystem=pyarrow.fs.LocalFileSystem())
