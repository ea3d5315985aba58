"""TTFT grid (``make latency``): any registered method beside the reference, batch x length.

One job = one method (with its options) and the reference method (config ``reference``,
full prefill by default), measured side by side in one process: for every grid point
(``batch`` prompts of ``length`` tokens) and iteration, both plan the *same* fresh
prompts through :meth:`Method.plan_batch` (the eval's path) and the backend prefills the
plans (:meth:`Backend.prefill`) up to the first token.

The timing protocol (:mod:`harness.analysis.speed` reads it): each iteration is a *pair*
(the reference and the method on one prompt set); the order of the methods within an
iteration turns over from one iteration to the next (:func:`harness.timing.iteration_order`:
a rotation and its reverse in consecutive iterations, the rotation spread so that every
method visits the ends of an iteration as often as its middle, so neither an order effect
nor a slow first or last slot can land on one side), recorded per row (``order``);
the speedup's interval resamples the pairs. An **A/A check** (config ``aa_check``, on by
default) times the reference a second time in every iteration as if it were a method
(rows ``method=aa_check``): its speedup must read 1.0, or the run's speed claims are
refused. Each row records the machine's load while it was timed
(:func:`harness.timing.machine_load`). ``iters`` defaults to 10 pairs: enough for the
bootstrap over pairs to mean something (fewer than
:data:`harness.analysis.stats.MIN_PAIRS` give no interval). TTFT counts everything up to the
first token's logits: the method's own cost (SpecPrefill: speculator prefill and
look-ahead, scoring, top-k; RAG: retrieval; GemFilter: the early layers) and the base
model's prefill of what it kept. A method that acts inside the model (MInference) patches
it only inside its own measurement (:func:`harness.timing.measure` enters
``Method.applied``), so the reference's iterations run on the model as loaded. Warm-up
iterations are recorded, flagged and left out of the statistics. ``conf/latency.yaml`` runs in multirun mode: ``method=a,b keep=x,y``
sweeps jobs, each with its own reference measurement, so every ratio is side by side.

Prompts: random token ids where both methods choose among prompt tokens (``scope``
``prompt``: they need no text); benchmark prompts where a method rewrites the context or
needs the question: ``prompt_task`` of any registered benchmark (``prompt_benchmark``,
default RULER, generated offline to the grid length; ``prompt_options`` are its options,
e.g. ``data_dir`` for LongBench), built at the grid length as that benchmark builds them
(RULER fills it, LongBench and InfiniteBench truncate to it). Each row records its prompt
tokens; a benchmark whose prompts fall short of a grid length (a corpus shorter than the
point) is refused at that point rather than measured under the wrong length. Each row
says which prompts (``prompt_source``).

Prefix caching: the transformers backend starts every prefill from an empty
``DynamicCache`` (there is no prefix cache to disable); the vLLM backend disables it and
asserts so at engine start: a prefix cache would measure the cache, not the prefill.

Ideal speedup (:mod:`specprefill.flops`): the reference's FLOPs over the method's (the
model calls it made through the backend, counted by ``Backend.method_flops``, plus the
base prefill of the kept tokens, which attend to kept tokens only). It is NaN for
methods that rewrite the text (their compressor runs outside the backend).
Efficiency = measured speedup / ideal speedup.

Models may be randomly initialised with real shapes (``conf/model/synth*.yaml``): prefill
compute does not depend on the weights; the rows say ``model_weights=random``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import hydra
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from harness.analysis.rows import AA_METHOD
from harness.benchmarks.base import BenchmarkConfig
from harness.benchmarks.samples import benchmark_samples
from harness.config import (
    ENGINE_IDEAL,
    LatencySchema,
    also_methods,
    check_common,
    check_in_model,
    check_keys,
    check_model_fits,
    config_errors,
    config_hash,
    container,
    method_conf,
    method_spec,
    model_from,
    model_identity,
)
from harness.dryrun import requirements_text
from harness.failures import measured
from harness.jobs import lifecycle as jobs
from harness.jobs.lifecycle import ModelJob
from harness.models.catalog import BYTES_PER_PARAM, ModelConfig
from harness.models.factory import make_backend
from harness.models.loading import check_before_start, check_runnable
from harness.models.placement import place
from harness.prompts import random_prompts, sample_prompt
from harness.provenance import provenance
from harness.registry import build_benchmark, build_method
from harness.report.summary import write_all
from harness.store import RunStore, check_layout, method_columns
from harness.timing import measure, point_order
from specprefill.flops import Shape
from specprefill.options import check_options
from specprefill.plan import Backend, Method, Prompt, check_choice

#: The timing protocol's version, part of a run's identity: rows timed under another one
#: (the reference always first, no A/A check) never share a folder with these.
PROTOCOL = "paired-v2"
#: Timed speculator prefills per grid point for its FLOP rate (after one untimed).
CALIBRATION_REPEATS = 3


@dataclass(frozen=True)
class LatencyConfig:
    model: ModelConfig
    method_name: str
    method_options: dict[str, Any]
    reference_name: str
    reference_options: dict[str, Any]
    grid: tuple[tuple[int, int], ...]  # (batch, length)
    warmup: int = 1
    iters: int = 10
    seed: int = 0
    out: Path = Path("results/latency")
    backend: str = "transformers"
    prompts: str = "auto"
    prompt_task: str = "qa_1"
    prompt_benchmark: str = "ruler"
    prompt_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Tokens decoded (greedy, timed) after each prefill; 0: TTFT only.
    decode_tokens: int = 0
    #: Time the reference a second time in every iteration, as a method (rows
    #: ``method=aa_check``): its speedup must read 1.0 (harness.analysis.speed).
    aa_check: bool = True
    #: More methods timed in the same iterations, each at the job's ``keep`` and
    #: ``lookahead`` with its ``conf/method`` defaults (config ``also``): one reference and one
    #: A/A check serve them all, so a comparison of many methods is side by side and costs
    #: one reference per iteration, not one per method.
    also: tuple[tuple[str, dict[str, Any]], ...] = ()
    #: Calibrate the speculator's FLOP rate at each point for the ideal per engine
    #: (:func:`speculator_rate`): ``auto`` where the speculator runs on another engine than
    #: the base (backend vllm), ``true``/``false`` always/never.
    engine_ideal: str = "auto"

    def prompt_config(self, length: int, limit: int = 10) -> BenchmarkConfig:
        """The benchmark whose ``prompt_task`` prompts a grid point of ``length`` tokens plans."""
        return BenchmarkConfig(
            name=self.prompt_benchmark,
            length=length,
            tasks=(self.prompt_task,),
            limit=limit,
            options=dict(self.prompt_options),
        )

    def __post_init__(self) -> None:
        if not self.grid:
            raise ValueError("grid is empty; give [[batch, length], ...]")
        for point in self.grid:
            if len(point) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in point):
                raise ValueError(f"grid point {list(point)!r} is invalid; allowed: [batch >= 1, length >= 1]")
        twice = sorted({p for p in self.grid if self.grid.count(p) > 1})
        if twice:
            raise ValueError(
                f"grid={[list(p) for p in self.grid]} names {[list(p) for p in twice]} more than once (measured twice "
                f"into one run); allowed: each [batch, length] point once"
            )
        # the keys the schema declares (harness.config.LatencySchema), checked the same way here
        # for a config built in Python
        keys = ("warmup", "iters", "seed", "decode_tokens", "aa_check", "backend", "prompts")
        check_options(LatencySchema, {k: getattr(self, k) for k in keys})
        check_choice("engine_ideal", self.engine_ideal, ENGINE_IDEAL)  # the text form ("true", not True)

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> LatencyConfig:
        c = container(cfg)
        check_keys(c, LatencySchema)
        check_common(c)
        name, options = method_spec(c["method"], int(c["lookahead"]))
        ref_name, ref_options = method_conf(str(c["reference"]), float(c["keep"]), int(c["lookahead"]))
        extra = also_methods(c["also"], float(c["keep"]), int(c["lookahead"]), c.get("keep_tokens"))
        grid = c["grid"]
        if not isinstance(grid, list) or not all(isinstance(p, list) for p in grid):
            raise ValueError(f"grid={grid!r} is invalid; allowed: a list of [batch, length] pairs, e.g. [[1,4096]]")
        return cls(
            model=model_from(c),
            method_name=name,
            method_options=options,
            reference_name=ref_name,
            reference_options=ref_options,
            grid=tuple(tuple(p) for p in grid),  # type: ignore[misc]
            warmup=c["warmup"],
            iters=c["iters"],
            seed=c["seed"],
            out=Path(str(c["out"])),
            backend=str(c["backend"]),
            prompts=str(c["prompts"]),
            prompt_task=str(c["prompt_task"]),
            prompt_benchmark=str(c["prompt_benchmark"]),
            prompt_options=dict(c["prompt_options"] or {}),
            decode_tokens=c["decode_tokens"],
            aa_check=c["aa_check"],
            also=extra,
            engine_ideal={True: "true", False: "false"}.get(c["engine_ideal"], str(c["engine_ideal"])),
        )


@dataclass(frozen=True)
class LatencyJob(ModelJob):
    """A validated latency job (a :class:`harness.jobs.lifecycle.Job`): a unit is a grid point."""

    kind: ClassVar[str] = "latency"
    retry_failed: ClassVar[bool] = True
    cfg: LatencyConfig
    reference: Method
    #: More methods timed beside the method (config ``also``).
    also: tuple[Method, ...]
    #: ``random``, or ``<benchmark>/<task>`` (benchmark prompts at each grid length; with
    #: the benchmark's options where any are given).
    prompt_source: str

    def config(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "kind": "latency",
            "model": dataclasses.asdict(c.model),
            "method": {"name": self.method.name, **self.method.options()},
            "also": [{"name": m.name, **m.options()} for m in self.also],
            "reference": {"name": self.reference.name, **self.reference.options()},
            "grid": [list(p) for p in c.grid],
            "warmup": c.warmup,
            "iters": c.iters,
            "seed": c.seed,
            "aa_check": c.aa_check,
            "engine_ideal": c.engine_ideal,
            "protocol": PROTOCOL,
            "backend": c.backend,
            "prompts": self.prompt_source,
            "placement": dataclasses.asdict(self.placement),
            "config_hash": self.config_hash,
        }

    def describe(self) -> str:
        """What a run would do and need, without loading anything (``dry_run=true``)."""
        c, m = self.cfg, self.cfg.model
        names = " vs ".join(f"{x.name} {json.dumps(x.options())}" for x in reversed(self.methods))
        aa = f", and {self.reference.name} again as the A/A check" if c.aa_check else " (no A/A check: aa_check=false)"
        lines = [
            f"[latency plan] {m.name} ({m.weights_label} weights, {m.dtype}), speculator {m.speculator}, backend {c.backend}",
            f"  {names}{aa}; prompts {self.prompt_source}",
            f"  {c.warmup} warm-up + {c.iters} timed pairs per point, the methods on the same prompts in an order "
            f"that turns over every iteration",
            requirements_text(m, self.placement, [(b * (c.warmup + c.iters) * len(self.timed), n) for b, n in c.grid]),
            f"  this machine: {'cuda' if torch.cuda.is_available() else 'cpu'}; results: {self.folder}",
        ]
        for b, n in c.grid:
            kv = ""
            if m.shape:
                per_tok = 2 * m.shape["num_hidden_layers"] * m.shape["num_key_value_heads"] * m.shape["head_dim"]
                kv = f", base KV cache {b * n * per_tok * BYTES_PER_PARAM[m.dtype] / 2**30:.2f} GiB"
            lines.append(f"  point batch={b} length={n} ({b * n} tokens){kv}")
        return "\n".join(lines)

    # --------------------------------------------------------------------------- measurement

    @contextlib.contextmanager
    def session(self, store: RunStore) -> Iterator[LatencySession]:
        cfg = self.cfg
        check_runnable(cfg.model)
        model = cfg.model
        if cfg.backend == "vllm":  # the engine sizes its KV cache for max_model_len: only what the grid needs
            need = max(n for _, n in cfg.grid) + 64
            model = dataclasses.replace(model, max_context=min(model.max_context, need))
        backend = make_backend(model, cfg.backend, any(m.needs_speculator for m in self.methods), self.placement)
        common = {
            "run_id": self.folder.name,
            "config_hash": self.config_hash,
            **provenance(model, cfg.backend, backend, self.placement),  # `model`: with the window the engine had
            "prompt_source": self.prompt_source,
            "prefix_cache": False,
        }
        yield LatencySession(self, backend, common)

    @property
    def methods(self) -> list[Method]:
        """The reference first, then the method (once, when it is the reference itself), then
        those of ``also``."""
        same = self.method.name == self.reference.name and self.method.options() == self.reference.options()
        return ([self.reference] if same else [self.reference, self.method]) + list(self.also)

    @property
    def calibrates(self) -> bool:
        """Whether each point measures the speculator's FLOP rate (config ``engine_ideal``):
        by default where a method runs a speculator on another engine than the base."""
        if self.cfg.engine_ideal != "auto":
            return self.cfg.engine_ideal == "true"
        return self.cfg.backend != "transformers" and any(m.needs_speculator for m in self.methods)

    @property
    def timed(self) -> list[tuple[str, Method]]:
        """What each iteration times, as (row method name, method): the reference, its A/A
        copy (``aa_check``), then the method (unless it is the reference itself)."""
        out = [(self.reference.name, self.reference)]
        if self.cfg.aa_check:
            out.append((AA_METHOD, self.reference))
        return out + [(m.name, m) for m in self.methods[1:]]  # the method, then those of ``also``


def prepare(cfg: LatencyConfig) -> LatencyJob:
    """Validate everything that can be validated without loading anything."""
    method = build_method(cfg.method_name, cfg.method_options)
    reference = build_method(cfg.reference_name, cfg.reference_options)
    also = tuple(build_method(n, o) for n, o in cfg.also)
    names = [(m.name, json.dumps(m.options(), sort_keys=True)) for m in (reference, method, *also)]
    twice = sorted({n for n, o in names if names.count((n, o)) > 1 and n != reference.name})
    if twice or any(m.name in (reference.name, AA_METHOD) for m in also):
        raise ValueError(
            f"also={[m.name for m in also]} names {twice or [reference.name]} twice (the method, the reference or "
            f"another entry); allowed: methods other than the reference and the job's method"
        )
    methods = [reference, method, *also]
    lookahead = max(int(m.options().get("lookahead", 1)) for m in methods)
    for _, n in cfg.grid:
        if n + lookahead - 1 > cfg.model.max_context:
            raise ValueError(
                f"grid length {n} (+{lookahead - 1} look-ahead tokens) is beyond the model's context window "
                f"({cfg.model.max_context} tokens)"
            )
    check_model_fits(cfg.model, methods, max(n for _, n in cfg.grid))
    check_in_model(methods, cfg.backend, cfg.model)
    placement = place(cfg.model, cfg.backend, any(m.needs_speculator for m in methods))
    needs_text = [m.name for m in methods if m.scope != "prompt" or m.needs_answer_length]
    if cfg.prompts == "random" and needs_text:
        raise ValueError(
            f"prompts=random: method(s) {needs_text} rewrite the context, need the question or draft the task's "
            f"answer length, which random token ids do not have; allowed: prompts=benchmark (or auto)"
        )
    source = "random"
    if cfg.prompts == "random" or (cfg.prompts == "auto" and not needs_text):
        # the prompt settings set to other than LatencyConfig's defaults (a dataclass keeps them on the class)
        given = {
            k: getattr(cfg, k)
            for k in ("prompt_task", "prompt_benchmark")
            if getattr(cfg, k) != getattr(LatencyConfig, k)
        }
        if cfg.prompt_options:
            given["prompt_options"] = cfg.prompt_options
        if given:  # set, but random ids would be timed: the run would not be what the command says
            why = "with prompts=random the methods" if cfg.prompts == "random" else "with prompts=auto these methods"
            raise ValueError(
                f"{', '.join(f'{k}={v}' for k, v in given.items())}: {why} time on random token ids"
                f"{'' if cfg.prompts == 'random' else ' (none needs text)'}, so no benchmark prompt is used; allowed: "
                f"prompts=benchmark to time on them, or drop {', '.join(given)}"
            )
    if (needs_text and cfg.prompts == "auto") or cfg.prompts == "benchmark":
        source = f"{cfg.prompt_benchmark}/{cfg.prompt_task}"
        if cfg.prompt_options:
            source += " " + json.dumps(cfg.prompt_options, sort_keys=True)
        if cfg.seed != LatencyConfig.seed:  # set, but it draws random ids only: the run would not be what it says
            raise ValueError(
                f"seed={cfg.seed}: every point times {source} prompts (benchmark samples, the same for any seed), "
                f"so the seed, which draws random token ids only, is unused; allowed: drop seed (its default, "
                f"{LatencyConfig.seed})" + ("" if needs_text else ", or prompts=random to time on random token ids")
            )
        for _, n in cfg.grid:  # the benchmark refuses a name, task, option or length it cannot give
            bench = build_benchmark(cfg.prompt_config(n))
            bench.check_model(cfg.model.max_context)
            bench.require_single_turn("make latency times one prompt per sample", "prompt_benchmark")
    timing: dict[str, Any] = {"warmup": cfg.warmup, "iters": cfg.iters, "seed": cfg.seed, "protocol": PROTOCOL,
                              "aa_check": cfg.aa_check}  # fmt: skip
    if cfg.decode_tokens:
        timing["decode_tokens"] = cfg.decode_tokens
    identity: dict[str, Any] = {
        "model": model_identity(cfg.model),
        "method": {"name": method.name, **method.options()},
        "reference": {"name": reference.name, **reference.options()},
        "backend": cfg.backend,
        "prompts": source,
        "timing": timing,
    }
    if also:  # only then: the identities of single-method runs stay what they are
        identity["also"] = [{"name": m.name, **m.options()} for m in also]
    h = config_hash(identity)  # the grid is not part of it: a run extends point by point
    folder = cfg.out / cfg.model.name / f"latency-{cfg.backend}" / f"{method.name}-{h}"
    check_layout(folder, cfg.out)
    return LatencyJob(
        cfg=cfg,
        method=method,
        reference=reference,
        also=also,
        prompt_source=source,
        config_hash=h,
        folder=folder,
        placement=placement,
    )


def validate(cfg: DictConfig) -> Path:
    """Build one sweep point's job, loading nothing, and return its run folder (the
    validating sweeper calls this, and runs each folder once)."""
    job = prepare(LatencyConfig.from_hydra(cfg))
    check_before_start(job.cfg.model, bool(cfg.dry_run))
    return job.folder


class PromptSource:
    """Fresh prompts for every iteration of a grid point: random ids, or benchmark samples."""

    def __init__(self, job: LatencyJob, backend: Backend, batch: int, length: int) -> None:
        self.job, self.backend, self.batch, self.length = job, backend, batch, length
        self.gen = torch.Generator().manual_seed(job.cfg.seed * 1_000_003 + batch * 7919 + length)
        self.samples: list[Prompt] = []
        if job.prompt_source == "random" and getattr(backend, "speculator_tokenizer", None) is not None:
            print(RANDOM_CROSS_FAMILY, file=sys.stderr)
        if job.prompt_source != "random":
            iters = job.cfg.warmup + job.cfg.iters
            bench = build_benchmark(job.cfg.prompt_config(length, limit=batch * iters))
            # A benchmark that truncates (LongBench, InfiniteBench) cuts to the point's length.
            tok, samples = benchmark_samples(job.cfg.model, bench, prompt_tokens=length)
            # the task's answer length, as the eval job gives it (SpecKV drafts that many tokens)
            answer = bench.max_new_tokens()
            self.samples = [dataclasses.replace(sample_prompt(s, tok)[0], answer_tokens=answer) for s in samples]
            low = int(MIN_PROMPT_FILL * (length - (bench.max_new_tokens() or 0)))
            check_prompts(job.prompt_source, [p.n for p in self.samples], batch * iters, low, length)

    def prompts(self, iteration: int) -> list[Prompt]:
        if self.job.prompt_source == "random":
            vocab = min(len(self.backend.tokenizer), Shape.of(self.backend.base_config).vocab)
            return random_prompts(self.batch, self.length, vocab, self.gen)
        return self.samples[iteration * self.batch : (iteration + 1) * self.batch]


#: Said once per grid point where a speculator from another family times random ids.
RANDOM_CROSS_FAMILY = (
    "[latency] a speculator from another family on random token ids: they decode to text its own tokenizer splits "
    "into several times as many tokens as a real prompt's, so its cost is overstated; prompts=benchmark times it "
    "on text"
)


#: A benchmark prompt may fall this far below its grid length less the benchmark's answer
#: tokens (RULER leaves room for its answer and fills to a whole sentence or needle line);
#: further, the point would be measured under the wrong length.
MIN_PROMPT_FILL = 0.8


def check_prompts(source: str, lengths: list[int], wanted: int, low: int, length: int) -> None:
    """Refuse a grid point its benchmark prompts cannot fill: too few samples for every
    iteration, or prompts well short of (or beyond) the point's length."""
    if len(lengths) < wanted:
        raise ValueError(
            f"prompts {source}: {len(lengths)} samples at length {length}, the point needs {wanted} "
            f"(batch x (warmup + iters)); allowed: a task with that many samples, or a smaller batch or iters"
        )
    short = [n for n in lengths if not low <= n <= length]
    if short:
        raise ValueError(
            f"prompts {source}: {len(short)} of {len(lengths)} prompts have {min(short)}-{max(short)} tokens at grid "
            f"length {length}; allowed: {low}..{length} tokens (a task whose contexts reach the length, or a "
            f"shorter grid point)"
        )


@dataclass
class LatencySession:
    """A latency job's open session: its backend; a unit is a grid point (batch, length)."""

    job: LatencyJob
    backend: Backend
    common: dict[str, Any]

    unit_name = "point"

    @property
    def progress(self) -> str:
        return f"latency {self.job.method.name}"

    def units(self) -> list[tuple[str, tuple[int, int]]]:
        return [(f"b{b}-n{n}", (b, n)) for b, n in self.job.cfg.grid]

    def measure(self, point: tuple[int, int]) -> list[dict[str, Any]]:
        return measure_point(self.job, self.backend, *point)


def point_row(
    job: LatencyJob, m: Method, unit: str, batch: int, length: int, it: int, name: str | None = None
) -> dict[str, Any]:
    """The columns one method's row of one iteration of a grid point starts with (``name``:
    the row's method, :data:`~harness.analysis.rows.AA_METHOD` for the A/A check)."""
    name = name or m.name
    return {
        **method_columns(m, job.reference.name),
        "method": name,
        "row_key": f"{unit}/{it}/{name}-{config_hash(m.options())}",
        "unit": unit,
        "batch": batch,
        "length": length,
        "iteration": it,
        "warmup": it < job.cfg.warmup,
    }


def measure_point(job: LatencyJob, backend: Backend, batch: int, length: int) -> list[dict[str, Any]]:
    """All iterations of one grid point, methods interleaved on the same prompts; a method
    that cannot run here (or raises) gets a failed row (:func:`harness.failures.measured`) and
    the point goes on; so do prompts the point cannot have (too short, too few)."""
    unit = f"b{batch}-n{length}"
    try:
        source = PromptSource(job, backend, batch, length)
    except Exception as e:
        error = e

        def refused() -> dict[str, Any]:
            raise error

        # one row per method, not a warm-up (so the summary counts it failed); retried on rerun
        return [
            measured({**point_row(job, m, unit, batch, length, 0, name), "warmup": False}, refused)
            for name, m in job.timed
        ]
    rows = []
    warmup, timed = job.cfg.warmup, job.timed
    rate: dict[str, Any] = {}
    if job.calibrates:
        try:
            rate["speculator_flop_rate"] = speculator_rate(backend, source.prompts(0))
        except Exception as e:  # the point is still timed; its ideal per engine is missing, and says why
            print(f"[latency] b{batch}-n{length}: no speculator rate ({type(e).__name__}: {e})", file=sys.stderr)
    bar = tqdm(range(warmup + job.cfg.iters), desc=f"batch {batch} x {length}", unit="pair", leave=False)
    for it in bar:
        prompts = source.prompts(it)
        for slot, j in enumerate(point_order(it, len(timed), warmup, job.cfg.iters)):
            name, m = timed[j]
            row = {**point_row(job, m, unit, batch, length, it, name), "order": slot, **rate}
            rows.append(measured(row, functools.partial(measure, m, prompts, backend, job.cfg.decode_tokens)))
    return rows


def speculator_rate(backend: Backend, prompts: list[Prompt], repeats: int = CALIBRATION_REPEATS) -> float:
    """The speculator's FLOP rate (FLOP/s) on its own engine, on one grid point's prompts: its
    batched prefill as SpecPrefill runs it (``speculate_batch``, one look-ahead step: the
    last query), once untimed, then the median of ``repeats`` timed runs, over the FLOPs the
    backend counts for it. With the base's rate from the reference's own TTFTs it gives the
    ideal per engine (:mod:`harness.analysis.speed`)."""
    if len({p.n for p in prompts}) != 1:
        raise ValueError("speculator_rate: the prompts of a point must have one length (random ids do)")
    ids = torch.stack([p.input_ids for p in prompts])
    times, flop = [], 0
    for i in range(repeats + 1):
        backend.method_flops = 0
        t0 = time.perf_counter()
        backend.speculate_batch(ids, 1)
        if i:
            times.append(time.perf_counter() - t0)
        flop = backend.method_flops
    if flop <= 0:
        raise ValueError("speculator_rate: the backend counted no speculator FLOPs")
    return float(flop / sorted(times)[len(times) // 2])


def execute(job: LatencyJob) -> Path:
    """Measure every grid point not already in the run folder (a killed run resumes by point)."""
    return jobs.execute(job, write_all)


@hydra.main(config_path="../../conf", config_name="latency", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    with config_errors():
        job = prepare(LatencyConfig.from_hydra(cfg))
    return jobs.main(job, bool(cfg.dry_run), bool(cfg.get("allow_failures", False)), write_all, cfg.get("gpu_hour_usd"))


if __name__ == "__main__":
    from harness import command_line

    command_line.main(main, "latency")  # the command line checked first: one line for what Hydra would refuse
