"""Energy of a timed call, from the hardware's own cumulative counters.

Two readers, chosen by where the work runs (:func:`meter_for`):

- **NVIDIA GPUs**: NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded; Volta and newer), read through nvidia-ml-py
  (``pynvml``) for each GPU this process sees (matched to NVML's by UUID, so
  ``CUDA_VISIBLE_DEVICES`` and CUDA's device order are honoured), summed. The counter covers
  the whole board, other processes on it included.
- **CPUs with RAPL** (Intel; AMD Zen through the same powercap driver): the package zones'
  ``energy_uj`` under ``/sys/class/powercap/intel-rapl:N`` (wrap-around handled with
  ``max_energy_range_uj``), summed over the packages. A package counts the whole socket:
  idle cores and other processes included.

Where neither can be read the meter says why (:attr:`Meter.source` starts with
``"not measurable here: "``) and every reading is None: no silent zeros. A window in which
the counter did not advance (shorter than the counter's update period) reads None too,
with the reason in :func:`EnergyWindow.joules`'s second value.

Kept free of Hydra and the benchmarks, like :mod:`harness.timing`, so that the bare GPU
check can import it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: What :attr:`Meter.source` starts with where nothing can be read.
NOT_MEASURABLE = "not measurable here: "
#: Where the kernel's powercap driver lists its RAPL zones.
POWERCAP = Path("/sys/class/powercap")


class Meter(Protocol):
    """A cumulative energy counter: ``read()`` gives joules since some fixed origin, or None;
    ``source`` says what it reads (or why it reads nothing)."""

    @property
    def source(self) -> str: ...

    def read(self) -> float | None: ...


@dataclass
class Unavailable:
    """No counter here; ``source`` says why."""

    reason: str

    @property
    def source(self) -> str:
        return NOT_MEASURABLE + self.reason

    def read(self) -> float | None:
        return None


@dataclass
class NvmlMeter:
    """NVML's total energy counters of ``handles`` (millijoules), summed, in joules."""

    nvml: Any
    handles: list[Any]
    source: str

    def read(self) -> float | None:
        return sum(int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles) / 1e3


@dataclass
class RaplZone:
    path: Path
    name: str
    max_range_uj: int


@dataclass
class RaplMeter:
    """The RAPL package zones' ``energy_uj``, summed and unwrapped, in joules."""

    zones: list[RaplZone]
    source: str
    _last: list[int] = field(default_factory=list)
    _wrapped: list[int] = field(default_factory=list)

    def read(self) -> float | None:
        now = [int((z.path / "energy_uj").read_text()) for z in self.zones]
        if not self._last:
            self._last, self._wrapped = now, [0] * len(now)
        for i, (z, a, b) in enumerate(zip(self.zones, self._last, now, strict=True)):
            if b < a:  # the counter wrapped since the last reading (reads must come within one range)
                self._wrapped[i] += z.max_range_uj + 1
        self._last = now
        return sum(n + w for n, w in zip(now, self._wrapped, strict=True)) / 1e6


def _uuid(s: object) -> str:
    """A GPU UUID as NVML and torch both can write it: lower case, without ``GPU-``."""
    text = str(s).strip().lower()
    return text.removeprefix("gpu-")


def _visible_uuids() -> list[str] | None:
    """The UUIDs of the CUDA devices this process sees (torch's), None where torch cannot say."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return [_uuid(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    except Exception:
        return None


def nvml_meter(nvml: Any = None, visible: list[str] | None = None) -> Meter:
    """NVML's counters of the GPUs this process sees (``visible``: their UUIDs, torch's by
    default; None: every GPU of the node, and the source says so); :class:`Unavailable`
    with the reason where nvidia-ml-py, the driver or the counter is missing."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return Unavailable("nvidia-ml-py (pynvml) is not installed")
        nvml = pynvml
    try:
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception as e:
        return Unavailable(f"NVML did not start ({type(e).__name__}: {e})")
    if not handles:
        return Unavailable("NVML sees no GPU")
    by_uuid = {_uuid(nvml.nvmlDeviceGetUUID(h)): h for h in handles}
    which = "every GPU of the node (this process's could not be told)"
    if visible is not None:
        visible = [_uuid(u) for u in visible]
        missing = [u for u in visible if u not in by_uuid]
        if missing:
            return Unavailable(f"NVML does not list this process's GPU(s) {missing} (MIG or a container's view)")
        handles = [by_uuid[u] for u in visible]
        which = f"{len(handles)} GPU(s) this process sees"
    names = sorted({str(nvml.nvmlDeviceGetName(h)) for h in handles})
    try:
        for h in handles:
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception as e:
        return Unavailable(
            f"NVML has no energy counter on {', '.join(names)} ({type(e).__name__}: {e}; Volta or newer)"
        )
    return NvmlMeter(nvml, handles, f"nvml: {which} ({', '.join(names)}), the whole board")


def rapl_meter(root: Path = POWERCAP) -> Meter:
    """The RAPL package zones under ``root``; :class:`Unavailable` with the reason where the
    tree is absent, has no package zone, or cannot be read by this user."""
    if not root.is_dir():
        return Unavailable(f"no RAPL: {root} is absent (a virtual machine, or a kernel without the powercap driver)")
    zones = []
    for d in sorted(root.glob("intel-rapl:*")):
        if d.name.count(":") != 1:  # intel-rapl:N:M are a package's sub-zones (core, dram)
            continue
        with contextlib.suppress(OSError, ValueError):
            name = (d / "name").read_text().strip()
            if name.startswith("package"):
                zones.append(RaplZone(d, name, int((d / "max_energy_range_uj").read_text())))
    if not zones:
        return Unavailable(f"no RAPL package zone under {root}")
    try:
        for z in zones:
            int((z.path / "energy_uj").read_text())
    except PermissionError:
        return Unavailable(
            f"{zones[0].path / 'energy_uj'} is readable by root only (Linux 5.10 and later, after CVE-2020-8694)"
        )
    except (OSError, ValueError) as e:
        return Unavailable(f"RAPL's energy_uj cannot be read ({type(e).__name__}: {e})")
    names = ", ".join(z.name for z in zones)
    return RaplMeter(zones, f"rapl: {names}, the whole socket(s)")


@functools.cache
def meter_for(device: str) -> Meter:
    """The meter for work on ``device`` (``cuda`` or ``cpu``), built once per process."""
    if device == "cuda":
        return nvml_meter(visible=_visible_uuids())
    return rapl_meter()


def device_of(backend: Any) -> str:
    """Where ``backend``'s base model runs: its ``device``'s type where it has one, else CUDA
    where torch sees a GPU (vLLM's engine), else the CPU."""
    dev = getattr(backend, "device", None)
    kind = getattr(dev, "type", None) or (dev if isinstance(dev, str) else None)
    if kind:
        return "cuda" if str(kind).startswith("cuda") else "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


@dataclass
class EnergyWindow:
    """Readings of one meter at named marks (``start`` first): what a backend calls through
    :attr:`mark` at the points of its timed call (``prefill_end``, ``decode_start``,
    ``decode_end``)."""

    meter: Meter
    readings: dict[str, float | None] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.readings[name] = self.meter.read()

    def joules(self, start: str, end: str) -> tuple[float | None, str]:
        """The joules between two marks and the source (or why there are none)."""
        a, b = self.readings.get(start), self.readings.get(end)
        if isinstance(self.meter, Unavailable):
            return None, self.meter.source
        if a is None or b is None:
            missing = start if a is None else end
            return None, f"{NOT_MEASURABLE}the backend marked no '{missing}' (its timed call cannot be split)"
        if b <= a:
            return (
                None,
                f"{NOT_MEASURABLE}the counter did not advance between '{start}' and '{end}' ({self.meter.source})",
            )
        return b - a, self.meter.source


@contextlib.contextmanager
def energy_window(backend: Any, meter: Meter | None = None) -> Iterator[EnergyWindow]:
    """An :class:`EnergyWindow` on ``backend``'s meter (:func:`meter_for` its device unless
    given), marked ``start`` on entry; the backend sees its ``mark`` as ``energy_mark`` for
    the body's duration (and None again after)."""
    w = EnergyWindow(meter if meter is not None else meter_for(device_of(backend)))
    previous: Callable[[str], None] | None = getattr(backend, "energy_mark", None)
    with contextlib.suppress(AttributeError):
        backend.energy_mark = w.mark
    w.mark("start")
    try:
        yield w
    finally:
        with contextlib.suppress(AttributeError):
            backend.energy_mark = previous
