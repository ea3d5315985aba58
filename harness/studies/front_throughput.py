"""Benchmark: the serving front's planning throughput, one request at a time vs batched.

The front (:mod:`harness.serving.front`) plans every request with the method's speculator
before forwarding it to vLLM. This drives its :class:`~harness.serving.front.Batcher` and
:class:`~harness.serving.front.Planner` in process (no HTTP, no vLLM: the planning alone)
with the default config's speculator: SmolLM2-135M-Instruct's first layers (8 when
``results/reference/front_throughput.md`` was measured, 20 since)
(``model_config("smollm2-135m")``, dtype as the config resolves on this machine), planning
SpecPrefill as ``make qps`` does (keep 0.3, look-ahead 1, chunks of 32, pool 13) on RULER
prompts of 2048 tokens (the default tasks, chat format; their lengths differ, so a batch is
padded to its longest prompt: ``padding`` is the extra tokens that costs). C clients each
send their next request when their previous one is planned (a closed loop), R requests per
setting, after a warm-up. ``before``: ``max_batch: 1`` (the serial front); ``after``: the
front's default batching (16 requests, 65536 tokens, 5 ms). The two alternate in
``--rounds`` rounds on the same requests, so the machine's drift hits both alike. Per
setting: requests/s, p50/p90 latency (submit to plan), mean batch size (requests / batches).

    python -m harness.studies.front_throughput [--clients 1 4 16] [--requests 32] [--rounds 2]
    python -m harness.studies.front_throughput [--clients 1 4 16] [--requests 32] [--out results/reference/front_throughput.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.benchmarks.base import BenchmarkConfig
from harness.benchmarks.samples import benchmark_samples
from harness.models.catalog import model_config
from harness.prompts import sample_prompt
from harness.registry import build_benchmark
from harness.rendering.tables import md_table
from harness.serving.front import Batcher, FrontSettings, Planned, Planner
from harness.studies import write_reference

#: The SpecPrefill options ``make qps`` serves with (conf/method/specprefill.yaml, conf/qps.yaml).
METHOD = {"name": "specprefill", "keep_rate": 0.3, "lookahead": 1, "chunk_size": 32, "pool_kernel": 13}
#: RULER's default tasks (conf/benchmark/ruler.yaml).
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "vt", "qa_1")


def ruler_prompts(model: Any, length: int, count: int) -> list[list[int]]:
    """``count`` RULER prompts of ``length`` tokens (chat format), as token ids, tasks interleaved."""

    limit = math.ceil(count / len(TASKS))
    tok, samples = benchmark_samples(model, build_benchmark(BenchmarkConfig("ruler", length, TASKS, limit)))
    by_task = [[s for s in samples if s.task == t] for t in TASKS]
    ordered = [s for group in itertools.zip_longest(*by_task) for s in group if s is not None]
    return [sample_prompt(s, tok)[0].input_ids.tolist() for s in ordered[:count]]


def _quantile(xs: list[float], q: float) -> float:
    return float(statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1])


@dataclass
class Tally:
    """One setting's measurements, pooled over its rounds: latency, queue time and plan
    share per request; size, prompt tokens and padded tokens (size x longest) per batch."""

    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    queues: list[float] = field(default_factory=list)
    plans: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    tokens: int = 0
    padded: int = 0

    def row(self, clients: int, settings: FrontSettings) -> dict[str, Any]:
        n = len(self.latencies)
        return {
            "clients": clients,
            **dataclasses.asdict(settings),
            "requests": n,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(n / self.wall_s, 4),
            "latency_p50_s": round(_quantile(self.latencies, 0.5), 3),
            "latency_p90_s": round(_quantile(self.latencies, 0.9), 3),
            "latency_mean_s": round(statistics.fmean(self.latencies), 3),
            "batches": len(self.sizes),
            "mean_batch_size": round(n / len(self.sizes), 2),
            "max_batch_size_seen": max(self.sizes),
            "padding_overhead": round(self.padded / self.tokens - 1, 4),
            "queue_mean_s": round(statistics.fmean(self.queues), 3),
            "plan_share_mean_s": round(statistics.fmean(self.plans), 3),
        }


async def drive(
    planner: Planner, settings: FrontSettings, prompts: list[list[int]], clients: int, todo: range, tally: Tally
) -> None:
    """``clients`` closed-loop clients send the requests ``todo`` (request i plans
    ``prompts[i % len(prompts)]``) through a fresh batcher; adds what they measure to ``tally``."""

    def run(batch: list[list[int]]) -> list[Planned]:
        tally.sizes.append(len(batch))
        tally.tokens += sum(len(ids) for ids in batch)
        tally.padded += len(batch) * max(len(ids) for ids in batch)
        return planner.plan_batch(batch)

    batcher: Batcher[list[int], Planned] = Batcher(run, settings, len)
    queue = iter(todo)

    async def client() -> None:
        for i in queue:
            t0 = time.perf_counter()
            (_, _, log), info = await batcher.submit(prompts[i % len(prompts)])
            tally.latencies.append(time.perf_counter() - t0)
            tally.queues.append(info.queue_s)
            tally.plans.append(float(log["plan_s"]))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        await batcher.close()
    tally.wall_s += time.perf_counter() - t0


def table(rows: list[dict[str, Any]]) -> str:
    import pandas as pd

    serial = {r["clients"]: r["requests_per_s"] for r in rows if r["front"] == "before"}
    cells = [
        {
            "clients": r["clients"],
            "front": f"{r['front']} (max_batch {r['max_batch']})",
            "req/s": f"{r['requests_per_s']:.3f}",
            "vs before": f"{r['requests_per_s'] / serial[r['clients']]:.2f}x",
            "p50 latency s": f"{r['latency_p50_s']:.2f}",
            "p90 latency s": f"{r['latency_p90_s']:.2f}",
            "mean batch": f"{r['mean_batch_size']:.1f}",
            "padding": f"{100 * r['padding_overhead']:.0f}%",
        }
        for r in rows
    ]
    return md_table(pd.DataFrame(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=32, help="requests per setting")
    ap.add_argument("--rounds", type=int, default=2, help="before/after alternate this many times per setting")
    ap.add_argument("--length", type=int, default=2048, help="RULER prompt length (tokens)")
    ap.add_argument("--prompts", type=int, default=32, help="distinct RULER prompts, cycled")
    ap.add_argument("--out", type=Path, default=Path("results/reference/front_throughput.json"))
    a = ap.parse_args()

    model = model_config("smollm2-135m")
    t0 = time.perf_counter()
    prompts = ruler_prompts(model, a.length, a.prompts)
    planner = Planner({"model": dataclasses.asdict(model), "method": METHOD})
    setup_s = time.perf_counter() - t0
    dtype = str(next(planner.backend.base.parameters()).dtype).removeprefix("torch.")  # the speculator
    lengths = [len(p) for p in prompts]
    spread = f"{min(lengths)}-{max(lengths)} tokens"
    print(f"{len(prompts)} RULER prompts of {spread}; speculator {model.speculator} in {dtype}; setup {setup_s:.1f}s")
    t0 = time.perf_counter()
    planner.plan_batch(prompts[:1])  # warm-up: first-call allocations, the padded batch path
    planner.plan_batch(prompts[1:3])
    print(f"warm-up {time.perf_counter() - t0:.1f}s", flush=True)

    fronts = {"before": FrontSettings(max_batch=1), "after": FrontSettings()}
    rows = []
    for clients in a.clients:
        tallies = {name: Tally() for name in fronts}
        cuts = [a.requests * r // a.rounds for r in range(a.rounds + 1)]
        for lo, hi in itertools.pairwise(cuts):  # before and after alternate on the same requests: drift hits both
            for name, settings in fronts.items():
                asyncio.run(drive(planner, settings, prompts, clients, range(lo, hi), tallies[name]))
        for name, settings in fronts.items():
            row = {"front": name, **tallies[name].row(clients, settings)}
            rows.append(row)
            print(
                f"{clients:>2} clients, {name:<6}: {row['requests_per_s']:.3f} req/s, p50 {row['latency_p50_s']:.2f}s,"
                f" p90 {row['latency_p90_s']:.2f}s, mean batch {row['mean_batch_size']:.1f} ({row['wall_s']:.0f}s)",
                flush=True,
            )
    print()
    print(table(rows))
    write_reference(
        a.out,
        "front_throughput",
        rows,
        model=f"{model.name}, speculator {model.speculator}, {dtype}",
        method=METHOD,
        prompts=f"RULER {a.length} ({', '.join(TASKS)}), {len(prompts)} prompts of {spread}",
        rounds=a.rounds,
        setup_s=round(setup_s, 1),
    )


if __name__ == "__main__":
    main()
