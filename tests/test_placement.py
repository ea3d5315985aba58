"""Placement: weight memory from a checkpoint's architecture (hand-counted), the speculator's
room beside the engine, the engine's share of each GPU, and what is refused before loading."""

from __future__ import annotations

import pytest

from harness.models import model_config
from harness.placement import GIB, RESERVE_GIB, plan, quantization, speculator_prefill_bytes, weight_bytes

# A toy checkpoint: hidden 8, 2 layers, 2 heads of 4, 1 KV head, MLP 16, vocabulary 10.
TOY = {
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": False,
}  # fmt: skip


def test_weight_bytes_by_hand():
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, MLP 3x8x16 = 384, two norms 16
    per_layer = 192 + 384
    assert weight_bytes(TOY, "bfloat16") == 2 * (80 + 8 + 80 + 2 * (per_layer + 16))
    assert weight_bytes({**TOY, "tie_word_embeddings": True}, "bfloat16") == 2 * (80 + 8 + 2 * (per_layer + 16))
    layer0 = [
        f"model.layers.0.{m}"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    kept = [*layer0, "model.layers.1.self_attn.q_proj"]  # full module paths, as the checkpoint lists them
    fp8 = {**TOY, "quantization_config": {"quant_method": "fbgemm_fp8", "modules_to_not_convert": kept}}
    assert quantization(fp8) == "fbgemm_fp8" and quantization(TOY) is None
    # embeddings, final norm and LM head in bf16 (336); layer 0 whole in bf16 (1152 + 32 of norms);
    # layer 1: q_proj (64 weights) in bf16, its other 512 weights in one byte, norms in bf16
    assert weight_bytes(fp8, "bfloat16") == 336 + 1184 + (128 + 512 + 32)


def test_speculator_prefill_bytes_by_hand():
    # KV cache 2 x 2 layers x 1 x 4 x n, the keys again (2 x 1 x 4 x n), activations n x (32 + 48); bf16
    m = speculator_prefill_bytes(TOY, 100)
    assert (m.kv_cache, m.keys, m.activations) == (2 * 1600, 2 * 800, 2 * 100 * 80)
    assert speculator_prefill_bytes(TOY, 100, chunk=10).activations == 2 * 10 * 80  # one chunk's forward


def test_multi_gpu_models_are_refused_on_the_transformers_backend():
    with pytest.raises(
        ValueError, match=r"needs 8 GPUs .*transformers backend runs a model on one device; use backend=vllm"
    ):
        plan(model_config("llama70b"), "transformers", True)
    assert plan(model_config("smollm2-135m"), "transformers", True).gpus == 1


def test_the_engine_leaves_room_for_the_speculator_on_its_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = plan(model_config("llama70b"), "vllm", True)
    assert not p.gpu_detected and p.gpu_gib == 80.0 and p.gpus == 8 and p.speculator_gpus == 8
    assert 14.0 < p.speculator_weights_gib < 15.5  # Llama-3.1-8B in bf16: about 15 GiB
    # Llama-3.1-8B at 128K tokens, 8K at a time: 16 GiB KV cache (spread with the layers), 8 GiB of keys and
    # a chunk's activations (on GPU 0)
    kv, keys, act = 16.0, 8.0, 8192 * (4 * 4096 + 3 * 14336) * 2 / 2**30
    assert p.speculator_gpu0_gib == pytest.approx((p.speculator_weights_gib + kv) / 8 + keys + act)
    assert p.gpu_memory_utilization == pytest.approx((80.0 - p.speculator_gpu0_gib - RESERVE_GIB) / 80.0)
    full = plan(model_config("llama70b"), "vllm", False)  # full prefill loads no speculator
    assert full.speculator is None and full.gpu_memory_utilization == pytest.approx(0.90)
    with pytest.raises(ValueError, match=r"the engine keeps .* less than its .* GiB of weights per GPU"):
        plan(model_config("llama405b", gpu_memory_gib=60.0), "vllm", True)
    one = plan(model_config("llama8b", gpu_memory_gib=141.0), "vllm", True)  # TP 1: the speculator shares GPU 0
    assert one.speculator_gpus == 1 and one.speculator_gpu0_gib > one.speculator_weights_gib


def test_the_fp8_checkpoint_is_planned_with_its_own_quantization_and_never_forced(monkeypatch, tmp_path):
    import torch

    from harness import models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = plan(model_config("llama405b"), "vllm", True)
    assert p.quantization == "fbgemm_fp8" and 440 < p.base_weights_gib < 470  # attention in bf16, most MLPs in FP8
    assert plan(model_config("llama405b-bf16-2node"), "vllm", True).quantization is None
    monkeypatch.setattr(models, "vllm_model", lambda cfg: (cfg.path, "auto"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the engine arguments of a GPU run
    args = models.vllm_engine_args(model_config("llama405b"), p.gpu_memory_utilization)
    assert "quantization" not in args and args["dtype"] == "bfloat16" and args["tensor_parallel_size"] == 8
    assert args["gpu_memory_utilization"] == p.gpu_memory_utilization and args["allow_deprecated_quantization"]
    with pytest.raises(ValueError, match=r"dtype='fp8'.*declares its quantization in its own config"):
        model_config("llama405b", dtype="fp8")


def test_paper_models_default_to_vllm_and_the_dry_run_says_what_they_need(capsys):
    from hydra import compose, initialize_config_dir

    from harness.config import CONF
    from harness.run import RunConfig, main

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=llama405b", "keep=0.1", "dry_run=true"])
        assert RunConfig.from_hydra(cfg).backend == "vllm"
        smol = compose(config_name="config", overrides=["model=smollm2-135m"])
        assert RunConfig.from_hydra(smol).backend == "transformers"
    main.__wrapped__(cfg)  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "backend=vllm" in out and "tensor_parallel 8" in out and "needs 8 GPU(s)" in out
    assert "quantization fbgemm_fp8 (the checkpoint's own)" in out and "vLLM gpu_memory_utilization" in out
    assert "speculator hub:meta-llama/Llama-3.1-8B-Instruct (bf16) on its layers spread over the 8 GPUs" in out


def test_gib():
    assert GIB == 1024**3
