"""Typed configs: the schemas of the three entry points, and turning Hydra's dicts into records.

Each entry point (``harness.run``, ``harness.latency``, ``harness.serving.qps``) has a
schema dataclass registered in Hydra's ConfigStore as the first entry of its defaults
list, so values are type-checked when Hydra composes them (``limit=abc`` is refused).
Hydra's ``+key=value`` appends even to a typed config, so :func:`check_keys` also
rejects every key no schema or record declares, at every level (top level, model,
method, benchmark and its options): an unknown key can never silently change a run's
hash. Nested groups are validated by their own dataclasses (:class:`ModelConfig`,
methods, :class:`BenchmarkConfig` and each benchmark's options).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness.benchmarks.base import BenchmarkConfig
from harness.models import ModelConfig

CONF = Path(__file__).resolve().parents[1] / "conf"
BACKENDS = ("transformers", "vllm")


@dataclass
class CommonSchema:
    """Keys every entry point shares, spelled the same way everywhere."""

    model: Any = MISSING
    method: Any = MISSING
    keep: float = 0.3  # fraction of prompt tokens the base model prefills, in (0, 1]
    lookahead: int = 1  # SpecPrefill look-ahead steps L
    out: str = "results/default"
    backend: str = "transformers"
    reference: str = "full"  # the method ratios are taken against (a conf/method name)
    dry_run: bool = False


@dataclass
class EvalSchema(CommonSchema):
    """``conf/config.yaml`` (``harness.run``, ``make eval``)."""

    benchmark: Any = MISSING
    length: int = 4096
    limit: int = 10
    max_new: int | None = None
    tasks: Any = None
    data_dir: str | None = None


@dataclass
class LatencySchema(CommonSchema):
    """``conf/latency.yaml`` (``harness.latency``, ``make latency``)."""

    grid: Any = field(default_factory=lambda: [[2, 4096], [1, 8192]])
    warmup: int = 1
    iters: int = 3
    seed: int = 0
    prompts: str = "auto"
    prompt_task: str = "qa_1"


@dataclass
class QPSSchema(EvalSchema):
    """``conf/qps.yaml`` (``harness.serving.qps``, ``make qps``)."""

    rates: Any = None
    arrival: str = "poisson"
    qps: Any = MISSING


SCHEMAS: dict[str, type] = {"eval_schema": EvalSchema, "latency_schema": LatencySchema, "qps_schema": QPSSchema}


def register_schemas() -> None:
    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)
    # The sweeper that validates every sweep point before the first one runs.
    cs.store(
        group="hydra/sweeper",
        name="validating",
        node={
            "_target_": "hydra_plugins.specprefill_sweeper.sweeper.ValidatingSweeper",
            "max_batch_size": None,
            "params": None,
            "validate": None,
        },
    )


register_schemas()


def _unknown(given: set[str], allowed: set[str], where: str) -> None:
    extra = sorted(given - allowed)
    if extra:
        hints = [difflib.get_close_matches(k, sorted(allowed), n=1) for k in extra]
        hint = "".join(f"; did you mean {h[0]!r} for {k!r}?" for k, h in zip(extra, hints, strict=True) if h)
        raise ValueError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}{hint}")


def check_keys(c: dict[str, Any], schema: type) -> None:
    """Reject keys no schema declares: top level here; model, method and benchmark by their
    own records when they are built."""
    _unknown(set(c), {f.name for f in dataclasses.fields(schema)} | {"hydra"}, "config")


def dataclass_from(cls: type, d: dict[str, Any], what: str) -> Any:
    """``cls(**d)``, refusing keys ``cls`` does not have (naming them and the allowed ones)."""
    _unknown(set(d), {f.name for f in dataclasses.fields(cls)}, what)
    return cls(**d)


def benchmark_config(bench: dict[str, Any]) -> BenchmarkConfig:
    """A ``conf/benchmark`` entry as composed by Hydra: ``tasks`` null -> the benchmark's
    ``default_tasks``; ``"all"`` -> every task; ``"a,b"`` or a list -> those tasks
    (``[all]`` means every task too)."""
    bench = dict(bench)
    default_tasks = bench.pop("default_tasks", None)
    tasks = bench.get("tasks") if bench.get("tasks") is not None else default_tasks
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    tasks = [str(t) for t in (tasks or [])]
    if tasks == ["all"]:
        tasks = []
    elif not tasks and bench.get("tasks") is not None:
        raise ValueError("tasks is empty; give task names, or tasks=all for every task")
    bench["tasks"] = tuple(tasks)
    options = dict(bench.get("options") or {})
    if options.get("data_dir"):
        options["data_dir"] = str(Path(str(options["data_dir"])).expanduser().resolve())
    bench["options"] = options
    return dataclass_from(BenchmarkConfig, bench, "benchmark config")


def config_hash(identity: Any) -> str:
    """The 12-hex-digit run id of a JSON-able identity (sorted keys)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: Model-config fields added after results were first stored, with their defaults. A field
#: at its default is left out of the run identity, so adding a field does not orphan the
#: run folders of every earlier sweep (they would no longer resume).
LATER_MODEL_FIELDS: dict[str, Any] = {
    "pipeline_parallel": 1,
    "speculator_shape": {},
    "nodes": 1,
    "architecture": None,
    "speculator_architecture": None,
    "speculator_chunk": None,
}
#: Model-config fields that never change results: the default backend (the backend that
#: ran is part of the identity on its own) and the GPU size a dry run plans with.
NOT_IDENTITY = ("backend", "gpu_memory_gib")


def model_identity(model: ModelConfig) -> dict[str, Any]:
    d = {k: v for k, v in dataclasses.asdict(model).items() if k not in NOT_IDENTITY}
    return {k: v for k, v in d.items() if not (k in LATER_MODEL_FIELDS and v == LATER_MODEL_FIELDS[k])}


def container(cfg: DictConfig) -> dict[str, Any]:
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    return {str(k): v for k, v in c.items()}


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {list(BACKENDS)}")


def model_from(c: dict[str, Any]) -> ModelConfig:
    return dataclass_from(ModelConfig, dict(c["model"]), "model config")


def method_spec(method: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, options) of a composed ``conf/method`` entry."""
    opts = dict(method)
    return str(opts.pop("name")), opts


def method_conf(name: str, keep: float, lookahead: int) -> tuple[str, dict[str, Any]]:
    """(name, options) of ``conf/method/<name>.yaml`` with the ``keep`` and ``lookahead``
    shorthands filled in: for a second method in one job (the reference of a latency run)."""
    path = CONF / "method" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        close = difflib.get_close_matches(name, known, n=1)
        raise ValueError(
            f"unknown method config {name!r}; allowed: {known}" + (f"; did you mean {close[0]!r}?" if close else "")
        )
    cfg = OmegaConf.merge({"keep": keep, "lookahead": lookahead}, {"m": OmegaConf.load(path)})
    assert isinstance(cfg, DictConfig)
    return method_spec(container(cfg)["m"])
