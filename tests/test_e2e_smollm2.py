"""One short end-to-end run on the real SmolLM2-135M-Instruct (CPU, offline)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.jobs.eval import EvalConfig, execute, prepare
from harness.parquet import read_parquet
from tests.test_run import _cfg


@pytest.mark.slow
def test_smollm2_ruler_full_and_specprefill(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "res"
    common = ["model=smollm2-135m", "length=1024", "tasks=[niah_single_1]", "limit=1", f"out={out}"]
    full = execute(prepare(EvalConfig.from_hydra(_cfg("method=full", *common))))
    spec = execute(prepare(EvalConfig.from_hydra(_cfg("method=specprefill", "keep=0.5", *common))))
    f = read_parquet(full / "rows.parquet").iloc[0]
    s = read_parquet(spec / "rows.parquet").iloc[0]
    assert f["status"] == "ok" and s["status"] == "ok", (f["error"], s["error"])
    # SmolLM2 finds a single needle in a 1K noise haystack with full prefill.
    assert f["score"] == 100.0, f["prediction"]
    assert f["references"][0] in f["prediction"]
    assert f["model_weights"] == "real, dequantized from Q4_1 GGUF" and f["speculator"] == "self_layers:20"
    # chunk mode keeps whole chunks of 32; a short last chunk can land it a little under 0.5
    assert 0.45 <= s["kept_fraction"] <= 0.55 and s["kept_tokens"] < f["prompt_tokens"]
    assert s["prompt_tokens"] == f["prompt_tokens"] and 0 <= s["needle_kept"] <= 1
    assert s["speculator_s"] > 0 and s["base_prefill_s"] > 0
    assert (out / "summary.csv").exists() and (out / "plots" / "score_vs_keep.png").exists()


@pytest.mark.slow
def test_smollm2_keep_one_equals_full_prefill(smollm2_tokenizer):
    import torch

    from harness.models.loading import load
    from specprefill import FullPrefill, Prompt, SpecPrefill
    from specprefill.backends.transformers import TransformersBackend

    cfg = EvalConfig.from_hydra(_cfg("model=smollm2-135m")).model
    lm = load(cfg)
    be = TransformersBackend(lm.base, lm.tokenizer, lm.speculator)
    text = "The capital of France is Paris. The capital of Italy is Rome. " * 20 + "What is the capital of Italy?"
    prompt = Prompt(torch.tensor(smollm2_tokenizer(text).input_ids))
    full = be.generate(FullPrefill().plan(prompt, be), max_new_tokens=8)
    spec = be.generate(SpecPrefill(keep_rate=1.0, chunk_size=32, pool_kernel=13, lookahead=1).plan(prompt, be), 8)
    assert spec.token_ids == full.token_ids
    torch.testing.assert_close(spec.first_logits, full.first_logits, rtol=0, atol=0)  # same ops, same order


def _fixture_rows(benchmark: str, tasks: list[str], out: Path) -> pd.DataFrame:
    """Full prefill and SpecPrefill (keep 0.5) on one sample per task of a fixture folder."""
    fixtures = Path(__file__).parent / "fixtures" / benchmark
    common = [
        "model=smollm2-135m",
        f"benchmark={benchmark}",
        f"tasks=[{','.join(tasks)}]",
        "limit=1",
        f"out={out}",
        f"benchmark.options.data_dir={fixtures}",
    ]
    folders = [
        execute(prepare(EvalConfig.from_hydra(_cfg(f"method={m}", "keep=0.5", *common))))
        for m in ("full", "specprefill")
    ]
    rows = pd.concat([read_parquet(f / "rows.parquet") for f in folders])
    assert len(rows) == 2 * len(tasks) and set(rows["status"]) == {"ok"}, rows["error"].tolist()
    assert set(rows["task"]) == set(tasks) and set(rows["method"]) == {"full", "specprefill"}
    assert rows["score"].between(0, 100).all() and rows["benchmark_version"].str.startswith(f"{benchmark}-").all()
    return rows


@pytest.mark.slow
def test_smollm2_longbench_fixture_full_and_specprefill(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = _fixture_rows("longbench", ["passage_retrieval_en", "multifieldqa_zh", "lcc"], tmp_path / "res")
    assert set(rows["category"]) == {"synthetic", "single-doc QA", "code"}
    assert '"truncation": "middle"' in rows.iloc[0]["benchmark_options"]
    summary = (tmp_path / "res" / "summary.md").read_text()
    assert "[category] code" in summary and "| ALL |" in summary


@pytest.mark.slow
def test_smollm2_infinitebench_fixture_full_and_specprefill(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = _fixture_rows("infinitebench", ["passkey", "code_debug", "longbook_qa_chn"], tmp_path / "res")
    assert (rows[rows["method"] == "specprefill"]["kept_fraction"] < 1).all()
