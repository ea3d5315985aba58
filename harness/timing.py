"""One measurement of TTFT: a method plans a batch of prompts, the backend prefills the plans.

Kept free of Hydra and the benchmarks so that it runs wherever PyTorch and transformers
do (``make gpu-check`` on a bare GPU machine); :mod:`harness.jobs.latency` drives it over a
grid with the store around it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.energy import EnergyWindow, energy_window
from specprefill.flops import Shape, causal_pairs, prefill_flops
from specprefill.plan import Backend, Method, Plan, Prompt


def flops(base: Shape, prompts: Sequence[Prompt], plans: Sequence[Plan], overhead: int) -> tuple[int, float]:
    """(reference FLOPs, method FLOPs) of one batch: full prefill of every prompt, against
    the method's own model calls plus the base prefill of each plan (NaN for text rewrites)."""
    full = sum(prefill_flops(base, p.n, causal_pairs(p.n)) for p in prompts)
    if any(p.kept_indices is None for p in plans):
        return full, math.nan
    return full, float(overhead + sum(prefill_flops(base, p.k, causal_pairs(p.k)) for p in plans))


def iteration_order(iteration: int, k: int, iterations: int | None = None) -> list[int]:
    """The order in which ``k`` methods are timed in ``iteration`` of ``iterations`` (indices
    into the methods timed at a point, e.g. :attr:`harness.jobs.latency.LatencyJob.timed`).

    Iterations come in twos: a rotation of ``0..k-1``, then the same rotation reversed, so
    each two consecutive iterations time every pair of methods once in each order (ABBA: an
    order effect cancels in each pair's median) and every method's mean place is the middle.
    The rotation moves by ``k / (iterations / 2)`` places from one two to the next, so over
    the run every method visits the whole range of places, the ends as often as the middle:
    with a rotation that moved one place at a time, 10 iterations of 12 methods (a
    ``also=[...]`` job) left the reference at the ends and the presses in the middle, and a
    slot effect read as a speedup. ``iterations`` None: ``2k`` (every place twice)."""
    twos = max(1, -(-(iterations or 2 * k) // 2))
    rot = ((iteration // 2) * k // twos) % k
    order = [(j + rot) % k for j in range(k)]
    return order[::-1] if iteration % 2 else order


def point_order(iteration: int, k: int, warmup: int, iterations: int) -> list[int]:
    """:func:`iteration_order` for one iteration of a grid point that starts with ``warmup``
    warm-ups: the timed iterations count from 0, so the balanced design covers exactly the
    ``iterations`` timed ones (warm-ups take their own index)."""
    if iteration < warmup:
        return iteration_order(iteration, k)
    return iteration_order(iteration - warmup, k, iterations)


#: A timed call shorter than this gets no ``foreign_cpu``: /proc/stat counts in clock ticks
#: (10 ms), so one tick of another process would read as a large share of a short call.
MIN_LOAD_WINDOW_S = 0.25


def _cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_ticks(cpus: set[int]) -> int | None:
    """Clock ticks the given CPUs spent not idle (steal included: the hypervisor ran someone
    else), from ``/proc/stat``; None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        busy += sum(v[:8]) - v[3] - v[4]  # user..steal, less idle and iowait (guest is inside user)
    return busy


def _own_cpu_s() -> float:
    """CPU seconds of this process and its live children (a vLLM engine core runs in one)."""
    try:
        import psutil

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total
    except ImportError:
        t = os.times()
        return t.user + t.system


def _cpu_mhz(cpus: set[int]) -> float | None:
    """The mean current clock of the given CPUs (cpufreq), else /proc/cpuinfo's; None where
    neither can be read (a VM's cpuinfo states its nominal clock)."""
    now = []
    for c in sorted(cpus):
        f = Path(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq")
        with contextlib.suppress(OSError, ValueError):
            now.append(int(f.read_text()) / 1000)
    if not now:
        with contextlib.suppress(OSError):
            now = [
                float(x.split(":")[1])
                for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("cpu MHz")
            ]
    return sum(now) / len(now) if now else None


@contextlib.contextmanager
def machine_load() -> Iterator[dict[str, Any]]:
    """The load on the machine while the body ran, in the dict it yields (filled on exit):
    ``foreign_cpu``, the share of this process's CPUs busy with other work (their busy
    ticks less this process's and its children's CPU time, over the CPUs x the wall time;
    None for a body shorter than :data:`MIN_LOAD_WINDOW_S` or without /proc/stat);
    ``loadavg_1m`` (the kernel's, at the end; the job's own compute threads count in it);
    ``cpus``; ``cpu_mhz`` where readable."""
    cpus = _cpus()
    out: dict[str, Any] = {"cpus": len(cpus)}
    b0, own0, t0 = _busy_ticks(cpus), _own_cpu_s(), time.perf_counter()
    try:
        yield out
    finally:
        wall, b1, own1 = time.perf_counter() - t0, _busy_ticks(cpus), _own_cpu_s()
        foreign = None
        if b0 is not None and b1 is not None and wall >= MIN_LOAD_WINDOW_S:
            hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
            foreign = max(0.0, ((b1 - b0) / hz - (own1 - own0)) / (len(cpus) * wall))
        out["foreign_cpu"] = foreign
        out["loadavg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        out["cpu_mhz"] = _cpu_mhz(cpus)


def measure(method: Method, prompts: list[Prompt], backend: Backend, decode_tokens: int = 0) -> dict[str, Any]:
    """Plan ``prompts`` with ``method`` and prefill the plans: the measured fields of a row,
    with the machine's load while they ran (:func:`machine_load`) and the energy the work
    took where the hardware counts it (:func:`energy`).

    Both run inside ``method.applied(backend)`` (a method acting inside the model patches
    it for this turn only, untimed, and leaves it as it found it), so methods measured in
    turn on one backend (a latency job's reference and method) never see each other's patch."""
    with machine_load() as load, method.applied(backend), energy_window(backend) as joules:
        backend.method_flops = 0
        t0 = time.perf_counter()
        plans = method.plan_batch(prompts, backend)
        method_s = time.perf_counter() - t0
        overhead = backend.method_flops
        # decode_tokens > 0: the backend also decodes that many tokens after the timed prefill,
        # timed apart (``last_decode_s``), outside TTFT
        base_s = backend.prefill(plans, decode_tokens) if decode_tokens else backend.prefill(plans)
        joules.mark("end")
        kv = getattr(backend, "last_kv", None)  # set by each prefill of a backend that measures its cache
    parts: dict[str, float] = {}
    for p in plans:
        for k, v in p.timings.items():
            parts[k] = parts.get(k, 0.0) + float(v)
    f_full, f_method = flops(Shape.of(backend.base_config), prompts, plans, overhead)
    mean_n = sum(p.n for p in prompts) / len(prompts)
    mean_k = sum(p.kept for p in plans) / len(plans)
    return {
        "prompt_tokens": mean_n,
        "kept_tokens": mean_k,
        "kept_fraction": mean_k / mean_n,
        "ttft_s": method_s + base_s,
        "method_s": method_s,
        "speculator_s": parts.get("speculator_s"),
        "selection_s": parts.get("selection_s"),
        "method_timings": json.dumps(parts, sort_keys=True),
        "base_prefill_s": base_s,
        "flops_full": float(f_full),
        "flops_method": f_method,
        "flops_speculator": float(overhead),
        "ideal_speedup": f_full / f_method if f_method == f_method else math.nan,
        # the KV cache after the prefill (a press's eviction included), where the backend measures it
        "kv_tokens": kv[0] if kv else None,
        "kv_bytes": kv[1] if kv else None,
        # decoding after the prefill (latency grids with decode_tokens > 0): the batch's seconds
        "decode_tokens": decode_tokens or None,
        "decode_s": getattr(backend, "last_decode_s", None) if decode_tokens else None,
        **energy(joules, decode_tokens),
        **load,
    }


def energy(window: EnergyWindow, decode_tokens: int) -> dict[str, Any]:
    """A timed call's energy columns from its marks: ``energy_j``, the batch's joules over
    the TTFT window (the method's work and the base's prefill, from the start to the
    backend's ``prefill_end``; a backend that marks nothing and decodes nothing: to the
    call's end); ``decode_energy_j`` over the decode after it (``decode_start`` to
    ``decode_end``); ``energy_source``, what was read, or ``not measurable here: <why>``
    where a column is empty."""
    split = "prefill_end" in window.readings or decode_tokens
    j, source = window.joules("start", "prefill_end" if split else "end")
    out: dict[str, Any] = {"energy_j": j, "energy_source": source, "decode_energy_j": None}
    if decode_tokens:
        dj, dsource = window.joules("decode_start", "decode_end")
        out["decode_energy_j"] = dj
        if dj is None and j is not None:
            out["energy_source"] = f"{source}; decode: {dsource}"
    return out
