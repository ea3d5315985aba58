"""Cached artefacts verified before use.

Everything the harness builds once and reuses (the dequantized SmolLM2 weights and
tokenizer, random-weight replicas, generated RULER sets) gets a manifest when it is built:
each file's size, modification time and SHA-256. Before use, a file whose size and mtime
match its manifest, and whose hash this process already checked, passes at once; any other
file is hashed (so each cached file is hashed at least once per process, and again whenever
it changed). A missing manifest, a missing file, a size or hash mismatch: the artefact is
rebuilt, with one line on stderr saying what was wrong.

:func:`fingerprint` is the hash of a verified artefact (over its files' hashes), which rows
record as ``weights_hash``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
#: (path, size, mtime_ns) -> sha256 of files hashed by this process.
_HASHED: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _hash(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


def manifest_path(target: Path) -> Path:
    """A folder's manifest lies inside it; a single file's beside it (``<name>.MANIFEST.json``)."""
    return target / MANIFEST if target.is_dir() else target.with_name(f"{target.name}.{MANIFEST}")


def _files(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(target: Path) -> dict[str, Any]:
    """Record every file of ``target`` (a folder, or one file): size, mtime and SHA-256."""
    target = Path(target)
    base = target if target.is_dir() else target.parent
    entries = {}
    for f in _files(target):
        st = f.stat()
        entries[str(f.relative_to(base))] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _hash(f)}
    manifest = {"files": entries}
    out = manifest_path(target)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, out)
    return manifest


def problems(target: Path) -> list[str]:
    """What is wrong with ``target`` against its manifest (empty: it is intact)."""
    target = Path(target)
    if not target.exists():
        return [f"{target} is missing"]
    mpath = manifest_path(target)
    if not mpath.exists():
        return [f"{target} has no manifest ({mpath.name}): built before integrity checks, or its build was cut short"]
    try:
        entries = json.loads(mpath.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{mpath} is unreadable"]
    base = target if target.is_dir() else target.parent
    found = []
    for name, e in entries.items():
        f = base / name
        if not f.is_file():
            found.append(f"{f} is missing")
            continue
        st = f.stat()
        if st.st_size != e["size"]:
            found.append(f"{f} has {st.st_size} bytes, its manifest {e['size']}")
        elif _hash(f) != e["sha256"]:
            found.append(f"{f} does not match its manifest's SHA-256 (changed or corrupted)")
    if target.is_dir():
        extra = sorted(str(f.relative_to(base)) for f in _files(target) if str(f.relative_to(base)) not in entries)
        found += [f"{base / x} is not in the manifest" for x in extra]
    return found


def fingerprint(target: Path) -> str:
    """A short hash of a verified artefact: its files' names and SHA-256s."""
    entries = json.loads(manifest_path(Path(target)).read_text())["files"]
    payload = json.dumps({k: v["sha256"] for k, v in sorted(entries.items())}).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def ensure(target: Path, build: Callable[[], Any], what: str) -> Path:
    """``target`` verified, or (re)built by ``build`` when missing or not intact (one line on
    stderr saying why), then given a manifest and verified again."""
    target = Path(target)
    found = problems(target)
    if not found:
        return target
    if target.exists():
        print(f"[integrity] {what}: {found[0]}" + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
              + f"; rebuilding {target}", file=sys.stderr)  # fmt: skip
    build()
    write_manifest(target)
    left = problems(target)
    if left:
        raise RuntimeError(f"{what}: rebuilt {target} but it still fails its check: {left[0]}")
    return target
