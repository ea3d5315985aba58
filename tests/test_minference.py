"""MInference acts inside the model, so it runs inside its scoped hook (``Method.applied``):
the reference measured beside it in one latency job never runs patched, and leaving the
hook restores the model exactly. The ``minference`` package needs CUDA, so a stand-in
patches the model the way the package's ``new_patch`` / ``patch_hf`` do (v0.1.6): an
instance ``forward`` on every attention module, instance methods on the model, attributes
on its config, a registered submodule; its attention counts the calls made while patched."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from hydra import compose, initialize_config_dir

import baselines.minference as mi
from harness.jobs import latency as lat
from harness.store import RunStore
from specprefill.backends.transformers import TransformersBackend

CONF = str(Path(__file__).resolve().parents[1] / "conf")


class FakeMInference:
    """``minference.MInference(attn_type, model_name)(model)``, patching as the package does."""

    calls: ClassVar[int] = 0  # attention forwards run while patched
    made: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, attn_type: str, model_name: str) -> None:
        self.args = (attn_type, model_name)

    def __call__(self, model: Any) -> Any:
        FakeMInference.made.append(self.args)
        attention = type(model.model.layers[0].self_attn)

        def sparse(self: Any, *args: Any, **kwargs: Any) -> Any:
            FakeMInference.calls += 1
            return attention.forward(self, *args, **kwargs)

        def update(m: torch.nn.Module) -> None:
            if isinstance(m, attention):
                m.forward = (lambda self, *a, **k: sparse(self, *a, **k)).__get__(m, attention)

        model.apply(update)
        model._prepare_cache_for_generation = (lambda self, *a, **k: None).__get__(model, type(model))
        model.model._old_forward = model.model.forward
        model.config.starting_layer = -1
        model.config.config_path = ""
        model.model.position_bias = torch.nn.Identity()  # nn.Module.__setattr__ registers it in _modules
        return model


@pytest.fixture
def fake_minference(monkeypatch):
    """CUDA and the package, faked: ``unsupported_reason`` says it can run, ``import minference`` gets the stand-in."""
    fake = types.ModuleType("minference")
    fake.MInference = FakeMInference  # type: ignore[attr-defined]
    fake.__spec__ = importlib.machinery.ModuleSpec("minference", None)
    monkeypatch.setitem(sys.modules, "minference", fake)
    monkeypatch.setattr(mi, "unsupported_reason", lambda: None)
    FakeMInference.calls, FakeMInference.made = 0, []
    return FakeMInference


def _lat(tmp_path: Path, *overrides: str) -> lat.LatencyJob:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=tiny-random", f"out={tmp_path}", *overrides])
    return lat.prepare(lat.LatencyConfig.from_hydra(cfg))


def _patched(model: torch.nn.Module) -> bool:
    return any("forward" in vars(m) for m in model.modules()) or "position_bias" in model.model._modules


def test_the_reference_beside_minference_never_runs_patched(tmp_path, monkeypatch, fake_minference):
    """Interleaved on one backend: full prefill, then MInference, every iteration. Each
    prefill notes whether patched attention ran in it; the reference's never did."""
    monkeypatch.chdir(tmp_path)
    ran_patched: list[bool] = []
    bases: list[Any] = []
    prefill = TransformersBackend.prefill

    def noting(self: TransformersBackend, plans: Any, *decode: Any) -> float:
        before = fake_minference.calls
        out = prefill(self, plans, *decode)
        ran_patched.append(fake_minference.calls > before)
        bases.append(self.base)
        return out

    monkeypatch.setattr(TransformersBackend, "prefill", noting)
    job = _lat(tmp_path, "method=minference", "grid=[[1,32],[2,48]]", "warmup=1", "iters=2")
    assert [m.name for m in job.methods] == ["full", "minference"]
    rows = RunStore(lat.execute(job)).read()
    assert (rows["status"] == "ok").all() and len(rows) == 2 * 3 * 3
    # 2 points x 3 iterations, each: the reference and its A/A copy (unpatched) and MInference
    # (patched), in the order harness.timing.iteration_order gives (index 2: MInference)
    from harness.timing import iteration_order

    orders = [iteration_order(0, 3), *(iteration_order(i, 3, 2) for i in range(2))]
    assert ran_patched == [j == 2 for _ in range(2) for o in orders for j in o]
    assert fake_minference.made and {a[0] for a in fake_minference.made} == {"minference"}
    assert not _patched(bases[-1])  # the job leaves the model as it found it


def test_leaving_the_hook_restores_the_model_exactly(tiny_llama, fake_minference):
    """The forward functions, instance attributes, submodules and config after the hook are
    the originals (the same objects), whether its body returns or raises."""
    model = tiny_llama
    backend = types.SimpleNamespace(base=model)
    method = mi.MInference()

    def state() -> list[Any]:
        mods = [(n, dict(vars(m)), dict(m._modules)) for n, m in model.named_modules()]
        return [mods, dict(vars(model.config)), model.forward, model.model.forward]

    def same(a: list[Any], b: list[Any]) -> bool:
        (ma, ca, *fa), (mb, cb, *fb) = a, b
        if [n for n, _, _ in ma] != [n for n, _, _ in mb] or ca != cb or fa != fb:
            return False
        for (_, da, sa), (_, db, sb) in zip(ma, mb, strict=True):
            if da.keys() != db.keys() or any(da[k] is not db[k] for k in da) or sa != sb:
                return False
        return True

    before = state()
    x = torch.arange(1, 9)[None]
    dense = model(x).logits
    with method.applied(backend):
        assert _patched(model) and not same(before, state())
        calls = fake_minference.calls
        torch.testing.assert_close(model(x).logits, dense)  # the stand-in is dense attention, counted
        assert fake_minference.calls == calls + model.config.num_hidden_layers
    assert same(before, state()) and not _patched(model)
    calls = fake_minference.calls
    model(x)
    assert fake_minference.calls == calls  # the original attention runs again
    with pytest.raises(ValueError, match="boom"), method.applied(backend):
        assert _patched(model)
        raise ValueError("boom")
    assert same(before, state()) and not _patched(model)


def test_every_method_that_overrides_the_hook_says_it_acts_inside_the_model():
    from specprefill.plan import _REGISTRY, Method

    for name, cls in _REGISTRY.items():
        assert cls.acts_in_model == (cls.applied is not Method.applied), name
    assert mi.MInference.acts_in_model


def test_a_method_acting_inside_the_model_is_refused_where_the_hook_cannot_reach_it(tmp_path):
    """vLLM owns its model: MInference on it would record every sample unsupported beside a
    reference run at full cost, so each entry point refuses it before anything loads."""
    import dataclasses

    from harness.jobs import eval as run
    from harness.models.catalog import model_config
    from harness.serving.front import Planner

    with pytest.raises(ValueError, match=r"'minference' acts inside the base model.*backend='vllm'"):
        _lat(tmp_path, "method=minference", "backend=vllm")
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=tiny-random", "method=minference", "backend=vllm"])
    with pytest.raises(ValueError, match="acts inside the base model"):
        run.prepare(run.EvalConfig.from_hydra(cfg))
    with pytest.raises(ValueError, match="acts inside the base model, which runs in vLLM's server"):
        Planner({"model": dataclasses.asdict(model_config("tiny-random")), "method": {"name": "minference"}})
    assert _lat(tmp_path, "method=minference").methods[1].acts_in_model  # transformers: runs


def _eval_job(tmp_path: Path, *overrides: str) -> Any:
    from harness.jobs import eval as run

    common = ["model=tiny-random", "length=1024", "tasks=[niah_single_1,vt]", "limit=1", f"out={tmp_path / 'res'}"]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method=minference", *common, *overrides])
    return run.prepare(run.EvalConfig.from_hydra(cfg))


def test_eval_without_cuda_records_every_sample_unsupported(tmp_path, monkeypatch):
    from harness.jobs import eval as run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = RunStore(run.execute(_eval_job(tmp_path))).read()
    assert len(rows) == 2 and set(rows["status"]) == {"unsupported"}
    assert rows["error"].str.startswith("minference needs a CUDA GPU").all()


def test_eval_decodes_each_sample_inside_the_hook(tmp_path, monkeypatch, fake_minference):
    from harness.jobs import eval as run

    monkeypatch.chdir(tmp_path)
    ran_patched: list[bool] = []
    bases: list[Any] = []
    generate = TransformersBackend.generate

    def noting(self: TransformersBackend, *args: Any, **kwargs: Any) -> Any:
        before = fake_minference.calls
        out = generate(self, *args, **kwargs)
        ran_patched.append(fake_minference.calls > before)
        bases.append(self.base)
        return out

    monkeypatch.setattr(TransformersBackend, "generate", noting)
    rows = RunStore(run.execute(_eval_job(tmp_path))).read()
    assert len(rows) == 2 and set(rows["status"]) == {"ok"} and (rows["kept_fraction"] == 1.0).all()
    assert ran_patched == [True, True] and len(fake_minference.made) == 2  # one scope per sample
    assert not _patched(bases[-1])


def test_minference_imports_through_the_package_probe_shim(tmp_path, monkeypatch):
    """MInference 0.1.6.0 guards its CUDA extensions with ``if _is_package_available(x):
    import x`` (from transformers.utils.import_utils); transformers 5 returns an always-truthy
    ``(exists, version)`` there, so the import of an absent extension runs and fails. A
    stand-in package written the same way fails to import bare and imports through
    :func:`package_probe_as_bool`, whose probe still indexes and unpacks as transformers'
    own callers do; the original function is back after the block, also after an error."""
    from transformers.utils import import_utils as iu

    pkg = tmp_path / "standin_minference"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from transformers.utils.import_utils import _is_package_available\n"
        "if _is_package_available('specprefill_absent_extension'):\n"
        "    import specprefill_absent_extension\n"
        "PRESENT = bool(_is_package_available('packaging'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    original = iu._is_package_available
    assert original("specprefill_absent_extension")  # the truthy tuple this shim exists for
    with pytest.raises(ModuleNotFoundError, match="specprefill_absent_extension"):
        importlib.import_module("standin_minference")
    sys.modules.pop("standin_minference", None)
    with mi.package_probe_as_bool():
        mod = importlib.import_module("standin_minference")
        assert iu._is_package_available("specprefill_absent_extension")[0] is False  # transformers' [0] style
        ok, version = iu._is_package_available("packaging", return_version=True)  # and its unpacking style
        assert ok and version
    assert mod.PRESENT and iu._is_package_available is original
    sys.modules.pop("standin_minference", None)
    with pytest.raises(RuntimeError, match="inside"), mi.package_probe_as_bool():
        raise RuntimeError("inside")
    assert iu._is_package_available is original
    monkeypatch.setattr(iu, "_is_package_available", lambda name, *a, **k: False)  # transformers 4: a bool
    with mi.package_probe_as_bool():
        assert iu._is_package_available("x") is False
