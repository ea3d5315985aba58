"""Placement: weight memory from a checkpoint's architecture (hand-counted), the speculator's
room beside the engine, the engine's share of each GPU, and what is refused before loading."""

from __future__ import annotations

import re

import pytest
import torch

from harness.models.catalog import model_config
from harness.models.placement import (
    GIB,
    RESERVE_GIB,
    WINDOW_SLACK_GIB,
    architecture,
    engine_activation_bytes,
    kv_cache_bytes,
    place,
    quantization,
    speculator_prefill_bytes,
    weight_bytes,
)

#: A RULER-4K run's longest sequence: 4096 tokens (prompt + answer) + niah's 128 to generate + 256 of margin.
RULER_4K = 4096 + 128 + 256

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
        place(model_config("llama70b"), "transformers", True)
    assert place(model_config("smollm2-135m"), "transformers", True).gpus == 1


def test_the_engine_leaves_room_for_the_speculator_on_its_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = place(model_config("llama70b"), "vllm", True)
    assert not p.gpu_detected and p.gpu_gib == 80.0 and p.gpus == 8 and p.speculator_gpus == 8
    assert 14.0 < p.speculator_weights_gib < 15.5  # Llama-3.1-8B in bf16: about 15 GiB
    # Llama-3.1-8B at 128K tokens, 8K at a time: 16 GiB KV cache (spread with the layers), 8 GiB of keys and
    # a chunk's activations (on GPU 0)
    kv, keys, act = 16.0, 8.0, 8192 * (4 * 4096 + 3 * 14336) * 2 / 2**30
    assert p.speculator_gpu0_gib == pytest.approx((p.speculator_weights_gib + kv) / 8 + keys + act)
    assert p.gpu_memory_utilization == pytest.approx((80.0 - p.speculator_gpu0_gib - RESERVE_GIB) / 80.0)
    full = place(model_config("llama70b"), "vllm", False)  # full prefill loads no speculator
    assert full.speculator is None and full.gpu_memory_utilization == pytest.approx(0.90)
    with pytest.raises(ValueError, match=r"the engine keeps .* less than its .* GiB of weights per GPU"):
        place(model_config("llama405b", gpu_memory_gib=60.0), "vllm", True)
    one = place(model_config("llama8b", gpu_memory_gib=141.0), "vllm", True)  # TP 1: the speculator shares GPU 0
    assert one.speculator_gpus == 1 and one.speculator_gpu0_gib > one.speculator_weights_gib


def test_the_fp8_checkpoint_is_planned_with_its_own_quantization_and_never_forced(monkeypatch, tmp_path):
    import torch

    from harness.models import loading as models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = place(model_config("llama405b"), "vllm", True, RULER_4K)
    assert p.quantization == "fbgemm_fp8" and 440 < p.base_weights_gib < 470  # attention in bf16, most MLPs in FP8
    assert place(model_config("llama405b-bf16-2node"), "vllm", True, RULER_4K).quantization is None
    monkeypatch.setattr(models, "vllm_model", lambda cfg: (cfg.path, "auto"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the engine arguments of a GPU run
    args = models.vllm_engine_args(model_config("llama405b"), p.gpu_memory_utilization)
    assert "quantization" not in args and args["dtype"] == "bfloat16" and args["tensor_parallel_size"] == 8
    assert args["gpu_memory_utilization"] == p.gpu_memory_utilization and args["allow_deprecated_quantization"]
    with pytest.raises(ValueError, match=r"dtype='fp8'.*declares its quantization in its own config"):
        model_config("llama405b", dtype="fp8")


def test_paper_models_default_to_vllm_and_the_dry_run_says_what_they_need(capsys, monkeypatch):
    from hydra import compose, initialize_config_dir

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # planned on the config's 80 GiB GPUs

    from harness.config import CONF
    from harness.jobs.eval import EvalConfig, main

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=llama405b", "keep=0.1", "dry_run=true"])
        assert EvalConfig.from_hydra(cfg).backend == "vllm"
        smol = compose(config_name="config", overrides=["model=smollm2-135m"])
        assert EvalConfig.from_hydra(smol).backend == "transformers"
    main.__wrapped__(cfg)  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "backend=vllm" in out and "tensor_parallel 8" in out and "needs 8 GPU(s)" in out
    assert "quantization fbgemm_fp8 (the checkpoint's own)" in out and "vLLM gpu_memory_utilization" in out
    assert "speculator hub:meta-llama/Llama-3.1-8B-Instruct (bf16) on its layers spread over the 8 GPUs" in out
    # `make eval model=llama405b keep=0.1 dry_run=true`: what a user with 8 GPUs needs to know first
    assert "meta-llama/Llama-3.1-405B-Instruct-FP8 @ main (unpinned)" in out
    assert "meta-llama/Llama-3.1-8B-Instruct @ main (unpinned)" in out and "HF_TOKEN" in out
    base, spec, download = (float(x) for x in re.search(
        r"base \S+ @ main \(unpinned\) ([\d.]+) GiB; speculator \S+ @ main \(unpinned\) ([\d.]+) GiB; download ([\d.]+) GiB",
        out).groups())  # fmt: skip
    assert spec == pytest.approx(LLAMA_8B_PARAMS * 2 / 2**30, abs=0.05)
    assert download == pytest.approx(base + spec, abs=0.1)
    # per GPU: weights 56.7 + the whole window's KV cache 7.9 + activations ~6.8 leave less than
    # WINDOW_SLACK_GIB of the engine's 72 GiB: the engine gets the run's own window (RULER 4K)
    assert f"max_model_len lowered from 131072 to {RULER_4K}" in out and f"max_model_len {RULER_4K}," in out
    assert f"KV cache {kv_gib('llama405b', RULER_4K):.1f} (max_model_len {RULER_4K}, bfloat16)" in out
    total, share = (float(x) for x in re.search(r"= ([\d.]+) of the engine's ([\d.]+) GiB", out).groups())
    assert total + WINDOW_SLACK_GIB <= share
    # GPU-hours: 6 tasks x 10 prompts x 2 FLOPs x 405e9 parameters x 4096 tokens at 989 TFLOP/s x 40 %
    hours = float(re.search(r"compute: at most ~([\d.]+) GPU-hours", out).group(1))
    rough = 60 * 2 * 405e9 * 4096 / (989e12 * 0.4) / 3600
    assert rough * 0.95 < hours < rough * 1.15
    assert "vLLM model runner V1" in out
    assert "per GPU-hour" not in out  # no price given


def test_the_dry_run_prices_the_gpu_hours_where_asked(capsys, monkeypatch):
    """``gpu_hour_usd=2.5``: the GPU run's compute line carries its cost, the GPU-hours x 2.5;
    a CPU run has no GPU-hours and says so; a price that is not above 0 is refused."""
    from hydra import compose, initialize_config_dir

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from harness.config import CONF
    from harness.jobs.eval import main

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        main.__wrapped__(
            compose(config_name="config", overrides=["model=llama405b", "dry_run=true", "gpu_hour_usd=2.5"])
        )  # type: ignore[attr-defined]
        out = capsys.readouterr().out
        hours, usd = (float(x) for x in re.search(r"at most ~([\d.]+) GPU-hours .*?, cost ~\$([\d.]+) at \$2.5 per GPU-hour", out).groups())  # fmt: skip
        assert usd == pytest.approx(hours * 2.5, rel=0.05)  # both printed to two significant figures
        main.__wrapped__(
            compose(config_name="config", overrides=["model=smollm2-135m", "dry_run=true", "gpu_hour_usd=2.5"])
        )  # type: ignore[attr-defined]
        assert "cost: not estimated (no GPU-hours for this run" in capsys.readouterr().out
        with pytest.raises(ValueError, match="gpu_hour_usd"):
            main.__wrapped__(
                compose(config_name="config", overrides=["model=smollm2-135m", "dry_run=true", "gpu_hour_usd=0"])
            )  # type: ignore[attr-defined]


def test_gib():
    assert GIB == 1024**3


# --------------------------------------------------------------------------- the engine's KV cache

#: KV-cache bytes per token on one GPU, counted by hand from conf/model/arch (keys and values,
#: bf16): Llama-3.1-8B 32 layers x 8 KV heads x 128 dims, one GPU; Llama-3.1-70B 80 x 8 x 128
#: and Llama-3.1-405B 126 x 8 x 128, the 8 KV heads split over tensor parallel 8 (1 per GPU).
KV_PER_TOKEN = {"llama8b": 32 * 8 * 128 * 2 * 2, "llama70b": 80 * 1 * 128 * 2 * 2, "llama405b": 126 * 1 * 128 * 2 * 2}
#: Llama-3.1-8B's parameters by hand: embeddings and LM head 2 x 128256 x 4096; per layer
#: q, o 4096^2 each, k, v 4096 x 1024 each, MLP 3 x 4096 x 14336, two norms 2 x 4096; final norm.
LLAMA_8B_PARAMS = 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096


def kv_gib(name: str, tokens: int) -> float:
    """One ``tokens``-long sequence (a multiple of 16) and vLLM's null page of 16 tokens, GiB per GPU."""
    return KV_PER_TOKEN[name] * (tokens + 16) / 2**30


def test_the_hand_counts():
    assert KV_PER_TOKEN["llama405b"] * 131072 / 2**30 == 7.875  # 64,512 B per token: 7.9 GiB per GPU at 128K
    assert KV_PER_TOKEN["llama70b"] * 131072 / 2**30 == 5.0 and KV_PER_TOKEN["llama8b"] * 131072 / 2**30 == 16.0
    assert weight_bytes(architecture("Llama-3.1-8B-Instruct"), "bfloat16") == 2 * LLAMA_8B_PARAMS


def test_kv_cache_bytes_by_hand():
    # TOY: 2 layers x 1 KV head x 4 dims x K and V x 2 bytes = 32 B per token; 100 tokens fill 7 pages of
    # 16, and the null page makes 8: 128 token slots
    assert kv_cache_bytes(TOY, 100) == 128 * 32
    assert kv_cache_bytes(TOY, 100, tensor_parallel=2) == 128 * 32  # 1 KV head, 2 ranks: replicated, not split
    assert kv_cache_bytes(TOY, 100, pipeline_parallel=2) == 128 * 16  # one layer per stage
    assert kv_cache_bytes({**TOY, "num_key_value_heads": 2}, 100, tensor_parallel=2) == 128 * 32
    assert kv_cache_bytes(TOY, 100, dtype_bytes=1) == 128 * 16  # an fp8 KV cache


def test_engine_activations_by_hand():
    arch = architecture("Llama-3.1-405B-Instruct-FP8")
    assert arch is not None
    # >= 70 GiB: vLLM profiles 16384 tokens (hidden 16384: four full-width bf16 copies; the MLP's
    # 53248 / 8 per rank, three of them) and samples 1024 rows of 128256 logits (18 B each); + 2 GiB
    big = 16384 * 2 * (4 * 16384 + 3 * 6656) + 1024 * 128256 * 18 + 2 * 2**30
    assert engine_activation_bytes(arch, 8, 80.0) == big
    small = 8192 * 2 * (4 * 16384 + 3 * 6656) + 256 * 128256 * 18 + 2 * 2**30  # below 70 GiB: 8192 and 256
    assert engine_activation_bytes(arch, 8, 48.0) == small


@pytest.mark.parametrize("gpu", [80.0, 141.0])
@pytest.mark.parametrize("name", ["llama8b", "llama70b", "llama405b"])
def test_the_paper_models_plan_their_kv_cache_per_gpu(monkeypatch, name, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = place(model_config(name, gpu_memory_gib=gpu), "vllm", True, RULER_4K)
    # Only the 405B on 80 GiB has less than WINDOW_SLACK_GIB to spare at its whole window
    # (56.7 + 7.9 + ~6.8 of 72 GiB): it gets the run's own; the others keep 131072.
    window = RULER_4K if (name, gpu) == ("llama405b", 80.0) else 131072
    assert p.gpu_gib == gpu and p.max_model_len == window
    assert p.max_model_len_lowered_from == (None if window == 131072 else 131072)
    assert p.kv_cache_per_gpu_gib == pytest.approx(kv_gib(name, window), rel=1e-12)
    kv_window = kv_gib(name, 131072)  # the whole window's, by hand, against what the engine has for it
    assert p.engine_gib is not None
    assert (kv_window + WINDOW_SLACK_GIB <= p.engine_gib - p.base_per_gpu_gib - p.engine_activations_gib) == (
        window == 131072
    )
    assert p.engine_gib is not None
    assert p.base_per_gpu_gib + p.kv_cache_per_gpu_gib + p.engine_activations_gib <= p.engine_gib
    assert p.speculator_gpus == (1 if name == "llama8b" else 8) and p.run_tokens == RULER_4K


def test_the_8b_on_one_gpu_holds_its_whole_window_beside_the_speculator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for gpu in (80.0, 141.0):
        p = place(model_config("llama8b", gpu_memory_gib=gpu), "vllm", True)  # prompts of the whole window
        assert p.speculator_gpus == 1 and p.max_model_len == 131072
        assert p.kv_cache_per_gpu_gib == pytest.approx(kv_gib("llama8b", 131072), rel=1e-12)  # 16 GiB
        assert p.engine_gib is not None and p.gpu_memory_utilization is not None
        assert p.base_per_gpu_gib + p.kv_cache_per_gpu_gib + p.engine_activations_gib <= p.engine_gib
        assert p.engine_gib + p.speculator_gpu0_gib + RESERVE_GIB <= gpu + 1e-9  # GPU 0 holds both


def test_the_405b_window_on_80_gib_is_lowered_to_the_run_or_refused_with_the_numbers(monkeypatch):
    from harness.models import loading as models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Prompts of the whole window: 56.7 GiB of weights + 7.9 of KV cache + activations do not fit
    # beside the speculator at 128K (its keys alone take 8 GiB of GPU 0).
    with pytest.raises(ValueError) as refused:
        place(model_config("llama405b"), "vllm", True)
    msg = str(refused.value)
    assert "56.7 GiB weights" in msg and f"{kv_gib('llama405b', 131072):.1f} KV cache" in msg
    assert "would refuse to start" in msg and "gpu_memory_utilization 0.80" in msg
    fits = int(re.search(r"longest sequence that fits is (\d+) tokens", msg).group(1))
    larger = int(re.search(r"GPUs of at least (\d+) GiB", msg).group(1))
    # The advice holds: a run that long plans (its window lowered to it), a page more does not, and
    # the GPU size it names holds the whole window.
    p = place(model_config("llama405b"), "vllm", True, fits)
    assert (p.max_model_len, p.max_model_len_lowered_from) == (fits, 131072) and 0 < fits < 131072
    with pytest.raises(ValueError, match="would refuse to start"):
        place(model_config("llama405b"), "vllm", True, fits + 32)
    assert place(model_config("llama405b", gpu_memory_gib=float(larger)), "vllm", True).max_model_len == 131072
    # A RULER-64K run: the whole window does not fit, its own longest sequence does
    need = 65536 + 128 + 256
    p = place(model_config("llama405b"), "vllm", True, need)
    assert (p.max_model_len, p.max_model_len_lowered_from) == (need, 131072)
    assert p.kv_cache_per_gpu_gib == pytest.approx(kv_gib("llama405b", need), rel=1e-12)
    assert kv_gib("llama405b", 131072) > p.engine_gib - p.base_per_gpu_gib - p.engine_activations_gib  # why
    assert f"max_model_len lowered from 131072 to {need}" in p.describe()
    monkeypatch.setattr(models, "vllm_model", lambda cfg: (cfg.path, "auto"))
    assert models.vllm_engine_args(model_config("llama405b"), p.gpu_memory_utilization, p.max_model_len)[
        "max_model_len"
    ] == need  # fmt: skip
    # LongBench's 127.5K-token prompts do not fit 80 GiB at all; 141 GiB GPUs hold the whole window
    with pytest.raises(ValueError, match=r"128268 tokens, prompt \+ answer.*would refuse to start"):
        place(model_config("llama405b"), "vllm", True, 127500 + 512 + 256)
    big = place(model_config("llama405b", gpu_memory_gib=141.0), "vllm", True)
    assert big.max_model_len == 131072 and big.max_model_len_lowered_from is None
    full = place(model_config("llama405b"), "vllm", False)  # full prefill: no speculator, the whole window fits
    assert full.max_model_len == 131072 and full.gpu_memory_utilization == pytest.approx(0.90)


def test_a_run_knows_its_longest_sequence():
    from harness.benchmarks.base import BenchmarkConfig, build_benchmark
    from harness.config import longest_sequence

    model = model_config("llama405b")  # max_input_length 127500, window 131072

    def longest(name: str, length: int, tasks: tuple[str, ...], cap: int | None = None) -> int:
        bench = build_benchmark(BenchmarkConfig(name=name, length=length, tasks=tasks, max_new_tokens_cap=cap))
        return longest_sequence(model, bench)

    assert longest("ruler", 4096, ("niah_single_1", "vt")) == 4096 + 128 + 256  # niah generates 128, vt 30
    assert longest("ruler", 4096, ("vt",)) == 4096 + 30 + 256
    assert longest("longbench", 127500, ("hotpotqa", "gov_report")) == 127500 + 512 + 256  # dataset2maxlen
    assert longest("longbench", 127500, ("gov_report",), cap=32) == 127500 + 32 + 256
    assert longest("infinitebench", 127500, ("math_calc",)) == 131072  # 30000 to generate: the whole window


def test_decode_budget_and_rows_keep_to_the_engines_window(monkeypatch):
    from harness.provenance import provenance

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from harness.jobs.eval import decode_budget
    from harness.types import Sample

    s = Sample(benchmark="b", task="t", sample_id=0, length=1, instruction="", context="", question="",
               answer_prefix="", prompt="p", references=(), max_new_tokens=512, metric="m")  # fmt: skip
    model = model_config("llama405b")
    assert decode_budget(s, 4000, model, None) == 512
    assert decode_budget(s, 4000, model, None, window=4096) == 96  # never past what the engine accepts
    assert decode_budget(s, 4000, model, None, window=1 << 20) == 512  # nor past the model's own window
    p = place(model, "vllm", True, 65536 + 128 + 256)
    assert provenance(model, "vllm", None, p)["max_model_len"] == p.max_model_len < 131072


def test_the_planned_window_and_share_reach_the_engine(monkeypatch):
    import specprefill.backends.vllm as vllm_backend
    from harness.models import factory
    from harness.models import loading as models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = place(model_config("llama405b"), "vllm", True, 65536 + 128 + 256)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the engine arguments of a GPU run
    monkeypatch.setattr(factory, "load", lambda model, with_base=True: models.LoadedModel(model, None, None, None))
    monkeypatch.setattr(models, "vllm_model", lambda cfg: (cfg.path, "auto"))
    seen: dict = {}
    monkeypatch.setattr(vllm_backend, "VLLMBackend", lambda **kw: seen.update(kw) or "engine")
    assert factory.make_backend(model_config("llama405b"), "vllm", True, p) == "engine"
    assert seen["max_model_len"] == p.max_model_len == 65536 + 128 + 256
    assert seen["gpu_memory_utilization"] == p.gpu_memory_utilization
