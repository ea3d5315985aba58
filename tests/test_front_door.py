"""What needs a model is checked at the front door (issue 43): before any sweep point starts,
in one line, no traceback, no Hydra hint; the dry run says it in its plan instead of refusing
(a plan for another machine is still a plan)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})  # fmt: skip


def _one_line(r: subprocess.CompletedProcess, starts: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(starts) and "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.fixture
def empty_cache(tmp_path):
    """A cache without the Qwen models fetched (``make fetch-models`` not run)."""
    (tmp_path / "cache").mkdir()
    return {"SPECPREFILL_CACHE": str(tmp_path / "cache")}


def test_multiturn_before_fetch_models_is_one_line_and_the_dry_run_says_so(tmp_path, empty_cache):
    r = _run("harness.studies.multiturn", "--limit", "1", "--out", str(tmp_path / "o"), env=empty_cache)
    _one_line(r, "model 'qwen2.5-coder-1.5b' is not fetched: run `make fetch-models`")
    assert not list((tmp_path / "o").rglob("*.parquet"))
    r = _run("harness.studies.multiturn", "--limit", "1", "--out", str(tmp_path / "o"), "--dry-run", env=empty_cache)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fetch first: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b (make fetch-models" in r.stdout
    assert "nothing to download" not in r.stdout
    assert "runnable here: no, not now: model 'qwen2.5-coder-1.5b' is not fetched" in r.stdout


def test_a_speculator_of_another_family_on_vllm_is_refused_by_the_dry_run(tmp_path):
    """Its token map runs on the transformers backend only: refused before anything loads (the
    dry run too), not by the factory after the speculator has loaded; full prefill runs none."""
    r = _run("harness.jobs.eval", "model=qwen2.5-coder-1.5b", "model.speculator=model:smollm2-135m", "backend=vllm",
             "dry_run=true", f"out={tmp_path / 'o'}")  # fmt: skip
    _one_line(r, "speculator='model:smollm2-135m' has another tokenizer (smollm2) than model 'qwen2.5-coder-1.5b'")
    assert r.stderr.strip().endswith("(3 of 6 sweep points: method=specprefill; nothing ran)"), r.stderr
    assert "[dry run]" not in r.stdout


def test_a_paper_model_too_big_for_this_machine_is_one_line(tmp_path):
    r = _run("harness.jobs.eval", "model=llama405b", "limit=1", f"out={tmp_path / 'o'}")
    _one_line(r, "model 'llama405b' needs 8 GPUs")
    r = _run("harness.jobs.eval", "model=llama405b", "limit=1", f"out={tmp_path / 'o'}", "dry_run=true")
    assert r.returncode == 0 and "runnable here: no, not now: model 'llama405b' needs 8 GPUs" in r.stdout


@pytest.mark.parametrize(
    ("speculator", "starts"),
    [
        ("model:nosuch", "speculator='model:nosuch': unknown model 'nosuch'; allowed: ["),
        ("hub:nosuch/model", "model 'smollm2-135m' needs 'nosuch/model' from the model hub"),
    ],
)
def test_an_unknown_speculator_is_one_line(tmp_path, speculator, starts):
    args = ("harness.jobs.eval", "model=smollm2-135m", f"model.speculator={speculator}", "limit=1",
            f"out={tmp_path / 'o'}")  # fmt: skip
    _one_line(_run(*args), starts)
    if speculator.startswith("model:"):  # a name that does not exist: refused in the dry run too
        _one_line(_run(*args, "dry_run=true"), starts)


def test_a_speculator_window_the_prompts_pass_is_one_line_naming_the_points(tmp_path):
    """Issue 41's command: SmolLM2's 8192-token window under a 16K Qwen run, refused before
    loading; full prefill (no speculator) is fine, so the line names the points that fail."""
    r = _run("harness.jobs.eval", "model=qwen2.5-coder-1.5b", "model.speculator=model:smollm2-135m", "length=16384",
             "dry_run=true", f"out={tmp_path / 'o'}")  # fmt: skip
    _one_line(r, "speculator='model:smollm2-135m' has a context window of 8192 tokens")
    assert r.stderr.strip().endswith("(3 of 6 sweep points: method=specprefill; nothing ran)"), r.stderr


def test_fetch_models_takes_the_conf_model_names():
    from harness.models.transports import by_model_name

    assert by_model_name("qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b-instruct"
    assert by_model_name("qwen2.5-coder-1.5b-instruct") == "qwen2.5-coder-1.5b-instruct"
    with pytest.raises(ValueError, match="'smollm2-135m' is not fetched by make fetch-models"):
        by_model_name("smollm2-135m")


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        (
            ["method=specprefill_lah8", "lookahead=4"],
            "lookahead=4: no method of this command reads it (specprefill_lah8",
        ),
        (["method=full,specprefill_ref", "lookahead=4"], "lookahead=4: no method of this command reads it (full, "),
        (["method=minference", "keep=0.1"], "keep=0.1: no method of this command reads it (minference"),
        (["data_dir=/tmp/nowhere"], "data_dir=/tmp/nowhere: benchmark ruler does not read it"),
    ],
)
def test_a_shorthand_no_method_reads_is_one_line(tmp_path, args, starts):
    """What the command typed that every method ignores (a preset fixes it) is refused, in
    the dry run too: a run without it would read as a run with it."""
    _one_line(_run("harness.jobs.eval", *args, "dry_run=true", f"out={tmp_path / 'o'}"), starts)


def test_a_shorthand_one_method_reads_or_the_reference_alone_runs(tmp_path):
    for args in (
        ["method=full,specprefill", "lookahead=4"],
        ["method=full", "keep=1"],
        ["benchmark=longbench", "data_dir=tests/fixtures/longbench", "limit=1"],
    ):
        r = _run("harness.jobs.eval", *args, "dry_run=true", f"out={tmp_path / 'o'}")
        assert r.returncode == 0, r.stderr[-3000:]
