"""Summary table: ratios to full prefill, variants kept apart, category and bucket means."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.folder import analyze_rows
from harness.analysis.quality import summarize
from harness.rendering.tables import to_markdown


def _rows(method, keep, h, score, ttft, tasks, *, mopts=None, bopts=None, category="", bucket="", first=0):
    """One row per entry of ``tasks``; the i-th row of a task is its sample ``first + i`` (so
    a method's rows pair with the reference's on the same samples)."""
    seen: dict[str, int] = {t: first - 1 for t in tasks}
    rows = []
    for t in tasks:
        seen[t] = seen.get(t, -1) + 1
        rows.append({
            "model": "m", "benchmark": "b", "length": 100, "task": t, "sample_id": seen[t], "method": method,
            "keep_rate": keep, "config_hash": h, "method_options": json.dumps(mopts or {}),
            "benchmark_options": json.dumps(bopts or {}), "status": "ok", "score": score,
            "kept_fraction": keep or 1.0, "needle_kept": None, "ttft_s": ttft, "category": category or None,
            "bucket": bucket or None, "reference_method": "full",
        })  # fmt: skip
    return rows


def test_ratio_to_full_and_variants_are_not_merged():
    df = pd.DataFrame(
        _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])
        + _rows("specprefill", 0.3, "a", 60.0, 1.0, ["t1", "t2"], mopts={"keep_rate": 0.3, "lookahead": 1})
        + _rows("specprefill", 0.3, "b", 70.0, 2.0, ["t1", "t2"], mopts={"keep_rate": 0.3, "lookahead": 8})
    )
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "specprefill (lookahead=1)"), "ttft_ratio"] == pytest.approx(0.25)
    assert s.loc[("t1", "specprefill (lookahead=8)"), "speedup"] == pytest.approx(2.0)
    assert s.loc[("ALL", "specprefill (lookahead=8)"), "score"] == pytest.approx(70.0)
    assert s.loc[("ALL", "full"), "n"] == 2


@pytest.mark.parametrize("measure", ["needle_whole", "question_kept"])
def test_kept_shares_are_macro_means_over_the_tasks_that_have_them(measure):
    """``needle_whole`` and ``question_kept`` as ``needle_kept`` is taken: per task the mean over
    its samples, then the mean over the tasks that have a value (a task without evidence or a
    question has none and is left out); older rows without the column give no value, not 0."""
    spec = _rows("specprefill", 0.3, "a", 60.0, 1.0, ["t1", "t1", "t2", "t3"], mopts={"keep_rate": 0.3})
    for r, share in zip(spec, [1.0, 0.5, 0.2, None], strict=True):
        r[measure] = share
    s = summarize(pd.DataFrame(_rows("full", None, "f", 80.0, 4.0, ["t1", "t1", "t2", "t3"]) + spec))
    s = s.set_index(["task", "method"])
    assert s.loc[("t1", "specprefill"), measure] == pytest.approx(0.75)
    assert s.loc[("ALL", "specprefill"), measure] == pytest.approx((0.75 + 0.2) / 2)  # t3 left out
    lo, hi = s.loc[("t1", "specprefill"), [f"{measure}_lo", f"{measure}_hi"]]
    assert 0.5 <= lo <= 0.75 <= hi <= 1.0
    assert pd.isna(s.loc[("ALL", "full"), measure])  # rows without the column


def test_a_speedup_over_rows_timed_on_a_loaded_machine_is_marked():
    """A between-runs speedup whose rows, the point's or its reference's, saw other work on the
    machine (``foreign_cpu`` over 10 % of the cores, or a load average above the cores + 0.5) is
    ``between runs, loaded`` and rendered ``(loaded)`` with its note; rows alone on the machine
    and rows that record no load are not; a task's label looks at that task's rows only."""
    tasks = ["t1", "t1", "t2", "t2"]

    def with_load(rows, foreign, load=1.9):
        return [{**r, "foreign_cpu": f, "loadavg_1m": load, "cpus": 2} for r, f in zip(rows, foreign, strict=True)]

    full = with_load(_rows("full", None, "f", 80.0, 4.0, tasks), [0.01, 0.02, 0.01, 0.30])  # t2's second shared
    alone = with_load(_rows("specprefill", 0.3, "a", 60.0, 1.0, tasks, mopts={"keep_rate": 0.3}), [0.0] * 4)
    s = summarize(pd.DataFrame(full + alone)).set_index(["task", "method"])
    assert s.loc[("t1", "specprefill"), "speedup_timing"] == "between runs"
    assert s.loc[("t2", "specprefill"), "speedup_timing"] == "between runs, loaded"  # the reference's row
    assert s.loc[("ALL", "specprefill"), "speedup_timing"] == "between runs, loaded"
    assert s.loc[("t1", "full"), "speedup_timing"] == ""  # the reference itself
    md = to_markdown(summarize(pd.DataFrame(full + alone)))
    assert md.count(" (loaded)") == 2 and "(loaded): some sample of the point or of its reference" in md

    # the point's own load, by the load average alone (2 cores + 0.5 < 2.6)
    busy = with_load(_rows("specprefill", 0.3, "a", 60.0, 1.0, tasks, mopts={"keep_rate": 0.3}), [0.0] * 4, load=2.6)
    quiet = with_load(_rows("full", None, "f", 80.0, 4.0, tasks), [0.0] * 4)
    s = summarize(pd.DataFrame(quiet + busy)).set_index(["task", "method"])
    assert set(s.xs("specprefill", level="method")["speedup_timing"]) == {"between runs, loaded"}
    # rows without the columns (before 2026-12-06): not marked, and no note
    old = summarize(
        pd.DataFrame(
            _rows("full", None, "f", 80.0, 4.0, tasks)
            + _rows("specprefill", 0.3, "a", 60.0, 1.0, tasks, mopts={"keep_rate": 0.3})
        )
    )
    assert set(old.loc[old["method"] == "specprefill", "speedup_timing"]) == {"between runs"}
    assert "(loaded)" not in to_markdown(old)


def test_speculators_are_variants_compared_with_the_one_full_prefill_run():
    """A speculator-depth sweep: SpecPrefill at one keep rate with two speculators is two
    summary rows, each with its ratio to the single full prefill run."""
    spec = {"keep_rate": 0.1, "lookahead": 1}
    df = pd.DataFrame(
        [{**r, "speculator": "self_layers:8"} for r in _rows("full", None, "f", 80.0, 4.0, ["t1"])]
        + [{**r, "speculator": "self_layers:4"} for r in _rows("specprefill", 0.1, "a", 20.0, 1.0, ["t1"], mopts=spec)]
        + [{**r, "speculator": "self_layers:30"} for r in _rows("specprefill", 0.1, "b", 80.0, 5.0, ["t1"], mopts=spec)]
    )  # fmt: skip
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "specprefill (speculator=self_layers:4)"), "ttft_ratio"] == pytest.approx(0.25)
    assert s.loc[("t1", "specprefill (speculator=self_layers:30)"), "score"] == pytest.approx(80.0)
    assert s.loc[("t1", "specprefill (speculator=self_layers:30)"), "retention"] == pytest.approx(1.0)
    assert s.loc[("t1", "full"), "n"] == 1


def test_categories_macro_mean_and_all_is_mean_over_categories():
    df = pd.DataFrame(
        _rows("full", None, "f", 90.0, 1.0, ["a1"], category="A")
        + _rows("full", None, "f", 70.0, 1.0, ["a2"], category="A")
        + _rows("full", None, "f", 20.0, 1.0, ["b1"], category="B")
    )
    s = summarize(df).set_index("task")["score"]
    assert s["[category] A"] == pytest.approx(80.0) and s["[category] B"] == pytest.approx(20.0)
    assert s["ALL"] == pytest.approx(50.0)  # (80 + 20) / 2, not (90 + 70 + 20) / 3


def test_buckets():
    df = pd.DataFrame(
        _rows("full", None, "f", 100.0, 1.0, ["t"], bucket="0-4k")
        + _rows("full", None, "f", 0.0, 1.0, ["t"], bucket="8k+", first=1)  # a task's sample ids are unique
    )
    s = summarize(df).set_index("task")["score"]
    assert s["t @0-4k"] == 100.0 and s["t @8k+"] == 0.0 and s["ALL @0-4k"] == 100.0 and s["t"] == 50.0


def test_unsupported_and_failed_rows_are_counted_and_a_method_without_ok_rows_still_shows():
    df = pd.DataFrame(
        _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])
        + [{**r, "status": "unsupported", "score": None, "ttft_s": None}
           for r in _rows("minference", 1.0, "m", None, None, ["t1", "t2"])]
        + [{**_rows("random", 0.1, "r", 0.0, 1.0, ["t1"])[0], "status": "failed"}]
        + _rows("random", 0.1, "r", 10.0, 1.0, ["t2"])
    )  # fmt: skip
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("ALL", "minference"), "unsupported"] == 2 and s.loc[("ALL", "minference"), "n"] == 0
    assert pd.isna(s.loc[("t1", "minference"), "score"])
    assert s.loc[("t1", "random"), "failed"] == 1 and s.loc[("t2", "random"), "n"] == 1
    assert s.loc[("ALL", "full"), "unsupported"] == 0
    # random failed t1 entirely: its ALL is not the mean of t2 alone
    assert pd.isna(s.loc[("t1", "random"), "score"]) and pd.isna(s.loc[("ALL", "random"), "score"])
    assert s.loc[("ALL", "full"), "score"] == pytest.approx(80.0)


def test_a_failed_task_makes_its_category_mean_missing_not_the_mean_of_the_rest():
    df = pd.DataFrame(
        _rows("full", None, "f", 90.0, 1.0, ["a1"], category="A")
        + [{**r, "status": "failed", "score": None} for r in _rows("full", None, "f", 0.0, 1.0, ["a2"], category="A")]
        + _rows("full", None, "f", 20.0, 1.0, ["b1"], category="B")
    )  # fmt: skip
    s = summarize(df).set_index("task")["score"]
    assert pd.isna(s["[category] A"]) and pd.isna(s["ALL"]) and s["[category] B"] == pytest.approx(20.0)


def test_ratios_are_taken_against_the_rows_reference_method():
    """The reference is data (the config's `reference`), not a name the report knows."""
    df = pd.DataFrame(
        [{**r, "reference_method": "truncate"} for r in _rows("truncate", 0.5, "t", 50.0, 2.0, ["t1"])]
        + [{**r, "reference_method": "truncate"} for r in _rows("random", 0.5, "r", 10.0, 1.0, ["t1"])]
        + [{**r, "reference_method": "truncate"} for r in _rows("full", None, "f", 80.0, 8.0, ["t1"])]
    )  # fmt: skip
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "random"), "ttft_ratio"] == pytest.approx(0.5)
    assert s.loc[("t1", "full"), "ttft_ratio"] == pytest.approx(4.0)


def test_ttft_ratio_only_side_by_side_on_one_machine():
    """A sweep resumed on another machine: its rows get no cross-machine TTFT ratio."""
    a, b = "cpu: A, 2 threads", "cpu: B, 2 threads"
    df = pd.DataFrame(
        [{**r, "hardware": a} for r in _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])]
        + [{**r, "hardware": a} for r in _rows("random", 0.1, "r", 0.0, 1.0, ["t1"])]
        + [{**r, "hardware": b} for r in _rows("random", 0.1, "r", 0.0, 1.0, ["t2"])]
        + [{**r, "hardware": hw} for r, hw in zip(_rows("truncate", 0.1, "t", 0.0, 2.0, ["t1", "t1"]), (a, b))]
    )  # fmt: skip
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "random"), "ttft_ratio"] == pytest.approx(0.25)
    assert pd.isna(s.loc[("t2", "random"), "ttft_ratio"])  # ran on B, full on A
    assert pd.isna(s.loc[("t1", "truncate"), "ttft_ratio"])  # rows from A and B mixed
    assert s.loc[("t1", "truncate"), "ttft_s"] == pytest.approx(2.0)
    assert "no side-by-side ratio" in to_markdown(summarize(df))
    assert "no side-by-side ratio" not in to_markdown(summarize(df[df["method"] == "full"]))


def test_two_cpus_of_one_name_with_other_flags_are_two_machines():
    """Same ``hardware`` string, other CPU flags (other kernels): no TTFT ratio between them;
    the same flags, or no flags on either side (older rows), one machine."""
    hw = "cpu: AMD EPYC, 2 threads"
    fast, slow = "avx2 avx512_bf16 avx512f", "avx2"
    df = pd.DataFrame(
        [{**r, "hardware": hw, "cpu_flags": fast} for r in _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])]
        + [{**r, "hardware": hw, "cpu_flags": fast} for r in _rows("random", 0.1, "r", 0.0, 1.0, ["t1"])]
        + [{**r, "hardware": hw, "cpu_flags": slow} for r in _rows("random", 0.1, "r", 0.0, 1.0, ["t2"])]
        + [{**r, "hardware": hw, "cpu_flags": None} for r in _rows("truncate", 0.1, "t", 0.0, 2.0, ["t1"])]
    )  # fmt: skip
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "random"), "ttft_ratio"] == pytest.approx(0.25)  # the same flags
    assert pd.isna(s.loc[("t2", "random"), "ttft_ratio"])  # avx2 only against avx512_bf16
    assert pd.isna(s.loc[("t1", "truncate"), "ttft_ratio"])  # flags not recorded: not known to be the same
    assert s.loc[("t1", "full"), "hardware"] == f"{hw} [{fast}]"
    old = df.assign(cpu_flags=None)  # rows from before flags were recorded: hardware alone decides, as it did
    s = summarize(old).set_index(["task", "method"])
    assert s.loc[("t2", "random"), "ttft_ratio"] == pytest.approx(0.25)
    assert s.loc[("t1", "truncate"), "ttft_ratio"] == pytest.approx(0.5)


def test_runs_differing_only_in_dtype_are_kept_apart():
    df = pd.DataFrame(
        [{**r, "dtype": "float32"} for r in _rows("full", None, "f", 80.0, 4.0, ["t1"])]
        + [{**r, "dtype": "bfloat16"} for r in _rows("full", None, "g", 70.0, 1.0, ["t1"])]
    )  # fmt: skip
    methods = set(summarize(df)["method"])
    assert methods == {"full (dtype=float32)", "full (dtype=bfloat16)"}
    more = pd.DataFrame([{**r, "dtype": "bfloat16"} for r in _rows("random", 0.1, "r", 0.0, 0.5, ["t1"])])
    df = pd.concat([df, more.astype(df.dtypes.to_dict())])  # the index repeats: summarize must not care
    s = summarize(df).set_index(["task", "method"])
    assert s.loc[("t1", "random"), "ttft_ratio"] == pytest.approx(0.5)  # against the bfloat16 full run


def test_score_per_task_pivot_marks_partial_points_and_orders_all_last():
    from harness.rendering.tables import by_task_markdown, score_by_task

    df = pd.DataFrame(
        _rows("full", None, "f", 80.0, 4.0, ["t2", "t1"])  # two samples per task
        + _rows("full", None, "f", 80.0, 4.0, ["t2", "t1"], first=1)
        + _rows("random", 0.1, "r", 0.0, 1.0, ["t1", "t2"])
        + _rows("random", 0.1, "r", 10.0, 1.0, ["t1"], first=1)  # two samples of t1, one of t2
        + _rows("truncate", 0.1, "t", 30.0, 1.0, ["t1"])  # t2 never ran
    )
    wide = score_by_task(summarize(df)).set_index(["method", "keep_rate"])
    assert list(wide.columns) == ["model", "benchmark", "length", "t1", "t2", "ALL"]
    assert wide.loc[("full", 1.0), "t1"] == "80.0" and wide.loc[("full", 1.0), "t2"] == "80.0"
    assert wide.loc[("random", 0.1), "t1"] == "5.0"
    assert wide.loc[("random", 0.1), "t2"] == "0.0 (n=1)"  # fewer than full's two
    assert wide.loc[("truncate", 0.1), "t2"] == "-"
    assert wide.loc[("truncate", 0.1), "t1"] == "30.0 (n=1)"
    md = by_task_markdown(summarize(df))
    assert md.splitlines()[0] == "| model | benchmark | length | method | keep_rate | t1 | t2 | ALL |"
    assert "| m | b | 100 | truncate | 0.1 | 30.0 (n=1) | - | 30.0 (n=1) |" in md
    assert by_task_markdown(summarize(pd.DataFrame(_rows("full", None, "f", 1.0, 1.0, ["only"])))) == ""


def test_the_plot_marks_partial_points(tmp_path):
    """A point with fewer samples than the fullest of its task is drawn hollow."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from harness.rendering.plots import score_vs_keep as plot_score_vs_keep

    df = pd.DataFrame(
        _rows("full", None, "f", 80.0, 4.0, ["t1"])
        + _rows("full", None, "f", 80.0, 4.0, ["t1"], first=1)
        + _rows("random", 0.1, "r", 0.0, 1.0, ["t1"])
        + _rows("random", 0.1, "r", 0.0, 1.0, ["t1"], first=1)
        + _rows("random", 0.3, "s", 10.0, 1.0, ["t1"])  # one sample of two
    )
    drawn = []
    real = plt.Axes.plot

    def spy(self, *a, **k):
        drawn.append((list(a[0]) if a else None, k.get("markerfacecolor")))
        return real(self, *a, **k)

    plt.Axes.plot = spy  # type: ignore[method-assign]
    try:
        assert plot_score_vs_keep(summarize(df), tmp_path / "p.png").exists()
    finally:
        plt.Axes.plot = real  # type: ignore[method-assign]
    hollow = {x[0] for x, face in drawn if x and len(x) == 1 and face == "none"}
    assert hollow == {0.3}


def _samples(method, keep, h, scores, ttfts, task="t", **kw):
    rows = _rows(method, keep, h, 0.0, 0.0, [task] * len(scores), **kw)
    return [{**r, "score": s, "ttft_s": t} for r, s, t in zip(rows, scores, ttfts, strict=True)]


def test_score_intervals_collapse_on_constant_scores_and_widen_on_few_samples():
    df = pd.DataFrame(
        _samples("full", None, "f", [70.0] * 8, [1.0] * 8, "a")
        + _samples("full", None, "f", [0.0] * 9 + [100.0], [1.0] * 10, "b")
        + _samples("full", None, "f", ([0.0] * 9 + [100.0]) * 4, [1.0] * 40, "c")
    )
    s = summarize(df).set_index("task")
    assert (s.loc["a", "score_lo"], s.loc["a", "score_hi"]) == (70.0, 70.0)
    assert s.loc["b", "score"] == pytest.approx(10.0) and s.loc["b", "score_lo"] == 0.0 and s.loc["b", "score_hi"] >= 20
    assert s.loc["c", "score_hi"] - s.loc["c", "score_lo"] < s.loc["b", "score_hi"] - s.loc["b", "score_lo"]
    assert "70.0 [70.0, 70.0]" in to_markdown(summarize(df))


def test_all_resamples_within_each_task():
    """ALL over a task always 100 and a task always 0 is exactly 50: resampling within each
    task (stratified), not pooling the samples, whose mean would wander."""
    df = pd.DataFrame(_samples("full", None, "f", [100.0] * 10, [1.0] * 10, "a")
                      + _samples("full", None, "f", [0.0] * 10, [1.0] * 10, "b"))  # fmt: skip
    s = summarize(df).set_index("task")
    assert (s.loc["ALL", "score"], s.loc["ALL", "score_lo"], s.loc["ALL", "score_hi"]) == (50.0, 50.0, 50.0)


def test_retention_and_ttft_ratio_are_paired_on_the_same_samples():
    ref_ttft = [1.0, 2.0, 3.0, 4.0, 8.0, 16.0]
    df = pd.DataFrame(
        _samples("full", None, "f", [100.0, 100.0, 0.0, 100.0, 100.0, 0.0], ref_ttft)
        # half the reference's correct answers kept, at a quarter of each sample's TTFT
        + _samples("specprefill", 0.3, "s", [100.0, 0.0, 0.0, 100.0, 0.0, 0.0], [t / 4 for t in ref_ttft])
    )
    s = summarize(df).set_index(["task", "method"])
    row = s.loc[("t", "specprefill")]
    assert row["retention"] == pytest.approx(0.5)
    assert row["retention_lo"] < 0.5 < row["retention_hi"] <= 1.0
    # every sample's ratio is 0.25: paired resampling keeps it exactly; independent would not
    assert (row["ttft_ratio"], row["ttft_ratio_lo"], row["ttft_ratio_hi"]) == pytest.approx((0.25, 0.25, 0.25))
    ref = s.loc[("t", "full")]
    assert (ref["retention"], ref["retention_lo"], ref["retention_hi"]) == (1.0, 1.0, 1.0)
    # only samples both ran are paired: a sample the method lacks is left out of its retention
    fewer = df.drop(index=df[(df["method"] == "specprefill") & (df["sample_id"] == 0)].index)
    assert summarize(fewer).set_index(["task", "method"]).loc[("t", "specprefill"), "retention"] == pytest.approx(1 / 3)


def test_a_retention_on_fewer_samples_than_its_row_says_so():
    """Full prefill ran 4 of the method's 6 samples: the method's retention pairs those 4
    (``retention_n``), and the table shows ``(n=4)`` beside it with a note; where both ran every
    sample, nothing is added."""
    from harness.rendering.tables import FEWER_NOTE

    ref = _samples("full", None, "f", [100.0, 100.0, 0.0, 100.0, 100.0, 0.0], [1.0] * 6)
    method = _samples("specprefill", 0.3, "s", [100.0, 0.0, 0.0, 100.0, 100.0, 100.0], [0.5] * 6)
    short = pd.DataFrame(ref[:4] + method)
    s = summarize(short).set_index(["task", "method"])
    row = s.loc[("t", "specprefill")]
    assert (row["n"], row["retention_n"]) == (6, 4) and row["retention"] == pytest.approx(2 / 3)
    text = to_markdown(summarize(short))
    assert "0.67 [" in text and "] (n=4) |" in text and FEWER_NOTE in text
    whole = to_markdown(summarize(pd.DataFrame(ref + method)))
    assert "(n=" not in whole and FEWER_NOTE not in whole


def test_a_speedup_on_fewer_samples_than_its_row_says_so():
    """Full prefill ran all 6 samples but timed 4 (two TTFTs missing): retention pairs 6 and is
    unmarked, while the TTFT ratio and the speedup pair 4 (``speedup_n``) and show ``(n=4)``,
    with the note; the positions study's retention-only note stays silent."""
    from harness.rendering.tables import FEWER_NOTE, short_paired

    ref = _samples("full", None, "f", [100.0] * 6, [1.0] * 4 + [float("nan")] * 2)
    method = _samples("specprefill", 0.3, "s", [100.0] * 6, [0.5] * 6)
    s = summarize(pd.DataFrame(ref + method))
    row = s.set_index(["task", "method"]).loc[("t", "specprefill")]
    assert (row["n"], row["retention_n"], row["speedup_n"]) == (6, 6, 4) and row["speedup"] == pytest.approx(2.0)
    text = to_markdown(s)
    assert "1.00 [1.00, 1.00] |" in text and "0.50 [0.50, 0.50] (n=4) | 2.00x [2.00x, 2.00x] (n=4) |" in text
    assert FEWER_NOTE in text and short_paired(s) and not short_paired(s, ("retention",))


def test_speculator_depth_table_and_the_choice_of_depth():
    """The depth sweep's table: one line per depth x keep beside full prefill, with speedup,
    ideal (the FLOP model's counts in the rows) and efficiency; the chosen depth is the best retention among
    those faster than 1.3x at keep 0.1 (the oracle, all 30 layers, is slower than full)."""
    from harness.studies.speculator_depth import choose, markdown, table

    def spec(depth, score, ttft, keep=0.1):
        rows = _rows("specprefill", keep, f"d{depth}-{keep}", score, ttft, ["t1", "t2"],
                     mopts={"keep_rate": keep, "lookahead": 1})  # fmt: skip
        # the FLOP model's counts (harness.jobs.eval records them per sample): 1e9 full, 1e8 the method
        return [{**r, "speculator": f"self_layers:{depth}", "speculator_s": ttft / 2, "flops_full": 1e9,
                 "flops_method": 2e8} for r in rows]  # fmt: skip

    full = [
        {**r, "speculator": "self_layers:8", "speculator_s": None}
        for r in _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])
    ]
    df = pd.DataFrame(
        full + spec(4, 20.0, 1.0) + spec(8, 60.0, 2.0) + spec(30, 80.0, 5.0) + spec(8, 70.0, 2.5, keep=0.3)
    )
    t = table(analyze_rows(None, df.assign(kind="eval")))
    assert list(zip(t["method"], t["depth"].fillna(0).astype(int), t["keep"], strict=True)) == [
        ("full", 0, 1.0), ("specprefill", 4, 0.1), ("specprefill", 8, 0.1), ("specprefill", 30, 0.1),
        ("specprefill", 8, 0.3),
    ]  # fmt: skip
    d8 = t[(t["depth"] == 8) & (t["keep"] == 0.1)].iloc[0]
    assert d8["speedup"] == pytest.approx(2.0) and d8["ideal_speedup"] == pytest.approx(5.0)  # FLOPs, not 1 / kept
    assert d8["efficiency"] == pytest.approx(0.4) and d8["retention"] == pytest.approx(0.75)
    assert d8["speculator_s"] == pytest.approx(1.0)
    assert int(choose(t)["depth"]) == 8  # depth 4 is faster but keeps a quarter; 30 is slower than full
    assert "| self_layers:30 (oracle) | 0.1 |" in markdown(t) and "| full prefill | 1 |" in markdown(t)
    # the interleaved speedups (latency jobs), where measured, are what the choice reads: here
    # depth 8 is not faster than 1.3x when measured side by side, so depth 4 is chosen
    lat = pd.DataFrame({"depth": [4, 8, 30, 8], "keep": [0.1, 0.1, 0.1, 0.3], "lat_n": 8,
                        "lat_speedup": [4.0, 1.2, 0.9, 1.1], "lat_speedup_lo": [3.5, 1.1, 0.8, 1.0],
                        "lat_speedup_hi": [4.5, 1.3, 1.0, 1.2], "lat_ideal": 9.0, "lat_efficiency": 0.5})  # fmt: skip
    tl = table(analyze_rows(None, df.assign(kind="eval")), lat)
    assert tl["lat_speedup"].tolist()[1:] == [4.0, 1.2, 0.9, 1.1] and pd.isna(tl["lat_speedup"].iloc[0])
    assert int(choose(tl)["depth"]) == 4
    md = markdown(tl)
    assert "speedup (interleaved)" in md and "| self_layers:8 | 0.1 |" in md and "1.20 [1.10, 1.30] | 9.00x" in md
    assert all(line.count("|") == md.splitlines()[0].count("|") for line in md.splitlines())


def test_a_committed_depth_table_re_timed_keeps_its_quality_and_replaces_its_speed():
    """``--quality-from``: the committed table's quality columns as they were, the interleaved
    columns from the new latency rows only (a point they lack is empty, never the old number),
    and the new rows' A/A and check printed beside each speedup."""
    from harness.studies.speculator_depth import markdown, retimed, summary_of

    committed = pd.DataFrame({
        "method": ["full", "specprefill", "specprefill"], "depth": [None, 4.0, 8.0], "keep": [1.0, 0.1, 0.1],
        "n": 30, "score": [80.0, 20.0, 60.0], "score_lo": [70.0, 10.0, 50.0], "score_hi": [90.0, 30.0, 70.0],
        "retention": [1.0, 0.25, 0.75], "retention_lo": [1.0, 0.1, 0.6], "retention_hi": [1.0, 0.4, 0.9],
        "needle_kept": [1.0, 0.2, 0.7], "speculator_s": [None, 0.5, 0.9], "ttft_s": [3.6, 0.8, 1.2],
        "ttft_ratio": [1.0, 0.2, 0.3], "speedup": [1.0, 4.4, 2.9], "ideal_speedup": [1.0, 9.8, 5.0],
        "efficiency": [1.0, 0.45, 0.58], "lat_n": [None, 8.0, 8.0], "lat_speedup": [None, 4.42, 2.99],
        "lat_speedup_lo": [None, 4.06, 2.50], "lat_speedup_hi": [None, 5.60, 3.66], "lat_ideal": [None, 5.04, 3.01],
        "lat_efficiency": [None, 0.88, 0.99],
    })  # fmt: skip
    new = pd.DataFrame({"depth": [4, 4], "keep": [0.1, 1.0], "lat_n": 10, "lat_speedup": [3.9, 1.0],
                        "lat_speedup_lo": [3.7, 0.97], "lat_speedup_hi": [4.1, 1.04], "lat_ideal": [4.6, 1.0],
                        "lat_efficiency": [0.85, 1.0], "lat_aa": [1.01, 1.0], "lat_aa_lo": [0.97, 0.97],
                        "lat_aa_hi": [1.05, 1.04], "lat_check": ["ok", "ok"]})  # fmt: skip
    t = retimed(committed, new)
    assert len(t) == 3 and t["retention"].tolist() == [1.0, 0.25, 0.75] and t["speedup"].tolist() == [1.0, 4.4, 2.9]
    assert t["lat_speedup"].iloc[1] == pytest.approx(3.9) and t["lat_n"].iloc[1] == 10
    assert t[["lat_speedup", "lat_ideal", "lat_check"]].iloc[2].isna().all()  # depth 8 not re-timed: no old number
    md = markdown(t)
    assert "| A/A | check |" in md and "| 3.90 [3.70, 4.10] | 4.60x | 0.85 | 1.01 [0.97, 1.05] | ok |" in md
    assert md.splitlines()[-1].endswith("| - | - | - | - | - |")  # depth 8: no speed shown, old or new
    assert all(line.count("|") == md.splitlines()[0].count("|") for line in md.splitlines())
    s = summary_of(t).set_index("method")
    assert s.loc["self_layers:4", "speedup"] == pytest.approx(3.9) and s.loc["self_layers:4", "retention"] == 0.25
    with pytest.raises(ValueError, match="no latency rows"):
        retimed(committed, new.iloc[0:0])


def test_latency_speedups_per_depth_from_latency_rows():
    """Each depth's latency job has its own full prefill beside it: the speedup is that job's
    median full prefill TTFT over the depth's median, per keep."""
    from harness.studies.speculator_depth import latency_speedups

    rows = []
    for depth, full_s, spec_s in ((4, 4.0, 1.0), (20, 4.0, 2.0)):
        for i in range(4):
            for method, keep, t in (("full", None, full_s), ("specprefill", 0.1, spec_s)):
                rows.append({
                    "kind": "latency", "run_id": f"d{depth}", "config_hash": f"h{depth}{method}", "status": "ok", "model": "m", "backend": "transformers",
                    "prompt_source": "random", "batch": 1, "length": 4096, "iteration": i, "warmup": False,
                    "method": method, "method_options": "{}", "keep_rate": keep, "reference_method": "full",
                    "speculator": f"self_layers:{depth}", "ttft_s": t * (1 + 0.01 * i), "method_s": 0.1,
                    "base_prefill_s": t, "kept_fraction": 0.1 if keep else 1.0, "ideal_speedup": 8.0,
                })  # fmt: skip
    got = latency_speedups(analyze_rows(None, pd.DataFrame(rows))).set_index("depth")
    assert got.loc[4, "lat_speedup"] == pytest.approx(4.0) and got.loc[20, "lat_speedup"] == pytest.approx(2.0)
    assert got.loc[20, "lat_efficiency"] == pytest.approx(0.25) and got.loc[4, "keep"] == 0.1


def test_speculator_family_table_keys_every_line_by_its_speculator():
    """The family study: one line per speculator x keep beside the one full prefill run, the
    interleaved speedup merged by (speculator, keep), each speculator named with its kind."""
    from harness.studies.speculator_family import markdown, table, with_latency_speedups

    def spec(speculator, score, ttft, keep=0.1):
        rows = _rows("specprefill", keep, f"{speculator}-{keep}", score, ttft, ["t1", "t2"],
                     mopts={"keep_rate": keep, "lookahead": 1})  # fmt: skip
        return [{**r, "speculator": speculator, "speculator_s": ttft / 2, "flops_full": 1e9, "flops_method": 2e8}
                for r in rows]  # fmt: skip

    full = [{**r, "speculator": "model:qwen2.5-coder-0.5b", "speculator_s": None}
            for r in _rows("full", None, "f", 80.0, 4.0, ["t1", "t2"])]  # fmt: skip
    df = pd.DataFrame(full + spec("model:qwen2.5-coder-0.5b", 60.0, 2.0) + spec("model:smollm2-135m", 40.0, 1.0)
                      + spec("self_layers:3", 20.0, 1.0))  # fmt: skip
    lat = pd.DataFrame({"speculator": ["model:smollm2-135m", "model:qwen2.5-coder-0.5b"], "keep": [0.1, 0.1],
                        "lat_n": 3, "lat_speedup": [3.0, 1.5], "lat_speedup_lo": [2.9, 1.4],
                        "lat_speedup_hi": [3.1, 1.6], "lat_ideal": [6.0, 2.0], "lat_efficiency": [0.5, 0.75]})  # fmt: skip
    t = table(analyze_rows(None, df.assign(kind="eval")), lat).set_index("speculator", drop=False)
    assert t["method"].iloc[0] == "full" and pd.isna(t["speculator"].iloc[0])
    assert t.loc["model:smollm2-135m", "retention"] == pytest.approx(0.5)
    assert t.loc["model:smollm2-135m", "lat_speedup"] == 3.0 and t.loc["model:qwen2.5-coder-0.5b", "lat_speedup"] == 1.5
    assert pd.isna(t.loc["self_layers:3", "lat_speedup"])  # not measured: no number made up
    md = markdown(t.reset_index(drop=True))
    assert "| `model:smollm2-135m`: other family (SmolLM2-135M, token map) | 0.1 | 2 |" in md
    assert "3.00 [2.90, 3.10] | 6.00x | 0.50 |" in md and "| - | - | - |" in md  # self_layers:3: none measured
    summary = with_latency_speedups(summarize(df), t.reset_index(drop=True))
    one = summary[(summary["task"] == "ALL") & (summary["speculator"] == "model:smollm2-135m")].iloc[0]
    assert (one["speedup"], one["ideal_speedup"]) == (3.0, 6.0)


def test_an_early_exit_speculator_gets_a_line_pointing_at_the_committed_depth_sweep():
    from pathlib import Path

    from harness.rendering.tables import DEPTH_SWEEP, speculator_note

    rows = pd.DataFrame(_rows("full", None, "f", 80.0, 4.0, ["t1"]) + _rows("specprefill", 0.1, "a", 20.0, 1.0, ["t1"]))
    rows["kind"] = "eval"
    rows["speculator"] = "self_layers:8"
    note = speculator_note(rows)
    assert note is not None and "self_layers:8" in note and DEPTH_SWEEP in note
    assert (Path(__file__).resolve().parents[1] / DEPTH_SWEEP).exists()
    rows["speculator"] = "hub:meta-llama/Llama-3.2-1B-Instruct"  # a separate speculator: nothing to say
    assert speculator_note(rows) is None


def test_the_speculator_note_quotes_the_sweep_for_its_depth_and_the_oracle(tmp_path):
    """For the sweep's model, the line quotes the committed sweep at keep 0.1: the depth that
    ran (the interleaved speedup where measured) and the oracle; for another model, nothing."""
    from harness.rendering.tables import DEPTH_SWEEP_CSV, speculator_note

    csv = tmp_path / "sweep.csv"
    pd.DataFrame({
        "method": ["full", "specprefill", "specprefill", "specprefill", "specprefill"],
        "depth": [None, 12, 16, 30, 16], "keep": [1.0, 0.1, 0.1, 0.1, 0.3],
        "retention": [1.0, 0.4, 0.55, 0.97, 0.7], "speedup": [1.0, 2.5, 2.2, 1.1, 1.4],
        "lat_speedup": [None, 2.1, 1.75, 0.9, 1.3],
    }).to_csv(csv, index=False)  # fmt: skip
    rows = pd.DataFrame(_rows("full", None, "f", 80.0, 4.0, ["t1"]) + _rows("specprefill", 0.1, "a", 20.0, 1.0, ["t1"]))
    rows["kind"], rows["model"], rows["speculator"] = "eval", "smollm2-135m", "self_layers:16"
    note = speculator_note(rows, csv)
    assert note is not None
    assert "self_layers:16 keeps 0.55 of full prefill's score at 1.75x" in note
    assert "self_layers:30 (the oracle: all layers) keeps 0.97 of full prefill's score at 0.90x" in note
    assert "self_layers:12" not in note
    rows["model"] = "tiny-random"
    assert "keeps" not in (speculator_note(rows, csv) or "")
    assert (Path(__file__).resolve().parents[1] / DEPTH_SWEEP_CSV).exists()
