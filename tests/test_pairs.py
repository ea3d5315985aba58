"""Paired differences between the lines of one folder (harness.studies.pairs): the values
worked out by hand, setups never paired across, and the base named in one line or refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.analysis.folder import analyze_rows
from harness.studies import sample_range
from harness.studies.pairs import main, markdown, pairs, pick


def _rows(
    method: str,
    opts: dict,
    scores: dict[str, list[float]],
    whole: float | None = None,
    length: int = 2048,
    question: float | None = None,
):
    out = []
    for task, values in scores.items():
        for i, v in enumerate(values):
            out.append({"kind": "eval", "status": "ok", "model": "m", "benchmark": "ruler", "length": length,
                        "task": task, "sample_id": i, "method": method, "keep_rate": None if method == "full" else 0.1,
                        "method_options": json.dumps(opts), "benchmark_options": "{}", "reference_method": "full",
                        "config_hash": method + json.dumps(opts), "score": v, "needle_kept": 0.5,
                        "needle_whole": whole, "question_kept": question, "kept_fraction": 0.1, "ttft_s": 1.0, "run_id": "r", "hardware": "x",
                        "dtype": "bfloat16", "backend": "transformers"})  # fmt: skip
    return out


@pytest.fixture
def rows() -> pd.DataFrame:
    base = _rows("sp", {"chunk_size": 32}, {"vt": [0, 0, 50, 100], "qa": [100, 0, 0, 0]}, whole=0.2, question=0.9)
    token = _rows(
        "sp", {"chunk_size": None}, {"vt": [100, 0, 100, 100], "qa": [100, 0, 0, 100]}, whole=0.6, question=1.0
    )
    other = _rows("pc", {}, {"vt": [0, 0, 0, 0]})  # no needle_whole: old rows
    longer = _rows("pc", {}, {"vt": [100, 100, 100, 100]}, length=4096)  # another setup: never paired
    return analyze_rows(None, pd.DataFrame(base + token + other + longer)).ok("eval")


def test_each_line_against_the_base_worked_by_hand(rows):
    df = pairs(rows, "chunk_size=32")
    assert set(df["length"]) == {2048} and set(df["base"]) == {"sp (chunk_size=32)"}
    t = df[(df["line"] == "sp (chunk_size=None)") & (df["measure"] == "score")].set_index("task")
    # vt: +100, 0, +50, 0 -> +37.5 (2 won); qa: 0, 0, 0, +100 -> +25.0 (1 won); ALL: the two tasks' mean
    assert t.loc["vt", "difference"] == pytest.approx(37.5) and (t.loc["vt", "wins"], t.loc["vt", "losses"]) == (2, 0)
    assert t.loc["qa", "difference"] == pytest.approx(25.0) and t.loc["qa", "line_mean"] == pytest.approx(50.0)
    assert t.loc["ALL", "difference"] == pytest.approx(31.25) and t.loc["ALL", "n"] == 8
    assert t.loc["vt", "lo"] <= 37.5 <= t.loc["vt", "hi"] and t.loc["vt", "base_mean"] == pytest.approx(37.5)
    w = df[(df["line"] == "sp (chunk_size=None)") & (df["measure"] == "needle_whole")].set_index("task")
    assert w.loc["ALL", "difference"] == pytest.approx(0.4)
    q = df[(df["line"] == "sp (chunk_size=None)") & (df["measure"] == "question_kept")].set_index("task")
    assert q.loc["ALL", "difference"] == pytest.approx(0.1) and q.loc["ALL", "line_mean"] == pytest.approx(1.0)
    pc = df[df["line"] == "pc"]
    assert set(pc["measure"]) == {"score", "needle_kept", "kept_fraction"}  # no needle_whole, question_kept
    assert pc[(pc["measure"] == "score") & (pc["task"] == "vt")]["difference"].item() == pytest.approx(-37.5)
    md = markdown(df)
    assert "| sp (chunk_size=None) | vt | 4 | 75.0 | +37.5 [" in md and "; 2 won, 0 lost |" in md
    assert "| 0.60 | +40.0 [+40.0, +40.0] |" in md  # a share's difference in percentage points
    assert "| 1.00 | +10.0 [+10.0, +10.0] |" in md  # the question kept, likewise
    assert "4096" not in md


def test_a_method_at_several_keep_rates_is_one_line_per_keep_worked_by_hand():
    """make eval keep=0.1,0.3 gives two runs one label ("sp"): once paired as one line, the first
    row of each sample was kept and the other keep's rows dropped without a word."""
    full = _rows("full", {}, {"vt": [100, 100, 100, 0]})
    low = _rows("sp", {}, {"vt": [0, 0, 100, 0]})
    high = [{**r, "keep_rate": 0.3, "config_hash": "sp-0.3"} for r in _rows("sp", {}, {"vt": [100, 100, 0, 100]})]
    rows = analyze_rows(None, pd.DataFrame(full + low + high)).ok("eval")
    assert set(rows["label"]) == {"full", "sp"}  # the label leaves the keep out
    df = pairs(rows, "full", ("score",)).set_index("line")
    assert sorted(df.index) == ["sp (keep 0.1)", "sp (keep 0.3)"] and (df["n"] == 4).all()
    assert df.loc["sp (keep 0.1)", "difference"] == pytest.approx((-100 - 100 + 0 + 0) / 4)
    assert df.loc["sp (keep 0.3)", "difference"] == pytest.approx((0 + 0 - 100 + 100) / 4)
    assert pairs(rows, "keep 0.3", ("score",)).set_index("line").loc["full", "difference"] == pytest.approx(0.0)


def test_the_base_is_one_label_or_part_of_exactly_one():
    labels = ["full", "sp (chunk_size=32)", "sp (chunk_size=None)"]
    assert pick("full", labels) == "full" and pick("=None", labels) == "sp (chunk_size=None)"
    with pytest.raises(ValueError, match=r"--base 'sp': 2 lines hold it; allowed: one of its lines"):
        pick("sp", labels)
    with pytest.raises(ValueError, match="--base 'specpc': no line of the folder holds it"):
        pick("specpc", labels)


def test_the_command_refuses_a_measure_and_a_folder_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--base", "full", "--measures", "speedup"])
    assert (
        "--measures speedup: allowed: ['score', 'needle_kept', 'needle_whole', 'question_kept', 'kept_fraction']"
        in (capsys.readouterr().err)
    )
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--base", "full"])
    err = capsys.readouterr().err
    assert f"folder: no run's rows under {tmp_path}; allowed: a results folder holding a run's rows" in err
    assert "--no-run" not in err  # a flag pairs does not have
    for bad in ("/tmp/elsewhere", "../up", "sub/p", "..", ".hidden", ""):  # the files go into the folder, nowhere else
        with pytest.raises(SystemExit):
            main([str(tmp_path), "--base", "full", "--name", bad])
        assert (
            f"--name {bad}: allowed: a file name: letters, digits, _ . - (no folder; not starting"
            in capsys.readouterr().err
        )


def test_a_sample_range_pairs_only_those_samples_worked_by_hand(rows):
    df = pairs(rows, "chunk_size=32", ("score",), samples=(2, None))
    t = df[df["line"] == "sp (chunk_size=None)"].set_index("task")
    # samples 2 and 3 only: vt +50, 0 -> +25.0 (1 won); qa 0, +100 -> +50.0
    assert t.loc["vt", "difference"] == pytest.approx(25.0) and t.loc["vt", "n"] == 2
    assert t.loc["qa", "difference"] == pytest.approx(50.0) and t.loc["ALL", "n"] == 4
    one = pairs(rows, "chunk_size=32", ("score",), samples=(1, 1)).set_index(["line", "task"])
    assert one.loc[("sp (chunk_size=None)", "vt"), "difference"] == pytest.approx(0.0)  # 0 vs 0
    assert one.loc[("sp (chunk_size=None)", "vt"), "n"] == 1
    assert "### model m, benchmark ruler, length 2048, samples 2- only:" in markdown(df, "2-")
    assert sample_range("15-44") == (15, 44) and sample_range("15-") == (15, None)
    for bad in ("15", "44-15", "a-b", "-3"):
        with pytest.raises(ValueError, match=f"--samples '{bad}': allowed: FIRST-LAST or FIRST-"):
            sample_range(bad)


def test_the_command_refuses_a_bad_sample_range(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--base", "full", "--samples", "9-3"])
    assert "--samples '9-3': allowed: FIRST-LAST or FIRST- (sample ids, FIRST <= LAST), e.g. 15-44" in (
        capsys.readouterr().err
    )


def test_the_base_is_taken_in_each_setup_that_holds_it_worked_by_hand():
    """One base text names a different line in each setup (here the chunk size differs by
    length): each setup's lines are paired with its own; a setup without it is left out."""
    rows = analyze_rows(
        None,
        pd.DataFrame(
            _rows("sp", {"chunk_size": 32}, {"vt": [0, 50]}, length=2048)
            + _rows("sp", {"chunk_size": None}, {"vt": [100, 50]}, length=2048)
            + _rows("sp", {"chunk_size": 64, "pool": 1}, {"vt": [0, 0]}, length=4096)
            + _rows("sp", {"chunk_size": None, "pool": 3}, {"vt": [100, 100]}, length=4096)
            + _rows("pc", {}, {"vt": [0, 100]}, length=8192)  # no line of the base's
        ),
    ).ok("eval")
    df = pairs(rows, "chunk_size=None", ("score",)).set_index(["length", "line"])
    assert df.loc[(2048, "sp (chunk_size=32)"), "difference"] == pytest.approx(-50.0)  # 0-100, 50-50
    assert df.loc[(4096, "sp (chunk_size=64, pool=1)"), "difference"] == pytest.approx(-100.0)
    assert set(df["base"]) == {"sp (chunk_size=None)", "sp (chunk_size=None, pool=3)"}  # each setup's own
    assert 8192 not in df.index.get_level_values("length")
    only = pairs(rows, "chunk_size=32", ("score",))
    assert set(only["length"]) == {2048}  # held at 2K only: the other setups left out
    with pytest.raises(ValueError, match=r"--base 'sp': 2 lines hold it"):
        pairs(rows, "sp", ("score",))
    with pytest.raises(ValueError, match="--base 'lookahead': no line of the folder holds it"):
        pairs(rows, "lookahead", ("score",))


def test_rows_at_another_benchmark_setting_are_another_setup():
    """vt at 8 hops (benchmark.options.vt_hops) beside RULER's own in one folder: its sample 0 is
    another prompt, so its lines are paired only with each other, under their own heading."""
    own = _rows("sp", {"chunk_size": 32}, {"vt": [0, 0]}) + _rows("sp", {"chunk_size": None}, {"vt": [100, 100]})
    hops = json.dumps({"name": "ruler", "vt_hops": 8})
    eight = [
        {**r, "benchmark_options": hops}
        for r in _rows("sp", {"chunk_size": 32}, {"vt": [100, 100]})
        + _rows("sp", {"chunk_size": None}, {"vt": [0, 100]})
    ]
    rows = analyze_rows(None, pd.DataFrame(own + eight)).ok("eval")
    df = pairs(rows, "chunk_size=32", measures=("score",))
    got = df[df["task"] == "vt"].set_index("benchmark_options")["difference"]
    assert got.to_dict() == pytest.approx({"-": 100.0, "vt_hops=8": -50.0})
    text = markdown(df)
    assert "### model m, benchmark ruler, length 2048 (vt_hops=8): each line against" in text
    assert "### model m, benchmark ruler, length 2048: each line against" in text


def test_studies_that_pool_by_sample_refuse_two_benchmark_settings_in_one_folder():
    from harness.studies import draft_family, lookahead, one_benchmark_setting, options_of

    own = pd.DataFrame(_rows("sp", {"keep_tokens": 256}, {"vt": [0, 100]}))
    eight = own.assign(benchmark_options=json.dumps({"name": "ruler", "vt_hops": 8}))
    rows = pd.concat([own, eight], ignore_index=True)
    one_benchmark_setting(own, "x")  # one setting: nothing to refuse
    one_benchmark_setting(pd.concat([own, own.assign(length=4096, benchmark_options="{}")]), "x")  # other length
    for study, check in (("draft-family", draft_family.one_variant), ("lookahead", lookahead.one_setting)):
        with pytest.raises(ValueError, match=rf"^{study}: rows of m at length 2048 ran at 2 settings of the benchmark "
                                             r"\(\['-', 'vt_hops=8'\]\); allowed: one per folder"):  # fmt: skip
            check(rows)
    assert options_of(float("nan")) == {} and options_of(None) == {} and options_of('{"a": 1}') == {"a": 1}


def _timed(run: str, method: str, ttfts: list[float], keep: float | None = 0.3, ideal: float = 2.0) -> list[dict]:
    """One line's latency rows of one run: a warm-up (9 s), then ``ttfts`` by iteration."""
    return [{"kind": "latency", "run_id": run, "model": "m", "backend": "b", "prompt_source": "random", "batch": 1,
             "length": 8, "method": method, "keep_rate": keep, "reference_method": "full", "iteration": i,
             "warmup": i == 0, "status": "ok", "ttft_s": t, "method_s": 0.0, "base_prefill_s": t,
             "kept_fraction": 1.0, "ideal_speedup": ideal, "method_options": "{}", "config_hash": run + method,
             "dtype": "x", "order": i % 2, "hardware": "h"}
            for i, t in enumerate([9.0, *ttfts])]  # fmt: skip


def test_two_lines_timed_side_by_side_worked_by_hand():
    """SpecPC's TTFT against SpecPrefill's in the job that timed both, paired by iteration:
    the median of the per-iteration ratios, worked out here; a line timed only in another job
    is not paired; the speedup of each over full prefill is the same estimator."""
    import numpy as np

    from harness.analysis.speed import between_lines, summarize_latency

    full = [10.0, 12.0, 11.0, 13.0, 10.5, 12.5]
    sp = [5.0, 6.3, 5.4, 6.4, 5.0, 6.0]
    pc = [4.0, 6.0, 5.0, 6.2, 4.9, 6.1]
    rows = pd.DataFrame(
        _timed("a", "full", full, keep=None, ideal=1.0) + _timed("a", "sp", sp, ideal=2.0)
        + _timed("a", "pc", pc, ideal=2.2)
        + _timed("b", "full", [20.0] * 6, keep=None, ideal=1.0) + _timed("b", "other", [1.0] * 6)
    )  # fmt: skip
    df = between_lines(rows, "sp").set_index("line")
    assert set(df.index) == {"full", "pc"}  # "other" ran in job b only
    by_hand = np.median(np.array(sp) / np.array(pc))  # 1.25 1.05 1.08 1.032 1.020 0.984 -> 1.041
    assert df.loc["pc", "speedup"] == pytest.approx(by_hand) and df.loc["pc", "pairs"] == 6
    assert df.loc["pc", "speedup_lo"] <= by_hand <= df.loc["pc", "speedup_hi"]
    assert df.loc["pc", "ideal_ratio"] == pytest.approx(1.1) and df.loc["pc", "runs"] == 1
    assert df.loc["pc", "base_ttft_median_s"] == pytest.approx(np.median(sp))
    # with full prefill as the base, a line's ratio is its speedup in the latency summary
    lat = summarize_latency(rows).set_index("method")
    assert between_lines(rows, "full").set_index("line").loc["pc", "speedup"] == pytest.approx(lat.loc["pc", "speedup"])
    # one label at two keeps in one job: two lines
    two = pd.DataFrame(_timed("a", "sp", sp, keep=0.1) + _timed("a", "sp", pc, keep=0.3))
    assert set(between_lines(two, "sp (keep 0.1)")["line"]) == {"sp (keep 0.3)"}


def test_speed_pairs_from_the_command_line(tmp_path, capsys):
    """The committed draft-family timing job's lines against SpecPrefill: one table, the
    cascades (timed in jobs of their own) left out; a bad base or --samples refused."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / "draft_family_qwen_cpu" / "latency"
    folder = tmp_path / "latency"
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("*.md", "*.csv"))
    main([str(folder), "--base", "specprefill (512", "--speed"])
    text = (folder / "speed_pairs.md").read_text()
    assert "against `specprefill (512 tokens)`, side by side" in text and "| specpc (512 tokens) | 1 | 10 |" in text
    assert "compose" not in text  # the cascades ran in other jobs
    assert (folder / "speed_pairs.csv").exists()
    with pytest.raises(SystemExit):
        main([str(folder), "--base", "nothing", "--speed"])
    assert "no line of the folder holds it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(folder), "--base", "specprefill (512", "--speed", "--samples", "0-4"])
    assert "--samples '0-4' with --speed" in capsys.readouterr().err
