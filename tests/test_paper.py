"""The paper tables: experiments valid and planned, GPU-hours from the FLOP model, and the
rendering of ours beside the paper's from stored rows (none, some, all)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import paper
from harness.store import RunStore, record

ROOT = Path(__file__).resolve().parents[1]


def test_every_published_table_has_an_experiment_with_both_variants():
    assert paper.experiment_names() == ["categories_8b", "latency_grid", "longbench_405b", "qps"]
    sources = set(paper.published()["source"])
    for name in paper.experiment_names():
        exp = paper.load_experiment(name)
        assert exp.source in sources and set(exp.variants) == {"paper", "cpu"}
        assert exp.variants["cpu"].gpus == 0


@pytest.mark.parametrize("name", ["categories_8b", "latency_grid", "longbench_405b", "qps"])
def test_a_paper_variant_holds_the_gpus_its_models_need(name):
    exp = paper.load_experiment(name)
    for c in exp.variants["paper"].commands:
        model = next(a.split("=", 1)[1] for a in c.args if a.startswith("model="))
        cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{model}.yaml").read_text())
        need = int(cfg.get("tensor_parallel", 1)) * int(cfg.get("pipeline_parallel", 1))
        assert exp.variants["paper"].gpus == need, (name, model)


def test_gpu_hours_agree_with_two_flops_per_parameter_per_token():
    """Independent of the FLOP model: 2 x 405e9 parameters x 10K tokens x 23,750 prompts at
    989 TFLOP/s x 40 %; attention adds a few per cent at 10K tokens."""
    hours = paper.gpu_hours(paper.load_experiment("longbench_405b").variants["paper"])
    rough = 2 * 405e9 * 10_000 * 23_750 / (989e12 * 0.4) / 3600
    assert rough < hours < 1.15 * rough
    assert paper.gpu_hours(paper.load_experiment("longbench_405b").variants["cpu"]) is None


def test_unknown_table_and_variant_are_one_line_errors():
    with pytest.raises(SystemExit, match=r"table 'nope' .*allowed: \['categories_8b'"):
        paper.load_experiment("nope")
    with pytest.raises(SystemExit, match=r"no variant 'gpu'; allowed: \['cpu', 'paper'\]"):
        paper.command_lines(paper.load_experiment("qps"), "gpu")


def test_cell_format():
    from harness.stats import Estimate

    assert paper.cell(Estimate(40.0, 30.0, 50.0, 10), 33.32, "{:.1f}") == "40.0 [30.0, 50.0] n=10 \\| 33.3 \\| +6.7"
    assert paper.cell(None, 22.64, "{:.2f}", "needs 8 GPU(s)") == "(needs 8 GPU(s)) \\| 22.64 \\| -"
    assert paper.cell(2.5, None) == "2.50 \\| - \\| -"


def test_with_no_rows_every_table_renders_the_paper_and_why_ours_is_missing(tmp_path):
    paper.write_report(tmp_path)
    lb = (tmp_path / "longbench_405b.md").read_text()
    assert "Our rows: not run: needs 8 GPU(s); `make paper table=longbench_405b`." in lb
    assert "| narrativeqa | (not run) \\| 33.3 \\| - |" in lb
    assert "6.69" in lb and "variant=cpu" in lb
    grid = (tmp_path / "latency_grid.md").read_text()
    assert "22.64" in grid and "34.56" in grid and "\\| 3.18 \\|" in grid  # full / SpecPrefill 10 % at 128x4K
    qps = (tmp_path / "qps.md").read_text()
    assert "(not in this variant) \\| times out" in qps and "4.6 (53.84)" in qps
    cats = (tmp_path / "categories_8b.md").read_text()
    assert "50.91" in cats and "0.964" in cats  # Avg retention at keep 50 %: 49.10 / 50.91 = 0.9644
    assert "7.66" in (tmp_path / "headline.md").read_text()


def _eval(store_dir: Path, model: str, method: str, keep: float | None, scores: dict[str, list[float]], ttft: float):
    store = RunStore(store_dir)
    store.write_config({"m": method, "k": keep})
    store.append([
        record("eval", run_id=f"{method}{keep}", row_key=f"{t}/{i}", unit=f"{t}/{i}", timestamp=1.0, status="ok",
               model=model, benchmark="longbench", length=1000, task=t, sample_id=i, method=method,
               method_options=json.dumps({} if keep is None else {"keep_rate": keep}), keep_rate=keep,
               reference_method="full", score=s, ttft_s=ttft, hardware="cpu", category="", git_sha="abc",
               backend="vllm", dtype="bfloat16", references=["x"])
        for t, ss in scores.items() for i, s in enumerate(ss)
    ])  # fmt: skip


def test_ours_beside_the_paper_with_intervals_retention_and_speedup(tmp_path):
    f = paper.folder("longbench_405b", "paper", tmp_path)
    full = {"narrativeqa": [40.0] * 5 + [20.0] * 5, "qasper": [50.0] * 10}
    spec = {"narrativeqa": [20.0] * 10, "qasper": [50.0] * 10}
    _eval(f / "a", "llama405b", "full", None, full, 4.0)
    _eval(f / "b", "llama405b", "specprefill", 0.1, spec, 1.0)
    md = paper.render("longbench_405b", tmp_path)
    row = next(line for line in md.splitlines() if line.startswith("| narrativeqa"))
    assert "30.0 [" in row and "n=10 \\| 33.3 \\| -3.3" in row
    assert "| 0.67 [" in row  # retention at keep 0.1: 20 / 30, paired
    speed = next(line for line in md.splitlines() if line.startswith("| 0.1 |"))
    assert "4.00 [4.00, 4.00] n=20 \\| 6.69 \\| -2.69" in speed
    # ALL over the two datasets: (20 + 50) / 2
    assert "35.0 [" in speed
    assert "model llama405b; backend vllm; hardware cpu; dtype bfloat16; git_sha abc" in md


def test_latency_grid_cells_from_latency_rows(tmp_path):
    f = paper.folder("latency_grid", "cpu", tmp_path)
    store = RunStore(f / "r")
    store.write_config({"x": 1})
    rows = []
    for method, keep, t in (("full", None, 8.0), ("specprefill", 0.1, 2.0), ("minference", None, 10.0)):
        for i in range(3):
            bad = {"status": "unsupported", "error": "needs CUDA"} if method == "minference" else {"status": "ok"}
            rows.append(record(
                "latency", run_id="r", row_key=f"{method}/{i}", unit="b2-n4096", timestamp=1.0, **bad,
                model="smollm2-135m", backend="transformers", prompt_source="random", batch=2, length=4096,
                iteration=i, warmup=i == 0, method=method, keep_rate=keep, reference_method="full",
                method_options=json.dumps({} if keep is None else {"keep_rate": keep}), ttft_s=t + 0.1 * i,
                method_s=0.0, base_prefill_s=t, kept_fraction=1.0, ideal_speedup=4.0, config_hash="r", dtype="float32",
            ))  # fmt: skip
    store.append(rows)
    md = paper.render("latency_grid", tmp_path)
    cpu = md.split("## Variant `cpu`")[1]
    full = next(line for line in cpu.splitlines() if line.startswith("| full |"))
    assert "8.15 \\| - \\| -" in full  # median of the timed 8.1, 8.2; the paper has no 2x4096 point
    sp = [line for line in cpu.splitlines() if line.startswith("| specprefill 10% |")]
    assert len(sp) == 2 and "2.15 \\| - \\| -" in sp[0]
    assert "3.79 [" in sp[1] and np.isclose(8.15 / 2.15, 3.79, atol=0.01)
    mi = [line for line in cpu.splitlines() if line.startswith("| minference |")]
    assert len(mi) == 2 and all("(unsupported: needs CUDA) \\| - \\| -" in line for line in mi)
    assert "128x4096" not in cpu  # the CPU variant's columns are its own grid


@pytest.mark.parametrize("name", ["longbench_405b", "latency_grid", "categories_8b", "qps"])
def test_every_experiment_dry_runs(name, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "harness.paper", "run", "--table", name, "--dry-run", "--root", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "GPU-hours" in r.stdout and f"GPUs: {paper.load_experiment(name).variants['paper'].gpus}" in r.stdout


def test_a_command_that_cannot_run_in_its_table_is_named_not_launched_and_not_counted(tmp_path):
    """MInference in the 70B latency grid: the model runs only on vLLM, which its in-model
    patch cannot reach. The dry run says so, its GPU-hours are left out, the harness
    refuses the command's own config, and the table says why its cells are empty."""
    import dataclasses

    from hydra import compose, initialize_config_dir

    from harness import latency

    exp = paper.load_experiment("latency_grid")
    v = exp.variants["paper"]
    (mi,) = [c for c in v.commands if c.cannot_run]
    assert mi.method == "minference" and "vLLM" in mi.cannot_run
    assert paper.cannot_run(v) == {"minference": mi.cannot_run} and paper.cannot_run(exp.variants["cpu"]) == {}
    lines = paper.command_lines(exp, "paper", tmp_path)
    assert len(lines) == len(v.commands) - 1 and not any("method=minference" in " ".join(c) for c in lines)
    counted = dataclasses.replace(v, commands=[dataclasses.replace(c, cannot_run="") for c in v.commands])
    alone = dataclasses.replace(v, commands=[c for c in v.commands if not c.cannot_run])
    assert paper.gpu_hours(v) == paper.gpu_hours(alone) < paper.gpu_hours(counted)
    text = paper.plan_text(exp, "paper", tmp_path)
    assert f"minference: cannot run in this table (not launched, no GPU-hours counted): {mi.cannot_run}" in text
    assert f"{paper.gpu_hours(v):.1f} GPU-hours" in text
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="latency", overrides=[a for a in mi.args if not a.startswith("keep=")])
    with pytest.raises(ValueError, match="acts inside the base model"):
        latency.prepare(latency.LatencyConfig.from_hydra(cfg))
    md = paper.render("latency_grid", tmp_path).split("## Variant `paper`")[1].split("## Variant `cpu`")[0]
    row = next(line for line in md.splitlines() if line.startswith("| minference |"))
    assert "(cannot run in this table: see below) \\| 34.56 \\|" in row
    assert f"minference: cannot run in this table: {mi.cannot_run}." in md
