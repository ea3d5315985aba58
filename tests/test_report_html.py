"""The report page and its figures, on a hand-made results folder holding every kind of row
(eval at two lengths with needle depths, a failed sample, an unsupported method, a latency
grid, a served rate search), and the same page opened in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.quality import summarize
from harness.diagnostics import needle_depth
from harness.rendering import plots
from harness.report.html import failures, paper_tables
from harness.report.summary import build, write_all
from harness.store import RunStore, record

COMMON = {"timestamp": 1.7e9, "model": "m", "git_sha": "abc1234", "hardware": "cpu-x", "dtype": "float32",
          "backend": "transformers", "versions": json.dumps({"torch": "2.13.0", "transformers": "5.19.0"}),
          "reference_method": "full"}  # fmt: skip


def _opts(keep):
    return json.dumps({"keep_rate": keep} if keep is not None else {})


def _eval(run, method, keep, length, scores, ttft, depths=None, status="ok", error=None, kept=None):
    """Rows of tasks niah_single_1 (with needle depths) and qa_1, sample i scoring scores[i]."""
    rows = []
    for task in ("niah_single_1", "qa_1"):
        for i, sc in enumerate(scores):
            rows.append(
                record(
                    "eval", **COMMON, run_id=run, row_key=f"{task}/{i}", unit=f"{task}/{i}", status=status,
                    error=error, benchmark="ruler", length=length, task=task, sample_id=i, method=method,
                    method_options=_opts(keep), keep_rate=keep, benchmark_options="{}",
                    score=None if status != "ok" else sc, ttft_s=None if status != "ok" else ttft,
                    kept_fraction=kept or (keep or 1.0), needle_kept=None if keep is None else 0.5,
                    needle_depth=(depths[i] if depths and task.startswith("niah") else None), references=["x"],
                    config_hash=run, flops_full=1e9 * (1 + i), flops_method=(1e9 if keep is None else 4e8) * (1 + i),
                )
            )  # fmt: skip
    return rows


def _latency(run):
    rows = []
    for method, keep, t, ideal in (("full", None, 4.0, None), ("specprefill", 0.3, 1.0, 3.0)):
        for i in range(4):
            rows.append(
                record(
                    "latency", **COMMON, run_id=run, row_key=f"b1-n2048/{i}/{method}", unit="b1-n2048", status="ok",
                    prompt_source="random", batch=1, length=2048, iteration=i, warmup=False, method=method,
                    method_options=_opts(keep), keep_rate=keep, ttft_s=t * (1 + 0.01 * i), method_s=0.1,
                    base_prefill_s=t, kept_fraction=keep or 1.0, ideal_speedup=ideal, config_hash=run,
                )
            )  # fmt: skip
    return rows


def _qps(run, method, keep):
    rows = []
    for rate, passed in ((0.1, True), (0.2, True), (0.4, False)):
        for r in range(3):
            rows.append(
                record(
                    "qps", **COMMON, run_id=run, row_key=f"{rate}/{r}", unit=str(rate), status="ok",
                    benchmark="ruler", length=2048, task="qa_1", sample_id=r, arrival="poisson", rate=rate, request=r,
                    prompt_tokens=2000, kept_tokens=600 if keep else 2000, kept_source="front", ttft_s=rate * 10,
                    e2e_s=rate * 12, tpot_s=0.01, timed_out=not passed, score=100.0, method=method,
                    method_options=_opts(keep), keep_rate=keep, pass_timeout_rule=passed, pass_ttft_slo=passed,
                    passed=passed, request_throughput=rate, references=["x"], config_hash=run,
                )
            )  # fmt: skip
    return rows


def _store(root: Path, name: str, rows: list, config: dict | None = None) -> None:
    s = RunStore(root / name)
    s.write_config(config or {"name": name})
    s.append(rows)


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "res"
    depths = [0.05, 0.5, 0.95]
    for length in (2048, 4096):
        _store(out, f"full-{length}", _eval(f"full-{length}", "full", None, length, [100.0, 100.0, 0.0], 4.0, depths))
        _store(out, f"spec-{length}",
               _eval(f"spec-{length}", "specprefill", 0.3, length, [100.0, 0.0, 0.0], 1.0, depths, kept=0.25))  # fmt: skip
    _store(out, "spec-boom", _eval("spec-boom", "specprefill", 0.1, 2048, [0.0], None, status="failed",
                                   error="RuntimeError: boom\nTraceback ..."))  # fmt: skip
    _store(out, "minf", _eval("minf", "minference", 0.3, 2048, [0.0], None, status="unsupported",
                              error="minference needs a CUDA GPU (hardware: cpu-x)"))  # fmt: skip
    _store(out, "lat", _latency("lat"))
    for method, keep in (("full", None), ("specprefill", 0.3)):
        _store(out, f"qps-{method}", _qps(f"qps-{method}", method, keep),
               {"kind": "qps", "qps": {"ttft_p90_slo_s": 3.5}})  # fmt: skip
    (out / "broken").mkdir()
    (out / "broken" / "job_error.txt").write_text("Traceback ...\nValueError: the job died")
    return out


def test_needle_depth_is_the_evidence_position_in_the_context():
    context = "a" * 100
    prompt = "HEAD:" + context + "?"
    assert needle_depth(prompt, context, ((5 + 25, 5 + 30),)) == pytest.approx(0.25)
    assert needle_depth(prompt, context, ((5, 6), (5 + 50, 5 + 60))) == pytest.approx(0.25)  # mean of 0 and 0.5
    assert needle_depth(prompt, context, ()) is None and needle_depth(prompt, "zz", ((1, 2),)) is None


def test_needle_grid_bins_depth_by_length(folder):
    rows = build(folder, folder / "p").analysis.rows
    cells = plots.needle_grid(rows[rows["kind"] == "eval"]).set_index(["method", "keep", "length", "depth_bin"])
    cells = cells.sort_index()
    # depths 0.05, 0.5, 0.95 fall in bins 0, 2, 4 of five; full scored 100, 100, 0
    assert list(cells.loc[("full", 1.0, 2048), "score"]) == [100.0, 100.0, 0.0]
    assert list(cells.loc[("full", 1.0, 2048)].index) == [0, 2, 4]
    assert list(cells.loc[("specprefill", 0.3, 4096), "score"]) == [100.0, 0.0, 0.0]
    assert set(cells["n"]) == {1}  # qa_1 rows carry no depth and the failed run no score


def test_pareto_points_speedup_interval_and_ideal(folder):
    s = summarize(build(folder, folder / "p").analysis.rows.query("kind == 'eval'"))
    p = plots.pareto_points(s)
    assert len(p) == 2  # specprefill 0.3 at 2048 and 4096; the failed 0.1 run has no score
    pt = p[(p["length"] == 2048) & (p["method"] == "specprefill") & (p["keep_rate"] == 0.3)].iloc[0]
    assert pt["speedup"] == pytest.approx(4.0)  # TTFT 1.0 vs full's 4.0 on the same samples
    assert pt["ideal_speedup"] == pytest.approx(2.5)  # the rows' FLOP counts (not 1 / kept fraction 0.25)
    assert pt["speedup_lo"] == pytest.approx(4.0) and pt["speedup_hi"] == pytest.approx(4.0)  # constant TTFTs
    assert pt["retention"] == pytest.approx(1 / 3 * 100 / (2 / 3 * 100))  # 33.3 / 66.7 on niah; qa the same
    # rows without FLOP counts (older runs) have no ideal: none is made up from the kept fraction
    s2 = summarize(build(folder, folder / "p").analysis.rows.query("kind == 'eval'").drop(columns="flops_method"))
    assert plots.pareto_points(s2)["ideal_speedup"].isna().all()


def test_report_has_every_figure_table_and_failure_and_stays_in_its_folder(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_all(folder)
    assert not (tmp_path / "plots").exists()  # figures go under the folder they describe
    pngs = sorted(p.name for p in (folder / "plots").glob("*.png"))
    assert pngs == sorted(["pareto.png", "score_vs_keep.png", "needle_vs_keep.png", "score_vs_length.png",
                           "needle_heatmap.png", "latency.png", "latency_grid.png", "qps.png"])  # fmt: skip
    html = (folder / "report.html").read_text()
    assert html.count('<img src="data:image/png;base64,') == len(pngs)
    for table in ("quality-summary", "score-per-task", "latency-summary", "qps-summary", "qps-rates",
                  "failures-table", "provenance-table"):  # fmt: skip
        assert f'<table id="{table}">' in html, table
    # self-contained: nothing fetched from anywhere, no script
    assert not re.search(r'(src|href)="(https?:|//)', html) and "<script" not in html and "<link" not in html
    assert "RuntimeError: boom" in html and "minference needs a CUDA GPU" in html
    assert "ValueError: the job died" in html  # a job that failed as a whole
    assert "abc1234" in html and "torch 2.13.0" in html and "cpu-x" in html and "float32" in html


def test_failures_are_grouped_by_reason_with_counts(folder):
    bad = failures(build(folder, folder / "p").analysis.rows).set_index("status")
    assert bad.loc["failed", "reason"] == "RuntimeError: boom" and bad.loc["failed", "rows"] == 2
    assert bad.loc["unsupported", "rows"] == 2 and "niah_single_1/0" in bad.loc["unsupported", "units"]


def test_qps_slo_comes_from_each_runs_config(folder):
    """Rows written before the serving settings were recorded take them from their run's config."""
    analysis = build(folder, folder / "p").analysis
    rates = analysis.qps_rates
    assert set(rates["ttft_p90_slo_s"]) == {3.5} and len(rates) == 6
    assert rates["timeout_s"].isna().all()  # not in these configs either: unknown, not made up
    assert set(analysis.qps["ttft_p90_slo_s"]) == {3.5}
    assert analysis.qps.set_index("method").loc["specprefill", "qps_ratio_to_reference"] == pytest.approx(1.0)


def test_the_paper_tables_join_a_report_inside_results_paper(tmp_path):
    root = tmp_path / "paper"
    (root / "latency_grid" / "cpu").mkdir(parents=True)
    inside = paper_tables(root / "latency_grid" / "cpu", root)
    assert len(inside) == 1 and inside[0].startswith("# ") and "batch" in inside[0].lower()
    assert len(paper_tables(root, root)) >= 5  # every table and the headline figures
    assert paper_tables(tmp_path / "elsewhere", root) == []


def test_an_empty_folder_still_gets_a_page(tmp_path):
    write_all(tmp_path / "empty")
    html = (tmp_path / "empty" / "report.html").read_text()
    assert "no result rows yet" in html and "<img" not in html


def _browser_or_skip():
    """The browser test runs wherever Chromium and playwright are installed; CI sets
    SPECPREFILL_REQUIRE_BROWSER=1 so that a missing browser fails instead of skipping."""
    from harness.report.browser import find_chromium

    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if find_chromium() is None:
        missing.append("a Chromium binary")
    if missing:
        why = f"{' and '.join(missing)} not installed: run `make setup-browser`"
        if os.environ.get("SPECPREFILL_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)


def test_the_page_renders_in_a_real_browser(folder, tmp_path):
    _browser_or_skip()
    from harness.report.browser import check_page

    write_all(folder)
    shot = tmp_path / "report.png"
    check = check_page(folder / "report.html", shot)
    assert check.console_errors == [] and check.page_errors == [] and check.outside_requests == []
    assert len(check.images) == 8 and check.broken_images == []
    assert {"quality-summary", "latency-summary", "qps-summary", "failures-table", "provenance-table"} <= set(
        check.tables
    )
    assert check.title.startswith("specprefill-bench report") and check.height > 2000
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_a_broken_image_is_caught_by_the_browser_check(folder, tmp_path):
    _browser_or_skip()
    from harness.report.browser import check_page

    write_all(folder)
    page = folder / "report.html"
    html = page.read_text()
    page.write_text(html.replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    check = check_page(page)
    assert len(check.broken_images) == 1 and not check.ok


def test_plots_from_a_summary_without_rows_draw_nothing(tmp_path):
    empty = summarize(pd.DataFrame())
    assert plots.pareto(empty, tmp_path / "a.png") is None and plots.score_vs_keep(empty, tmp_path / "b.png") is None
    assert not list(tmp_path.glob("*.png"))


def test_the_page_says_when_a_retention_pairs_fewer_samples_than_its_row(tmp_path):
    """Full prefill ran 2 of the method's 3 samples per task: the page's quality table shows
    ``(n=4)`` beside the method's retention (ALL: 4 of 6) and the note says what it means."""
    from harness.analysis.folder import analyze_rows
    from harness.rendering.tables import FEWER_NOTE
    from harness.report.html import render

    rows = _eval("f", "full", None, 2048, [100.0, 100.0], 4.0) + _eval("s", "specprefill", 0.3, 2048, [100.0] * 3, 1.0)
    html = render(analyze_rows(tmp_path, pd.DataFrame(rows)), [])
    assert "<td>1.00 [1.00, 1.00] (n=4)</td>" in html and FEWER_NOTE.split(": ")[1].split("'")[0] in html
    whole = _eval("f", "full", None, 2048, [100.0] * 3, 4.0) + _eval("s", "specprefill", 0.3, 2048, [100.0] * 3, 1.0)
    html = render(analyze_rows(tmp_path, pd.DataFrame(whole)), [])
    assert "(n=4)" not in html and "K samples both ran" not in html


def test_the_provenance_table_names_the_cpu_flags_beside_the_hardware(tmp_path):
    """A run whose rows recorded ``cpu_flags`` shows them beside its hardware; one without
    (older rows) shows the hardware alone."""
    from dataclasses import replace

    from harness.analysis.folder import analyze_rows
    from harness.report.html import provenance

    old = _eval("f", "full", None, 2048, [100.0], 4.0)
    new = [replace(r, cpu_flags="avx512_bf16 avx512f avx2") for r in _eval("s", "specprefill", 0.3, 2048, [100.0], 1.0)]
    table = provenance(analyze_rows(tmp_path, pd.DataFrame(old + new)).rows).set_index("run_id")
    hardware = old[0].hardware
    assert table.loc["s", "hardware"] == f"{hardware} [avx512_bf16 avx512f avx2]"
    assert table.loc["f", "hardware"] == hardware
