"""The Hydra entry point for quality: ``python -m harness.jobs.eval model=... method=... keep=...`` (``make eval``).

One job = one (model, method options, benchmark, length, backend). ``conf/config.yaml``
runs in multirun mode with the default sweep in ``hydra.sweeper.params`` (full prefill
and SpecPrefill at keep 0.1, 0.3, 0.5), so ``python -m harness.jobs.eval`` and ``make eval``
run the same thing; a comma list on the command line replaces a default sweep. Jobs that
map to the same results (full prefill at several keep rates) share a run folder and skip
finished samples. Every sweep point is validated before the first one runs
(:func:`validate`, through the validating sweeper).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import hydra
import torch
from omegaconf import DictConfig

from harness.benchmarks.base import Benchmark, BenchmarkConfig
from harness.benchmarks.samples import benchmark_samples
from harness.config import (
    EvalSchema,
    also_methods,
    benchmark_config,
    check_common,
    check_in_model,
    check_keys,
    check_model_fits,
    config_errors,
    config_hash,
    container,
    longest_prompt,
    longest_sequence,
    method_spec,
    model_from,
    model_identity,
)
from harness.diagnostics import (
    kept_hash,
    needle_depth,
    needle_kept,
    needle_tokens,
    pieces_whole,
    question_kept,
    question_span,
)
from harness.dryrun import requirements_text
from harness.failures import measured
from harness.jobs import lifecycle as jobs
from harness.jobs.lifecycle import ModelJob
from harness.models.catalog import ModelConfig, check_backend
from harness.models.factory import make_backend
from harness.models.loading import check_before_start, check_runnable
from harness.models.placement import place
from harness.prompts import sample_prompt
from harness.provenance import provenance
from harness.registry import build_benchmark, build_method
from harness.report.summary import write_all
from harness.store import RunStore, check_layout, method_columns, token_budget
from harness.timing import flops, iteration_order, machine_load
from harness.types import Sample
from specprefill.conversation import ConversationRun, check_multiturn
from specprefill.flops import Shape
from specprefill.plan import Backend, Generation, Method


@dataclass(frozen=True)
class EvalConfig:
    """The validated form of the Hydra config for one job."""

    model: ModelConfig
    method_name: str
    method_options: dict[str, Any]
    benchmark: BenchmarkConfig
    backend: str
    out: Path
    reference: str  # the method ratios are taken against (config `reference`)
    #: More methods run in the same job (config ``also``): every sample (a conversation: every
    #: turn) is run by each method in turn, in an order turned over from one sample (turn) to
    #: the next (:func:`harness.timing.iteration_order`), so their TTFTs are side by side.
    also: tuple[tuple[str, dict[str, Any]], ...] = ()

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> EvalConfig:
        c = container(cfg)
        check_keys(c, EvalSchema)
        check_common(c)
        name, options = method_spec(c["method"], int(c["lookahead"]))
        check_backend(str(c["backend"]))
        return cls(
            model=model_from(c),
            method_name=name,
            method_options=options,
            benchmark=benchmark_config(dict(c["benchmark"])),
            backend=str(c["backend"]),
            out=Path(str(c["out"])),
            reference=str(c["reference"]),
            also=also_methods(c.get("also"), float(c["keep"]), int(c["lookahead"]), c.get("keep_tokens")),
        )


@dataclass(frozen=True)
class EvalJob(ModelJob):
    """A validated, ready-to-run eval job (nothing loaded yet): a :class:`harness.jobs.lifecycle.Job`."""

    kind: ClassVar[str] = "eval"
    retry_failed: ClassVar[bool] = True
    cfg: EvalConfig
    benchmark: Benchmark
    #: More methods run sample by sample (turn by turn) beside the method (config ``also``).
    also: tuple[Method, ...] = ()

    @property
    def methods(self) -> list[Method]:
        """The method, then those of ``also``."""
        return [self.method, *self.also]

    @property
    def needs_speculator(self) -> bool:
        """Whether any of the job's methods runs the speculator (the backend then loads it)."""
        return any(m.needs_speculator for m in self.methods)

    def config(self) -> dict[str, Any]:
        """What ``config.yaml`` records of an eval job."""
        return {
            "kind": "eval",
            "model": dataclasses.asdict(self.cfg.model),
            "method": {"name": self.method.name, **self.method.options()},
            **({"also": [{"name": m.name, **m.options()} for m in self.also]} if self.also else {}),
            "reference": self.cfg.reference,
            "benchmark": {
                **self.benchmark.options(),
                "tasks": list(self.benchmark.tasks),
                "limit": self.cfg.benchmark.limit,
            },
            "backend": self.cfg.backend,
            "placement": dataclasses.asdict(self.placement),
            "config_hash": self.config_hash,
        }

    def describe(self) -> str:
        c = self.cfg
        prompts = c.benchmark.limit * len(self.benchmark.tasks)  # at most: a task may have fewer samples
        work = [(prompts, longest_prompt(c.model, c.benchmark))]
        also = "".join(f" + {m.name} {json.dumps(m.options())}" for m in self.also)
        return (
            f"[dry run] {c.model.name} {self.method.name} {json.dumps(self.method.options())}{also} "
            f"{self.benchmark.name}-{c.benchmark.length} tasks={list(self.benchmark.tasks)} "
            f"limit={c.benchmark.limit} backend={c.backend} -> {self.folder}\n"
            f"          {backend_plan(c.model, c.backend, self.needs_speculator, self.placement.max_model_len)}\n"
            + requirements_text(c.model, self.placement, work, indent=" " * 10)
        )

    @contextlib.contextmanager
    def session(self, store: RunStore) -> Iterator[EvalSession]:
        """The tokenizer and the samples first (a missing dataset fails before any model
        loads), then the backend."""
        cfg = self.cfg
        check_runnable(cfg.model)
        tok, samples = benchmark_samples(cfg.model, self.benchmark)
        backend = make_backend(cfg.model, cfg.backend, self.needs_speculator, self.placement)
        common = {
            "run_id": self.folder.name,
            "config_hash": self.config_hash,
            **provenance(cfg.model, cfg.backend, backend, self.placement),
            **method_columns(self.method, cfg.reference),
            "benchmark": self.benchmark.name,
            "benchmark_version": self.benchmark.version,
            "benchmark_options": json.dumps(self.benchmark.options(), sort_keys=True),
            "metrics_version": self.benchmark.metrics_version,
            "benchmark_notes": self.benchmark.notes or None,
            "length": cfg.benchmark.length,
        }
        yield EvalSession(self, backend, tok, samples, common)


@dataclass
class EvalSession:
    """An eval job's open session: its backend, tokenizer and samples; a unit is a sample."""

    job: EvalJob
    backend: Backend
    tok: Any
    samples: list[Sample]
    common: dict[str, Any]

    unit_name = "sample"

    @property
    def progress(self) -> str:
        opts = self.job.method.options()
        tokens = token_budget(opts)
        keep = f" {tokens} tokens" if tokens is not None else ""
        keep = keep or (f" keep={opts['keep_rate']}" if opts.get("keep_rate") is not None else "")
        b = self.job.cfg.benchmark
        return f"{self.job.method.name}{keep} {b.name}-{b.length}"

    def units(self) -> list[tuple[str, Sample]]:
        return [(f"{s.task}/{s.sample_id}", s) for s in self.samples]

    def measure(self, sample: Sample) -> list[dict[str, Any]]:
        key = f"{sample.task}/{sample.sample_id}"
        if self.job.benchmark.multiturn:
            return run_conversation(self.job, self.backend, self.tok, sample, self.common["hardware"])
        if self.job.also:
            return self.side_by_side(sample, key)
        row = {**row_head(sample, key), "references": list(sample.references)}
        return [measured(row, lambda: run_sample(self.job, self.backend, self.tok, sample), self.common["hardware"])]

    def side_by_side(self, sample: Sample, key: str) -> list[dict[str, Any]]:
        """One sample run by every method of the job (config ``also``) in turn, in the order
        :func:`harness.timing.iteration_order` gives the sample's place among the job's samples
        (turned over from one sample to the next, each method first as often as the others;
        recorded, ``order``): one row per method, the first method's keyed by the sample, the
        others' by the sample and the method, one unit (a resumed job reruns a sample whole)."""
        methods = self.job.methods
        place = next(i for i, s in enumerate(self.samples) if s is sample)
        rows = []
        for slot, j in enumerate(iteration_order(place, len(methods), len(self.samples))):
            m = methods[j]
            suffix = "" if j == 0 else f"/{m.name}-{config_hash(m.options())}"
            row = {
                **row_head(sample, f"{key}{suffix}", unit=key),
                "references": list(sample.references),
                **method_columns(m, self.job.cfg.reference),
                "order": slot,
            }
            rows.append(measured(row, functools.partial(self.run_one, sample, m), self.common["hardware"]))
        return rows

    def run_one(self, sample: Sample, method: Method) -> dict[str, Any]:
        """One sample by one of the job's methods: :func:`run_sample`."""
        return run_sample(self.job, self.backend, self.tok, sample, method)


def prepare(cfg: EvalConfig) -> EvalJob:
    """Validate everything that can be validated without loading a model."""
    method = build_method(cfg.method_name, cfg.method_options)
    if cfg.model.nodes > 1 and cfg.backend != "vllm":
        raise ValueError(
            f"model {cfg.model.name!r} spans {cfg.model.nodes} nodes: only backend=vllm runs across nodes (Ray)"
        )
    benchmark = build_benchmark(cfg.benchmark)
    benchmark.check_model(cfg.model.max_context)
    benchmark.check_data()
    also = tuple(build_method(n, o) for n, o in cfg.also)
    methods = [method, *also]
    names = [(m.name, json.dumps(m.options(), sort_keys=True)) for m in methods]
    if len(set(names)) < len(names):
        raise ValueError(
            f"also={[m.name for m in also]} names a method twice (or the job's method); allowed: each once"
        )
    check_model_fits(cfg.model, methods, longest_prompt(cfg.model, cfg.benchmark))
    check_in_model(methods, cfg.backend, cfg.model)
    if benchmark.multiturn:
        for m in methods:
            check_multiturn(m, cfg.backend)
    needs_speculator = any(m.needs_speculator for m in methods)
    placement = place(cfg.model, cfg.backend, needs_speculator, longest_sequence(cfg.model, benchmark))
    identity: dict[str, Any] = {
        "model": model_identity(cfg.model),
        "method": {"name": method.name, **method.options()},
        "benchmark": benchmark.options(),
        "backend": cfg.backend,
        "decoding": "greedy",
    }
    if also:  # only then: single-method runs keep their identities
        identity["also"] = [{"name": m.name, **m.options()} for m in also]
    h = config_hash(identity)
    folder = cfg.out / cfg.model.name / f"{cfg.benchmark.name}-{cfg.benchmark.length}" / f"{method.name}-{h}"
    check_layout(folder, cfg.out)
    return EvalJob(
        cfg=cfg, method=method, benchmark=benchmark, config_hash=h, folder=folder, placement=placement, also=also
    )


def validate(cfg: DictConfig) -> Path:
    """Build one sweep point's job, loading nothing, and return its run folder (the
    validating sweeper calls this, and runs each folder once)."""
    job = prepare(EvalConfig.from_hydra(cfg))
    check_before_start(job.cfg.model, bool(cfg.dry_run))
    return job.folder


def backend_plan(model: ModelConfig, backend: str, needs_speculator: bool, max_model_len: int | None = None) -> str:
    """One line on where the base model and the speculator will run (dry runs); ``max_model_len``:
    the engine's window as planned (:class:`Placement`), the model's max_context when None."""
    spec = model.speculator if needs_speculator else None
    if backend == "vllm":
        where = (
            f"base on a vLLM engine (dtype {model.dtype}, max_model_len {max_model_len or model.max_context}, "
            f"tensor_parallel {model.tensor_parallel}, pipeline_parallel {model.pipeline_parallel}, prefix caching off)"
        )
        return f"backend vllm: {where}; speculator {spec} on transformers beside it"
    return f"backend transformers: base ({model.dtype}) and speculator {spec} in this process"


def decode_budget(
    sample: Sample, prompt_tokens: int, model: ModelConfig, cap: int | None, window: int | None = None
) -> int:
    """Tokens to generate for a sample: the benchmark's own length, never past the model's
    window after the *whole* prompt (InfiniteBench's math_calc asks for 30000), capped by
    ``max_new``. The same for every method: a method that re-numbers kept tokens from 0
    must not get a longer answer than full prefill. ``window``: the engine's max_model_len
    where the placement lowered it (it is never below the run's longest prompt + answer, so
    the budget only changes for a prompt longer than the benchmark promised)."""
    limit = min(model.max_context, window or model.max_context)
    budget = max(1, min(sample.max_new_tokens, limit - prompt_tokens))
    return min(budget, cap) if cap is not None else budget


def sample_hash(sample: Sample) -> str:
    """The data a row used: its prompt and references, hashed."""
    payload = json.dumps([sample.prompt, list(sample.references), sample.label_json], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def run_sample(
    job: EvalJob, backend: Backend, tokenizer: Any, sample: Sample, method: Method | None = None
) -> dict[str, Any]:
    """Plan, prefill, decode and score one sample by ``method`` (the job's, unless one of its
    ``also``); returns the measured fields of its row."""
    method = method or job.method
    prompt, offsets = sample_prompt(sample, tokenizer)
    max_new = decode_budget(
        sample, prompt.n, job.cfg.model, job.cfg.benchmark.max_new_tokens_cap, job.placement.max_model_len
    )
    prompt = dataclasses.replace(prompt, answer_tokens=max_new)
    # A method acting inside the model (MInference) patches it for this sample only, untimed.
    # The machine's load over the sample's work: a between-runs speedup is flagged where it was shared.
    with machine_load() as load, method.applied(backend):
        backend.method_flops = 0
        plan = method.plan(prompt, backend)
        overhead = backend.method_flops
        gen = backend.generate(plan, max_new, stop=sample.stop)
    f_full, f_method = flops(Shape.of(backend.base_config), [prompt], [plan], overhead)
    # a KV press prefills every token and each head keeps its own entries: no token-level answer
    # (each diagnostic below reads None for None)
    kept = None if method.compresses_cache else plan.kept_indices
    return {
        "prompt_tokens": prompt.n,
        "kept_tokens": plan.kept,
        "kept_fraction": plan.kept / prompt.n,
        "prediction": gen.text,
        "score": job.benchmark.score(sample, gen.text),
        "needle_kept": needle_kept(kept, needle_tokens(offsets, sample.spans)),
        "distractor_kept": needle_kept(kept, needle_tokens(offsets, sample.distractor_spans)),
        "needle_whole": pieces_whole(kept, offsets, sample.spans),
        "question_kept": question_kept(
            kept, offsets, question_span(sample.prompt, sample.instruction, sample.context, sample.question)
        ),
        "needle_depth": needle_depth(sample.prompt, sample.context, sample.spans),
        "kept_hash": kept_hash(kept),
        "sample_hash": sample_hash(sample),
        "flops_full": float(f_full),
        "flops_method": f_method,
        **generation_fields(plan.timings, gen, max_new),
        **load,
    }


def generation_fields(timings: Mapping[str, float], gen: Generation, max_new: int) -> dict[str, Any]:
    """The fields of a row that come from a method's own timings and the base model's
    generation: TTFT and its parts, decoding, the KV cache left (a sample's or a turn's)."""
    t = dict(timings)
    method_s = float(sum(t.values()))
    return {
        "ttft_s": method_s + gen.prefill_s,
        "method_s": method_s,
        "speculator_s": t.get("speculator_s"),
        "selection_s": t.get("selection_s"),
        "method_timings": json.dumps(t, sort_keys=True),
        "base_prefill_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "timing_source": gen.timing_source,
        "output_tokens": len(gen.token_ids),
        "max_new_tokens": max_new,
        "kv_tokens": gen.kv_tokens,
        "kv_bytes": gen.kv_bytes,
    }


def row_head(sample: Sample, row_key: str, unit: str | None = None) -> dict[str, Any]:
    """The identifying fields of a sample's row (``unit``: the row key unless the sample
    writes several rows, a conversation's turns)."""
    return {
        "row_key": row_key,
        "unit": unit or row_key,
        "task": sample.task,
        "category": sample.category or None,
        "bucket": sample.bucket or None,
        "sample_id": sample.sample_id,
    }


def run_conversation(
    job: EvalJob, backend: Backend, tokenizer: Any, sample: Sample, hardware: str
) -> list[dict[str, Any]]:
    """The rows of one conversation (a multi-turn benchmark's sample): one per turn and
    method, each turn run by the method's multi-turn policy (:mod:`specprefill.conversation`).
    With several methods (config ``also``) every turn is run by each in an order turned over
    from turn to turn (recorded, ``order``), so their TTFTs are side by side; each follows its
    own answers. A turn that fails is recorded and ends that method's conversation (its later
    turns follow from its answer)."""
    bench: Any = job.benchmark
    prompt, offsets = sample_prompt(sample, tokenizer)
    methods = job.methods
    runs = [ConversationRun(m, backend) for m in methods]
    alive = [True] * len(methods)
    rows: list[dict[str, Any]] = []
    key = f"{sample.task}/{sample.sample_id}"
    turns = list(bench.turns(sample))
    for t, turn in enumerate(turns):
        for slot, j in enumerate(iteration_order(t, len(methods), len(turns))):
            if not alive[j]:
                continue
            m, run = methods[j], runs[j]
            suffix = "" if j == 0 else f"/{m.name}-{config_hash(m.options())}"
            row = {
                **row_head(sample, f"{key}/turn{turn.index}{suffix}", unit=key),
                "turn": turn.index,
                "turn_policy": run.policy,
                "references": list(turn.references),
            }
            if len(methods) > 1:
                row.update(method_columns(m, job.cfg.reference), order=slot)
            new_ids = prompt.input_ids
            if turn.index > 1:
                text = tokenizer(turn.text, add_special_tokens=False).input_ids
                new_ids = torch.cat([run.answer(), torch.tensor(text, dtype=torch.int64)])

            # the other turns' needles: look-alikes this turn's question does not ask
            others = tuple(s for s in sorted(sample.spans + sample.distractor_spans) if s not in turn.spans)

            def one(
                turn: Any = turn, ids: torch.Tensor = new_ids, run: ConversationRun = run, others: Any = others
            ) -> dict[str, Any]:
                n = int(run.ids.numel()) + int(ids.numel())
                max_new = decode_budget(
                    sample, n, job.cfg.model, job.cfg.benchmark.max_new_tokens_cap, job.placement.max_model_len
                )
                with machine_load() as load:
                    res = run.turn(ids, max_new, sample.stop)
                gen = res.generation
                return {
                    "prompt_tokens": res.prompt_tokens,
                    "kept_tokens": int(res.held.numel()),
                    "kept_fraction": int(res.held.numel()) / res.prompt_tokens,
                    "prefilled_tokens": res.prefilled,
                    "revived_tokens": res.revived,
                    "prediction": gen.text,
                    "score": bench.score_turn(sample, turn, gen.text),
                    "needle_kept": needle_kept(res.held, needle_tokens(offsets, turn.spans)),
                    "distractor_kept": needle_kept(res.held, needle_tokens(offsets, others)),
                    "needle_whole": pieces_whole(res.held, offsets, turn.spans),
                    "needle_depth": needle_depth(sample.prompt, sample.context, turn.spans),
                    "kept_hash": kept_hash(res.held),
                    "turn_needle": turn.needle,
                    "speculator_kv_bytes": res.speculator_kv_bytes,
                    "sample_hash": sample_hash(sample),
                    **generation_fields(res.timings, gen, max_new),
                    **load,
                }

            done = measured(row, one, hardware)
            rows.append(done)
            alive[j] = done["status"] == "ok"
    return rows


def execute(job: EvalJob) -> Path:
    """Run a prepared job to completion (resuming), then refresh the summaries."""
    return jobs.execute(job, write_all)


@hydra.main(config_path="../../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    with config_errors():
        job = prepare(EvalConfig.from_hydra(cfg))
    return jobs.main(job, bool(cfg.dry_run), bool(cfg.get("allow_failures", False)), write_all, cfg.get("gpu_hour_usd"))


if __name__ == "__main__":
    from harness import command_line

    command_line.main(main, "config")  # the command line checked first: one line for what Hydra would refuse
