"""The paper tables: experiments valid and planned, GPU-hours from the FLOP model, and the
rendering of ours beside the paper's from stored rows (none, some, all)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import experiments
from harness.paper import __main__ as cli
from harness.paper import builders as tables
from harness.paper import cells
from harness.paper import numbers as data
from harness.store import RunStore, record

ROOT = Path(__file__).resolve().parents[1]


def test_every_published_table_has_an_experiment_with_both_variants():
    assert data.experiment_names() == ["categories_8b", "latency_grid", "longbench_405b", "qps"]
    sources = set(data.published()["source"])
    for name in data.experiment_names():
        exp = data.load_experiment(name)
        assert exp.source in sources and {"paper", "cpu"} <= set(exp.variants)
        assert all(v.gpus == 0 for k, v in exp.variants.items() if k != "paper")  # every other variant: CPU
    # the 8B/3B table's closer stand-in: a separate same-family speculator, its reason in the table
    qwen = data.load_experiment("categories_8b").variants["cpu_qwen"]
    assert "model.speculator=model:qwen2.5-coder-0.5b" in qwen.commands[0].args and "closer stand-in" in qwen.note


@pytest.mark.parametrize("name", ["categories_8b", "latency_grid", "longbench_405b", "qps"])
def test_a_paper_variant_holds_the_gpus_its_models_need(name):
    exp = data.load_experiment(name)
    for c in exp.variants["paper"].commands:
        model = next(a.split("=", 1)[1] for a in c.args if a.startswith("model="))
        cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{model}.yaml").read_text())
        need = int(cfg.get("tensor_parallel", 1)) * int(cfg.get("pipeline_parallel", 1))
        assert exp.variants["paper"].gpus == need, (name, model)


def test_gpu_hours_agree_with_two_flops_per_parameter_per_token():
    """Independent of the FLOP model: 2 x 405e9 parameters x 10K tokens x 23,750 prompts at
    989 TFLOP/s x 40 %; attention adds a few per cent at 10K tokens."""
    hours = experiments.gpu_hours(data.load_experiment("longbench_405b").variants["paper"])
    rough = 2 * 405e9 * 10_000 * 23_750 / (989e12 * 0.4) / 3600
    assert rough < hours < 1.15 * rough
    assert experiments.gpu_hours(data.load_experiment("longbench_405b").variants["cpu"]) is None


def test_unknown_table_and_variant_are_one_line_errors():
    with pytest.raises(SystemExit, match=r"table 'nope' .*allowed: \['categories_8b'"):
        data.load_experiment("nope")
    with pytest.raises(SystemExit, match=r"no variant 'gpu'; allowed: \['cpu', 'paper'\]"):
        cli.command_lines(data.load_experiment("qps"), "gpu")


def test_cell_format():
    """Ours, the paper's and Δ are three cells; a published number keeps its printed text."""
    from harness.analysis.stats import Estimate

    published = data.Published(33.32, "33.32")
    assert cells.cell(Estimate(40.0, 30.0, 50.0, 10), published, "{:.1f}") == (
        "40.0 [30.0, 50.0] n=10",
        "33.32",
        "+6.7",
    )
    assert cells.cell(None, data.Published(22.64, "22.64"), "{:.2f}", "needs 8 GPU(s)") == (
        "(needs 8 GPU(s))",
        "22.64",
        "-",
    )
    assert cells.cell(2.5, None) == ("2.50", "-", "-")
    assert cells.cell(2.5, 0.5) == ("2.50", "0.50", "+2.00")  # a ratio of published numbers, at our precision
    assert cells.cell(2.5, 0.5, no_delta="other model") == ("2.50", "0.50", "— (other model)")
    assert cells.columns("x", ("a", "b", "c")) == {"x: ours": "a", "x: paper": "b", "x: Δ": "c"}


def test_with_no_rows_every_table_renders_the_paper_and_why_ours_is_missing(tmp_path):
    tables.write_report(tmp_path)
    lb = (tmp_path / "longbench_405b.md").read_text()
    assert "Our rows: not run: needs 8 GPU(s); `make paper table=longbench_405b`." in lb
    assert "| narrativeqa | (not run) | 33.32 | - |" in lb
    assert "6.69" in lb and "variant=cpu" in lb
    grid = (tmp_path / "latency_grid.md").read_text()
    assert "| specprefill 10% | 128x4096 | (not run) | 7.12 | - | (not run) | 3.18 | - |" in grid  # 22.64 / 7.12
    qps = (tmp_path / "qps.md").read_text()
    assert "| summarization | 0.5, 40s | 405B | full | (not in this variant) | times out | - |" in qps
    assert "| 4.6 | - | (not run) | 53.84 |" in qps
    cats = (tmp_path / "categories_8b.md").read_text()
    assert "| Avg | keep 50% | (not run) | 49.10 | - | (not run) | 0.964 | - |" in cats  # 49.10 / 50.91 = 0.9644
    assert "\\|" not in "".join(f.read_text() for f in tmp_path.glob("*.md"))  # no cell holds three
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
    f = data.folder("longbench_405b", "paper", tmp_path)
    full = {"narrativeqa": [40.0] * 5 + [20.0] * 5, "qasper": [50.0] * 10}
    spec = {"narrativeqa": [20.0] * 10, "qasper": [50.0] * 10}
    _eval(f / "a", "llama405b", "full", None, full, 4.0)
    _eval(f / "b", "llama405b", "specprefill", 0.1, spec, 1.0)
    md = tables.render("longbench_405b", tmp_path)
    row = next(line for line in md.splitlines() if line.startswith("| narrativeqa"))
    assert "| 30.00 [" in row and "n=10 | 33.32 | -3.32 |" in row
    assert "| 0.67 [" in row  # retention at keep 0.1: 20 / 30, paired
    speed = next(line for line in md.splitlines() if line.startswith("| 0.1 |"))
    assert "| 4.00 [4.00, 4.00] n=20 | 6.69 | -2.69 |" in speed
    # ALL over the two datasets: (20 + 50) / 2
    assert "35.0 [" in speed
    assert "model llama405b; backend vllm; hardware cpu; dtype bfloat16; git_sha abc" in md


def test_latency_grid_cells_from_latency_rows(tmp_path):
    f = data.folder("latency_grid", "cpu", tmp_path)
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
    md = tables.render("latency_grid", tmp_path)
    cpu = md.split("## Variant `cpu`")[1]
    (full,) = [line for line in cpu.splitlines() if line.startswith("| full |")]
    assert "| 2x4096 | 8.15 n=2 | - | - |" in full  # median of the timed 8.1, 8.2; the paper has no 2x4096 point
    (sp,) = [line for line in cpu.splitlines() if line.startswith("| specprefill 10% |")]
    # the median of the two pairs' ratios, 8.1 / 2.1 and 8.2 / 2.2; two pairs give no interval
    assert "| 2.15 n=2 | - | - | 3.79 n=2 (few pairs, old protocol) |" in sp and np.isclose(
        (8.1 / 2.1 + 8.2 / 2.2) / 2, 3.79, atol=0.005
    )
    (mi,) = [line for line in cpu.splitlines() if line.startswith("| minference |")]
    assert mi.count("(unsupported: needs CUDA) | - | - |") == 2
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
    assert "GPU-hours" in r.stdout and f"GPUs: {data.load_experiment(name).variants['paper'].gpus}" in r.stdout


def test_a_command_that_cannot_run_in_its_table_is_named_not_launched_and_not_counted(tmp_path):
    """MInference in the 70B latency grid: the model runs only on vLLM, which its in-model
    patch cannot reach. The dry run says so, its GPU-hours are left out, the harness
    refuses the command's own config, and the table says why its cells are empty."""
    import dataclasses

    from hydra import compose, initialize_config_dir

    from harness.jobs import latency

    exp = data.load_experiment("latency_grid")
    v = exp.variants["paper"]
    (mi,) = [c for c in v.commands if c.cannot_run]
    assert mi.method == "minference" and "vLLM" in mi.cannot_run
    assert (
        experiments.cannot_run(v) == {"minference": mi.cannot_run} and experiments.cannot_run(exp.variants["cpu"]) == {}
    )
    lines = cli.command_lines(exp, "paper", tmp_path)
    assert len(lines) == len(v.commands) - 1 and not any("method=minference" in " ".join(c) for c in lines)
    counted = dataclasses.replace(v, commands=[dataclasses.replace(c, cannot_run="") for c in v.commands])
    alone = dataclasses.replace(v, commands=[c for c in v.commands if not c.cannot_run])
    assert experiments.gpu_hours(v) == experiments.gpu_hours(alone) < experiments.gpu_hours(counted)
    text = cli.describe(exp, "paper", tmp_path)
    assert f"minference: cannot run in this table (not launched, no GPU-hours counted): {mi.cannot_run}" in text
    assert f"{experiments.gpu_hours(v):.1f} GPU-hours" in text
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="latency", overrides=[a for a in mi.args if not a.startswith("keep=")])
    with pytest.raises(ValueError, match="acts inside the base model"):
        latency.prepare(latency.LatencyConfig.from_hydra(cfg))
    md = tables.render("latency_grid", tmp_path).split("## Variant `paper`")[1].split("## Variant `cpu`")[0]
    row = next(line for line in md.splitlines() if line.startswith("| minference | 4x131072 |"))
    assert "| (cannot run in this table: see below) | 34.56 | - |" in row
    assert f"minference: cannot run in this table: {mi.cannot_run}." in md


# --------------------------------------------------------------------------- committed point files


def test_the_committed_tables_re_render_byte_for_byte_from_the_committed_point_files(tmp_path):
    """What a fresh clone has (the point files, no run folders) renders every committed
    table and figure as committed."""
    import shutil

    points = sorted(data.RESULTS.glob(f"*/*/{data.POINTS}"))
    assert points, "no committed point file"
    for f in points:
        (tmp_path / f.relative_to(data.RESULTS)).parent.mkdir(parents=True)
        shutil.copy(f, tmp_path / f.relative_to(data.RESULTS))
        # rows trimmed to the columns the tables read (a latency grid of 10 pairs + A/A a point: ~200 KB)
        assert f.stat().st_size < 300_000, f
    tables.write_report(tmp_path)
    committed = sorted(p.name for p in data.RESULTS.glob("*.md")) + sorted(p.name for p in data.RESULTS.glob("*.png"))
    assert committed == sorted(p.name for p in tmp_path.glob("*.md")) + sorted(p.name for p in tmp_path.glob("*.png"))
    for name in committed:
        assert (tmp_path / name).read_bytes() == (data.RESULTS / name).read_bytes(), name


def _latency_rows(store_dir: Path, model: str = "smollm2-135m") -> None:
    store = RunStore(store_dir)
    store.write_config({"x": 1})
    rows = []
    for method, keep, t in (("full", None, 8.0), ("specprefill", 0.1, 2.0), ("minference", None, 10.0)):
        for i in range(3):
            bad = {"status": "unsupported", "error": "needs CUDA"} if method == "minference" else {"status": "ok"}
            rows.append(record(
                "latency", run_id="r", row_key=f"{method}/{i}", unit="b2-n4096", timestamp=1.0, **bad,
                model=model, backend="transformers", prompt_source="random", batch=2, length=4096,
                iteration=i, warmup=i == 0, method=method, keep_rate=keep, reference_method="full",
                method_options=json.dumps({} if keep is None else {"keep_rate": keep}), ttft_s=t + 0.1 * i,
                method_s=0.0, base_prefill_s=t, kept_fraction=1.0, ideal_speedup=4.0, config_hash="r", dtype="float32",
                speculator=None if method != "specprefill" else "self_layers:20", git_sha="0123456789",
                versions=json.dumps({"torch": "x"}),
            ))  # fmt: skip
    store.append(rows)


def _qps_rows(store_dir: Path, method: str, keep: float | None, top: float) -> None:
    """A rate search on qa_1: every rate up to ``top`` passes, the next fails (none where top is the last)."""
    store = RunStore(store_dir)
    store.write_config({"m": method})
    rows = []
    for rate in (0.5, 1.0, 2.0):
        passed = rate <= top
        for r in range(3):
            rows.append(record(
                "qps", run_id=f"q{method}", row_key=f"{rate}/{r}", unit=str(rate), timestamp=1.0, status="ok",
                model="smollm2-135m", benchmark="ruler", length=2048, task="qa_1", sample_id=r, arrival="poisson",
                rate=rate, request=r, prompt_tokens=2000, kept_tokens=200 if keep else 2000, kept_source="front",
                ttft_s=rate, e2e_s=rate * 2, tpot_s=0.01, timed_out=not passed, score=50.0 + r, method=method,
                method_options=json.dumps({} if keep is None else {"keep_rate": keep}), keep_rate=keep,
                reference_method="full", pass_timeout_rule=passed, pass_ttft_slo=passed, passed=passed,
                request_throughput=rate, references=["x"], config_hash=f"q{method}", hardware="cpu: x, 2 threads",
                dtype="float32", backend="vllm", git_sha="abc", prediction="a long answer, with commas",
            ))  # fmt: skip
    store.append(rows)


def _every_kind(root: Path) -> None:
    """Rows of every kind in the CPU variants: eval (a task where full prefill scores 0),
    latency (an unsupported method), qps (a lower bound, in its category's subfolder)."""
    lb = data.folder("longbench_405b", "cpu", root)
    full = {"niah_single_1": [100.0] * 4, "vt": [0.0] * 4, "qa_1": [50.0, 0.0, 100.0, 0.0]}
    spec = {"niah_single_1": [100.0, 0.0, 100.0, 100.0], "vt": [20.0] * 4, "qa_1": [50.0] * 4}
    _eval(lb / "a", "smollm2-135m", "full", None, full, 4.0)
    _eval(lb / "b", "smollm2-135m", "specprefill", 0.1, spec, 2.0)
    _latency_rows(data.folder("latency_grid", "cpu", root) / "r")
    q = data.folder("qps", "cpu", root) / "multi-doc-qa"
    _qps_rows(q / "full", "full", None, 1.0)
    _qps_rows(q / "spec", "specprefill", 0.1, 2.0)


def _pages(root: Path) -> dict[str, str]:
    return {
        **{t: tables.render(t, root) for t in data.experiment_names()},
        "headline": tables.headline(root),
        "baselines": tables.baselines(root),
    }


def test_a_point_file_renders_what_its_run_folders_render(tmp_path):
    """Every kind of row, trimmed to the point file's columns and read back: the same pages."""
    import shutil

    _every_kind(tmp_path)
    for table in data.experiment_names():
        exp = data.load_experiment(table)
        for variant in exp.variants:
            kept = data.write_points(exp, variant, tmp_path)
            assert (kept is not None) == (variant == "cpu" and table != "categories_8b")
    before = _pages(tmp_path)  # from the run folders
    assert "(undefined: full prefill scored 0)" in before["longbench_405b"] and ">=" in before["qps"]
    for f in tmp_path.glob("*/*/*"):
        if f.name != data.POINTS:
            shutil.rmtree(f)  # what a clone has: no run folder
    after = _pages(tmp_path)
    for page, md in before.items():
        assert after[page] == md, page
    assert "kept in `qps/cpu/rows.csv`" in after["qps"] and "git_sha 0123456789" in after["latency_grid"]


def test_a_delta_only_where_our_setting_is_the_papers(tmp_path):
    pub = data.published()
    for table in data.experiment_names():
        exp = data.load_experiment(table)
        assert cells.no_delta(exp, "paper", pub) == ""
        want = "other model" if table == "latency_grid" else "other model and benchmark"
        assert cells.no_delta(exp, "cpu", pub) == want, table
    # the same rows, once as the 405B on LongBench, once as the CPU variant's model
    for variant, model in (("paper", "llama405b"), ("cpu", "smollm2-135m")):
        f = data.folder("longbench_405b", variant, tmp_path)
        _eval(f / "a", model, "full", None, {"narrativeqa": [40.0] * 4}, 4.0)
        _eval(f / "b", model, "specprefill", 0.1, {"narrativeqa": [20.0] * 4}, 1.0)
    md = tables.render("longbench_405b", tmp_path)
    ours_paper, cpu = md.split("## Variant `cpu`")
    assert "| narrativeqa | 40.00 [40.00, 40.00] n=4 | 33.32 | +6.68 |" in ours_paper
    assert "| 0.1 | 4.00 [4.00, 4.00] n=4 | 6.69 | -2.69 |" in ours_paper
    assert "| narrativeqa | 40.00 [40.00, 40.00] n=4 | 33.32 | — (other model and benchmark) |" in cpu
    assert "| 0.1 | 4.00 [4.00, 4.00] n=4 | 6.69 | — (other model and benchmark) |" in cpu
    _latency_rows(data.folder("latency_grid", "cpu", tmp_path) / "r")
    head = tables.headline(tmp_path)
    assert "| up to x TTFT | 3.79 | 7.66 | — (other model) | latency_grid/cpu: smollm2-135m specprefill |" in head


def test_retention_over_a_full_prefill_score_of_zero_is_undefined_not_missing(tmp_path):
    _every_kind(tmp_path)
    md = tables.render("longbench_405b", tmp_path).split("## Variant `cpu`")[1]
    (vt,) = [line for line in md.splitlines() if line.startswith("| vt |")]
    assert "| (undefined: full prefill scored 0) | (not run) |" in vt  # keep 0.1 ran, keep 0.3 did not
    (niah,) = [line for line in md.splitlines() if line.startswith("| niah_single_1 |")]
    assert "| 0.75 [" in niah  # 75 / 100


def test_published_numbers_keep_the_papers_precision(tmp_path):
    """Every published score, latency, speedup and QPS is printed as the paper prints it
    (33.32, 23.70, 18.0, 100), not re-rounded."""
    tables.write_report(tmp_path)
    pub = data.published()
    assert {"33.32", "23.70", "18.0", "100", "63.30"} <= set(pub["printed"])
    for exp in map(data.load_experiment, data.experiment_names()):
        md = (tmp_path / f"{exp.table}.md").read_text()
        for printed in pub[(pub["source"] == exp.source) & (pub["printed"] != "")]["printed"]:
            assert f"| {printed} |" in md, (exp.table, printed)
    for printed in ("0.997", "2.54", "6.54"):
        assert f"| {printed} |" in (tmp_path / "baselines.md").read_text()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--table", "latency_grid", "--variant", "nope"], "paper: table 'latency_grid' has no variant 'nope'; allowed: ['cpu', 'paper']"),
        (["--table", "latency_grid", "--variant", "nope", "--dry-run"], "has no variant 'nope'; allowed: ['cpu', 'paper']"),
        (["--table", "nope", "--variant", "cpu"], "paper: table 'nope' has no conf/experiment/paper_nope.yaml; allowed: ['categories_8b'"),
    ],
)  # fmt: skip
def test_an_unknown_table_or_variant_is_one_line(args, line, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "harness.paper", "run", *args, "--root", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr


def test_every_cpu_variant_pins_the_speculator_its_rows_were_measured_with():
    """A rerun measures what the table says: each CPU command names its speculator, the note
    says the same depth, and the committed rows carry it."""
    for exp in map(data.load_experiment, data.experiment_names()):
        v = exp.variants["cpu"]
        pins = {a.split("=", 1)[1] for c in v.commands for a in c.args if a.startswith("model.speculator=")}
        assert len(pins) == 1 and all(any(a.startswith("model.speculator=") for a in c.args) for c in v.commands)
        (pin,) = pins
        depth = pin.removeprefix("self_layers:")
        assert f"model.speculator={pin}" in v.note and f"first {depth} of 30 layers" in v.note, exp.table
        points = data.folder(exp.table, "cpu") / data.POINTS
        if points.is_file():
            measured = set(data.read_points(points)["speculator"].dropna())
            assert measured == {pin}, (exp.table, measured)


def test_the_rebuttal_baselines_have_a_table_and_ruler_says_why_it_has_none(tmp_path):
    pub = data.published()
    assert not pub["benchmark"].str.contains("ruler", case=False).any()  # nothing transcribed to tabulate
    md = tables.baselines(tmp_path)
    assert "No RULER number is transcribed" in md and "RAG and LLMLingua-2" in md
    assert "| SpecPrefill keep 10 %'s LongBench score over MInference's (70B base) | - | (not run:" in md
    assert "| cpu | (not run) | 2.54 | - |" in md
    _latency_rows(data.folder("latency_grid", "cpu", tmp_path) / "r")
    md = tables.baselines(tmp_path)
    assert "| cpu | (unsupported: needs CUDA) | 6.54 | - |" in md


def test_each_table_links_its_figure_with_ours_beside_the_papers(tmp_path):
    _every_kind(tmp_path)
    tables.write_report(tmp_path)
    for name in [*data.experiment_names(), "baselines"]:
        md = (tmp_path / f"{name}.md").read_text()
        assert f"]({name}.png)" in md and (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    for table in ("longbench_405b", "latency_grid", "qps"):
        marks = tables.render_table(table, tmp_path)[1]
        assert {"paper", "cpu"} <= {m.source for m in marks}, table
    qps = tables.render_table("qps", tmp_path)[1]
    bounds = [(m.panel, m.y) for m in qps if m.source == "cpu" and m.lower_bound]  # the search never failed
    assert bounds == [("max QPS", 2.0), ("SpecPrefill's max QPS over full prefill's", 2.0)]
