"""The analysis layer: one definition per measure, points inside their intervals, and the
summary, the gate and the paper tables printing the same number for the same point."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analysis.folder import analyze_rows
from harness.analysis.quality import Point, macro_mean, paired_ratio, summarize
from harness.analysis.speed import point_speedup, summarize_latency
from harness.analysis.stats import Estimate
from harness.paper import builders as tables
from harness.paper import numbers as data
from harness.regress import compare as regress
from harness.regress.verdict import point_fields
from harness.store import read_results

ROOT = Path(__file__).resolve().parents[1]
#: ``value [lo, hi]`` as every renderer prints an interval (``x`` after speedups).
CELL = re.compile(r"(-?\d+(?:\.\d+)?)x? \[(-?\d+(?:\.\d+)?)x?, (-?\d+(?:\.\d+)?)x?\]")
WITH_INTERVAL = ["score", "retention", "kept_fraction", "needle_kept", "ttft_ratio", "speedup"]


def committed_rows() -> dict[str, pd.DataFrame]:
    """Every committed set of rows: the regression baselines and the paper tables' point files
    (one set per command subfolder)."""
    out = {str(f.relative_to(ROOT)): read_results(f) for f in sorted((ROOT / "results" / "baseline").glob("*/rows"))}
    for f in sorted(data.RESULTS.glob(f"*/*/{data.POINTS}")):
        rows = data.read_points(f)
        for sub, g in rows.groupby("sub"):
            out[f"{f.relative_to(ROOT)}:{sub}"] = g
    assert len(out) >= 6, sorted(out)
    return out


def _inside(df: pd.DataFrame, measures: list[str]) -> list[str]:
    bad = []
    for m in measures:
        if f"{m}_lo" not in df:
            continue
        v, lo, hi = (df[c].astype(float) for c in (m, f"{m}_lo", f"{m}_hi"))
        has = v.notna() & lo.notna()
        out = has & ~((lo <= v + 1e-12) & (v <= hi + 1e-12))
        bad += [f"{m}: {a} [{b}, {c}]" for a, b, c in zip(v[out], lo[out], hi[out], strict=True)]
    return bad


def test_every_committed_markdown_interval_contains_its_value():
    """Every ``v [lo, hi]`` printed in a committed summary or table (results/reference,
    results/baseline, results/paper): lo <= v <= hi, as printed (rounding is monotone)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "results/*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    cells, bad = 0, []
    for f in (ROOT / name for name in tracked.stdout.split()):
        for m in CELL.finditer(f.read_text()):
            v, lo, hi = map(float, m.groups())
            cells += 1
            if not lo <= v <= hi:
                bad.append(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert cells > 150 and not bad, bad


@pytest.mark.parametrize("name", sorted(committed_rows()))
def test_every_point_of_the_committed_rows_lies_in_its_interval(name):
    rows = committed_rows()[name]
    a = analyze_rows(ROOT, rows)
    assert not a.summary.empty or not a.latency.empty or not a.qps.empty
    assert not _inside(a.summary, WITH_INTERVAL), name
    assert not _inside(a.latency, ["speedup"]), name


def test_a_point_lies_in_its_interval_where_a_mean_of_ratios_would_not():
    """Tasks of unequal size and score: the ratio of macro means and its paired bootstrap
    agree; the mean of per-task ratios (the old point estimate) falls outside that interval."""
    rng = np.random.default_rng(3)
    rows = []
    for task, n, p_ref, p_m in (("a", 40, 0.9, 0.85), ("b", 12, 0.3, 0.05), ("c", 25, 0.5, 0.4)):
        for i in range(n):
            for method, p in (("full", p_ref), ("m", p_m)):
                rows.append({"task": task, "sample_id": i, "method": method, "score": 100.0 * (rng.random() < p),
                             "hardware": "x"})  # fmt: skip
    df = pd.DataFrame(rows)
    m, r = Point(df[df["method"] == "m"]), Point(df[df["method"] == "full"])
    parts = [["a", "b", "c"]]
    e = paired_ratio(m, "score", r, "score", parts)
    assert e.lo <= e.value <= e.hi
    assert all(r.values(t, "score").mean() > 0 for t in "abc")
    mean_of_ratios = np.mean([m.values(t, "score").mean() / r.values(t, "score").mean() for t in "abc"])
    assert not e.lo <= mean_of_ratios <= e.hi  # what the old report printed beside this interval
    assert macro_mean(m, "score", parts).value == pytest.approx(np.mean([m.values(t, "score").mean() for t in "abc"]))


def test_the_median_run_gives_the_speedup_and_its_interval():
    runs = [
        Estimate(1.0, 0.9, 1.1, 8),
        Estimate(2.0, 1.9, 2.1, 8),
        Estimate(3.0, 2.9, 3.1, 8),
        Estimate(4.0, 3.9, 4.1, 8),
    ]
    e = point_speedup(runs)
    assert e is not None and e.lo <= e.value <= e.hi  # a median of values (2.5) would lie in no run's interval
    assert e.value == 2.0


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory):
    """A fresh tiny run: full prefill, SpecPrefill at two keep rates, two RULER tasks."""
    from hydra import compose, initialize_config_dir

    from harness.jobs.eval import EvalConfig, execute, prepare

    out = tmp_path_factory.mktemp("tiny") / "res"
    common = ["model=tiny-random", "length=1024", "tasks=[niah_single_1,vt]", "limit=4", f"out={out}"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for extra in (["method=full"], ["method=specprefill", "keep=0.3"], ["method=specprefill", "keep=0.5"]):
            execute(prepare(EvalConfig.from_hydra(compose(config_name="config", overrides=[*extra, *common]))))
    return read_results(out)


def test_one_eval_job_runs_several_methods_sample_by_sample_side_by_side(tmp_path):
    """``also=[...]`` on a single-turn benchmark: every sample run by each method in an order
    turned over from sample to sample (each method in each place equally often), one run id,
    so the summary's speedups are side by side; a rerun resumes without a duplicate row."""
    from hydra import compose, initialize_config_dir

    from harness.jobs.eval import EvalConfig, execute, prepare

    over = ["model=tiny-random", "length=1024", "tasks=[niah_single_1,vt]", "limit=3", "method=full",
            "also=[specprefill,truncate]", "keep=0.3", f"out={tmp_path}"]  # fmt: skip
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        job = prepare(EvalConfig.from_hydra(compose(config_name="config", overrides=over)))
    assert "speculator self_layers:1 in this process" in job.describe()  # full needs none, specprefill does
    execute(job)
    rows = read_results(tmp_path)
    assert len(rows) == 18 and rows["run_id"].nunique() == 1 and (rows["status"] == "ok").all()
    places = rows.groupby("method")["order"].value_counts().unstack()
    assert (places == 2).all().all()  # 6 samples, 3 methods: each method twice in each place
    assert all(sorted(g) == [0, 1, 2] for _, g in rows.groupby(["task", "sample_id"])["order"])
    s = summarize(rows)
    timing = s[s["method"] != "full"].set_index("method")["speedup_timing"]
    assert set(timing) == {"side by side"}
    execute(job)  # every sample done: nothing reruns, nothing is duplicated
    assert len(read_results(tmp_path)) == 18


def _same_number_everywhere(rows: pd.DataFrame) -> int:
    """For every eval point of ``rows``: the summary's ALL score, retention and speedup are
    the gate's (the folder against itself) and the paper tables' (:class:`data.Ours`); the
    latency summary's speedups are the gate's. Returns how many numbers were compared."""
    a = analyze_rows(ROOT, rows)
    v = regress.gate(a, a, eval_speed=True)
    compared = 0
    gate_quality = {(c.fields["model"], c.fields["method"], c.fields["keep"], c.fields["speculator"],
                     c.fields["options"], c.fields["where"]): c for c in v.rows if c.kind == "quality"}  # fmt: skip
    ours = data.Ours(a)
    for _, s in a.summary[a.summary["task"] == "ALL"].iterrows():
        is_ref = s["method_name"] == s["reference"]
        fields = point_fields(s.to_dict() | {"method": s["method_name"]}, is_ref)
        key = (fields["model"], fields["method"], fields["keep"], fields["speculator"], fields["options"], "ALL")
        if key in gate_quality:  # the gate compares ALL where a point has more than one task
            c = gate_quality[key]
            assert c.candidate == pytest.approx(s["score"], abs=1e-9)
            if not is_ref:
                assert c.retention is not None
                assert (c.retention.value, c.retention.lo, c.retention.hi) == pytest.approx(
                    (s["retention"], s["retention_lo"], s["retention_hi"]), nan_ok=True
                )
            compared += 1
        sc = ours.score(s["method_name"], float(s["keep_rate"]), "ALL", model=s["model"])
        assert sc is not None and (sc.value, sc.lo, sc.hi) == pytest.approx((s["score"], s["score_lo"], s["score_hi"]))
        compared += 1
        if is_ref:
            continue
        ret = ours.retention(s["method_name"], float(s["keep_rate"]), "ALL", model=s["model"])
        if not np.isnan(s["retention"]):
            assert ret is not None and (ret.value, ret.lo, ret.hi) == pytest.approx(
                (s["retention"], s["retention_lo"], s["retention_hi"])
            )
            compared += 1
        sp = ours.ttft_speedup(s["method_name"], float(s["keep_rate"]), s["model"])
        if not np.isnan(s["speedup"]):
            assert sp is not None and (sp.value, sp.lo, sp.hi) == pytest.approx(
                (s["speedup"], s["speedup_lo"], s["speedup_hi"])
            )
            gate_speed = [c for c in v.rows if c.kind == "speed" and c.fields.get("where") == "speedup TTFT ALL"
                          and c.fields["method"] == s["method_name"] and c.fields["keep"] == fields["keep"]]  # fmt: skip
            assert [c.candidate for c in gate_speed] == pytest.approx([s["speedup"]])
            compared += 2
    lat = a.latency[~a.latency["is_reference"].astype(bool)].dropna(subset=["speedup"])
    # the gate compares neither the A/A check nor rows of the older protocol (no speed baseline)
    lat = lat[(lat["method_name"] != "aa_check") & ~lat["flags"].str.contains("order not balanced")]
    gate_lat = [c.candidate for c in v.rows if c.kind == "speed" and "latency" in c.point]
    assert sorted(gate_lat) == pytest.approx(sorted(lat["speedup"]))
    return compared + len(gate_lat)


def synthetic_rows(seed: int = 0) -> pd.DataFrame:
    """LongBench-like eval rows: two categories of unequal size, tasks of unequal n, full
    prefill and two keep rates, one machine."""
    rng = np.random.default_rng(seed)
    rows = []
    tasks = {"qa1": ("QA", 9), "qa2": ("QA", 5), "sum1": ("Summ", 14)}
    for method, keep, p, t in (
        ("full", None, 0.7, 4.0),
        ("specprefill", 0.1, 0.4, 1.5),
        ("specprefill", 0.3, 0.6, 2.5),
    ):
        for task, (cat, n) in tasks.items():
            for i in range(n):
                rows.append({
                    "kind": "eval", "status": "ok", "model": "m", "benchmark": "longbench", "length": 0, "task": task,
                    "category": cat, "sample_id": i, "method": method, "keep_rate": keep, "reference_method": "full",
                    "method_options": "{}" if keep is None else f'{{"keep_rate": {keep}}}', "config_hash": f"{keep}",
                    "benchmark_options": "{}", "hardware": "x", "dtype": "float32", "backend": "transformers",
                    "score": 100.0 * (rng.random() < p), "ttft_s": t * rng.uniform(0.8, 1.2), "kept_fraction": keep or 1.0,
                    "needle_kept": None, "run_id": f"r{keep}", "speculator": "self_layers:8",
                })  # fmt: skip
    return pd.DataFrame(rows)


def test_summary_gate_and_paper_print_the_same_number_with_categories():
    """``ALL`` over categories (LongBench's Avg) is the same in the summary, the gate and the
    paper tables: a macro mean of macro means, not a mean over tasks or pooled samples."""
    rows = synthetic_rows()
    assert _same_number_everywhere(rows) >= 8
    qa = np.mean([rows[(rows["task"] == t) & (rows["keep_rate"] == 0.1)]["score"].mean() for t in ("qa1", "qa2")])
    summ = rows[(rows["task"] == "sum1") & (rows["keep_rate"] == 0.1)]["score"].mean()
    assert summarize(rows).query("task == 'ALL' and keep_rate == 0.1")["score"].iloc[0] == pytest.approx(
        (qa + summ) / 2
    )


def test_summary_gate_and_paper_print_the_same_number_on_a_fresh_run(tiny_rows):
    assert _same_number_everywhere(tiny_rows) >= 8


@pytest.mark.parametrize("name", [n for n in sorted(committed_rows()) if "baseline" in n or "longbench" in n])
def test_summary_gate_and_paper_print_the_same_number_on_the_committed_rows(name):
    assert _same_number_everywhere(committed_rows()[name]) >= 4


def test_the_paper_table_prints_the_summarys_retention():
    """The rendered longbench table's retention ALL cells are the summary's, as printed."""
    rows = data.read_points(data.RESULTS / "longbench_405b" / "cpu" / data.POINTS)
    s = summarize(rows[rows["kind"] == "eval"])
    table = tables.render("longbench_405b")
    for _, r in s[(s["task"] == "ALL") & (s["method_name"] != s["reference"])].iterrows():
        assert f"{r['retention']:.2f} [{r['retention_lo']:.2f}, {r['retention_hi']:.2f}] n={r['n']}" in table


def test_latency_summary_keeps_the_point_key():
    rows = read_results(ROOT / "results" / "baseline" / "cpu-amx" / "rows")
    lat = summarize_latency(rows[rows["kind"] == "latency"])
    assert {"speculator", "method_options", "dtype", "method_name"} <= set(lat.columns)
    assert set(lat.loc[~lat["is_reference"], "speculator"]) == {"self_layers:8"}
    assert set(lat.loc[lat["is_reference"], "speculator"]) == {""}  # the reference runs none
    m = lat[~lat["is_reference"]].iloc[0]
    ref = lat[lat["is_reference"]].iloc[0]
    assert m["ideal_ttft_s"] == pytest.approx(ref["ttft_median_s"] / m["ideal_speedup"])  # what latency_grid draws


# --------------------------------------------------------------------------- one definition

HARNESS = ROOT / "harness"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in HARNESS.rglob("*.py")}


@pytest.mark.parametrize(
    "pattern,home",
    [
        (r"fillna\((1\.0|REFERENCE_KEEP)\)", "harness/analysis/rows.py"),  # the reference's keep rate
        (r"ratio_of_medians_ci\(", "harness/analysis/"),  # the latency speedup
        (
            r"def (paired_ratio|macro_mean|paired_difference|summarize|summarize_latency|summarize_qps)\b",
            "harness/analysis/",
        ),
        (r"mean_draws\(|task_seed\(", "harness/analysis/|harness/studies/lm_eval_crosscheck.py"),
        (r"1\.0 / .*kept_fraction|1 / .*kept_fraction", "(none)"),  # no ideal from the kept fraction
    ],
)
def test_each_measure_is_defined_in_one_place(pattern, home):
    hits = [f for f, text in _sources().items() for line in text.splitlines()
            if re.search(pattern, line) and not line.lstrip().startswith(("#", '"', "'"))]  # fmt: skip
    assert (hits and all(re.match(home, f) for f in hits)) or (home == "(none)" and not hits), hits
    if pattern.startswith("fillna"):
        assert len(hits) == 1, hits


#: Reading rows for a measure: the store's readers, normalizing and summarizing. Only the
#: analysis package (and the store itself) calls them; every reader is handed an Analysis.
ROW_READERS = {"read_results", "read_rows", "normalize", "summarize", "summarize_latency", "summarize_qps",
               "summarize_qps_rates"}  # fmt: skip
#: The write side reads its own run folder to resume (which units are done, which rates a
#: serving job measured) and for its exit status (how many rows failed): a job's control,
#: not a measure.
STORE_READS_TO_RESUME = {"harness/jobs/qps.py", "harness/failures.py"}


def _calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every call by a bare or dotted name (``f(...)``, ``m.f(...)``); a
    run store's ``read`` (``RunStore(...).read()``, ``store.read()``) is named ``RunStore.read``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "read" and isinstance(f, ast.Attribute):
                on = f.value
                if (isinstance(on, ast.Call) and getattr(on.func, "id", "") == "RunStore") or (
                    isinstance(on, ast.Name) and on.id == "store"
                ):
                    name = "RunStore.read"
            out.append((node.lineno, name))
    return out


def _reads_rows_itself(root: Path = ROOT) -> list[str]:
    """Where a module under ``root/harness`` outside the analysis package and the store reads
    rows for a measure itself (the write side's resume reads excepted)."""
    found = []
    for path in sorted((root / "harness").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("harness/analysis/") or rel == "harness/store.py":
            continue
        for line, name in _calls(ast.parse(path.read_text())):
            if name in ROW_READERS or (name == "RunStore.read" and rel not in STORE_READS_TO_RESUME):
                found.append(f"{rel}:{line} {name}()")
    return found


def test_only_the_analysis_package_reads_rows_for_measures():
    """The summary, report, figures, gate, paper tables and studies are handed an
    :class:`~harness.analysis.folder.Analysis`; none reads the store, normalizes or
    summarizes rows itself (so a measure cannot be taken two ways)."""
    assert _reads_rows_itself() == []


def test_the_row_reader_check_finds_a_reader_that_reads_for_itself(tmp_path):
    """The check above can fail: a renderer calling ``normalize`` or ``read_results``, or a
    job reading its store outside the resume reads, is found; the analysis package is not."""
    (tmp_path / "harness" / "rendering").mkdir(parents=True)
    (tmp_path / "harness" / "rendering" / "page.py").write_text(
        "from harness import store\n\n\ndef page(out, rows):\n    return normalize(rows), store.read_results(out)\n"
    )
    (tmp_path / "harness" / "jobs").mkdir()
    (tmp_path / "harness" / "jobs" / "count.py").write_text("def n(folder):\n    return len(RunStore(folder).read())\n")
    (tmp_path / "harness" / "analysis").mkdir()
    (tmp_path / "harness" / "analysis" / "ok.py").write_text("def f(rows):\n    return normalize(rows)\n")
    assert sorted(_reads_rows_itself(tmp_path)) == [
        "harness/jobs/count.py:2 RunStore.read()", "harness/rendering/page.py:5 normalize()",
        "harness/rendering/page.py:5 read_results()",
    ]  # fmt: skip


PACKAGES = ("harness", "specprefill", "baselines")


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGES):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(PACKAGES)}
    return out


def test_the_import_graph_has_no_circle():
    """No circle anywhere in the project (a function-level import counts), and the analysis
    layer imports no renderer."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}  # fmt: skip
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            for y in graph[x]:
                if y == b:
                    return True
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return False

    circles = sorted(m for m in modules if reaches(m, m))
    assert not circles, circles
    for m in (x for x in modules if x.startswith("harness.analysis")):
        assert not any(reaches(m, r) for r in ("harness.report.summary", "harness.report.html", "harness.paper.builders",
                                                "harness.rendering.plots", "harness.rendering.tables")), m  # fmt: skip


def test_the_default_reference_pareto_has_the_flop_ideal_and_a_panel_per_task(tmp_path, monkeypatch):
    """The committed default run's rows: the Pareto's ideal is the FLOP model's (about 1.36x at
    keep 0.1 for self_layers:20 on SmolLM2, not 1 / kept fraction = 9.8x), drawn over all tasks
    and in one panel per task."""
    from harness.analysis.folder import analyze
    from harness.rendering import plots

    a = analyze(ROOT / "results" / "reference" / "default_eval")
    s = a.summary
    at = s[(s["task"] == "ALL") & (s["method_name"] == "specprefill") & (s["keep_rate"] == 0.1)].iloc[0]
    assert 1.3 < at["ideal_speedup"] < 1.45 and at["kept_fraction"] < 0.11
    titles = []
    real = plots._panel_pareto
    monkeypatch.setattr(
        plots, "_panel_pareto", lambda ax, g, title, xmax: titles.append(title) or real(ax, g, title, xmax)
    )
    assert plots.pareto(s, tmp_path / "p.png").exists()
    tasks = sorted(set(s["task"]) - {"ALL"})
    assert len(titles) == 1 + len(tasks) == 7 and "ALL" in titles[0]
    assert all(any(t in title for title in titles) for t in tasks)


def test_an_eval_speedup_above_its_ideal_is_marked_between_runs():
    """An eval run's TTFT ratio is between runs: where it beats its FLOP ideal by more than
    the tolerance (a cold reference run, a busy minute) the summary says so in
    ``speed_anomaly`` and the table's cell reads "(above ideal)"; the table's note says the
    speedups are between runs."""
    from harness.rendering.tables import BETWEEN_RUNS, format_summary, to_markdown

    rows = synthetic_rows()
    rows["flops_full"] = 100.0
    rows["flops_method"] = np.where(rows["keep_rate"].isna(), 100.0, 50.0)  # ideal 2x at both keeps
    s = summarize(rows)
    at = s[(s["task"] == "ALL") & (s["keep_rate"] == 0.1)].iloc[0]  # TTFT 1.5 s against 4 s: about 2.7x
    assert at["ideal_speedup"] == pytest.approx(2.0) and at["speedup"] > 2.0 * 1.15
    assert at["speed_anomaly"].startswith("anomaly:") and "FLOP ideal 2.00x" in at["speed_anomaly"]
    ok = s[(s["task"] == "ALL") & (s["keep_rate"] == 0.3)].iloc[0]  # 4 / 2.5 = 1.6x: under its ideal
    assert ok["speed_anomaly"] == ""
    cells = format_summary(s)
    assert cells.loc[at.name, "speedup"].endswith("(above ideal)")
    assert not cells.loc[ok.name, "speedup"].endswith("(above ideal)")
    assert BETWEEN_RUNS in to_markdown(s)


def test_task_seeds_are_a_stable_hash_of_the_name():
    """CRC-32 of the name (values from zlib, not from the code under test): the same in every
    process, and two tasks with the same letters get two seeds (the old sum of character
    codes gave gov_report and multi_news both 1095, so their resamples were one draw)."""
    from harness.analysis.stats import SEED, task_seed

    assert task_seed("gov_report") - SEED == 2569334372
    assert task_seed("multi_news") - SEED == 1273716772


def test_kv_held_counts_a_second_cache_and_is_unknown_where_a_revival_row_lacks_it():
    """KV revival keeps the speculator's cache beside the base's: held = both. A revival row
    written before ``speculator_kv_bytes`` existed holds an unknown amount (NaN), never the
    base's alone, which would understate it; other policies hold the base's."""
    from harness.analysis.rows import normalize

    rows = pd.DataFrame({"kind": "eval", "model": "m", "length": 2048, "keep_rate": [None, 0.1, 0.1],
                         "reference_method": "full", "method": ["full", "specprefill_revival", "specprefill_revival"],
                         "turn_policy": ["prefix_cache", "revival", "revival"], "kv_bytes": [1000, 100, 100],
                         "speculator_kv_bytes": [None, 400, None]})  # fmt: skip
    held = normalize(rows)["kv_held_bytes"].tolist()
    assert held[:2] == [1000, 500] and np.isnan(held[2])
    old = normalize(rows.drop(columns="speculator_kv_bytes"))["kv_held_bytes"].tolist()
    assert old[0] == 1000 and np.isnan(old[1]) and np.isnan(old[2])


def test_a_folder_mixing_model_settings_at_one_reference_is_refused():
    """Two runs of one model under settings that change results (here the chat template)
    would be pooled under one reference; the readers refuse it in one line naming the
    setting. A setting older rows do not record, or a real model's seed, does not count."""
    from harness.failures import MixedModels

    rows = synthetic_rows()
    rows["model_weights"] = "real"
    rows["chat_template"] = True
    mixed = rows.copy()
    mixed.loc[mixed["keep_rate"] == 0.1, "chat_template"] = False
    with pytest.raises(MixedModels, match=r"^model m: .*chat_template=False \(runs r0\.1\).*chat_template=True"):
        summarize(mixed)
    older = rows.copy()
    older["chat_template"] = older["chat_template"].astype(object)
    older.loc[older["keep_rate"] == 0.1, "chat_template"] = None  # a run written before the column
    older["model_seed"] = np.where(older["keep_rate"] == 0.1, 1, 0)  # real weights: the seed changes nothing
    assert summarize(older).equals(summarize(rows))
    randoms = older.assign(model_weights="random")
    with pytest.raises(MixedModels, match=r"model_seed=0 .*model_seed=1"):
        summarize(randoms)


def test_every_row_records_the_model_settings_that_change_results():
    from harness.models.catalog import model_config
    from harness.provenance import provenance

    p = provenance(model_config("tiny-random", chat_template=False, seed=3), "transformers")
    assert {k: p[k] for k in ("chat_template", "model_revision", "model_seed")} == {
        "chat_template": False, "model_revision": None, "model_seed": 3,
    }  # fmt: skip


def test_a_method_doing_the_references_work_whose_interval_lies_above_it_is_an_anomaly():
    """A press (ideal 1.0) cannot be faster than full prefill: an interval wholly above 1.0 is
    the job's timing, flagged even inside the 10 % tolerance; a method doing less work, or an
    interval reaching 1.0, is not flagged by it."""
    from harness.analysis.speed import interval_anomaly

    assert "lies wholly above 1.00x" in interval_anomaly(Estimate(1.09, 1.01, 1.15, 10), 1.0)
    assert interval_anomaly(Estimate(1.05, 0.99, 1.09, 10), 1.0) == ""
    assert interval_anomaly(Estimate(0.88, 0.878, 0.89, 10), 0.871) == ""  # above its ideal, below 1: anomaly()'s
    assert interval_anomaly(Estimate(2.02, 1.85, 2.16, 10), 1.84) == ""  # does less work: the tolerance holds
    folder = ROOT / "results" / "reference" / "kv_compare_smollm2_cpu"
    lat = analyze_rows(folder, read_results(folder)).latency
    flagged = lat[lat["anomaly"].fillna("").str.contains("wholly above")]
    assert sorted(zip(flagged["method"], flagged["keep_rate"])) == [("knorm", 0.1), ("tova", 0.1)]
    assert not flagged["comparable"].any()
