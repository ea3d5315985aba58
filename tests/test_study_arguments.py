"""The studies' command lines: a bad value, or --no-run without a run's rows, is one line
before any job starts (harness/studies/__init__.py: require_values, require_runs)."""

from __future__ import annotations

import sys

import pytest

from harness.studies import (
    draft_family,
    kvpress_crosscheck,
    lm_eval_crosscheck,
    lookahead,
    positions,
    speculator_depth,
    speculator_family,
)


@pytest.fixture
def no_jobs(monkeypatch):
    """Any job a study would start fails the test."""

    def job(cmd):
        raise AssertionError(f"a job started: {cmd}")

    for mod in (
        speculator_depth,
        speculator_family,
        kvpress_crosscheck,
        lm_eval_crosscheck,
        positions,
        draft_family,
        lookahead,
    ):
        monkeypatch.setattr(mod, "run_job", job)


@pytest.mark.parametrize(
    ("module", "args", "says"),
    [
        (speculator_depth, ["--keeps", "1.5"], "--keeps 1.5: allowed: a fraction in (0, 1]"),
        (speculator_depth, ["--depths", "8", "99"], "--depths 99: allowed: 1 to 30"),
        (speculator_depth, ["--limit", "0"], "--limit 0: allowed"),
        (speculator_family, ["--keeps", "0"], "--keeps 0.0: allowed"),
        (speculator_depth, ["--no-run", "--out", "{tmp}/none"], "--no-run: no run's rows under {tmp}/none"),
        (speculator_family, ["--no-run", "--out", "{tmp}"], "--no-run: no run's rows under {tmp}"),
        (kvpress_crosscheck, ["--no-run", "--out", "{tmp}"], "--no-run: no run's rows under {tmp}/ours"),
        (lm_eval_crosscheck, ["--no-run", "--out", "{tmp}"], "--no-run: no run's rows under {tmp}/ours"),
        (positions, ["--keeps", "1"], "--keeps 1.0: allowed: a fraction in (0, 1)"),
        (positions, ["--methods", "speckv"], "--methods speckv: allowed: one of ['specprefill'"),
        (positions, ["--no-run", "--out", "{tmp}"], "--no-run: no run's rows under {tmp}"),
        (draft_family, ["--no-run", "--out", "{tmp}/README.md"], "--no-run: no run's rows under {tmp}/README.md"),
        (draft_family, ["--keep-tokens", "0"], "--keep-tokens 0: allowed: a budget of 1 or more tokens"),
        (draft_family, ["--limit", "0"], "--limit 0: allowed"),
        (lookahead, ["--lookaheads", "1", "0"], "--lookaheads 0: allowed: look-ahead steps of 1 or more"),
        (lookahead, ["--lookaheads", "1", "8", "1"], "--lookaheads 1 8 1: allowed: each look-ahead once"),
        (lookahead, ["--methods", "specpc", "specpc"], "--methods specpc specpc: allowed: each method once"),
        (lookahead, ["--no-run", "--out", "{tmp}"], "--no-run: no run's rows under {tmp}"),
        (lookahead, ["--keep-tokens", "0"], "--keep-tokens 0: allowed"),
    ],
)
def test_a_bad_study_argument_is_one_line_before_any_job(module, args, says, tmp_path, monkeypatch, capsys, no_jobs):
    monkeypatch.setattr(sys, "argv", ["study", *[a.format(tmp=tmp_path) for a in args]])
    with pytest.raises(SystemExit) as e:
        module.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says.format(tmp=tmp_path) in err[-1], err
