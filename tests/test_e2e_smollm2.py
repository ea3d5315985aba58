"""One short end-to-end run on the real SmolLM2-135M-Instruct (CPU, offline)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.run import RunConfig, execute, prepare
from tests.test_run import _cfg


@pytest.mark.slow
def test_smollm2_ruler_full_and_specprefill(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "res"
    common = ["model=smollm2-135m", "length=1024", "tasks=[niah_single_1]", "limit=1", f"out={out}"]
    full = execute(prepare(RunConfig.from_hydra(_cfg("method=full", *common))))
    spec = execute(prepare(RunConfig.from_hydra(_cfg("method=specprefill", "keep=0.5", *common))))
    f = pd.read_parquet(full / "rows.parquet").iloc[0]
    s = pd.read_parquet(spec / "rows.parquet").iloc[0]
    assert f["status"] == "ok" and s["status"] == "ok", (f["error"], s["error"])
    # SmolLM2 finds a single needle in a 1K noise haystack with full prefill.
    assert f["score"] == 100.0, f["prediction"]
    assert f["references"][0] in f["prediction"]
    assert f["model_weights"] == "real" and f["speculator"] == "self_layers:8"
    # chunk mode keeps whole chunks of 32; a short last chunk can land it a little under 0.5
    assert 0.45 <= s["kept_fraction"] <= 0.55 and s["kept_tokens"] < f["prompt_tokens"]
    assert s["prompt_tokens"] == f["prompt_tokens"] and 0 <= s["needle_kept"] <= 1
    assert s["speculator_s"] > 0 and s["base_prefill_s"] > 0
    assert (out / "summary.csv").exists() and (Path("plots") / "res" / "score_vs_keep.png").exists()
