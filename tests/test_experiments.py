"""Experiment presets other than the paper's tables (harness/experiments.py): the kvpress
leaderboard's setting with SpecPrefill beside it, planned and validated without loading a
model, and run command by command with a failure recorded while the others go on."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness import experiments
from harness.jobs import eval as eval_job

ROOT = Path(__file__).resolve().parents[1]
#: The kvpress leaderboard (NVIDIA kvpress, evaluation/leaderboard.sh): its compression
#: ratios, its query-agnostic presses that we have, and its query-aware loop's SnapKV.
RATIOS = {0.25, 0.5, 0.75, 0.875}
AGNOSTIC = {"random_kv", "knorm", "snapkv", "expected_attention", "streaming_llm", "tova", "keydiff", "kvzip"}


def _points(c: experiments.Command) -> list[list[str]]:
    """Each sweep point of a command as plain overrides (``keep=a,b`` -> one per value)."""
    fixed = [a for a in c.args if "," not in a.split("=", 1)[1] or a.split("=", 1)[1].startswith("[")]  # a list
    swept = [[f"{a.split('=', 1)[0]}={v}" for v in a.split("=", 1)[1].split(",")] for a in c.args if a not in fixed]
    return [fixed + list(p) for p in itertools.product(*swept)]


def _args(c: experiments.Command) -> dict[str, str]:
    return dict(a.split("=", 1) for a in c.args)


def test_the_kvpress_preset_runs_the_leaderboards_setting_with_specprefill_beside_it():
    exp = experiments.load("kvpress_ruler4k")
    assert set(exp.variants) == {"paper", "cpu"} and exp.variants["paper"].gpus == 1
    seen: dict[tuple[str, str], set[float]] = {}
    for c in exp.variants["paper"].commands:
        a = _args(c)
        assert (a["model"], a["benchmark"], a["length"], a["tasks"]) == ("llama8b", "ruler", "4096", "all")
        assert a["model.backend"] == "transformers"  # the presses act inside the model's forward
        keeps = {round(1 - float(k), 3) for k in a.get("keep", "0").split(",")}
        seen[(a["method"], a.get("method.query_aware", "-"))] = keeps
    assert seen.pop(("full", "-")) == {1.0}
    assert seen.pop(("specprefill", "-")) == RATIOS  # keep = 1 - the press's compression ratio
    assert seen.pop(("snapkv", "true")) == RATIOS  # the leaderboard's query-aware loop
    assert seen == {(p, "false"): RATIOS for p in AGNOSTIC}


def test_every_command_of_every_experiment_validates_without_loading_a_model(tmp_path):
    """Each sweep point of every non-paper experiment composes and prepares (method options,
    the model's backend, the benchmark's tasks): a typo fails here, not hours into a run."""
    names = [n for n in experiments.names() if not n.startswith(experiments.PAPER_PREFIX)]
    assert names == ["draft_family", "kvpress_ruler4k"]
    folders = set()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for name in names:
            for variant in experiments.load(name).variants.values():
                for c in variant.commands:
                    assert c.module == "jobs.eval"
                    for point in _points(c):
                        cfg = compose(config_name="config", overrides=[*point, f"out={tmp_path}"])
                        job = eval_job.prepare(eval_job.EvalConfig.from_hydra(cfg))
                        if "method.query_aware=false" in point:
                            assert job.method.options()["query_aware"] is False
                        folders.add(job.folder)
    # every point is its own run folder: the query-aware and -agnostic SnapKV rows stay distinct
    assert len(folders) == sum(
        len(_points(c)) for n in names for v in experiments.load(n).variants.values() for c in v.commands
    )


def test_the_kvpress_preset_gpu_hours_agree_with_two_flops_per_parameter_per_token():
    """Independent of the FLOP model: 2 x 8.03e9 parameters x 4,096 tokens for every press
    prompt (8 presses query-agnostic, KVzip twice, SnapKV query-aware, 4 ratios, 6,500
    prompts) and full prefill's; attention adds a few per cent at 4K; SpecPrefill's share is
    small beside them."""
    hours = experiments.gpu_hours(experiments.load("kvpress_ruler4k").variants["paper"])
    prompts = (len(AGNOSTIC) + 1 + 1) * 4 * 6500 + 6500
    rough = 2 * 8.03e9 * 4096 * prompts / (989e12 * 0.4) / 3600
    assert rough < hours < 1.2 * rough
    assert experiments.gpu_hours(experiments.load("kvpress_ruler4k").variants["cpu"]) is None


def test_the_plan_prices_its_gpu_hours(tmp_path, capsys):
    exp = experiments.load("kvpress_ruler4k")
    hours = experiments.gpu_hours(exp.variants["paper"])
    text = experiments.describe(exp, "paper", tmp_path, gpu_hour_usd=2.0)
    usd = float(re.search(r"cost: ~\$([\d,.]+) at \$2 per GPU-hour", text).group(1).replace(",", ""))
    assert usd == pytest.approx(2.0 * hours, rel=0.01)
    assert "per GPU-hour" not in experiments.describe(exp, "paper", tmp_path)
    with pytest.raises(SystemExit):
        experiments.main(["run", "kvpress_ruler4k", "--dry-run", "--gpu-hour-usd", "free"])
    assert "'free'; allowed: dollars per GPU-hour, a number above 0" in capsys.readouterr().err


def test_the_draft_family_preset_runs_the_papers_pairs_and_budgets():
    """Galim et al.'s setting (their cfg/paper/): both pairs, RULER 4K-32K, all tasks x 500,
    SpecPC at 1024 / 2048 / 3072 tokens, SpecKV at 256 / 512 / 1024 entries (dense above 4K,
    the named deviation), SpecKV-PC at 2048 then 256 / 512 / 1024; the GPU-hours within the
    bounds of 2 FLOPs per parameter per prefilled token (attention adds up to half at 32K)."""
    v = experiments.load("draft_family").variants["paper"]
    by = {(a["model"], a["method"]): a for a in map(_args, v.commands)}
    assert {m for m, _ in by} == {"qwen2.5-14b", "llama8b-draft1b"}
    for model in ("qwen2.5-14b", "llama8b-draft1b"):
        assert {m for mm, m in by if mm == model} == {"full", "specprefill", "specpc", "speckv", "speckvpc", "compose"}
        assert by[(model, "specpc")]["keep_tokens"] == "1024,2048,3072"
        kv = by[(model, "speckv")]
        assert (kv["keep_tokens"], kv["method.sparse_prefill"]) == ("256,512,1024", "false")
        pc = by[(model, "speckvpc")]
        entries = sorted(int(2048 * float(r)) for r in pc["method.then_keep_rate"].split(","))
        assert pc["keep_tokens"] == "2048" and entries == [256, 512, 1024]
        assert all(
            a["length"] == "4096,8192,16384,32768" and a["limit"] == "500" for (mm, _), a in by.items() if mm == model
        )
    s, p = 4096 + 8192 + 16384 + 32768, 6500

    def pair(base: float, draft: float) -> float:  # prefilled tokens x 2 x parameters
        on_base = p * s + 2 * 4 * p * (1024 + 2048 + 3072) + 3 * p * s + 12 * p * 2048 + 4 * p * 2048
        return 2 * base * on_base + 2 * draft * 11 * p * s

    rough = (pair(14.77e9, 0.49e9) + pair(8.03e9, 1.24e9)) / (989e12 * 0.4) / 3600
    assert rough < experiments.gpu_hours(v) < 1.5 * rough


def test_a_failed_command_is_recorded_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if "method=knorm" in cmd else 0)

    monkeypatch.setattr(experiments.subprocess, "run", fake_run)
    assert experiments.run("kvpress_ruler4k", "cpu", dry_run=True, root=tmp_path) == 1
    exp = experiments.load("kvpress_ruler4k")
    assert len(calls) == len(exp.variants["cpu"].commands)
    assert all(c[-2] == f"out={tmp_path / 'kvpress_ruler4k' / 'cpu'}" and c[-1] == "dry_run=true" for c in calls)
    out = capsys.readouterr().out
    assert "1 command(s) failed" in out and "method=knorm" in out.split("failed:")[1]


def test_unknown_experiment_variant_and_a_paper_table_are_one_line_errors():
    with pytest.raises(SystemExit, match=r"'nope' .*allowed: \['draft_family', 'kvpress_ruler4k'"):
        experiments.load("nope")
    with pytest.raises(SystemExit, match=r"no variant 'gpu'; allowed: \['cpu', 'paper'\]"):
        experiments.run("kvpress_ruler4k", "gpu", dry_run=True)
    with pytest.raises(SystemExit, match="make paper table=qps"):
        experiments.run("paper_qps", "cpu", dry_run=True)
