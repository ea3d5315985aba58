"""Serving throughput (``make qps``): max QPS under an SLO, on vLLM's OpenAI server.

One job = one method (the reference, full prefill, or any method that chooses among the
tokens of the whole prompt, such as SpecPrefill) on one model and benchmark. The harness

1. starts ``vllm serve`` for the base model on localhost (prefix caching off, asserted
   from the engine's own config line: a prefix cache would serve repeated prompts from
   cache and, with SpecPrefill's original positions, from KV computed at the wrong
   positions) and, for a method that plans (``not method.identity``), the async front of
   :mod:`harness.serving.front`, in which the method (SpecPrefill: its speculator) runs
   under the same load (two engines behind one server);
2. writes the benchmark's real prompts (official templates, chat format) as a JSONL
   custom dataset and drives the endpoint with vLLM's own load generator, ``vllm bench
   serve`` (Poisson arrivals, or constant with ``arrival=constant``), one call per
   request rate, streaming, greedy, every prompt once per rate. Special tokens a sample's
   tokenization adds (BOS on no-chat LongBench tasks) are written into its text, so one
   request-wide ``add_special_tokens=false`` serves a mix of chat and no-chat tasks
   exactly (:func:`request_text`);
3. scores every served answer with the benchmark's official metric and reads TTFT, TPOT
   and end-to-end latency per request; a rate passes when no more than ``max_timeouts``
   requests fail or exceed ``timeout_s`` end to end (the paper's rule) and the TTFT p90
   is within ``ttft_p90_slo_s``; whether the queue grew during the rate's burst (TTFT
   against send time) and the throughput delivered are reported beside the verdict
   (:mod:`harness.analysis.serving`);
4. searches the rate: ``start_rate`` times ``growth`` until a rate fails (at most
   ``max_points``), then ``bisect_steps`` bisections between the last pass and the
   first fail (or the explicit ``rates`` list). The max QPS is the highest passing rate.

Everything is bounded (requests per point, points, a time limit per point) and the
servers are stopped (process group, TERM then KILL) however the job ends. Rows go to the
one results store (``kind=qps``, one per request and rate; a killed run resumes by
rate; the request set, ``tasks`` and ``limit``, and its order, ``qps.request_order``, are in
the hash, as every rate serves all of it) under ``<out>/<model>/<benchmark>-<length>/qps-<method>-<hash>/``; the summaries
(per rate, and max QPS per method with its ratio to the reference's, on the same
machine and dtype under the same serving settings, which every row records) are in ``<out>/summary.md`` (:func:`harness.analysis.serving.summarize_qps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig

from harness.analysis.serving import point_stats, setting_columns
from harness.benchmarks.base import Benchmark, BenchmarkConfig
from harness.benchmarks.samples import benchmark_samples
from harness.config import (
    ARRIVALS,
    QPSSchema,
    benchmark_config,
    check_common,
    check_in_model,
    check_keys,
    check_model_fits,
    config_errors,
    config_hash,
    container,
    dataclass_from,
    longest_prompt,
    longest_sequence,
    method_spec,
    model_from,
    model_identity,
)
from harness.dryrun import requirements_text
from harness.jobs import lifecycle as jobs
from harness.jobs.lifecycle import ModelJob
from harness.models.catalog import ModelConfig
from harness.models.loading import check_before_start, check_runnable, vllm_model
from harness.models.placement import place
from harness.provenance import provenance
from harness.registry import build_benchmark, build_method
from harness.report.summary import write_all
from harness.serving.front import FrontSettings
from harness.serving.processes import SERVED_NAME, Servers, ServerStopped, log_tail, serving
from harness.store import RunStore, check_layout, method_columns
from harness.types import Sample
from specprefill.plan import check_choice

REQUEST_ORDERS = ("shuffled", "benchmark")


#: The rate search's settings: read only where no explicit ``rates`` are given.
SEARCH_SETTINGS = ("start_rate", "growth", "max_points", "bisect_steps")


@dataclass(frozen=True)
class QPSSettings:
    """``qps:`` in ``conf/qps.yaml``: the load, the SLOs and the search."""

    arrival: str = "poisson"
    rates: tuple[float, ...] = ()  # explicit request rates (req/s); empty = search
    start_rate: float = 0.05
    growth: float = 2.0
    max_points: int = 5
    bisect_steps: int = 1
    timeout_s: float = 60.0  # end-to-end timeout per request (the paper's rule)
    max_timeouts: int = 4  # a rate fails when more requests than this time out or fail
    ttft_p90_slo_s: float = 30.0
    warmups: int = 1
    seed: int = 0
    #: The order each rate sends the requests in: ``shuffled`` (one permutation drawn from
    #: ``seed``, the same at every rate and for every method, as vLLM's own load generator
    #: shuffles by default) or ``benchmark`` (task by task, as the benchmark lists them: a
    #: task's requests all land at the same point of the burst, early or late in the queue).
    request_order: str = "shuffled"
    server_timeout_s: float = 900.0
    point_timeout_s: float = 1800.0
    #: How the planning front batches concurrent requests (harness.serving.front.FrontSettings).
    front: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:

        check_choice("arrival", self.arrival, ARRIVALS)
        check_choice("request_order", self.request_order, REQUEST_ORDERS)
        FrontSettings.from_spec(self.front)  # bad or unknown keys fail before any server starts
        for r in self.rates:
            if isinstance(r, bool) or not isinstance(r, int | float) or not r > 0 or math.isinf(r):
                raise ValueError(f"rates contains {r!r}; allowed: finite request rates > 0 (req/s)")
        search = {k: getattr(self, k) for k in SEARCH_SETTINGS if getattr(self, k) != getattr(QPSSettings, k)}
        if self.rates and search:
            raise ValueError(
                f"{', '.join(f'{k}={v!r}' for k, v in search.items())} with rates={list(self.rates)!r}: explicit rates "
                f"run no search, so the search setting would be unused; allowed: drop {', '.join(search)}, or rates=null "
                "to search"
            )
        if len(set(self.rates)) < len(self.rates):
            raise ValueError(f"rates={list(self.rates)!r} names a rate twice; allowed: each rate once")
        for name in ("start_rate", "growth", "timeout_s", "ttft_p90_slo_s", "server_timeout_s", "point_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
                raise ValueError(f"{name}={v!r}; allowed: a number")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}; allowed: int >= 0 (the arrival times' and request order's seed)")
        if not self.start_rate > 0:
            raise ValueError(f"start_rate={self.start_rate!r}; allowed: > 0 (req/s)")
        if not self.growth > 1:
            raise ValueError(f"growth={self.growth!r}; allowed: > 1 (rate multiplier between search points)")
        for name in ("max_points", "bisect_steps", "max_timeouts", "warmups"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "max_points" else 0):
                raise ValueError(f"{name}={v!r}; allowed: int >= {1 if name == 'max_points' else 0}")
        for name in ("timeout_s", "ttft_p90_slo_s", "server_timeout_s", "point_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}; allowed: > 0 seconds")
        if self.point_timeout_s < self.timeout_s:
            raise ValueError(
                f"point_timeout_s={self.point_timeout_s!r} is shorter than timeout_s={self.timeout_s!r}, one request's "
                "own limit; allowed: point_timeout_s >= timeout_s (a rate's whole run holds at least one request's)"
            )


@dataclass(frozen=True)
class QPSConfig:
    model: ModelConfig
    method_name: str
    method_options: dict[str, Any]
    benchmark: BenchmarkConfig
    reference: str  # the method max-QPS ratios are taken against (config `reference`)
    qps: QPSSettings = QPSSettings()
    out: Path = Path("results/qps")

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> QPSConfig:
        c = container(cfg)
        check_keys(c, QPSSchema)
        check_common(c)
        if c["backend"] != "vllm":
            raise ValueError(f"backend={c['backend']!r}; allowed: ['vllm'] (qps serves the base model on vllm serve)")
        name, options = method_spec(c["method"], int(c["lookahead"]))
        q = dict(c["qps"])
        for k in ("start_rate", "growth", "timeout_s", "ttft_p90_slo_s", "server_timeout_s", "point_timeout_s"):
            if isinstance(q.get(k), int) and not isinstance(q[k], bool):
                q[k] = float(q[k])
        rates = q.pop("rates", None)
        if isinstance(rates, list) and not rates:
            raise ValueError("rates=[]; allowed: a request rate or a non-empty list of them (req/s), or null to search")
        rates = [rates] if isinstance(rates, int | float) and not isinstance(rates, bool) else (rates or [])
        if not isinstance(rates, list):
            raise ValueError(f"rates={rates!r}; allowed: a request rate or a list of them (req/s)")
        return cls(
            model=model_from(c),
            method_name=name,
            method_options=options,
            benchmark=benchmark_config(dict(c["benchmark"])),
            qps=dataclass_from(QPSSettings, {**q, "rates": tuple(rates)}, "qps config"),
            out=Path(str(c["out"])),
            reference=str(c["reference"]),
        )


@dataclass(frozen=True)
class QPSJob(ModelJob):
    """A validated serving job (a :class:`harness.jobs.lifecycle.Job`): a unit is a request rate."""

    kind: ClassVar[str] = "qps"
    retry_failed: ClassVar[bool] = False  # a failed request is a measurement of its rate
    cfg: QPSConfig
    benchmark: Benchmark

    def config(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "kind": "qps",
            "model": dataclasses.asdict(c.model),
            "method": {"name": self.method.name, **self.method.options()},
            "reference": c.reference,
            "benchmark": {**self.benchmark.options(), "tasks": list(self.benchmark.tasks), "limit": c.benchmark.limit},
            "qps": dataclasses.asdict(c.qps),
            "config_hash": self.config_hash,
        }

    def describe(self) -> str:
        c, q = self.cfg, self.cfg.qps
        search = (
            f"rates {list(q.rates)}"
            if q.rates
            else f"search from {q.start_rate} req/s x{q.growth} (<= {q.max_points} points) + {q.bisect_steps} bisection(s)"
        )
        served = (
            "vllm serve"
            if self.method.identity
            else f"vllm serve + a {self.method.name} front (the method plans there, {front_settings(q)})"
        )
        return (
            f"[qps plan] {c.model.name} {self.method.name} {json.dumps(self.method.options())} "
            f"{self.benchmark.name}-{c.benchmark.length} tasks={list(self.benchmark.tasks)} limit={c.benchmark.limit}\n"
            f"           {served}; {q.arrival} arrivals; {search}; every sample once per rate, {q.warmups} warm-up\n"
            f"           a rate passes with <= {q.max_timeouts} requests over {q.timeout_s:g} s (or failed) and "
            f"TTFT p90 <= {q.ttft_p90_slo_s:g} s\n"
            + requirements_text(c.model, self.placement, indent=" " * 11)
            + f"\n           results: {self.folder}"
        )

    # --------------------------------------------------------------------------- servers

    @contextlib.contextmanager
    def session(self, store: RunStore) -> Iterator[QPSSession]:
        """The samples, then the servers, started only when the rate search has a rate left."""
        cfg, q = self.cfg, self.cfg.qps
        check_runnable(cfg.model)
        tok, samples = benchmark_samples(cfg.model, self.benchmark)
        if not samples:
            raise ValueError(f"{self.benchmark.name}-{cfg.benchmark.length}: no samples")
        samples = request_order(samples, q)
        texts = [request_text(s, tok) for s in samples]
        prompt_tokens = [len(tok(s.prompt, add_special_tokens=s.add_special_tokens).input_ids) for s in samples]
        common = {
            "run_id": self.folder.name,
            "config_hash": self.config_hash,
            **provenance(cfg.model, "vllm", None, self.placement),
            **method_columns(self.method, cfg.reference),
            "speculator": cfg.model.speculator if self.method.needs_speculator else None,
            "benchmark": self.benchmark.name,
            "benchmark_version": self.benchmark.version,
            "benchmark_options": json.dumps(self.benchmark.options(), sort_keys=True),
            "metrics_version": self.benchmark.metrics_version,
            "benchmark_notes": self.benchmark.notes or None,
            "length": cfg.benchmark.length,
            "arrival": q.arrival,
            **row_settings(q, self.method),
            "prefix_cache": False,
        }
        if next_rate(q, tested(store)) is None:  # the search is over: nothing to serve
            yield QPSSession(self, store, None, samples, prompt_tokens, Path(), common)
            return
        logs = self.folder / "logs"
        up = serving(cfg.model, self.placement, self.method, front_settings(q), q.server_timeout_s, logs)
        with tempfile.TemporaryDirectory() as tmp, up as servers:
            common.update(engine_runner=servers.engine_runner, position_check=servers.position_check)
            dataset = Path(tmp) / "requests.jsonl"
            write_dataset(texts, samples, dataset)
            yield QPSSession(self, store, servers, samples, prompt_tokens, dataset, common)


def prepare(cfg: QPSConfig) -> QPSJob:
    """Validate everything that can be validated without loading or starting anything."""
    method = build_method(cfg.method_name, cfg.method_options)
    if not method.identity and method.scope != "prompt":
        raise ValueError(
            f"method {method.name!r} (scope {method.scope!r}) cannot be served: a request carries one prompt text; "
            f"allowed: the reference, or a method that selects tokens of the whole prompt (scope 'prompt')"
        )
    benchmark = build_benchmark(cfg.benchmark)
    benchmark.check_model(cfg.model.max_context)
    benchmark.require_single_turn("make qps serves each sample as one request", "benchmark")
    check_model_fits(cfg.model, [method], longest_prompt(cfg.model, cfg.benchmark))
    check_in_model([method], "vllm", cfg.model, serving=True)  # the base is served by vLLM, no other backend
    placement = place(cfg.model, "vllm", method.needs_speculator, longest_sequence(cfg.model, benchmark))
    q = cfg.qps
    identity = {
        "model": model_identity(cfg.model),
        "method": {"name": method.name, **method.options()},
        "benchmark": benchmark.options(),
        # Every request is served at every rate and a rate's verdict is over all of them, so
        # the request set is the job's (unlike an eval's per-sample rows, where a larger limit
        # adds samples): 12 requests at a rate cannot be resumed into 48.
        "requests": {"tasks": list(benchmark.tasks), "limit": cfg.benchmark.limit},
        "serving": {
            "arrival": q.arrival,
            "timeout_s": q.timeout_s,
            "max_timeouts": q.max_timeouts,
            "ttft_p90_slo_s": q.ttft_p90_slo_s,
            "warmups": q.warmups,
            "seed": q.seed,
            "request_order": q.request_order,
            **({} if method.identity else {"front": dataclasses.asdict(front_settings(q))}),
        },
        "decoding": "greedy",
    }
    h = config_hash(identity)
    folder = cfg.out / cfg.model.name / f"{cfg.benchmark.name}-{cfg.benchmark.length}" / f"qps-{method.name}-{h}"
    check_layout(folder, cfg.out)
    return QPSJob(cfg=cfg, method=method, benchmark=benchmark, config_hash=h, folder=folder, placement=placement)


def row_settings(q: QPSSettings, method: Any) -> dict[str, Any]:
    """The serving settings every row of the job records (harness.analysis.serving.SETTINGS:
    what decides its verdicts, matched against the reference's; its front's, where it has one)."""
    return setting_columns(q, None if method.identity else dataclasses.asdict(front_settings(q)))


def front_settings(q: QPSSettings) -> Any:

    return FrontSettings.from_spec(q.front)


def validate(cfg: DictConfig) -> Path:
    """Build one sweep point's job, starting nothing, and return its run folder (the
    validating sweeper calls this, and runs each folder once)."""
    job = prepare(QPSConfig.from_hydra(cfg))
    check_before_start(job.cfg.model, bool(cfg.dry_run))
    return job.folder


# --------------------------------------------------------------------------- load


def request_order(samples: list[Sample], q: QPSSettings) -> list[Sample]:
    """The samples in the order every rate sends them (``qps.request_order``): a permutation
    drawn from ``qps.seed`` alone, so the same at every rate, in every method's run and on a
    resume; or the benchmark's own order."""
    if q.request_order == "benchmark":
        return list(samples)
    perm = np.random.default_rng(q.seed).permutation(len(samples))
    return [samples[int(i)] for i in perm]


def request_text(sample: Sample, tokenizer: Any) -> str:
    """The sample's prompt with the special tokens its own tokenization adds written out as
    text, so that tokenizing it with ``add_special_tokens=False`` (every request's setting)
    gives exactly the ids the sample asks for. LongBench mixes chat tasks (the template
    writes BOS) with no-chat tasks (the tokenizer adds it): one request-wide flag would
    get one kind wrong."""
    if not sample.add_special_tokens:
        return sample.prompt
    want = list(tokenizer(sample.prompt, add_special_tokens=True).input_ids)
    plain = list(tokenizer(sample.prompt, add_special_tokens=False).input_ids)
    if want == plain:
        return sample.prompt
    head = len(want) - len(plain)
    if head <= 0 or want[head:] != plain:
        raise ValueError(
            f"sample {sample.task}/{sample.sample_id}: the tokenizer's special tokens are not a prefix of the prompt "
            f"ids; a served request cannot reproduce them"
        )
    text = tokenizer.decode(want[:head], skip_special_tokens=False) + sample.prompt
    if list(tokenizer(text, add_special_tokens=False).input_ids) != want:
        raise ValueError(
            f"sample {sample.task}/{sample.sample_id}: the special tokens {want[:head]} do not survive as text; "
            f"a served request cannot reproduce the prompt"
        )
    return text


def write_dataset(texts: list[str], samples: list[Sample], path: Path) -> None:
    """vLLM's custom dataset: one JSON line per request, prompt text and output length."""
    with path.open("w") as f:
        for text, s in zip(texts, samples, strict=True):
            f.write(json.dumps({"prompt": text, "output_tokens": s.max_new_tokens}) + "\n")


def bench_command(job: QPSJob, url: str, dataset: Path, n: int, rate: float, result: Path, prefix: str) -> list[str]:

    q = job.cfg.qps
    path, _ = vllm_model(job.cfg.model)
    burstiness = "1.0" if q.arrival == "poisson" else "inf"  # inf: constant inter-arrival times
    return [
        sys.executable, "-m", "harness.serving.vllm_cli", "bench", "serve", "--backend", "openai",
        "--base-url", url, "--endpoint", "/v1/completions", "--model", path, "--tokenizer", path,
        "--served-model-name", SERVED_NAME, "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(n),
        "--request-rate", repr(rate), "--burstiness", burstiness, "--seed", str(q.seed),
        "--temperature", "0", "--num-warmups", str(q.warmups), "--request-id-prefix", prefix,
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--extra-body", json.dumps({"add_special_tokens": False}),
        "--save-result", "--save-detailed", "--result-dir", str(result.parent),
        "--result-filename", result.name, "--disable-tqdm",
    ]  # fmt: skip


def truncate_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """What vLLM's ``stop`` would have returned: the text before the first stop string."""
    for s in stops:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text


def request_rows(job: QPSJob, samples: list[Sample], result: dict[str, Any], front: dict[str, dict] | None,
                 prompt_tokens: list[int], rate: float, prefix: str) -> list[dict[str, Any]]:  # fmt: skip
    """The measured fields of one row per request of one rate (the bench's detailed output
    is in request order). ``front`` is the front's log by request id, or None when the
    client talked to the engine directly (every prompt token served); a request the front
    did not log gets no kept count (``kept_source=missing``), never the whole prompt."""
    rows = []
    for i, s in enumerate(samples):
        ok = not result["errors"][i]
        text = result["generated_texts"][i] or ""
        ttft, e2e, out_tokens = result["ttfts"][i], result["latencies"][i], result["output_lens"][i]
        kept: int | None
        if front is None:
            f, kept, source = {}, prompt_tokens[i], "prompt"
        else:
            f = front.get(f"{prefix}{i}", {})
            kept, source = (f["kept_tokens"], "front") if "kept_tokens" in f else (None, "missing")
        rows.append({
            "row_key": f"{rate:g}/{i}", "rate": rate, "request": i, "task": s.task, "category": s.category or None,
            "sample_id": s.sample_id, "status": "ok" if ok else "failed", "error": result["errors"][i] or None,
            "prompt_tokens": prompt_tokens[i], "kept_tokens": kept, "kept_source": source,
            "ttft_s": ttft if ok else None, "e2e_s": e2e if ok else None, "output_tokens": out_tokens,
            "tpot_s": (e2e - ttft) / (out_tokens - 1) if ok and out_tokens and out_tokens > 1 else None,
            "timed_out": (not ok) or e2e > job.cfg.qps.timeout_s,
            "prediction": text, "score": job.benchmark.score(s, truncate_at_stop(text, s.stop)) if ok else None,
            "references": list(s.references), "front_queue_s": f.get("queue_s"),
            "speculator_s": f.get("speculator_s"), "selection_s": f.get("selection_s"),
            "front_plan_s": f.get("plan_s"), "front_batch_size": f.get("batch_size"),
            "start_time": result["start_times"][i],
        })  # fmt: skip
    return rows


def passes(stats: dict[str, Any], q: QPSSettings) -> dict[str, bool]:
    """The SLO verdicts of one rate point: the paper's timeout rule and the TTFT p90 SLO."""
    timeout_ok = stats["timeouts"] <= q.max_timeouts
    ttft_ok = stats["completed"] > 0 and stats["ttft_p90_s"] <= q.ttft_p90_slo_s
    return {"pass_timeout_rule": timeout_ok, "pass_ttft_slo": ttft_ok, "passed": timeout_ok and ttft_ok}


def read_front_log(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out[d.get("request_id", "")] = d
    return out


def next_rate(q: QPSSettings, tested: dict[float, bool]) -> float | None:
    """The next rate to measure given the outcomes so far (None: the search is over)."""
    if q.rates:
        todo = [r for r in q.rates if r not in tested]
        return todo[0] if todo else None
    ramp = [round(q.start_rate * q.growth**i, 6) for i in range(q.max_points)]
    bracket = (0.0, math.inf)  # between the ramp's last pass and its first failure
    for i, r in enumerate(ramp):
        if r not in tested:
            return r
        if not tested[r]:
            bracket = (ramp[i - 1] if i else 0.0, r)
            break
    passed = [r for r, ok in tested.items() if ok]
    failed = [r for r, ok in tested.items() if not ok]
    if not passed or not failed:
        return None
    above = [r for r in failed if r > max(passed)]
    if not above:
        return None
    lo, hi = max(passed), min(above)
    # The bisections so far: rates off the ramp inside its bracket. Rates a resumed run
    # measured on another ramp (another start_rate or growth) outside it are not bisections.
    bisections = sum(1 for r in tested if r not in ramp and bracket[0] < r < bracket[1])
    if bisections >= q.bisect_steps:
        return None
    return round((lo + hi) / 2, 6)


def tested(store: RunStore) -> dict[float, bool]:
    """The rates measured so far and whether each passed."""
    df = store.read()
    return {} if df.empty else {float(r): bool(g["passed"].iloc[0]) for r, g in df.groupby("rate")}


@dataclass
class QPSSession:
    """A serving job's open session: the servers and the request dataset; a unit is a rate,
    each next one chosen from the verdicts stored before it (resuming by rate)."""

    job: QPSJob
    store: RunStore
    servers: Servers | None
    samples: list[Sample]
    prompt_tokens: list[int]
    dataset: Path
    common: dict[str, Any]

    unit_name = "rate"

    @property
    def progress(self) -> str:
        return f"qps {self.job.method.name}"

    def units(self) -> Iterator[tuple[str, float]]:
        """The rate search, each next rate chosen from the verdicts stored before it."""
        q = self.job.cfg.qps
        rate = next_rate(q, tested(self.store))
        while rate is not None:
            yield f"rate-{rate:g}", rate
            rate = next_rate(q, tested(self.store))

    def measure(self, rate: float) -> list[dict[str, Any]]:
        """Serve the dataset at ``rate``: one row per request, with the rate's verdicts. A
        server that stops fails the run (the rate is not recorded: a rerun measures it anew)."""
        job, servers, q = self.job, self.servers, self.job.cfg.qps
        assert servers is not None
        logs = job.folder / "logs"
        if why := servers.down():  # a dead server would fail every request of every later rate
            raise ServerStopped(f"qps {job.method.name}: a server stopped before rate {rate:g}: {why}")
        prefix = f"r{rate:g}-"
        result = self.dataset.parent / f"rate-{rate:g}.json"
        cmd = bench_command(job, servers.url, self.dataset, len(self.samples), rate, result, prefix)
        log_path = logs / f"bench-{rate:g}.log"
        with log_path.open("w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=q.point_timeout_s)
        if why := servers.down():
            # Requests that failed because a server died measure the crash, not the load: the
            # rate is not recorded (so it stays untested and a rerun measures it again) and
            # the run stops.
            if result.exists():
                shutil.copy(result, logs / f"bench-{rate:g}-interrupted.json")
            raise ServerStopped(
                f"qps {job.method.name}: a server stopped during rate {rate:g}: {why}; that rate is "
                f"not recorded (its client log: {log_path}); earlier rates are kept and running the "
                f"same command again measures rate {rate:g} anew"
            )
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(
                f"vllm bench serve failed at rate {rate} (exit {proc.returncode}); log {log_path}:\n{log_tail(log_path)}"
            )
        bench = json.loads(result.read_text())
        front = None if servers.front_log is None else read_front_log(servers.front_log)
        rows = request_rows(job, self.samples, bench, front, self.prompt_tokens, rate, prefix)
        verdict = passes(point_stats(pd.DataFrame(rows)), q)
        extra = {
            "unit": f"rate-{rate:g}",
            "request_throughput": float(bench.get("request_throughput") or 0.0),
            "duration_s": float(bench.get("duration") or 0.0),
            "timestamp": time.time(),
            **verdict,
        }
        return [{**r, **extra} for r in rows]


def execute(job: QPSJob) -> Path:
    """Measure every rate the search asks for (resuming by rate); refresh the summaries."""
    return jobs.execute(job, write_all)


@hydra.main(config_path="../../conf", config_name="qps", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Failed requests are measurements here (a rate's verdict counts them), so a finished
    run exits 0 whatever they were; a run that cannot go on raises."""
    with config_errors():
        job = prepare(QPSConfig.from_hydra(cfg))
    if not cfg.dry_run:
        print(job.describe())  # the plan before the servers' minutes (the dry run prints it alone)
        # SIGTERM (a scheduler's kill) unwinds like Ctrl-C, so the servers are stopped.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    jobs.main(job, bool(cfg.dry_run), None, write_all, cfg.get("gpu_hour_usd"))


if __name__ == "__main__":
    from harness import command_line

    command_line.main(main, "qps")  # the command line checked first: one line for what Hydra would refuse
