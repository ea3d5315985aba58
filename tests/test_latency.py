"""TTFT grid: FLOPs model, batched capture, a short real run that resumes, config errors."""

from __future__ import annotations

import pytest
import torch

from harness import latency as lat
from harness.models import load, model_config
from specprefill.backends.transformers import TransformersBackend


def test_flops_model_by_hand():
    s = lat.Shape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)
    # per layer: q 8*8, k and v 8*4 each, o 8*8, MLP 3*8*16 -> 64+64+64+384 = 576 MACs, x2 FLOPs, x2 layers
    assert s.linear_per_token == 2 * 2 * 576
    assert s.attention_per_pair == 2 * 4 * 2 * 4
    assert lat.causal_pairs(4) == 10
    assert lat.prefill_flops(s, 4, 10) == 4 * 2304 + 10 * 64 + 2 * 8 * 10
    full, method, speedup = lat.ideal(s, s, 100, 100, 1)
    assert method == 2 * full and speedup == pytest.approx(0.5)  # same-size speculator, keep everything
    tiny = lat.Shape(layers=1, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)
    _, m1, _ = lat.ideal(s, tiny, 100, 10, 1)
    _, m3, _ = lat.ideal(s, tiny, 100, 10, 3)
    look = lat.prefill_flops(tiny, 1, 101) + lat.prefill_flops(tiny, 1, 102)
    assert m3 - m1 == look


@pytest.fixture(scope="module")
def tiny_backend(smollm2_tokenizer):
    cfg = model_config("tiny-random", speculator="self_layers:1")
    lm = load(cfg)
    return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)


def test_batched_capture_equals_one_prompt_at_a_time(tiny_backend):
    ids = torch.randint(0, 1000, (3, 50), generator=torch.Generator().manual_seed(0))
    caps = tiny_backend.speculate_batch(ids, 3)
    for i in range(3):
        one = tiny_backend.speculate(ids[i], 3)
        torch.testing.assert_close(caps[i].queries, one.queries, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(caps[i].keys, one.keys, rtol=1e-4, atol=1e-5)
        assert caps[i].lookahead_ids == one.lookahead_ids


def _cfg(tmp_path, **kw):
    base = {
        "model": model_config("tiny-random"),
        "grid": ((2, 96), (1, 192)),
        "keeps": (0.3, 0.5),
        "warmup": 1,
        "iters": 2,
        "out": tmp_path,
        "chunk_size": 16,
        "pool_kernel": 3,
    }
    return lat.LatencyConfig(**{**base, **kw})


def test_short_grid_run_summary_and_resume(tmp_path):
    cfg = _cfg(tmp_path)
    folder = lat.run(cfg)
    rows = lat.read_rows(folder)
    # 2 points x 3 iterations x (full + 2 keeps), warm-up flagged
    assert len(rows) == 2 * 3 * 3 and rows["warmup"].sum() == 2 * 3
    assert (rows["ttft_s"] > 0).all() and not rows["prefix_cache"].any()
    spec = rows[rows["method"] == "specprefill"]
    assert (spec["ttft_s"] >= spec["speculator_s"] + spec["base_prefill_s"]).all()
    assert set(spec["kept_tokens"][spec["length"] == 192]) == {64, 96}  # whole chunks of 16: ceil(12*0.3)=4, 6
    s = lat.summarize(rows)
    assert len(s) == 2 * 3 and set(s["n"]) == {2}
    full = s[s["method"] == "full"]
    assert (full["speedup"] == 1.0).all() and (full["efficiency"] == 1.0).all()
    sp = s[s["method"] == "specprefill"]
    assert ((sp["ideal_speedup"] > 0) & (sp["efficiency"] > 0)).all()
    assert (folder / "summary.md").read_text().count("\n") == 2 + 6
    before = {p.name: p.stat().st_mtime_ns for p in (folder / "parts").iterdir()}
    lat.run(cfg)  # resumes: nothing re-measured
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "parts").iterdir()} == before


def test_config_errors_name_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"grid point \[0, 96\]"):
        _cfg(tmp_path, grid=((0, 96),))
    with pytest.raises(ValueError, match=r"keep_rate=1\.5"):
        _cfg(tmp_path, keeps=(1.5,))
    with pytest.raises(ValueError, match="beyond the model's context window"):
        _cfg(tmp_path, grid=((1, 10**7),))
    with pytest.raises(ValueError, match="no speculator"):
        _cfg(tmp_path, model=model_config("tiny-random", speculator=None))
    with pytest.raises(ValueError, match="backend='sglang'"):
        _cfg(tmp_path, backend="sglang")


def test_dry_run_plans_without_loading(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir

    from harness import models

    def boom(*a, **k):
        raise AssertionError("dry run loaded a model")

    monkeypatch.setattr(models, "_load", boom)
    from tests.test_run import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=synth8b", "grid=[[4,131072],[128,4096]]"])
    text = lat.plan_text(lat.LatencyConfig.from_hydra(cfg))
    assert "synth8b" in text and "batch=4 length=131072" in text and "batch=128 length=4096" in text
    assert "GiB" in text
