"""``keep_tokens=N``: a budget in tokens beside ``keep`` for every method with a budget (the
methods' side is in tests/test_methods.py): refused in one line where a method cannot honour
it, recorded in the rows (requested in ``keep_tokens``, achieved in ``kept_tokens``), named in
the tables' labels."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.analysis.rows import normalize
from harness.config import ConfigError
from harness.jobs.eval import EvalConfig, execute, prepare

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_refused_where_a_method_cannot_honour_it(tmp_path):
    common = ["model=tiny-random", "length=1024", "limit=1", f"out={tmp_path}"]
    with pytest.raises(ConfigError, match=r"^keep_tokens=1024: method 'minference' takes no token budget; allowed: "):
        EvalConfig.from_hydra(_cfg("method=minference", "keep_tokens=1024", *common))
    with pytest.raises(ConfigError, match=r"keep_tokens=0; allowed: null or an int >= 1"):
        EvalConfig.from_hydra(_cfg("method=truncate", "keep_tokens=0", *common))
    EvalConfig.from_hydra(_cfg("method=full", "keep_tokens=1024", *common))  # the reference ignores it, as keep
    with pytest.raises(ValueError, match="max_capacity_prompt=2048 and keep_tokens=1024: two token budgets"):
        prepare(EvalConfig.from_hydra(_cfg("method=specpc", "method.max_capacity_prompt=2048", "keep_tokens=1024",
                                           *common)))  # fmt: skip
    with pytest.raises(ValueError, match="keep_tokens=100: a conversation's turns grow"):
        prepare(EvalConfig.from_hydra(_cfg("method=specprefill_revival", "benchmark=multiturn", "keep_tokens=100",
                                           *common)))  # fmt: skip


def test_rows_record_the_requested_and_the_achieved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["model=tiny-random", "benchmark=ruler", "tasks=[niah_single_1]", "length=1024", "limit=2", "max_new=2",
              f"out={tmp_path}"]  # fmt: skip
    by_tokens = execute(prepare(EvalConfig.from_hydra(_cfg("method=truncate", "keep_tokens=200", *common))))
    by_rate = execute(prepare(EvalConfig.from_hydra(_cfg("method=truncate", "keep=0.5", *common))))
    assert by_tokens != by_rate  # two budgets, two run folders
    rows = pd.read_parquet(by_tokens / "rows.parquet")
    assert set(rows["status"]) == {"ok"} and (rows["keep_tokens"] == 200).all() and rows["keep_rate"].isna().all()
    assert (rows["kept_tokens"] == 200).all() and (rows["prompt_tokens"] > 200).all()
    rate = pd.read_parquet(by_rate / "rows.parquet")
    assert rate["keep_tokens"].isna().all() and (rate["keep_rate"] == 0.5).all()
    labels = normalize(pd.concat([rows, rate]))["label"]
    assert set(labels) == {"truncate (200 tokens)", "truncate"}
