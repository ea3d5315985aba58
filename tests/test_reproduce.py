"""Twin runs of one job on two sides of a field (harness.studies.reproduce): the values worked
out by hand, keeps and options never mixed, what else differs listed, bad input refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.analysis.folder import analyze, analyze_rows
from harness.studies.reproduce import main, markdown, sides, twins


def _rows(dtype: str, method: str, keep: float | None, scores: list[float], answers: list[str], kept=None, **extra):
    opts = {} if method == "full" else {"lookahead": 1}  # the keep only in its column: JOB must name it
    out = []
    for i, (v, a) in enumerate(zip(scores, answers, strict=True)):
        out.append({"kind": "eval", "status": "ok", "model": "m", "benchmark": "ruler", "length": 2048, "task": "vt",
                    "sample_id": i, "method": method, "keep_rate": keep, "method_options": json.dumps(opts),
                    "benchmark_options": "{}", "reference_method": "full", "config_hash": f"{method}{keep}{dtype}",
                    "score": v, "prediction": a, "sample_hash": f"s{i}", "kept_hash": None if kept is None else kept[i],
                    "run_id": "r", "dtype": dtype, "backend": "transformers", "hardware": f"cpu {dtype}",
                    "git_sha": "a" * 40 if dtype == "bfloat16" else "b" * 40 + "-dirty",
                    "versions": json.dumps({"torch": "2.13.0+cpu", "transformers": "5.19.0"}), **extra})  # fmt: skip
    return out


def needle(rows: list[dict], kept: list[float]) -> list[dict]:
    return [{**r, "needle_kept": k} for r, k in zip(rows, kept, strict=True)]


@pytest.fixture
def rows() -> pd.DataFrame:
    frames = [
        _rows("bfloat16", "full", None, [100, 100, 0, 100], ["a", "b", "c", "d"]),
        _rows("float32", "full", None, [100, 0, 0, 100], ["a", "x", "c", "d"]),
        needle(
            _rows("bfloat16", "sp", 0.1, [0, 0, 100, 100], ["p", "q", "r", "s"], kept=["k0", "k1", "k2", "k3"]),
            [1.0, 0.5, 1.0, 0.25],
        ),
        needle(
            _rows("float32", "sp", 0.1, [100, 100, 100, 0], ["P", "Q", "r", "S"], kept=["k0", "j1", "k2", "k3"]),
            [1.0, 0.75, 1.0, 0.25],
        ),
        _rows("bfloat16", "sp", 0.3, [100, 100, 100, 100], ["a", "b", "c", "d"]),
        _rows("float32", "sp", 0.3, [100, 100, 100, 100], ["a", "b", "c", "d"]),
    ]
    return analyze_rows(None, pd.DataFrame([r for f in frames for r in f])).ok("eval")


def test_each_line_against_its_twin_worked_by_hand(rows):
    df = twins(rows, "dtype", "bfloat16").set_index("line")
    assert sorted(df.index) == ["full", "sp keep 0.1", "sp keep 0.3"]  # the keeps are not mixed
    assert (df["n"] == 4).all() and (df["other"] == "float32").all()
    full, low, high = df.loc["full"], df.loc["sp keep 0.1"], df.loc["sp keep 0.3"]
    # full: 0, -100, 0, 0 -> -25.0; answers a x c d against a b c d: 3 of 4 the same
    assert full["difference"] == pytest.approx(-25.0) and (full["wins"], full["losses"]) == (0, 1)
    assert full["same_answer"] == pytest.approx(0.75) and full["same_prompt"] == 1.0
    assert pd.isna(full["same_kept"]) and full["kept_recorded"] == 0  # full prefill's rows here record none
    # keep 0.1: +100, +100, 0, -100 -> +25.0; kept tokens k0 j1 k2 k3: 3 of 4; answers: only r the same
    assert low["difference"] == pytest.approx(25.0) and (low["wins"], low["losses"]) == (2, 1)
    assert low["same_kept"] == pytest.approx(0.75) and low["kept_recorded"] == 4
    assert low["same_answer"] == pytest.approx(0.25) and low["lo"] <= 25.0 <= low["hi"]
    assert low["same_needle"] == pytest.approx(0.75) and pd.isna(full["same_needle"])  # 0.5 against 0.75 in one
    assert high["difference"] == 0.0 and high["same_answer"] == 1.0
    assert full["base_mean"] == pytest.approx(75.0) and full["line_mean"] == pytest.approx(50.0)


def test_the_table_names_both_sides_and_what_else_differs(rows):
    text = markdown(twins(rows, "dtype", "bfloat16"), "dtype", rows)
    assert "### model m, benchmark ruler, length 2048: dtype=float32 against dtype=bfloat16" in text
    assert "| sp keep 0.1 | vt | 4 | 50.0 | 75.0 | +25.0 [" in text and "| 75% | 75% | 25% |" in text
    assert "| full | vt | 4 | 75.0 | 50.0 | -25.0 [" in text and "| 100% | not recorded | not recorded | 75% |" in text
    assert "| sp keep 0.3 | vt | 4 | 100.0 | 100.0 | +0.0 (every sample the same) |" in text
    assert sides(rows, "dtype") == [
        "- hardware: dtype=bfloat16: cpu bfloat16; dtype=float32: cpu float32",
        "- git_sha: dtype=bfloat16: aaaaaaa; dtype=float32: bbbbbbb-dirty",
    ]  # the libraries agree: not listed


def test_two_machines_of_one_model_name_are_told_apart_by_their_cpu_flags(rows):
    """Two CPUs that ``hardware`` names alike (``cpu: AMD EPYC``) but whose kernels differ: the
    rows' ``cpu_flags`` tell them apart, listed under the table; rows without it say nothing."""
    from harness.provenance import CPU_FLAGS, flags_in

    text = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\nflags\t: avx2\n"
    assert flags_in(text) == "avx512_bf16 avx512f avx2" and flags_in("model name: x\n") == ""
    assert CPU_FLAGS[0] == "amx_bf16"  # the first: bfloat16 on AMX
    flags = rows["dtype"].map({"bfloat16": "avx512_bf16 avx512f avx2", "float32": "avx2"})
    named = rows.assign(hardware="cpu: AMD EPYC, 2 threads", cpu_flags=flags)
    assert sides(named, "dtype")[0] == "- cpu_flags: dtype=bfloat16: avx512_bf16 avx512f avx2; dtype=float32: avx2"
    assert not any(line.startswith("- hardware") for line in sides(named, "dtype"))
    assert not any("cpu_flags" in line for line in sides(rows, "dtype"))  # not recorded on either side


def test_a_base_no_row_has_is_refused_naming_the_values(rows):
    with pytest.raises(
        ValueError, match=r"--base 'float16': no row has dtype='float16'; allowed: one of \['bfloat16', 'float32'\]"
    ):
        twins(rows, "dtype", "float16")
    with pytest.raises(ValueError, match=r"--base 'f': 2 values start with it"):
        twins(rows.assign(dtype=rows["dtype"].str.replace("b", "f")), "dtype", "f")
    with pytest.raises(ValueError, match=r"--base '': empty: name the side .*base=\); allowed: one of \['bfloat16'"):
        twins(rows, "dtype", "")  # make reproduce without base= passes --base ""
    by_commit = twins(rows.assign(dtype="float32"), "git_sha", "aaaa").set_index("line")  # the start of one names it
    assert by_commit.loc["full", "base"] == "a" * 40 and by_commit.loc["full", "difference"] == pytest.approx(-25.0)
    lonely = rows[rows["dtype"] == "bfloat16"]
    assert twins(lonely, "dtype", "bfloat16").empty
    assert markdown(twins(lonely, "dtype", "bfloat16"), "dtype", lonely).startswith("No line has a twin")


def test_a_sample_range_pairs_only_those_samples(rows):
    df = twins(rows, "dtype", "bfloat16", (1, 2)).set_index("line")
    assert (df["n"] == 2).all() and df.loc["full", "difference"] == pytest.approx(-50.0)


def test_a_tiny_job_at_two_dtypes_through_the_command(tmp_path, tiny_ruler_eval, capsys):
    """The same job at float32 and bfloat16: two runs (the dtype is in the run's identity), in one
    folder or in one folder each, paired by sample, the prompts the same; the files go to --out."""
    import shutil

    from harness.provenance import cpu_flags

    tiny_ruler_eval(["method=specprefill", "keep=0.3", "model.dtype=bfloat16"])
    shutil.move(tmp_path / "tiny-random", tmp_path / "b" / "tiny-random")
    tiny_ruler_eval(["method=specprefill", "keep=0.3", "model.dtype=float32"])
    shutil.move(tmp_path / "tiny-random", tmp_path / "a" / "tiny-random")
    a, b = tmp_path / "a", tmp_path / "b"
    assert set(analyze(a).ok("eval")["dtype"]) == {"float32"} and set(analyze(b).ok("eval")["dtype"]) == {"bfloat16"}
    assert set(analyze(a).ok("eval")["cpu_flags"]) == {cpu_flags()}  # every row records the CPU's flags
    main([str(a), str(b), "--base", "float32", "--name", "twins", "--out", str(tmp_path / "study")])
    df = pd.read_csv(tmp_path / "study" / "twins.csv")
    assert df["line"].tolist() == ["specprefill keep 0.3"] and df["n"].tolist() == [3]
    assert df["same_prompt"].tolist() == [1.0] and df["kept_recorded"].tolist() == [3]
    assert "dtype=bfloat16 against dtype=float32" in (tmp_path / "study" / "twins.md").read_text()
    shutil.copytree(b / "tiny-random", a / "tiny-random", dirs_exist_ok=True)  # both runs in one folder
    main([str(a), "--base", "float32"])
    assert pd.read_csv(a / "reproduce.csv")["n"].tolist() == [3]
    for argv, message in [
        ([str(a), "--base", "float16"], "no row has dtype='float16'"),
        ([str(a), "--base", "float32", "--across", "seed"], "invalid choice: 'seed'"),
        ([str(a), "--base", "float32", "--samples", "3-1"], "--samples '3-1': allowed"),
        ([str(a), "--base", "float32", "--name", "../x"], "--name ../x: allowed: a file name"),
        ([str(a), str(a), "--base", "float32"], "name one folder twice"),
        ([str(a), str(tmp_path / "none"), "--base", "float32"], "folders: no run's rows under"),
    ]:
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_runs_of_one_method_under_other_options_are_lines_of_their_own():
    """Token by token and by chunks at one keep: two lines, each named by the option, each paired
    with its own twin (not the first row of each sample of both)."""
    frames = []
    for dtype in ("bfloat16", "float32"):
        for chunk, scores in ((32, [0, 0]), (None, [100, 100])):
            rs = _rows(dtype, "sp", 0.1, scores if dtype == "bfloat16" else [100, 100], ["a", "b"])
            opts = json.dumps({"lookahead": 1, "chunk_size": chunk})
            frames += [{**r, "method_options": opts, "config_hash": f"{chunk}{dtype}"} for r in rs]
    rows = analyze_rows(None, pd.DataFrame(frames)).ok("eval")
    df = twins(rows, "dtype", "bfloat16").set_index("line")
    assert df["difference"].to_dict() == {"sp (chunk_size=32) keep 0.1": 100.0, "sp (chunk_size=None) keep 0.1": 0.0}
