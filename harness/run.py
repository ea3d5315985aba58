"""The Hydra entry point: ``python -m harness.run model=... method=... keep=...``.

One job = one (model, method options, benchmark, length). Comma lists sweep
(``--multirun``); jobs that map to the same results (full prefill at several keep
rates) share a run folder and skip finished samples. Everything is validated before
any model loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

import baselines  # noqa: F401  (registers the baseline methods)
from harness import report
from harness.benchmarks.base import Benchmark, BenchmarkConfig, TokenizerInfo, build_benchmark
from harness.models import ModelConfig, check_runnable, load, load_tokenizer, resources, tokenizer_id
from harness.store import RunRecord, RunStore
from harness.types import PromptFormat, Sample
from specprefill.backends.transformers import TransformersBackend
from specprefill.plan import Method, Prompt, Unsupported, build_method

BACKENDS = ("transformers", "vllm")
SPEC_OPTIONS = (
    "keep_rate",
    "lookahead",
    "pool_kernel",
    "chunk_size",
    "position_mode",
    "force_keep_first",
    "force_keep_last",
)


def _dataclass_from(cls: type, d: dict[str, Any], what: str) -> Any:
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return cls(**d)


def benchmark_config(bench: dict[str, Any]) -> BenchmarkConfig:
    """A ``conf/benchmark`` entry as composed by Hydra: ``tasks`` null -> the benchmark's
    ``default_tasks``, ``"all"`` -> every task, ``"a,b"`` -> a list."""
    bench = dict(bench)
    default_tasks = bench.pop("default_tasks", None)
    tasks = bench.get("tasks") if bench.get("tasks") is not None else default_tasks
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t] if tasks != "all" else []
    bench["tasks"] = tuple(tasks or ())
    return _dataclass_from(BenchmarkConfig, bench, "benchmark config")


def config_hash(identity: Any) -> str:
    """The 12-hex-digit run id of a JSON-able identity (sorted keys)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunConfig:
    """The validated form of the Hydra config for one job."""

    model: ModelConfig
    method_name: str
    method_options: dict[str, Any]
    benchmark: BenchmarkConfig
    backend: str
    out: Path

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> RunConfig:
        c = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(c, dict)
        model = _dataclass_from(ModelConfig, dict(c["model"]), "model config")
        method = dict(c["method"])
        name = str(method.pop("name"))
        bcfg = benchmark_config(dict(c["benchmark"]))
        backend = str(c.get("backend", "transformers"))
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}; allowed: {list(BACKENDS)}")
        return cls(
            model=model,
            method_name=name,
            method_options=method,
            benchmark=bcfg,
            backend=backend,
            out=Path(str(c["out"])),
        )


@dataclass(frozen=True)
class Job:
    """A validated, ready-to-run job (nothing loaded yet)."""

    cfg: RunConfig
    method: Method
    benchmark: Benchmark
    config_hash: str
    folder: Path


#: Model-config fields added after results were first stored, with their defaults. A field
#: at its default is left out of the run identity, so adding a field does not orphan the
#: run folders of every earlier sweep (they would no longer resume).
LATER_MODEL_FIELDS: dict[str, Any] = {"pipeline_parallel": 1, "speculator_shape": {}, "nodes": 1}


def model_identity(model: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(model)
    return {k: v for k, v in d.items() if not (k in LATER_MODEL_FIELDS and v == LATER_MODEL_FIELDS[k])}


def prepare(cfg: RunConfig) -> Job:
    """Validate everything that can be validated without loading a model."""
    method = build_method(cfg.method_name, cfg.method_options)
    if cfg.model.nodes > 1 and cfg.backend != "vllm":
        raise ValueError(
            f"model {cfg.model.name!r} spans {cfg.model.nodes} nodes: only backend=vllm runs across nodes (Ray)"
        )
    if cfg.backend == "vllm" and method.needs_speculator and str(cfg.model.speculator or "").startswith("self_layers"):
        raise ValueError(
            f"backend=vllm: model {cfg.model.name!r} has speculator={cfg.model.speculator!r}, a view of the "
            f"transformers base; with vLLM use a separate speculator (model.speculator=smollm2, random or hub:<id>)"
        )
    if method.needs_speculator and cfg.model.speculator is None:
        raise ValueError(
            f"method {cfg.method_name!r} needs a speculator, but model {cfg.model.name!r} has speculator: null"
        )
    benchmark = build_benchmark(cfg.benchmark)
    benchmark.check_model(cfg.model.max_context)
    identity = {
        "model": model_identity(cfg.model),
        "method": {"name": method.name, **method.options()},
        "benchmark": benchmark.options(),
        "backend": cfg.backend,
        "decoding": "greedy",
    }
    h = config_hash(identity)
    folder = cfg.out / cfg.model.name / f"{cfg.benchmark.name}-{cfg.benchmark.length}" / f"{method.name}-{h}"
    return Job(cfg=cfg, method=method, benchmark=benchmark, config_hash=h, folder=folder)


def git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("specprefill-bench", "torch", "transformers", "hydra-core", "pandas", "pyarrow", "tokenizers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "missing"
    return out


def hardware() -> str:
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


def needle_tokens(offsets: list[tuple[int, int]], spans: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Indices of tokens whose characters overlap any span. ``offsets``: per-token char spans."""
    idx = [i for i, (a, b) in enumerate(offsets) if b > a and any(a < e and s < b for s, e in spans)]
    return torch.tensor(idx, dtype=torch.int64)


def needle_kept(kept: torch.Tensor | None, needles: torch.Tensor) -> float | None:
    """Fraction of needle tokens the method kept (None when there is nothing to track)."""
    if needles.numel() == 0:
        return None
    if kept is None:
        return None
    return float(torch.isin(needles, kept).float().mean())


def make_backend(model: ModelConfig, backend: str, needs_speculator: bool = True) -> Any:
    """The backend a job runs on: transformers (base and speculator in this process), or
    vLLM (base on a vLLM engine, speculator on transformers, loaded only if needed)."""
    if backend == "transformers":
        lm = load(model)
        return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    if backend != "vllm":
        raise ValueError(f"backend={backend!r}; allowed: {list(BACKENDS)}")
    from harness.models import vllm_engine_args
    from specprefill.backends.vllm import VLLMBackend

    if not needs_speculator:
        model = dataclasses.replace(model, speculator=None)
    lm = load(model, with_base=False)
    spec = TransformersBackend(lm.speculator, lm.tokenizer, lm.speculator) if lm.speculator is not None else None
    return VLLMBackend(tokenizer=lm.tokenizer, speculator_backend=spec, **vllm_engine_args(model))


def run_sample(job: Job, backend: Any, tokenizer: Any, sample: Sample) -> dict[str, Any]:
    """Plan, prefill, decode and score one sample; returns the measured fields of its row."""
    enc = tokenizer(sample.prompt, add_special_tokens=sample.add_special_tokens, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.int64)
    body = sample.instruction + sample.context + sample.question
    start = sample.prompt.find(body)
    if start < 0:
        raise ValueError(f"sample {sample.task}/{sample.sample_id}: the prompt does not contain its parts in order")
    end = len(sample.prompt) - len(sample.answer_prefix)
    prompt = Prompt(
        ids,
        sample.instruction,
        sample.context,
        sample.question,
        sample.answer_prefix,
        head=sample.prompt[:start],
        tail=sample.prompt[start + len(body) : end],
        add_special_tokens=sample.add_special_tokens,
    )
    plan = job.method.plan(prompt, backend)
    # Never decode past the model's window (InfiniteBench's math_calc asks for 30000 tokens).
    max_new = max(1, min(sample.max_new_tokens, job.cfg.model.max_context - plan.next_position))
    if job.cfg.benchmark.max_new_tokens_cap is not None:
        max_new = min(max_new, job.cfg.benchmark.max_new_tokens_cap)
    gen = backend.generate(plan, max_new, stop=sample.stop)
    needles = needle_tokens([tuple(o) for o in enc["offset_mapping"]], sample.spans)
    t = dict(plan.timings)
    return {
        "prompt_tokens": prompt.n,
        "kept_tokens": plan.k,
        "kept_fraction": plan.k / prompt.n,
        "prediction": gen.text,
        "score": job.benchmark.score(sample, gen.text),
        "needle_kept": needle_kept(plan.kept_indices, needles),
        "ttft_s": plan.method_s + gen.prefill_s,
        "method_s": plan.method_s,
        "speculator_s": t.get("speculator_s"),
        "selection_s": t.get("selection_s"),
        "method_timings": json.dumps(t, sort_keys=True),
        "base_prefill_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "output_tokens": len(gen.token_ids),
    }


def benchmark_samples(model: ModelConfig, benchmark: Benchmark) -> tuple[Any, list[Sample]]:
    """The model's tokenizer and the benchmark's samples, prompts built in its chat format."""
    tok = load_tokenizer(model)
    fmt = PromptFormat.from_tokenizer(tok, model.chat_template)
    info = TokenizerInfo(
        id=tokenizer_id(model),
        count=lambda s: len(tok(s, add_special_tokens=fmt.add_special_tokens).input_ids),
        fmt=fmt,
        tokenizer=tok,
        max_input_length=model.max_input_length or model.max_context,
    )
    return tok, benchmark.samples(info)


def execute(job: Job) -> Path:
    """Run a prepared job to completion (resuming), then refresh the summary and plot."""
    cfg = job.cfg
    store = RunStore(job.folder)
    job.folder.mkdir(parents=True, exist_ok=True)
    check_runnable(cfg.model)
    # Tokenizer and data first: a missing dataset fails before any model loads.
    tok, samples = benchmark_samples(cfg.model, job.benchmark)
    backend = make_backend(cfg.model, cfg.backend, job.method.needs_speculator)
    (job.folder / "config.yaml").write_text(
        OmegaConf.to_yaml(
            {
                "model": dataclasses.asdict(cfg.model),
                "method": {"name": job.method.name, **job.method.options()},
                "benchmark": {
                    **job.benchmark.options(),
                    "tasks": list(job.benchmark.tasks),
                    "limit": cfg.benchmark.limit,
                },
                "backend": cfg.backend,
                "config_hash": job.config_hash,
            }
        )
    )
    done = store.done_keys()
    todo = [s for s in samples if (s.task, s.sample_id) not in done]
    opts = job.method.options()
    common = {
        "run_id": job.folder.name,
        "config_hash": job.config_hash,
        "git_sha": git_sha(),
        "model": cfg.model.name,
        "model_weights": cfg.model.weights,
        "dtype": cfg.model.dtype,
        "speculator": cfg.model.speculator,
        "backend": cfg.backend,
        "method": job.method.name,
        "scope": job.method.scope,
        "method_options": json.dumps(opts, sort_keys=True),
        **{k: opts.get(k) for k in SPEC_OPTIONS},
        "benchmark": job.benchmark.name,
        "benchmark_version": job.benchmark.version,
        "benchmark_options": json.dumps(job.benchmark.options(), sort_keys=True),
        "metrics_version": job.benchmark.metrics_version,
        "length": cfg.benchmark.length,
        "versions": json.dumps(versions(), sort_keys=True),
        "hardware": hardware(),
    }
    empty = {f: None for f in RunRecord.__dataclass_fields__ if f not in common}
    desc = f"{job.method.name} {json.dumps({k: v for k, v in opts.items() if k in ('keep_rate',)})} {job.benchmark.name}-{cfg.benchmark.length}"
    for sample in tqdm(todo, desc=desc, unit="sample"):
        row: dict[str, Any] = {
            **empty,
            **common,
            "task": sample.task,
            "category": sample.category or None,
            "bucket": sample.bucket or None,
            "sample_id": sample.sample_id,
            "references": list(sample.references),
        }
        try:
            row.update(run_sample(job, backend, tok, sample))
            row["status"] = "ok"
        except Unsupported as e:  # the method cannot run on this hardware: recorded, the sweep goes on
            row.update(status="unsupported", error=f"{e} (hardware: {common['hardware']})")
        except Exception as e:  # one bad sample must not end the run: record it and go on
            row.update(status="failed", error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
        row["timestamp"] = time.time()
        store.append(RunRecord(**row))
    store.compact()
    report.write_all(cfg.out)
    return job.folder


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    job = prepare(RunConfig.from_hydra(cfg))
    if cfg.get("dry_run", False):
        print(
            f"[dry run] {job.cfg.model.name} {job.method.name} {json.dumps(job.method.options())} "
            f"{job.benchmark.name}-{job.cfg.benchmark.length} tasks={list(job.benchmark.tasks)} "
            f"limit={job.cfg.benchmark.limit} backend={job.cfg.backend} -> {job.folder}\n"
            f"          {resources(job.cfg.model, job.cfg.backend)}"
        )
        return
    try:
        execute(job)
    except Exception:
        # A sweep point that fails as a whole (e.g. its model cannot load) is recorded
        # beside its results; Hydra runs the remaining sweep points, then reports it.
        job.folder.mkdir(parents=True, exist_ok=True)
        (job.folder / "job_error.txt").write_text(traceback.format_exc())
        raise


if __name__ == "__main__":
    main()
