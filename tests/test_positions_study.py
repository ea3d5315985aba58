"""The position study (harness/studies/positions.py) and the row field it pairs on (kept_hash):
its jobs run full prefill once and each method in both position modes on the same samples; its
paired differences are checked against numbers worked out by hand; a pair whose two rows kept
different tokens is counted, so a difference that is not the positions' alone shows; and a tiny
real run keeps the same tokens in both modes, at the positions each mode promises."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from harness.analysis.folder import analyze
from harness.diagnostics import kept_hash
from harness.studies import bench_label
from harness.studies import positions as study
from specprefill.plan import Prompt, kept_plan


def test_jobs_run_full_prefill_once_then_each_method_in_both_modes(tmp_path):
    cmds = study.eval_commands(tmp_path, "qwen2.5-coder-1.5b", 2048, ["vt", "qa_1"], 15, ["specprefill", "specpc"],
                               [0.1, 0.3])  # fmt: skip
    assert len(cmds) == 3 and "method=full" in cmds[0] and not any(c.startswith("keep=") for c in cmds[0])
    for cmd, method in zip(cmds[1:], ["specprefill", "specpc"], strict=True):
        assert f"method={method}" in cmd and "keep=0.1,0.3" in cmd
        assert "method.position_mode=original,contiguous" in cmd
    # every job reads the same samples
    assert len({tuple(c for c in cmd if c.startswith(("tasks=", "limit=", "length=", "model="))) for cmd in cmds}) == 1


def test_jobs_take_a_budget_in_tokens_and_overrides(tmp_path):
    """The chain-length study's setting: one budget in tokens, token by token, vt at 8 hops, with
    full prefill on the same prompts (the benchmark's option) and without the method's option."""
    cmds = study.eval_commands(tmp_path, "qwen2.5-coder-1.5b", 4096, ["vt"], 30, ["specprefill"], [0.1, 0.3], 512,
                               ["benchmark.options.vt_hops=8"], ["method.chunk_size=null"])  # fmt: skip
    full, spec = cmds
    assert "benchmark.options.vt_hops=8" in full and "benchmark.options.vt_hops=8" in spec
    assert "method.chunk_size=null" in spec and not any(c.startswith("method.") for c in full)
    assert "keep_tokens=512" in spec and not any(c.startswith("keep=") for c in spec)
    assert not any(c.startswith(("keep=", "keep_tokens=")) for c in full)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "method.chunk_size=null"], "--set method.chunk_size=null: allowed: KEY=VALUE overrides outside"),
        (["--set", "vt_hops"], "--set vt_hops: allowed: KEY=VALUE"),
        (["--method-set", "chunk"], "--method-set chunk: allowed: KEY=VALUE"),
        (["--keep-tokens", "0"], "--keep-tokens 0: allowed: 1 or more tokens"),
    ],
)
def test_bad_overrides_are_refused_before_any_job(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(study, "run_job", lambda cmd: pytest.fail(f"a job ran: {cmd}"))
    with pytest.raises(SystemExit):
        study.main([*argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_each_method_s_own_mode_is_its_preset_s():
    assert study.own_mode("specprefill") == "original"  # the paper's reference behaviour
    assert study.own_mode("specpc") == "contiguous"  # the draft-based papers' code
    assert study.own_mode("gemfilter") == "contiguous" and study.own_mode("random") == "original"
    assert study.own_mode("full") is None


def test_kept_hash_names_the_set_of_kept_tokens_not_their_order_or_positions():
    a = kept_hash(torch.tensor([5, 1, 2]))
    assert a == kept_hash(torch.tensor([1, 2, 5])) and len(a) == 16
    assert a != kept_hash(torch.tensor([1, 2, 6])) and a != kept_hash(torch.tensor([1, 2]))
    assert kept_hash(None) is None
    # the two modes' plans of one selection keep the same tokens at different positions
    prompt = Prompt(input_ids=torch.arange(100, 110))
    kept = torch.tensor([1, 4, 9])
    orig, cont = kept_plan(prompt, kept, "original", {}), kept_plan(prompt, kept, "contiguous", {})
    assert kept_hash(orig.kept_indices) == kept_hash(cont.kept_indices)
    assert orig.position_ids.tolist() == [1, 4, 9] and orig.next_position == 10
    assert cont.position_ids.tolist() == [0, 1, 2] and cont.next_position == 3


def _rows(scores: dict[tuple[str, str], list[float]], hashes: dict[tuple[str, str], list[str | None]] | None = None):
    """Eval rows of SpecPrefill at keep 0.1: (mode, task) -> per-sample scores (sample ids 0..)."""
    out = []
    for (mode, task), vals in scores.items():
        hs = (hashes or {}).get((mode, task)) or [f"h{task}{i}" for i in range(len(vals))]
        for i, (v, h) in enumerate(zip(vals, hs, strict=True)):
            out.append({"method": "specprefill", "keep_rate": 0.1, "task": task, "sample_id": i, "score": v,
                        "kept_hash": h, "method_options": json.dumps({"position_mode": mode, "keep_rate": 0.1})})  # fmt: skip
    return pd.DataFrame(out)


def test_contiguous_minus_original_is_paired_by_sample_and_tasks_weigh_equally():
    rows = _rows({
        ("original", "a"): [100, 100, 0, 100], ("contiguous", "a"): [0, 100, 0, 100],  # -25 on a
        ("original", "b"): [100, 100, 100, 100, 0, 0], ("contiguous", "b"): [100, 100, 0, 0, 100, 0],  # -16.7 on b
    })  # fmt: skip
    d = study.differences(rows).set_index("task")
    assert list(d.index) == ["ALL", "a", "b"]
    assert d.loc["a", "difference"] == pytest.approx(-25.0) and d.loc["b", "difference"] == pytest.approx(-100 / 6)
    # ALL: the mean of the tasks' differences (not of the 10 samples: -30)
    assert d.loc["ALL", "difference"] == pytest.approx((-25.0 - 100 / 6) / 2)
    assert d.loc["ALL", "original"] == pytest.approx((75 + 400 / 6) / 2)
    assert (d.loc["ALL", "wins"], d.loc["ALL", "losses"], d.loc["ALL", "n"]) == (1, 3, 10)
    assert (d.loc["a", "wins"], d.loc["a", "losses"]) == (0, 1)
    assert d.loc["ALL", "lo"] <= d.loc["ALL", "difference"] <= d.loc["ALL", "hi"]
    assert (d["same_selection"] == 1.0).all()


def test_a_pair_that_kept_other_tokens_shows_and_unrecorded_selections_are_not_called_the_same():
    scores = {("original", "a"): [100, 0, 100, 100], ("contiguous", "a"): [100, 0, 100, 0]}
    differ = {("original", "a"): ["x0", "x1", "x2", "x3"], ("contiguous", "a"): ["x0", "x1", "y2", "x3"]}
    d = study.differences(_rows(scores, differ)).set_index("task")
    assert d.loc["ALL", "same_selection"] == pytest.approx(0.75)
    assert "| 75% |" in study.markdown(pd.DataFrame(columns=["method"]), d.reset_index())
    old = {("original", "a"): ["x0", "x1", "x2", "x3"], ("contiguous", "a"): [None, None, None, None]}
    d = study.differences(_rows(scores, old)).set_index("task")  # rows before kept_hash
    assert np.isnan(d.loc["ALL", "same_selection"])
    assert "not recorded" in study.markdown(pd.DataFrame(columns=["method"]), d.reset_index())


def test_a_sample_only_one_mode_ran_is_left_out_and_a_method_in_one_mode_has_no_line():
    rows = _rows({("original", "a"): [100, 0, 100], ("contiguous", "a"): [0, 0]})
    d = study.differences(rows).set_index("task")
    assert d.loc["ALL", "n"] == 2 and d.loc["ALL", "difference"] == pytest.approx(-50.0)
    assert study.differences(_rows({("original", "a"): [100, 0]})).empty


def test_by_depth_pools_the_pairs_of_each_third_of_the_context():
    rows = _rows({("original", "a"): [100, 100, 0, 100], ("contiguous", "a"): [0, 100, 100, 100],
                  ("original", "b"): [100, 0], ("contiguous", "b"): [0, 0]})  # fmt: skip
    depth = {("a", 0): 0.1, ("a", 1): 0.2, ("a", 2): 0.5, ("a", 3): 0.9, ("b", 0): 0.05, ("b", 1): None}
    rows["needle_depth"] = [depth[(t, i)] for t, i in zip(rows["task"], rows["sample_id"], strict=True)]
    d = study.by_depth(rows).set_index("depth")
    assert list(d.index) == list(study.DEPTH_LABELS)
    # first third: a0 (-100), a1 (0), b0 (-100); middle: a2 (+100); last: a3 (0); b1 has no depth
    assert d["n"].tolist() == [3, 1, 1]
    assert d["difference"].tolist() == pytest.approx([-200 / 3, 100.0, 0.0])
    assert (d.loc["first third", "original"], d.loc["first third", "contiguous"]) == pytest.approx((100.0, 100 / 3))
    assert d.loc["first third", "lo"] <= d.loc["first third", "difference"] <= d.loc["first third", "hi"]
    text = study.markdown(pd.DataFrame(columns=["method"]), study.differences(rows), study.by_depth(rows))
    assert "| specprefill | 0.1 | middle third | 1 |" in text
    # no evidence in the last third: the bin is not printed (it read "+nan")
    rows.loc[rows["needle_depth"] == 0.9, "needle_depth"] = 0.5
    text = study.markdown(pd.DataFrame(columns=["method"]), study.differences(rows), study.by_depth(rows))
    assert "| specprefill | 0.1 | middle third | 2 |" in text and "last third" not in text and "nan" not in text


def test_by_whole_splits_the_pairs_by_whether_the_evidence_survived():
    """Hand-worked: a0 and a1 kept their needle whole (contiguous +100 on a1), a2 kept half of it
    (-100), b0 whole (0), b1 has no evidence (left out); full prefill's mean is taken on the same
    samples, of this setup only (the 4K full rows are not pooled in)."""
    rows = _rows({("original", "a"): [100, 0, 100], ("contiguous", "a"): [100, 100, 0],
                  ("original", "b"): [0, 0], ("contiguous", "b"): [0, 100]})  # fmt: skip
    whole = {("a", 0): 1.0, ("a", 1): 1.0, ("a", 2): 0.5, ("b", 0): 1.0, ("b", 1): None}
    rows["needle_whole"] = [whole[(t, i)] for t, i in zip(rows["task"], rows["sample_id"], strict=True)]
    full = pd.DataFrame({"method": "full", "task": ["a", "a", "a", "b", "b"], "sample_id": [0, 1, 2, 0, 1],
                         "score": [100.0, 100.0, 0.0, 0.0, 100.0], "length": 2048, "method_options": "{}",
                         "keep_rate": None})  # fmt: skip
    other = full.assign(length=4096, score=50.0)  # another setup's full prefill
    d = study.by_whole(pd.concat([rows.assign(length=2048), other, full], ignore_index=True)).set_index("evidence")
    assert list(d.index) == list(study.WHOLE_LABELS)
    assert d["n"].tolist() == [3, 1]
    assert d["difference"].tolist() == pytest.approx([100 / 3, -100.0])
    assert (d.loc["kept whole", "original"], d.loc["kept whole", "contiguous"]) == pytest.approx((100 / 3, 200 / 3))
    assert d.loc["kept whole", "full"] == pytest.approx(200 / 3) and d.loc["not kept whole", "full"] == 0.0
    assert d.loc["kept whole", "lo"] <= d.loc["kept whole", "difference"] <= d.loc["kept whole", "hi"]
    text = study.markdown(pd.DataFrame(columns=["method"]), study.differences(rows), None, None, d.reset_index())
    assert "| specprefill | 0.1 | kept whole | 3 | 33.3 | 66.7 |" in text and "| 66.7 |" in text
    assert study.by_whole(rows.drop(columns="needle_whole"))["n"].sum() == 0  # rows before needle_whole


def test_between_methods_compares_the_selections_at_the_same_positions():
    sp = _rows({("original", "a"): [100, 100, 0], ("contiguous", "a"): [100, 0, 0],
                ("original", "b"): [100, 100], ("contiguous", "b"): [100, 100]})  # fmt: skip
    pc = _rows({("original", "a"): [0, 100, 0], ("contiguous", "a"): [0, 0, 0],
                ("original", "b"): [100, 0], ("contiguous", "b"): [0, 0]}).assign(method="specpc")  # fmt: skip
    d = study.between_methods(pd.concat([pc, sp], ignore_index=True)).set_index("position_mode")
    assert (d["method"] == "specpc").all() and (d["against"] == "specprefill").all()
    # original: a -33.3, b -50 -> -41.7; contiguous: a -33.3, b -100 -> -66.7 (tasks weighted equally)
    assert d.loc["original", "difference"] == pytest.approx((-100 / 3 - 50) / 2)
    assert d.loc["contiguous", "difference"] == pytest.approx((-100 / 3 - 100) / 2)
    assert (d["n"] == 5).all()
    text = study.markdown(pd.DataFrame(columns=["method"]), study.differences(sp), None, d.reset_index())
    assert "| specpc | specprefill | 0.1 | original | 5 |" in text
    assert study.between_methods(sp).empty  # one method: nothing to compare


def test_runs_of_one_method_under_other_options_are_arms_of_their_own():
    """SpecPrefill by chunks and token by token in one folder: each option set is its own arm,
    named by the option that differs, paired within itself only (pooled, the sample ids would
    pair a chunked row with a token row, or one of them would be dropped)."""

    def runs(chunk, scores):
        r = _rows(scores)
        opts = [{**json.loads(o), "chunk_size": chunk, "lookahead": 1} for o in r["method_options"]]
        return r.assign(method_options=[json.dumps(o) for o in opts])

    chunked = runs(32, {("original", "a"): [100, 100, 100, 100], ("contiguous", "a"): [100, 100, 100, 100]})
    token = runs(None, {("original", "a"): [0, 0, 100, 100], ("contiguous", "a"): [100, 100, 100, 100]})
    rows = pd.concat([chunked, token], ignore_index=True)
    d = study.differences(rows)
    got = d[d["task"] == "ALL"].set_index("method")[["difference", "n", "wins"]]
    assert got.to_dict("index") == {
        "specprefill (chunk_size=32)": {"difference": 0.0, "n": 4, "wins": 0},
        "specprefill (chunk_size=None)": {"difference": 50.0, "n": 4, "wins": 2},
    }
    assert set(study.by_depth(rows.assign(needle_depth=0.5))["method"]) == set(got.index)
    between = study.between_methods(rows).set_index("position_mode")  # the two grains at the same positions
    assert (between["method"] == "specprefill (chunk_size=None)").all()
    assert (between["against"] == "specprefill (chunk_size=32)").all()
    assert (
        between.loc["original", "difference"] == pytest.approx(-50.0) and between.loc["contiguous", "difference"] == 0
    )
    # a method run one way has no variant: the committed tables' names are unchanged
    assert set(study.differences(chunked)["method"]) == {"specprefill"}


def test_a_budget_in_tokens_is_printed_as_one_and_budgets_are_never_pooled():
    """keep_tokens=N runs record keep_rate 1.0: the tables print "N tokens", not "1", and two
    budgets in one folder are two lines (a keep rate of 1.0 each, pooled, would pair across)."""

    def budget(n, scores):
        r = _rows(scores).assign(keep_rate=1.0)
        opts = [{**json.loads(o), "keep_rate": 1.0, "keep_tokens": n} for o in r["method_options"]]
        return r.assign(method_options=[json.dumps(o) for o in opts])

    rows = pd.concat([budget(256, {("original", "a"): [0, 0], ("contiguous", "a"): [100, 100]}),
                      budget(512, {("original", "a"): [100, 100], ("contiguous", "a"): [100, 100]})])  # fmt: skip
    d = study.differences(rows)
    got = d[d["task"] == "ALL"].set_index("method")
    assert sorted(got["budget"]) == ["256 tokens", "512 tokens"]
    assert got.set_index("budget").loc["256 tokens", "difference"] == pytest.approx(100.0)
    assert "| specprefill (keep_tokens=256) | 256 tokens | ALL | 2 |" in study.markdown(
        pd.DataFrame(columns=["method"]), d
    )


def test_rows_of_another_length_in_the_same_folder_are_not_pairs():
    at = {2048: _rows({("original", "a"): [100, 100], ("contiguous", "a"): [0, 100]}),
          4096: _rows({("original", "a"): [0, 0], ("contiguous", "a"): [100, 100]})}  # fmt: skip
    rows = pd.concat([f.assign(length=n, model="m") for n, f in at.items()], ignore_index=True)
    d = study.differences(rows)
    got = d[d["task"] == "ALL"].set_index("length")["difference"]
    assert got.to_dict() == pytest.approx({2048: -50.0, 4096: 100.0})
    assert "| 2048 | specprefill | 0.1 | ALL |" in study.markdown(pd.DataFrame(columns=["method"]), d)
    # one mode at each length: nothing to pair
    lone = pd.concat([at[2048][at[2048]["method_options"].str.contains("original")].assign(length=2048),
                      at[4096][at[4096]["method_options"].str.contains("contiguous")].assign(length=4096)])  # fmt: skip
    assert study.differences(lone).empty


def test_rows_of_another_benchmark_option_are_not_pairs_and_full_prefill_is_their_own(tmp_path):
    """vt at two chain lengths (benchmark.options.vt_hops) in one folder: sample 0 of one is not
    sample 0 of the other, so each is its own arm, named by its option, beside its own full
    prefill; RULER's own settings print as "-"."""
    own = json.dumps({"name": "ruler", "version": "ruler-1", "length": 4096})
    hops8 = json.dumps({"name": "ruler", "version": "ruler-1", "length": 4096, "vt_hops": 8})
    at = {own: _rows({("original", "vt"): [100, 100], ("contiguous", "vt"): [0, 100]}),
          hops8: _rows({("original", "vt"): [0, 0], ("contiguous", "vt"): [100, 100]})}  # fmt: skip
    rows = pd.concat([f.assign(benchmark_options=o, needle_whole=1.0) for o, f in at.items()], ignore_index=True)
    full = pd.DataFrame({"method": "full", "task": "vt", "sample_id": [0, 1, 0, 1], "score": [100.0, 100.0, 0.0, 50.0],
                         "benchmark_options": [own, own, hops8, hops8], "method_options": "{}", "keep_rate": None,
                         "needle_whole": None})  # fmt: skip
    d = study.differences(rows)
    got = d[d["task"] == "ALL"].set_index("benchmark_options")["difference"]
    assert got.to_dict() == pytest.approx({"-": -50.0, "vt_hops=8": 100.0})
    assert "| vt_hops=8 | specprefill | 0.1 | ALL | 2 |" in study.markdown(pd.DataFrame(columns=["method"]), d)
    groups = study.by_whole(pd.concat([rows, full], ignore_index=True))
    whole = groups[groups["evidence"] == "kept whole"].set_index("benchmark_options")["full"]
    assert whole.to_dict() == pytest.approx({"-": 100.0, "vt_hops=8": 25.0})
    # every pair kept its chain whole: the empty "not kept whole" groups are not printed
    text = study.markdown(pd.DataFrame(columns=["method"]), d, None, None, groups)
    assert "| vt_hops=8 | specprefill | 0.1 | kept whole | 2 |" in text and "not kept whole" not in text
    assert bench_label(own) == "-" and bench_label(hops8) == "vt_hops=8"
    study.difference_figure(d, tmp_path / "d.png")  # one line per option: drawn
    study.difference_figure(d.iloc[0:0], tmp_path / "none.png")  # no pair: nothing drawn
    assert (tmp_path / "d.png").stat().st_size > 0 and not (tmp_path / "none.png").exists()


def test_a_tiny_run_keeps_the_same_tokens_in_both_modes(tmp_path, tiny_ruler_eval):
    tiny_ruler_eval(["method=full"])
    for mode in study.MODES:
        tiny_ruler_eval(["method=specprefill", "keep=0.3", f"method.position_mode={mode}"])
    a = analyze(tmp_path)
    df, diff = study.table(a), study.differences(a.ok("eval"))
    assert df["method"].tolist() == ["full", "specprefill", "specprefill"]
    assert df["position_mode"].tolist()[1:] == ["original", "contiguous"] and (df["n"] == 3).all()
    assert diff["task"].tolist() == ["ALL", "niah_single_1"] and (diff["n"] == 3).all()
    assert (diff["same_selection"] == 1.0).all()  # the selection does not depend on the mode
    rows = a.ok("eval")
    assert rows["kept_hash"].notna().all()
    full = rows[rows["method"] == "full"]
    assert full["kept_hash"].tolist() == [kept_hash(torch.arange(int(n))) for n in full["prompt_tokens"]]
    text = study.markdown(df, diff, study.by_depth(a.ok("eval")))
    assert "specprefill, original (its own)" in text and "| 100% |" in text and "evidence in the context's" in text
    study.main(["--no-run", "--out", str(tmp_path)])
    assert (tmp_path / "positions.md").exists() and (tmp_path / "positions.png").exists()
    assert set(pd.read_csv(tmp_path / "positions_by_depth.csv")["depth"]) <= set(study.DEPTH_LABELS)


def test_a_reading_of_some_samples_is_written_beside_the_whole_one(tmp_path, tiny_ruler_eval, capsys):
    """--samples reads only those sample ids (a replication on samples no choice was made on),
    --name writes it beside the folder's own reading, which stays as it was."""
    tiny_ruler_eval(["method=full"])
    for mode in study.MODES:
        tiny_ruler_eval(["method=specprefill", "keep=0.3", f"method.position_mode={mode}"])
    study.main(["--no-run", "--out", str(tmp_path)])
    whole = (tmp_path / "positions.md").read_text()
    study.main(["--no-run", "--out", str(tmp_path), "--samples", "1-", "--name", "later"])
    assert (tmp_path / "positions.md").read_text() == whole
    text = (tmp_path / "later.md").read_text()
    assert text.startswith("Samples 1- only") and (tmp_path / "later.png").exists()
    got = pd.read_csv(tmp_path / "later_differences.csv").set_index("task").loc["ALL"]
    rows = analyze(tmp_path).ok("eval")
    rows = rows[rows["method"] == "specprefill"].assign(mode=lambda d: d["method_options"].map(study.position_mode))
    by = rows.pivot_table(index="sample_id", columns="mode", values="score")
    assert sorted(by.index) == [0, 1, 2] and got["n"] == 2  # sample 0 left out
    assert got["difference"] == pytest.approx((by["contiguous"] - by["original"]).loc[[1, 2]].mean())
    assert (pd.read_csv(tmp_path / "later.csv")["n"] == 2).all()
    for argv, message in [
        (["--samples", "2-1"], "--samples '2-1': allowed: FIRST-LAST"),
        (["--samples", "7-"], "no eval rows that ran among samples 7-"),
        (["--name", "../x"], "--name"),
    ]:
        with pytest.raises(SystemExit):
            study.main(["--no-run", "--out", str(tmp_path), *argv])
        assert message in capsys.readouterr().err
    assert pd.read_csv(tmp_path / "positions_differences.csv")["same_selection"].eq(1.0).all()


def test_gap_profile_counts_runs_gaps_and_capped_empty_positions_by_hand():
    from harness.studies import gaps
    from harness.studies.gaps import profile

    # runs [0-2], [10-11], [50], [99] of 100: gaps of 7, 38 and 48 empty positions
    p = profile(torch.tensor([0, 1, 2, 10, 11, 50, 99]), 100, caps=(4, 16, 64))
    assert (p["runs"], p["gaps"], p["longest_gap"], p["empty"]) == (4, 3, 48, 93)
    assert (p["empty_4"], p["empty_16"], p["empty_64"], p["even_gap"]) == (9, 37, 93, 31.0)  # 3+3+3, 7+15+15
    assert p["gap_sizes"] == "7 38 48"
    assert p["empty_scale_0.4"] == 3 + 15 + 19  # 2.8, 15.2, 19.2 rounded
    # the span and the share of it left empty: 7 kept + 93 empty = 100; capped at 4: 7 + 9
    sh = gaps.shares(pd.DataFrame([p]))
    assert (sh.loc[0, "span_empty"], sh.loc[0, "share_empty"]) == (100, pytest.approx(0.93))
    assert (sh.loc[0, "span_empty_4"], sh.loc[0, "share_empty_4"]) == (16, pytest.approx(9 / 16))
    assert "| `max_gap=4` | 16 | 0.562 | 0.562 | 0.562 |" in gaps.render(
        pd.DataFrame([p]).assign(same_as_row=None), "r"
    )
    # a gap before the first kept token and after the last: 5, 23 and 9 empty positions
    p = profile(torch.tensor([5, 6, 30]), 40, caps=(4, 16))
    assert (p["runs"], p["gaps"], p["longest_gap"], p["empty_4"], p["empty_16"]) == (2, 3, 23, 9, 29)
    assert p["gap_sizes"] == "5 23 9"


def test_gap_profile_of_a_run_checks_its_selections_against_the_rows(tiny_ruler_eval, tmp_path, monkeypatch, capsys):
    from harness.studies import gaps

    run = ["method=specprefill", "keep=0.3", "method.chunk_size=null"]
    tiny_ruler_eval(run)
    over = [
        "model=tiny-random",
        "benchmark=ruler",
        "tasks=[niah_single_1]",
        "length=1024",
        "limit=3",
        "max_new=2",
        *run,
    ]
    assert gaps.main([str(tmp_path), *over]) == 0
    df = pd.read_csv(tmp_path / "gaps.csv")
    assert len(df) == 3 and df["same_as_row"].eq(True).all() and (df["empty"] == df["n"] - df["k"]).all()
    assert "3 of 3 selections are the rows'" in (tmp_path / "gaps.md").read_text()
    # another name: the same profile beside the first, not over it
    (tmp_path / "gaps.md").write_text("first")
    assert gaps.main([str(tmp_path), "--name", "gaps_other", *over]) == 0
    assert (tmp_path / "gaps.md").read_text() == "first" and "3 of 3" in (tmp_path / "gaps_other.md").read_text()
    assert pd.read_csv(tmp_path / "gaps_other.csv")["kept_hash"].tolist() == df["kept_hash"].tolist()
    for bad in ("../x", "sub/x", ".hidden", ""):  # the files go into the folder, nowhere else
        with pytest.raises(SystemExit):
            gaps.main([str(tmp_path), "--name", bad, *over])
        assert (
            f"--name {bad}: allowed: a file name: letters, digits, _ . - (no folder; not starting"
            in capsys.readouterr().err
        )
    # re-rendered from the CSV alone: the same table, naming the same run; an old CSV without one refused
    planned = (tmp_path / "gaps_other.md").read_text()
    (tmp_path / "gaps_other.md").write_text("stale")
    assert gaps.main([str(tmp_path), "--no-run", "--name", "gaps_other"]) == 0
    assert (tmp_path / "gaps_other.md").read_text() == planned
    assert "ruler-1024" in (tmp_path / "gaps_other.md").read_text().splitlines()[0]
    pd.read_csv(tmp_path / "gaps_other.csv").drop(columns="run").to_csv(tmp_path / "gaps_old.csv", index=False)
    with pytest.raises(SystemExit, match="written before profiles named their run"):
        gaps.main([str(tmp_path), "--no-run", "--name", "gaps_old"])
    assert gaps.main([str(tmp_path), "--figure"]) == 0 and (tmp_path / "gaps.png").stat().st_size > 0
    with pytest.raises(
        SystemExit, match="no eval config given; allowed: the overrides of make eval, --figure or --no-run"
    ):
        gaps.main([str(tmp_path)])
    # a selection that is not the rows' (its hash changed): refused, naming the samples
    monkeypatch.setattr("harness.diagnostics.kept_hash", lambda kept: "0" * 16)
    with pytest.raises(SystemExit, match=r"samples \[0, 1, 2\]: the selection is not the one the rows"):
        gaps.main([str(tmp_path), *over])


def test_gap_treatments_are_paired_against_the_original_positions_and_drawn(tmp_path):
    from harness.studies import gaps

    def line(method, opts, scores):
        return pd.DataFrame({"method": method, "method_options": json.dumps(opts), "task": "vt",
                             "sample_id": range(len(scores)), "score": scores})  # fmt: skip

    rows = pd.concat([
        line("specprefill", {"position_mode": "original"}, [0, 100, 100, 0]),
        line("specprefill", {"position_mode": "original", "max_gap": 256}, [100, 100, 100, 0]),
        line("specprefill", {"position_mode": "original", "max_gap": 16}, [100, 100, 100, 100]),
        line("specprefill", {"position_mode": "contiguous"}, [100, 100, 0, 100]),
        line("specprefill", {"position_mode": "spread"}, [0, 0, 0, 0]),
        line("specprefill", {"position_mode": "original", "gap_scale": 0.4}, [100, 0, 100, 0]),
        line("full", {}, [100, 100, 100, 100]),
    ], ignore_index=True)  # fmt: skip
    d = gaps.treatments(rows).set_index("treatment")
    # the figure's order: re-numbered, the caps from the smallest, the original positions, the others
    assert d.index.tolist() == [
        "contiguous", "max_gap=16", "max_gap=256", "gap_scale=0.4", "original", "spread", "full prefill"
    ]  # fmt: skip
    assert d.loc["gap_scale=0.4", "difference"] == 0.0 and (
        d.loc["gap_scale=0.4", "wins"],
        d.loc["gap_scale=0.4", "losses"],
    ) == (1, 1)
    assert d.loc["max_gap=16", "difference"] == 50.0 and (
        d.loc["max_gap=16", "wins"],
        d.loc["max_gap=16", "losses"],
    ) == (2, 0)
    assert d.loc["contiguous", "difference"] == 25.0 and (
        d.loc["contiguous", "wins"],
        d.loc["contiguous", "losses"],
    ) == (2, 1)
    assert d.loc["max_gap=256", "difference"] == 25.0 and d.loc["spread", "difference"] == -50.0
    assert d.loc["original", "difference"] == 0.0 and (d["n"] == 4).all()
    with pytest.raises(ValueError, match="no rows at the original positions without max_gap"):
        gaps.treatments(rows[rows["method_options"] != json.dumps({"position_mode": "original"})])


def test_the_position_cost_between_budgets_is_a_difference_of_paired_differences_by_hand():
    """Two budgets of one method on the same samples: (contiguous - original) at 512 tokens minus
    the same at 256, per sample, then averaged; runs under another option are not paired across."""

    def budget(n, scores, **extra):
        r = _rows(scores).assign(keep_rate=1.0, sample_hash=lambda d: [f"s{i}" for i in d["sample_id"]])
        opts = [{**json.loads(o), "keep_rate": 1.0, "keep_tokens": n, **extra} for o in r["method_options"]]
        return r.assign(method_options=[json.dumps(o) for o in opts])

    small = {("original", "a"): [0, 0, 100, 100], ("contiguous", "a"): [100, 100, 100, 100]}  # cost +50
    large = {("original", "a"): [100, 0, 100, 100], ("contiguous", "a"): [100, 100, 100, 0]}  # cost 0
    rows = pd.concat([budget(256, small), budget(512, large)])
    b = study.between_budgets(rows)
    got = b[b["task"] == "ALL"].iloc[0]
    # per sample, the cost at 512 minus the cost at 256: 0 - 100, 100 - 100, 0 - 0, -100 - 0; mean -50
    assert (got["budget"], got["against"], got["n"]) == ("512 tokens", "256 tokens", 4)
    assert got["cost_against"] == pytest.approx(50.0) and got["cost"] == pytest.approx(0.0)
    assert got["difference"] == pytest.approx(-50.0) and got["lo"] <= -50.0 <= got["hi"]
    assert got["same_samples"] == 1.0
    assert "| 512 tokens | 256 tokens | ALL | 4 | +50.0 | +0.0 |" in study.markdown(
        pd.DataFrame(columns=["method"]), study.differences(rows), budgets=b
    )
    # a sample only one budget ran is left out; a changed prompt shows in same_samples
    rows2 = pd.concat([budget(256, small), budget(512, {k: v[:3] for k, v in large.items()})])
    rows2.loc[(rows2["sample_id"] == 0) & rows2["method_options"].str.contains("512"), "sample_hash"] = "other"
    got2 = study.between_budgets(rows2).query("task == 'ALL'").iloc[0]
    assert got2["n"] == 3 and got2["difference"] == pytest.approx((-100 + 0 + 0) / 3)
    assert got2["same_samples"] == pytest.approx(2 / 3)
    # the larger budget under another option (chunks of 32): no pair across options
    assert study.between_budgets(pd.concat([budget(256, small), budget(512, large, chunk_size=32)])).empty
    # a selection of 256 topped up with 256 random tokens: a budget of its own, after 512 (the same size)
    fill = {("original", "a"): [100, 100, 0, 100], ("contiguous", "a"): [100, 100, 100, 100]}  # cost +25
    b3 = study.between_budgets(pd.concat([budget(256, small), budget(512, large), budget(256, fill, random_fill=256)]))
    b3 = b3[b3["task"] == "ALL"].set_index(["budget", "against"])
    assert sorted(b3.index) == [("256 tokens + 256 random", "256 tokens"), ("256 tokens + 256 random", "512 tokens"),
                                ("512 tokens", "256 tokens")]  # fmt: skip
    assert b3.loc[("256 tokens + 256 random", "256 tokens"), "difference"] == pytest.approx(25.0 - 50.0)
    assert b3.loc[("256 tokens + 256 random", "512 tokens"), "difference"] == pytest.approx(25.0 - 0.0)


@pytest.fixture
def figure_calls(monkeypatch):
    """What the figure asked matplotlib to draw: each errorbar's x, y, yerr and label, each
    axhline's y (the calls still draw)."""
    import matplotlib.axes

    calls: dict[str, list[dict]] = {"errorbar": [], "axhline": []}
    real_bar, real_h = matplotlib.axes.Axes.errorbar, matplotlib.axes.Axes.axhline

    def errorbar(ax, x, y, *a, **k):
        yerr = k.get("yerr")
        calls["errorbar"].append({"x": list(x), "y": list(y), "yerr": None if yerr is None else yerr.tolist(),
                                  "label": k.get("label")})  # fmt: skip
        return real_bar(ax, x, y, *a, **k)

    def axhline(ax, y=0, *a, **k):
        calls["axhline"].append({"y": y})
        return real_h(ax, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", errorbar)
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", axhline)
    return calls


def test_the_figure_puts_a_budget_in_tokens_at_its_measured_share_and_joins_budgets_in_one_line(tmp_path, figure_calls):
    """keep_tokens runs record keep rate 1: on the figure they sit at the share they prefilled, not at 1,
    and a method's budgets are one line per position mode, not one point each."""
    df = pd.DataFrame({
        "budget": ["256 tokens", "512 tokens", "0.1"], "keep": [1.0, 1.0, 0.1], "kept_fraction": [0.064, 0.127, 0.1004],
    })  # fmt: skip
    assert study._prefilled(df).tolist() == [0.064, 0.127, 0.1]
    arm = {"model": "m", "length": 4096, "benchmark_options": "-", "method": "specprefill", "retention": 0.9,
           "retention_lo": 0.8, "retention_hi": 1.0}  # fmt: skip
    rows = [
        {**arm, "variant": f"keep_tokens={n}", "position_mode": mode, "budget": f"{n} tokens", "keep": 1.0,
         "kept_fraction": n / 4096}
        for n in (256, 512) for mode in ("original", "contiguous")
    ]  # fmt: skip
    study.figure(pd.DataFrame(rows), tmp_path / "p.png")
    drawn = figure_calls["errorbar"]
    assert [c["label"] for c in drawn] == ["specprefill, original (its own)", "specprefill, contiguous"]
    assert [round(c["x"][1] - c["x"][0], 4) for c in drawn] == [round(256 / 4096, 4)] * 2  # two budgets on one line


def test_the_figure_draws_scores_where_the_folder_has_no_full_prefill(tmp_path, figure_calls):
    """Without full prefill every retention is missing: the figure draws each arm's score and its
    interval (and says so), not an empty panel; with retention it draws retention and the line at 1."""
    arm = {"model": "m", "length": 8192, "benchmark_options": "-", "method": "specprefill", "variant": "",
           "budget": "1024 tokens", "keep": 1.0, "kept_fraction": 0.126}  # fmt: skip
    rows = [
        {**arm, "position_mode": "original", "score": 76.0, "score_lo": 63.0, "score_hi": 87.0},
        {**arm, "position_mode": "contiguous", "score": 95.0, "score_lo": 85.0, "score_hi": 100.0},
    ]
    drawn, lines = figure_calls["errorbar"], figure_calls["axhline"]
    no_full = pd.DataFrame(rows).assign(retention=np.nan, retention_lo=np.nan, retention_hi=np.nan)
    study.figure(no_full, tmp_path / "p.png")
    assert [(c["y"], c["yerr"]) for c in drawn] == [([76.0], [[13.0], [11.0]]), ([95.0], [[10.0], [5.0]])]
    assert lines == []
    drawn.clear()
    with_full = pd.DataFrame(rows).assign(retention=[0.8, 1.0], retention_lo=[0.7, 0.9], retention_hi=[0.9, 1.1])
    study.figure(with_full, tmp_path / "q.png")
    assert [c["y"] for c in drawn] == [[0.8], [1.0]] and [c["y"] for c in lines] == [1.0]
