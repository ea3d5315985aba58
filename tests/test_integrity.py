"""Cached artefacts are verified before use: truncated or garbled (even at the same size)
files are detected and rebuilt, for the generic check and for each kind of cache (RULER
sets, the converted SmolLM2 checkpoint, replicas)."""

from __future__ import annotations

import os
import shutil

import pytest

from harness import integrity
from harness.benchmarks import ruler
from harness.integrity import ensure, fingerprint, problems, write_manifest
from harness.models.catalog import model_config


def _new_process():
    integrity._HASHED.clear()  # what a fresh process has


def _garble_same_size(path, keep_mtime=False):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def artefact(tmp_path):
    d = tmp_path / "art"
    d.mkdir()
    (d / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (d / "config.json").write_text('{"layers": 2}')
    write_manifest(d)
    return d


def test_an_intact_artefact_passes_and_has_a_stable_fingerprint(artefact):
    assert problems(artefact) == []
    fp = fingerprint(artefact)
    _new_process()
    assert problems(artefact) == [] and fingerprint(artefact) == fp and len(fp) == 16


DAMAGE_IDS = ["truncated", "garbled", "garbled-same-mtime-new-process", "file-missing", "extra-file", "no-manifest",
              "manifest-garbled"]  # fmt: skip


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: (d / "weights.bin").write_bytes(b"\0" * 100), "has 100 bytes, its manifest 16384"),
        (lambda d: _garble_same_size(d / "weights.bin"), "does not match its manifest's SHA-256"),
        (lambda d: (_new_process(), _garble_same_size(d / "weights.bin", keep_mtime=True)), "SHA-256"),
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / "stray.bin").write_text("x"), "stray.bin is not in the manifest"),
        (lambda d: (d / integrity.MANIFEST).unlink(), "has no manifest"),
        (lambda d: (d / integrity.MANIFEST).write_text("{not json"), "unreadable"),
    ],
    ids=DAMAGE_IDS,
)
def test_damage_is_detected(artefact, damage, match):
    damage(artefact)
    found = problems(artefact)
    assert found and match in " ".join(found)


def test_ensure_rebuilds_once_and_says_why(artefact, capsys):
    built = []

    def build():
        built.append(1)
        (artefact / "weights.bin").write_bytes(bytes(range(256)) * 64)

    assert ensure(artefact, build, "test weights") == artefact and built == []  # intact: used as is
    (artefact / "weights.bin").write_bytes(b"short")
    ensure(artefact, build, "test weights")
    assert built == [1] and problems(artefact) == []
    err = capsys.readouterr().err
    assert "[integrity] test weights:" in err and "has 5 bytes" in err and "rebuilding" in err


def test_a_build_that_leaves_a_bad_artefact_is_an_error(tmp_path):
    target = tmp_path / "never"

    def build():
        target.mkdir()

    ensure(target, build, "empty")  # an empty folder with a manifest is intact
    with pytest.raises(RuntimeError, match="still fails its check"):
        ensure(tmp_path / "nothing", lambda: None, "nothing built")


def test_a_damaged_ruler_cache_is_regenerated(tmp_path, monkeypatch, smollm2_info, capsys):
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    calls = []
    real = ruler.generate
    monkeypatch.setattr(ruler.cache, "generate", lambda *a, **k: calls.append(a[:3]) or real(*a, **k))
    first = ruler.cached_samples("niah_single_1", 1024, 2, smollm2_info)
    (path,) = (tmp_path / "ruler").glob("*.parquet")
    assert problems(path) == [] and len(calls) == 1
    assert ruler.cached_samples("niah_single_1", 1024, 2, smollm2_info) == first and len(calls) == 1
    # a valid parquet with other contents (same size or not) is caught by its hash
    _garble_same_size(path)
    assert ruler.cached_samples("niah_single_1", 1024, 2, smollm2_info) == first and len(calls) == 2
    assert "[integrity] RULER cache" in capsys.readouterr().err
    path.write_bytes(path.read_bytes()[:100])  # truncated: not read by pyarrow, regenerated
    assert ruler.cached_samples("niah_single_1", 1024, 2, smollm2_info) == first and len(calls) == 3


def test_a_damaged_smollm2_checkpoint_is_rebuilt(tmp_path, monkeypatch):
    from harness.models import loading as models

    real_dir = models.smollm2_dir()  # the verified checkpoint of this machine
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    rebuilt = []

    def convert(out):  # stands in for the GGUF conversion (tens of seconds): the same files
        rebuilt.append(out)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(real_dir, out, ignore=shutil.ignore_patterns(integrity.MANIFEST))

    monkeypatch.setattr(models, "_convert_smollm2", convert)
    out = models.smollm2_dir()
    assert len(rebuilt) == 1 and problems(out) == []
    assert models.smollm2_dir() == out and len(rebuilt) == 1  # verified, not rebuilt
    weights = out / "model.safetensors"
    with open(weights, "r+b") as f:  # truncated
        f.truncate(weights.stat().st_size // 2)
    models.smollm2_dir()
    assert len(rebuilt) == 2 and problems(out) == []
    _garble_same_size(out / "tokenizer.json", keep_mtime=True)
    _new_process()
    models.smollm2_dir()
    assert len(rebuilt) == 3
    assert models.weights_hash(model_config("smollm2-135m")) == fingerprint(out)
