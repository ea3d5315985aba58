"""Serving throughput (``make qps``): max QPS under an SLO, on vLLM's OpenAI server.

One job = one method (``full`` or a prompt-level method such as ``specprefill``) on one
model and benchmark. The harness

1. starts ``vllm serve`` for the base model on localhost (prefix caching off, asserted
   from the engine's own config line: a prefix cache would serve repeated prompts from
   cache and, with SpecPrefill's original positions, from KV computed at the wrong
   positions) and, for SpecPrefill, the async front of :mod:`harness.front`, in which the
   speculator runs under the same load (two engines behind one server);
2. writes the benchmark's real prompts (official templates, chat format) as a JSONL
   custom dataset and drives the endpoint with vLLM's own load generator, ``vllm bench
   serve`` (Poisson arrivals, or constant with ``arrival=constant``), one call per
   request rate, streaming, greedy, every prompt once per rate;
3. scores every served answer with the benchmark's official metric and reads TTFT, TPOT
   and end-to-end latency per request; a rate passes when no more than ``max_timeouts``
   requests fail or exceed ``timeout_s`` end to end (the paper's rule, REFERENCE.md §3)
   and the TTFT p90 is within ``ttft_p90_slo_s``;
4. searches the rate: ``start_rate`` times ``growth`` until a rate fails (at most
   ``max_points``), then ``bisect_steps`` bisections between the last pass and the
   first fail (or the explicit ``rates`` list). The max QPS is the highest passing rate.

Everything is bounded (requests per point, points, a time limit per point) and the
servers are stopped — process group, TERM then KILL — however the job ends. Results:
``<out>/<model>/<benchmark>-<length>/qps-<method>-<hash>/points/*.parquet`` (one row per
request per rate; a killed run resumes by point), ``summary.md`` there, and
``<out>/qps_summary.md`` across methods (max QPS, score at it, ratio to full prefill).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import baselines  # noqa: F401  (registers the methods)
from harness.benchmarks.base import Benchmark, BenchmarkConfig, build_benchmark
from harness.models import ModelConfig, check_runnable, resources, vllm_engine_args
from harness.report import md_table
from harness.run import (
    _dataclass_from,
    benchmark_config,
    benchmark_samples,
    config_hash,
    git_sha,
    hardware,
    model_identity,
    versions,
)
from harness.types import Sample
from specprefill.plan import Method, build_method, check_choice

ARRIVALS = ("poisson", "constant")
SERVED_NAME = "specprefill-base"


@dataclass(frozen=True)
class QPSConfig:
    model: ModelConfig
    method_name: str
    method_options: dict[str, Any]
    benchmark: BenchmarkConfig
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
    server_timeout_s: float = 900.0
    point_timeout_s: float = 1800.0
    out: Path = Path("results/qps")

    def __post_init__(self) -> None:
        check_choice("arrival", self.arrival, ARRIVALS)
        for r in self.rates:
            if not r > 0 or math.isinf(r):
                raise ValueError(f"rates contains {r!r}; allowed: finite request rates > 0 (req/s)")
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

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> QPSConfig:
        d: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        method = dict(d["method"])
        q = dict(d["qps"])
        for k in ("start_rate", "growth", "timeout_s", "ttft_p90_slo_s", "server_timeout_s", "point_timeout_s"):
            if isinstance(q.get(k), int) and not isinstance(q[k], bool):
                q[k] = float(q[k])
        return cls(
            model=_dataclass_from(ModelConfig, dict(d["model"]), "model config"),
            method_name=str(method.pop("name")),
            method_options=method,
            benchmark=benchmark_config(dict(d["benchmark"])),
            rates=tuple(float(r) for r in (q.pop("rates") or ())),
            out=Path(str(d["out"])),
            **q,
        )


@dataclass(frozen=True)
class QPSJob:
    cfg: QPSConfig
    method: Method
    benchmark: Benchmark
    folder: Path


def prepare(cfg: QPSConfig) -> QPSJob:
    """Validate everything that can be validated without loading or starting anything."""
    method = build_method(cfg.method_name, cfg.method_options)
    if method.name != "full" and method.scope != "prompt":
        raise ValueError(
            f"method {method.name!r} (scope {method.scope!r}) cannot be served: a request carries one prompt text; "
            f"allowed: full, or a method that selects tokens of the whole prompt (specprefill)"
        )
    if method.needs_speculator and cfg.model.speculator is None:
        raise ValueError(f"method {method.name!r} needs a speculator, but model {cfg.model.name!r} has none")
    benchmark = build_benchmark(cfg.benchmark)
    benchmark.check_model(cfg.model.max_context)
    identity = {
        "model": model_identity(cfg.model),
        "method": {"name": method.name, **method.options()},
        "benchmark": benchmark.options(),
        "serving": {k: v for k, v in dataclasses.asdict(cfg).items()
                    if k in ("arrival", "timeout_s", "max_timeouts", "ttft_p90_slo_s", "warmups", "seed")},
        "decoding": "greedy",
    }  # fmt: skip
    h = config_hash(identity)
    folder = cfg.out / cfg.model.name / f"{cfg.benchmark.name}-{cfg.benchmark.length}" / f"qps-{method.name}-{h}"
    return QPSJob(cfg=cfg, method=method, benchmark=benchmark, folder=folder)


def plan_text(job: QPSJob) -> str:
    c = job.cfg
    search = (
        f"rates {list(c.rates)}"
        if c.rates
        else f"search from {c.start_rate} req/s x{c.growth} (<= {c.max_points} points) + {c.bisect_steps} bisection(s)"
    )
    served = "vllm serve" if job.method.name == "full" else "vllm serve + SpecPrefill front (speculator in the front)"
    return (
        f"[qps plan] {c.model.name} {job.method.name} {json.dumps(job.method.options())} "
        f"{job.benchmark.name}-{c.benchmark.length} tasks={list(job.benchmark.tasks)} limit={c.benchmark.limit}\n"
        f"           {served}; {c.arrival} arrivals; {search}; every sample once per rate, {c.warmups} warm-up\n"
        f"           a rate passes with <= {c.max_timeouts} requests over {c.timeout_s:g} s (or failed) and "
        f"TTFT p90 <= {c.ttft_p90_slo_s:g} s\n"
        f"           {resources(c.model, 'vllm')}; results: {job.folder}"
    )


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(model: ModelConfig, port: int) -> list[str]:
    """``vllm serve`` for the base model, from the same engine arguments the offline backend uses."""
    args = vllm_engine_args(model)  # also sets vLLM's CPU environment defaults
    cmd = [sys.executable, "-m", "harness.vllm_cli", "serve", str(args.pop("model_path")),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
           "--no-enable-prefix-caching", "--uvicorn-log-level", "warning"]  # fmt: skip
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            cmd += [flag] if v else []
        else:
            cmd += [flag, str(v)]
    return cmd


def _alive(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return bool(r.status == 200)
    except Exception:
        return False


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, what: str) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {proc.returncode} before it was ready; log {log}:\n{_tail(log)}"
            )
        if _alive(url):
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} was not ready after {timeout_s:g} s; log {log}:\n{_tail(log)}")


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop a server and everything it started (its process group): TERM, then KILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


def assert_no_prefix_cache(log: Path) -> None:
    """The engine prints its config at start-up; prefix caching must read False there."""
    text = log.read_text(errors="replace")
    if "enable_prefix_caching=False" not in text:
        raise RuntimeError(
            f"the vLLM server's config line does not say enable_prefix_caching=False (log {log}); "
            f"QPS with a prefix cache would measure the cache"
        )


@contextlib.contextmanager
def serving(job: QPSJob, logs: Path) -> Iterator[tuple[str, Path | None]]:
    """Start the servers the job needs; yields (URL the client calls, front log or None)."""
    procs: list[subprocess.Popen] = []
    logs.mkdir(parents=True, exist_ok=True)
    try:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        vlog = logs / "vllm_serve.log"
        with vlog.open("w") as f:
            procs.append(subprocess.Popen(serve_command(job.cfg.model, port), stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
        wait_ready(base_url, procs[-1], vlog, job.cfg.server_timeout_s, "vllm serve")
        assert_no_prefix_cache(vlog)
        if job.method.name == "full":
            yield base_url, None
            return
        fport = free_port()
        spec = logs / "front_spec.json"
        spec.write_text(json.dumps({"model": dataclasses.asdict(job.cfg.model),
                                    "method": {"name": job.method.name, **job.method.options()}}))  # fmt: skip
        flog, requests_log = logs / "front.log", logs / "front_requests.jsonl"
        requests_log.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "harness.front", "--spec", str(spec), "--upstream", base_url,
               "--port", str(fport), "--log", str(requests_log)]  # fmt: skip
        with flog.open("w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        wait_ready(f"http://127.0.0.1:{fport}", procs[-1], flog, job.cfg.server_timeout_s, "SpecPrefill front")
        yield f"http://127.0.0.1:{fport}", requests_log
    finally:
        for p in reversed(procs):
            stop(p)


# --------------------------------------------------------------------------- load


def write_dataset(samples: list[Sample], path: Path) -> None:
    """vLLM's custom dataset: one JSON line per request, prompt text and output length."""
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps({"prompt": s.prompt, "output_tokens": s.max_new_tokens}) + "\n")


def bench_command(job: QPSJob, url: str, dataset: Path, n: int, rate: float, result: Path, prefix: str,
                  add_special_tokens: bool) -> list[str]:  # fmt: skip
    from harness.models import vllm_model

    path, _ = vllm_model(job.cfg.model)
    burstiness = "1.0" if job.cfg.arrival == "poisson" else "inf"  # inf: constant inter-arrival times
    return [sys.executable, "-m", "harness.vllm_cli", "bench", "serve", "--backend", "openai",
            "--base-url", url, "--endpoint", "/v1/completions", "--model", path, "--tokenizer", path,
            "--served-model-name", SERVED_NAME, "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(n),
            "--request-rate", repr(rate), "--burstiness", burstiness, "--seed", str(job.cfg.seed),
            "--temperature", "0", "--num-warmups", str(job.cfg.warmups), "--request-id-prefix", prefix,
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--extra-body", json.dumps({"add_special_tokens": add_special_tokens}),
            "--save-result", "--save-detailed", "--result-dir", str(result.parent),
            "--result-filename", result.name, "--disable-tqdm"]  # fmt: skip


def truncate_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """What vLLM's ``stop`` would have returned: the text before the first stop string."""
    for s in stops:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text


def _pct(a: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(a, dtype=float), q)) if a else float("nan")


def request_rows(job: QPSJob, samples: list[Sample], result: dict[str, Any], front: dict[str, dict],
                 prompt_tokens: list[int], rate: float, prefix: str) -> list[dict[str, Any]]:  # fmt: skip
    """One row per request of one rate point (the bench's detailed output is in request order)."""
    rows = []
    for i, s in enumerate(samples):
        ok = not result["errors"][i]
        text = result["generated_texts"][i] or ""
        ttft, e2e, out_tokens = result["ttfts"][i], result["latencies"][i], result["output_lens"][i]
        f = front.get(f"{prefix}{i}", {})
        rows.append({
            "rate": rate, "request": i, "task": s.task, "sample_id": s.sample_id, "status": "ok" if ok else "failed",
            "error": result["errors"][i] or None, "prompt_tokens": prompt_tokens[i],
            "kept_tokens": f.get("kept_tokens", prompt_tokens[i]), "ttft_s": ttft if ok else None,
            "e2e_s": e2e if ok else None, "output_tokens": out_tokens,
            "tpot_s": (e2e - ttft) / (out_tokens - 1) if ok and out_tokens and out_tokens > 1 else None,
            "timed_out": (not ok) or e2e > job.cfg.timeout_s,
            "prediction": text, "score": job.benchmark.score(s, truncate_at_stop(text, s.stop)) if ok else None,
            "references": list(s.references), "front_queue_s": f.get("queue_s"),
            "speculator_s": f.get("speculator_s"), "selection_s": f.get("selection_s"),
            "front_plan_s": f.get("plan_s"), "start_time": result["start_times"][i],
        })  # fmt: skip
    return rows


def point_stats(rows: pd.DataFrame, bench: dict[str, Any] | None = None) -> dict[str, Any]:
    """Latency percentiles, timeouts and score of one rate point's request rows."""
    ok = rows[rows["status"] == "ok"]
    ttft, tpot, e2e = ok["ttft_s"].tolist(), ok["tpot_s"].dropna().tolist(), ok["e2e_s"].tolist()
    spec = rows["speculator_s"].dropna()
    out: dict[str, Any] = {
        "requests": len(rows), "completed": len(ok), "failed": int((rows["status"] != "ok").sum()),
        "timeouts": int(rows["timed_out"].sum()), "score": float(ok["score"].mean()) if len(ok) else float("nan"),
        "kept_fraction": float((rows["kept_tokens"] / rows["prompt_tokens"]).mean()),
        **{f"ttft_p{q}_s": _pct(ttft, q) for q in (50, 90, 99)},
        **{f"tpot_p{q}_s": _pct(tpot, q) for q in (50, 90, 99)},
        **{f"e2e_p{q}_s": _pct(e2e, q) for q in (50, 90, 99)},
        "speculator_median_s": float(spec.median()) if len(spec) else float("nan"),
    }  # fmt: skip
    if bench:
        out.update(request_throughput=float(bench.get("request_throughput") or 0.0),
                   duration_s=float(bench.get("duration") or 0.0))  # fmt: skip
    return out


def passes(stats: dict[str, Any], cfg: QPSConfig) -> dict[str, bool]:
    """The SLO verdicts of one rate point: the paper's timeout rule and the TTFT p90 SLO."""
    timeout_ok = stats["timeouts"] <= cfg.max_timeouts
    ttft_ok = stats["completed"] > 0 and stats["ttft_p90_s"] <= cfg.ttft_p90_slo_s
    return {"pass_timeout_rule": timeout_ok, "pass_ttft_slo": ttft_ok, "pass": timeout_ok and ttft_ok}


def read_front_log(path: Path | None) -> dict[str, dict]:
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out[d.get("request_id", "")] = d
    return out


def next_rate(cfg: QPSConfig, tested: dict[float, bool]) -> float | None:
    """The next rate to measure given the outcomes so far (None: the search is over)."""
    if cfg.rates:
        todo = [r for r in cfg.rates if r not in tested]
        return todo[0] if todo else None
    ramp = [cfg.start_rate * cfg.growth**i for i in range(cfg.max_points)]
    ramp = [round(r, 6) for r in ramp]
    for r in ramp:
        if r not in tested:
            return r
        if not tested[r]:
            break
    passed = [r for r, ok in tested.items() if ok]
    failed = [r for r, ok in tested.items() if not ok]
    if not passed or not failed:
        return None
    lo, hi = max(passed), min(r for r in failed if r > max(passed)) if any(r > max(passed) for r in failed) else None
    if hi is None:
        return None
    bisections = sum(1 for r in tested if r not in ramp)
    if bisections >= cfg.bisect_steps:
        return None
    return round((lo + hi) / 2, 6)


def run(job: QPSJob) -> Path:
    """Measure every rate the search asks for (resuming by rate); write the summaries."""
    cfg = job.cfg
    folder = job.folder
    points = folder / "points"
    points.mkdir(parents=True, exist_ok=True)
    check_runnable(cfg.model)
    tok, samples = benchmark_samples(cfg.model, job.benchmark)
    if not samples:
        raise ValueError(f"{job.benchmark.name}-{cfg.benchmark.length}: no samples")
    add_special = samples[0].add_special_tokens
    prompt_tokens = [len(tok(s.prompt, add_special_tokens=s.add_special_tokens).input_ids) for s in samples]
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(json.loads(json.dumps({
        "model": dataclasses.asdict(cfg.model), "method": {"name": job.method.name, **job.method.options()},
        "benchmark": {**job.benchmark.options(), "tasks": list(job.benchmark.tasks), "limit": cfg.benchmark.limit},
        "qps": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("model", "method_options", "benchmark")},
    }, default=str))))  # fmt: skip
    common = {
        "run_id": folder.name, "git_sha": git_sha(), "model": cfg.model.name, "model_weights": cfg.model.weights,
        "dtype": cfg.model.dtype, "speculator": cfg.model.speculator if job.method.needs_speculator else None,
        "method": job.method.name, "method_options": json.dumps(job.method.options(), sort_keys=True),
        "keep_rate": job.method.options().get("keep_rate", 1.0), "benchmark": job.benchmark.name,
        "length": cfg.benchmark.length, "arrival": cfg.arrival, "backend": "vllm", "prefix_cache": False,
        "hardware": hardware(), "versions": json.dumps(versions(), sort_keys=True),
    }  # fmt: skip

    def tested() -> dict[float, bool]:
        out = {}
        for f in points.glob("*.parquet"):
            d = pd.read_parquet(f, columns=["rate", "pass"])
            out[float(d["rate"].iloc[0])] = bool(d["pass"].iloc[0])
        return out

    rate = next_rate(cfg, tested())
    if rate is not None:
        with tempfile.TemporaryDirectory() as tmp, serving(job, folder / "logs") as (url, front_log):
            dataset = Path(tmp) / "requests.jsonl"
            write_dataset(samples, dataset)
            bar = tqdm(desc=f"qps {job.method.name}", unit="rate")
            while rate is not None:
                if not _alive(url):  # a dead server would fail every request of every later rate
                    raise RuntimeError(
                        f"the server at {url} stopped answering before rate {rate}; logs in {folder / 'logs'}"
                    )
                bar.set_postfix(rate=rate)
                prefix = f"r{rate:g}-"
                result = Path(tmp) / f"rate-{rate:g}.json"
                cmd = bench_command(job, url, dataset, len(samples), rate, result, prefix, add_special)
                with (folder / "logs" / f"bench-{rate:g}.log").open("w") as log:
                    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=cfg.point_timeout_s)
                if proc.returncode != 0 or not result.exists():
                    raise RuntimeError(
                        f"vllm bench serve failed at rate {rate} (exit {proc.returncode}); log "
                        f"{folder / 'logs' / f'bench-{rate:g}.log'}:\n{_tail(folder / 'logs' / f'bench-{rate:g}.log')}"
                    )
                bench = json.loads(result.read_text())
                rows = pd.DataFrame(request_rows(job, samples, bench, read_front_log(front_log), prompt_tokens,
                                                 rate, prefix))  # fmt: skip
                stats = point_stats(rows, bench)
                rows = rows.assign(**common, **passes(stats, cfg), request_throughput=stats["request_throughput"],
                                   duration_s=stats["duration_s"], timestamp=time.time())  # fmt: skip
                part = points / f"rate-{rate:g}.parquet"
                rows.to_parquet(part.with_suffix(".tmp"), index=False)
                part.with_suffix(".tmp").rename(part)
                bar.update(1)
                rate = next_rate(cfg, tested())
            bar.close()
    write_summary(folder)
    write_overall(cfg.out)
    return folder


# --------------------------------------------------------------------------- summaries


def read_points(folder: Path) -> pd.DataFrame:
    files = sorted((folder / "points").glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def summarize(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(one row per rate, the max-QPS record) of one run folder's request rows."""
    if rows.empty:
        return pd.DataFrame(), {}
    per = []
    for rate, g in rows.groupby("rate", sort=True):
        first = g.iloc[0]
        per.append({"rate": rate, **point_stats(g), "request_throughput": first.get("request_throughput"),
                    **{k: bool(first[k]) for k in ("pass_timeout_rule", "pass_ttft_slo", "pass")}})  # fmt: skip
    pts = pd.DataFrame(per)
    first = rows.iloc[0]
    best: dict[str, Any] = {k: first[k] for k in ("model", "method", "keep_rate", "benchmark", "length", "arrival",
                                                  "hardware", "run_id")}  # fmt: skip

    def highest(col: str) -> float:
        ok = pts[pts[col]]["rate"]
        return float(ok.max()) if len(ok) else 0.0

    best.update(max_qps=highest("pass"), max_qps_timeout_rule=highest("pass_timeout_rule"),
                max_qps_ttft_slo=highest("pass_ttft_slo"), rates_tested=len(pts))  # fmt: skip
    at = pts[pts["rate"] == best["max_qps"]]
    best["score_at_max_qps"] = float(at["score"].iloc[0]) if len(at) else float("nan")
    best["ttft_p90_at_max_qps_s"] = float(at["ttft_p90_s"].iloc[0]) if len(at) else float("nan")
    best["score_all_rates"] = float(rows["score"].mean())
    return pts, best


def _md(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no results)\n"
    return md_table(df.astype(object).map(lambda v: f"{v:.3f}" if isinstance(v, float) else v))


def write_summary(folder: Path) -> pd.DataFrame:
    pts, best = summarize(read_points(folder))
    pts.to_csv(folder / "points.csv", index=False)
    (folder / "summary.md").write_text(f"# {folder.name}\n\nmax QPS (both SLOs): {best.get('max_qps')}\n\n" + _md(pts))
    return pts


def write_overall(out: Path) -> pd.DataFrame:
    """``<out>/qps_summary.{md,csv}``: the max-QPS row of every run folder, with the ratio
    to full prefill of the same model, benchmark, length and arrival process."""
    rows = []
    for folder in sorted(out.glob("*/*/qps-*")):
        r = read_points(folder)
        if not r.empty:
            rows.append(summarize(r)[1])
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keys = ["model", "benchmark", "length", "arrival"]
    full = df[df["method"] == "full"][[*keys, "max_qps"]].rename(columns={"max_qps": "_full"})
    df = df.merge(full, on=keys, how="left")
    df["qps_ratio_to_full"] = (df["max_qps"] / df["_full"].where(df["_full"] > 0)).astype(float)
    df = df.drop(columns="_full")
    df = df.sort_values([*keys, "method", "keep_rate"])
    df.to_csv(out / "qps_summary.csv", index=False)
    (out / "qps_summary.md").write_text(_md(df.drop(columns=["run_id"])))
    return df


@hydra.main(config_path="../conf", config_name="qps", version_base="1.3")
def main(cfg: DictConfig) -> None:
    job = prepare(QPSConfig.from_hydra(cfg))
    print(plan_text(job))
    if cfg.get("dry_run", False):
        return
    # SIGTERM (a scheduler's kill) unwinds like Ctrl-C, so the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        folder = run(job)
    except Exception:
        job.folder.mkdir(parents=True, exist_ok=True)
        import traceback

        (job.folder / "job_error.txt").write_text(traceback.format_exc())
        raise
    print((folder / "summary.md").read_text())
    print((job.cfg.out / "qps_summary.md").read_text())


if __name__ == "__main__":
    main()
