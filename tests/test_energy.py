"""Energy per request (harness/energy.py): the NVML reader against a stand-in NVML, the RAPL
reader against a stand-in powercap tree, the marks a timed call leaves on the tiny model,
and the summary's energy columns on constructed rows, worked out by hand."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness import energy
from harness.analysis.speed import summarize_latency
from harness.energy import NOT_MEASURABLE, EnergyWindow, Unavailable, nvml_meter, rapl_meter
from harness.rendering.tables import latency_markdown


class StandInNVML:
    """pynvml's calls the reader makes, over GPUs whose counters run at ``watts`` each (a
    clock-driven counter: the joules of a window are its seconds x the watts)."""

    def __init__(self, uuids: list[str], watts: float = 300.0, energy: bool = True) -> None:
        self.uuids, self.watts, self.energy, self.t0 = uuids, watts, energy, time.perf_counter()
        self.reads: list[int] = []

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-" + self.uuids[h]

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        if not self.energy:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        self.reads.append(h)
        # millijoules since the driver loaded; each GPU started at another count
        return int(1e6 * (h + 1) + 1e3 * self.watts * (time.perf_counter() - self.t0))


def test_nvml_reads_the_gpus_this_process_sees_summed_in_joules():
    nvml = StandInNVML(["aaaa-1", "bbbb-2", "cccc-3"])
    m = nvml_meter(nvml, visible=["CCCC-3", "aaaa-1"])  # torch's UUIDs: no "GPU-", any case
    assert m.source.startswith("nvml: 2 GPU(s) this process sees (NVIDIA H200)")
    nvml.reads.clear()
    a = m.read()
    assert sorted(nvml.reads) == [0, 2]  # not GPU 1
    time.sleep(0.05)
    b = m.read()
    assert a is not None and b is not None
    assert a == pytest.approx((1e6 * 1 + 1e6 * 3) / 1e3, abs=200)  # the offsets of GPUs 0 and 2, in joules
    assert b - a == pytest.approx(2 * 300 * 0.05, rel=0.5)  # two GPUs at 300 W for 50 ms
    every = nvml_meter(StandInNVML(["a", "b"]), visible=None)
    assert "every GPU of the node" in every.source


def test_nvml_says_why_it_cannot_read():
    assert nvml_meter(StandInNVML(["a"], energy=False)).source.startswith(NOT_MEASURABLE + "NVML has no energy counter")
    gone = nvml_meter(StandInNVML(["a"]), visible=["b"])
    assert isinstance(gone, Unavailable) and "does not list this process's GPU(s) ['b']" in gone.source
    assert gone.read() is None

    class NoDriver(StandInNVML):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    assert (
        nvml_meter(NoDriver(["a"])).source
        == NOT_MEASURABLE + "NVML did not start (RuntimeError: NVML_ERROR_DRIVER_NOT_LOADED)"
    )


def test_nvml_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert nvml_meter().source == NOT_MEASURABLE + "nvidia-ml-py (pynvml) is not installed"


def _zone(root: Path, name: str, label: str, uj: int, max_uj: int = 1000_000_000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_sums_the_packages_and_unwraps(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 999_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 5)  # a package's sub-zone: not counted again
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 2_000_000)
    _zone(tmp_path, "intel-rapl:2", "psys", 7)  # the platform zone: not a package
    m = rapl_meter(tmp_path)
    assert m.source == "rapl: package-0, package-1, the whole socket(s)"
    a = m.read()
    assert a == pytest.approx(999 + 2)
    # package 0 wraps past its range (1000 J): 999 J -> 3 J reads as 4 J more, package 1 adds 5 J
    (p0 / "energy_uj").write_text("2999999\n")
    (p1 / "energy_uj").write_text("7000000\n")
    b = m.read()
    assert b is not None and b - a == pytest.approx((1000 + 0.000001 - 999 + 2.999999) + 5)


def test_rapl_says_why_it_cannot_read(tmp_path, monkeypatch):
    assert rapl_meter(tmp_path / "none").source == (
        NOT_MEASURABLE + f"no RAPL: {tmp_path / 'none'} is absent (a virtual machine, or a kernel without the "
        "powercap driver)"
    )
    _zone(tmp_path, "intel-rapl:0", "psys", 1)
    assert rapl_meter(tmp_path).source == NOT_MEASURABLE + f"no RAPL package zone under {tmp_path}"
    _zone(tmp_path, "intel-rapl:1", "package-0", 1)
    real = Path.read_text

    def root_only(self: Path, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", root_only)
    assert "readable by root only" in rapl_meter(tmp_path).source


def test_a_window_that_did_not_advance_reads_none_with_the_reason():
    class Still:
        source = "stand-in"

        def read(self) -> float:
            return 5.0

    w = EnergyWindow(Still())
    w.mark("start")
    w.mark("prefill_end")
    j, why = w.joules("start", "prefill_end")
    assert j is None and why.startswith(NOT_MEASURABLE + "the counter did not advance")
    assert (
        w.joules("start", "decode_end")[1]
        == NOT_MEASURABLE + "the backend marked no 'decode_end' (its timed call cannot be split)"
    )


def test_the_timed_call_marks_the_ttft_window_and_the_decode_apart(backend, monkeypatch):
    """The tiny model timed under a stand-in NVML at 300 W: the TTFT window's joules are 300 x
    its seconds and the decode's 300 x its own (were the marks misplaced, e.g. the whole call
    counted, the TTFT ratio would carry the decode's seconds)."""
    import torch

    from harness.timing import measure
    from specprefill.method import FullPrefill
    from specprefill.plan import Prompt

    nvml = StandInNVML(["x"], watts=300.0)
    monkeypatch.setattr(energy, "meter_for", lambda device: nvml_meter(nvml, visible=None))
    prompt = Prompt(input_ids=torch.from_numpy(np.random.default_rng(0).integers(5, 400, size=1500)))
    row = measure(FullPrefill(), [prompt], backend, decode_tokens=12)
    assert row["energy_source"].startswith("nvml: every GPU of the node")
    assert row["energy_j"] == pytest.approx(300 * row["ttft_s"], rel=0.1)
    assert row["decode_energy_j"] == pytest.approx(300 * row["decode_s"], rel=0.1)
    assert backend.energy_mark is None  # the backend is left as it was


def test_on_this_machine_the_columns_say_what_they_read_or_why_not(backend):
    import torch

    from harness.timing import measure
    from specprefill.method import FullPrefill
    from specprefill.plan import Prompt

    row = measure(FullPrefill(), [Prompt(input_ids=torch.arange(5, 300))], backend)
    if row["energy_j"] is None:  # no RAPL readable here (this project's CI machine: no powercap tree)
        assert row["energy_source"].startswith(NOT_MEASURABLE)
    else:
        assert row["energy_source"].startswith("rapl: ") and row["energy_j"] > 0


def _rows(ref_j: list[float] | None, method_j: list[float] | None, batch: int = 2, n: int = 6) -> pd.DataFrame:
    rows = []
    for method, joules in (("full", ref_j), ("x", method_j)):
        for i in range(n):
            j = None if joules is None else joules[i]
            rows.append({"run_id": "a", "model": "m", "backend": "b", "prompt_source": "random", "batch": batch,
                         "length": 1000, "method": method, "keep_rate": 0.3 if method == "x" else None,
                         "reference_method": "full", "iteration": i, "warmup": False, "status": "ok", "ttft_s": 1.0,
                         "method_s": 0.0, "base_prefill_s": 1.0, "kept_fraction": 1.0, "prompt_tokens": 1000.0,
                         "ideal_speedup": 2.0 if method == "x" else 1.0, "method_options": "{}", "config_hash": "a",
                         "dtype": "x", "order": (i + (method == "x")) % 2, "energy_j": j,
                         "energy_source": "nvml: stand-in" if j is not None else NOT_MEASURABLE + "stand-in reason"})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_summary_by_hand():
    ref = [400.0, 410.0, 390.0, 405.0, 395.0, 400.0]
    x = [200.0, 200.0, 200.0, 250.0, 200.0, 160.0]
    s = summarize_latency(_rows(ref, x)).set_index("method")
    ratios = sorted(r / m for r, m in zip(ref, x, strict=True))  # 2.0, 2.05, 1.95, 1.62, 1.975, 2.5
    assert s.loc["x", "energy_ratio"] == pytest.approx((ratios[2] + ratios[3]) / 2)
    assert s.loc["x", "energy_ratio_lo"] <= s.loc["x", "energy_ratio"] <= s.loc["x", "energy_ratio_hi"]
    assert s.loc["x", "energy_j_per_request"] == pytest.approx(200.0 / 2)  # batch of 2
    assert s.loc["x", "energy_j_per_token"] == pytest.approx(200.0 / 2 / 1000)
    assert s.loc["full", "energy_j_per_request"] == pytest.approx(400.0 / 2) and s.loc["full", "energy_ratio"] == 1.0
    md = latency_markdown(s.reset_index())
    assert "Energy: nvml: stand-in." in md and "| energy_ratio" in md


def test_no_counter_no_zeros_and_the_reason_in_the_report():
    s = summarize_latency(_rows(None, None)).set_index("method")
    assert s["energy_j_per_request"].isna().all() and s["energy_ratio"].isna().all()
    assert s.loc["x", "energy_source"] == NOT_MEASURABLE + "stand-in reason"
    md = latency_markdown(s.reset_index())
    assert "Energy: not measurable here: stand-in reason." in md and "| energy_ratio" not in md
