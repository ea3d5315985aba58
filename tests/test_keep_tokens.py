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
from harness.parquet import read_parquet

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
    rows = read_parquet(by_tokens / "rows.parquet")
    assert set(rows["status"]) == {"ok"} and (rows["keep_tokens"] == 200).all() and rows["keep_rate"].isna().all()
    assert (rows["kept_tokens"] == 200).all() and (rows["prompt_tokens"] > 200).all()
    rate = read_parquet(by_rate / "rows.parquet")
    assert rate["keep_tokens"].isna().all() and (rate["keep_rate"] == 0.5).all()
    labels = normalize(pd.concat([rows, rate]))["label"]
    assert set(labels) == {"truncate (200 tokens)", "truncate"}


@pytest.mark.parametrize("method, budget", [("specpc", 200), ("speckv", 160)])
def test_max_capacity_prompt_is_a_budget_in_tokens_as_keep_tokens(tmp_path, monkeypatch, method, budget):
    """SpecPC's / SpecKV's own budget in tokens (``method.max_capacity_prompt``, the paper's
    form the README gives) replaces the fraction as ``keep_tokens`` does: a ``keep`` sweep
    beside it is one run (keep_rate 1 in the identity), rows record the budget as
    ``keep_tokens`` with no ``keep_rate``, and the label names it."""
    monkeypatch.chdir(tmp_path)
    common = ["model=tiny-random", "benchmark=ruler", "tasks=[niah_single_1]", "length=1024", "limit=1", "max_new=2",
              f"out={tmp_path}", "method.window_size=16"]  # fmt: skip
    common += ["method.starting_layer_index=0"] if method == "specpc" else []  # the tiny model's draft: 1 layer
    budgeted = [f"method={method}", f"method.max_capacity_prompt={budget}", *common]
    jobs = [prepare(EvalConfig.from_hydra(_cfg(*budgeted, f"keep={k}"))) for k in (0.1, 0.3, 0.5)]
    assert len({j.folder for j in jobs}) == 1 and jobs[0].method.options()["keep_rate"] == 1.0
    rows = read_parquet(execute(jobs[0]) / "rows.parquet")
    assert set(rows["status"]) == {"ok"} and (rows["keep_tokens"] == budget).all() and rows["keep_rate"].isna().all()
    # achieved: SpecPC's kept tokens; SpecKV's cache, C entries and the prompt's last token prefilled again
    achieved = rows["kept_tokens"] if method == "specpc" else rows["kv_tokens"] - 1
    assert (achieved == budget).all() and (rows["prompt_tokens"] > budget).all()
    assert set(normalize(rows)["label"]) == {f"{method} ({budget} tokens)"}


def test_a_composed_methods_first_part_budget_in_tokens(tmp_path):
    """SpecKV-PC's SpecPC given its own ``max_capacity_prompt`` (``first_options``): the
    composed method's ``keep`` is unused, so the same one run and the same rows."""
    from harness.registry import build_method
    from harness.store import method_columns

    common = ["model=tiny-random", f"out={tmp_path}", "+method.first_options.max_capacity_prompt=2048"]
    cfgs = [EvalConfig.from_hydra(_cfg("method=speckvpc", f"keep={k}", *common)) for k in (0.1, 0.3)]
    assert cfgs[0].method_options == cfgs[1].method_options and cfgs[0].method_options["keep_rate"] == 1.0
    columns = method_columns(build_method(cfgs[0].method_name, cfgs[0].method_options), "full")
    assert (columns["keep_tokens"], columns["keep_rate"]) == (2048, None)
