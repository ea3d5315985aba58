"""The look-ahead study (harness/studies/lookahead.py): its jobs differ in the look-ahead alone
(one budget, every look-ahead timed in one latency job), and its tables read real rows: a tiny
run of full prefill and SpecPrefill at two look-aheads, each paired with the smallest on the
same samples, and the TTFT of each look-ahead over the baseline's paired by iteration."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.analysis.folder import analyze
from harness.jobs import latency as lat
from harness.studies import lookahead as study

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_the_jobs_differ_in_the_look_ahead_alone(tmp_path):
    cmds = study.eval_commands(tmp_path, "qwen2.5-coder-1.5b", 2048, ["vt"], 15, 256, [1, 8])
    assert "method=full" in cmds[0] and not any("keep_tokens" in c or "lookahead" in c for c in cmds[0])
    assert [c[-1] for c in cmds[1:]] == ["lookahead=1", "lookahead=8"]
    assert all(c[:-1] == cmds[1][:-1] and "keep_tokens=256" in c for c in cmds[1:])
    # the smallest look-ahead is the job's method, the others `also` entries of the same method
    cmd = study.latency_command(tmp_path, "m", 2048, "niah_single_2", 256, 10, 16, [8, 1, 4])
    assert "lookahead=1" in cmd and "also=[{name:specprefill,lookahead:4},{name:specprefill,lookahead:8}]" in cmd
    assert not any(c.startswith("also=") for c in study.latency_command(tmp_path, "m", 2048, "t", 256, 10, 16, [2]))
    # the entries are what the latency job itself composes from the command line
    args = [a for a in cmd if "=" in a and not a.startswith(("out=", "model="))]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=tiny-random", f"out={tmp_path}", *args])
    job = lat.prepare(lat.LatencyConfig.from_hydra(cfg))
    assert [m.options()["lookahead"] for _, m in job.timed[2:]] == [1, 4, 8]
    assert {m.options()["keep_tokens"] for _, m in job.timed[2:]} == {256}
    assert shlex.join(cmd)  # one command line


def test_tables_from_a_tiny_run(tmp_path, tiny_ruler_eval):
    tiny_ruler_eval(["method=full"])
    for la in (1, 3):
        tiny_ruler_eval(["method=specprefill", "keep_tokens=200", f"lookahead={la}"])
    a = analyze(tmp_path)
    # the tiny model scores 0 everywhere: scores set by hand per look-ahead and sample, the
    # differences worked out here
    r = a.rows
    la = pd.Series([study.line_of(m, o) for m, o in zip(r["method"], r["method_options"], strict=True)], index=r.index)
    hand = {1.0: [0, 100, 0], 3.0: [100, 100, 0]}
    for look, scores in hand.items():
        for sid, v in enumerate(scores):
            r.loc[(la == look) & (r["sample_id"].astype(int) == sid), "score"] = v
    r.loc[la.isna(), "score"] = 100.0  # full prefill
    for look, kept in {1.0: [0.5, 0.5, 0.5], 3.0: [1.0, 0.5, 0.25]}.items():  # the needle's tokens prefilled
        for sid, v in enumerate(kept):
            r.loc[(la == look) & (r["sample_id"].astype(int) == sid), "needle_kept"] = v
    df, diff = study.table(a), study.differences(a)
    assert pd.isna(df["lookahead"].iloc[0]) and df["lookahead"].tolist()[1:] == [1, 3]
    assert (df["n"] == 3).all() and df["budget"].tolist()[1:] == [200, 200]
    assert df["retention"].tolist()[1:] == pytest.approx([1 / 3, 2 / 3])
    got = diff.set_index("lookahead", drop=False)
    three = got[got["lookahead"] == 3].iloc[0]
    assert three["difference"] == pytest.approx(100 / 3) and (three["wins"], three["losses"], three["n"]) == (1, 0, 3)
    full = diff[diff["lookahead"].isna()].iloc[0]
    assert full["difference"] == pytest.approx(200 / 3) and (full["wins"], full["losses"]) == (2, 0)
    # what the base prefilled, paired the same way, in points of the needle's tokens: (50 + 0 - 25) / 3
    needle = diff[diff["measure"] == "needle_kept"]
    assert len(needle) == 1 and needle["lookahead"].iloc[0] == 3 and needle["task"].iloc[0] == "niah_single_1"
    assert needle["difference"].iloc[0] == pytest.approx(25 / 3) and (
        needle["wins"].iloc[0],
        needle["losses"].iloc[0],
    ) == (1, 1)
    diff = diff[diff["measure"] == "score"]
    assert set(diff["baseline"]) == {1.0} and set(diff["task"]) == {"ALL"}  # one task: ALL is it
    tasks = study.per_task(a)
    text = study.markdown(df, diff, tasks)
    assert "| SpecPrefill, look-ahead 3 | SpecPrefill, look-ahead 1 | +33.3" in text and "| full prefill | 3 |" in text
    # per task, the lines side by side: the scores set by hand above, as means over the 3 samples
    assert "| task | n | full prefill | look-ahead 1 | look-ahead 3 |" in text
    assert "| niah_single_1 | 3 | 100.0 (1.00) | 33.3 (0.50) | 66.7 (0.58) |" in text
    text = study.markdown(df, study.differences(a), tasks)
    assert "| niah_single_1 | needle kept | SpecPrefill, look-ahead 3 | SpecPrefill, look-ahead 1 | +8.3 [" in text
    study.figure(df, tmp_path / "f.png")  # no latency job: retention against the look-ahead
    study.main(["--no-run", "--out", str(tmp_path)])
    assert (tmp_path / "lookahead.md").exists() and (tmp_path / "lookahead.png").exists()
    # an ablation in the same folder (another pooling kernel) is refused, not paired
    tiny_ruler_eval(["method=specprefill", "keep_tokens=200", "lookahead=3", "method.pool_kernel=3"])
    for read in (study.table, study.differences):
        with pytest.raises(
            ValueError, match=r"hold 2 settings of its options .* allowed: one setting per method and folder"
        ):
            read(analyze(tmp_path))


def test_the_cost_of_look_ahead_is_paired_by_iteration(tmp_path, monkeypatch):
    """Each look-ahead's TTFT over the baseline's in the same job, iteration by iteration: set
    by hand to twice the baseline's in every iteration (but one, three times), it reads 2.0."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "latency"
    cmd = study.latency_command(out, "tiny-random", 96, "t", 32, 5, 0, [1, 2])
    args = [a for a in cmd if a.startswith(("also=", "lookahead=", "keep_tokens=", "method="))]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=[
            "model=tiny-random", f"out={out}", "grid=[[1,96]]", "warmup=1", "iters=5", "decode_tokens=0",
            "method.chunk_size=16", *args])  # fmt: skip
    lat.execute(lat.prepare(lat.LatencyConfig.from_hydra(cfg)))
    a = analyze(tmp_path)
    r = a.rows
    spec = r[r["method"] == "specprefill"]
    look = spec["method_options"].map(lambda o: study.line_of("specprefill", o))
    base = spec[look == 1].set_index("iteration")["ttft_s"]
    for idx, row in spec[look == 2].iterrows():
        r.loc[idx, "ttft_s"] = base[row["iteration"]] * (3.0 if row["iteration"] == 3 else 2.0)
    c = study.cost(a)
    assert len(c) == 1 and c["lookahead"].iloc[0] == 2 and c["baseline"].iloc[0] == 1
    assert c["ttft_ratio"].iloc[0] == pytest.approx(2.0) and c["pairs"].iloc[0] == 5
    assert c["ttft_ratio_lo"].iloc[0] == pytest.approx(2.0) and c["ttft_ratio_hi"].iloc[0] > 2.0
    sp = study.speed(a)
    assert sorted(sp["lookahead"]) == [1, 2] and (sp["lat_speedup"] > 0).all()


def test_the_per_task_table_gives_each_setup_its_own_budgets():
    """One folder at two lengths, each with its own budget: a task's line per setup and budget,
    never a budget of another setup (a line of full prefill alone)."""
    rows = []
    for length, budget in ((2048, 256), (4096, 512)):
        rows.append({"model": "m", "length": length, "budget": float("nan"), "lookahead": float("nan"), "task": "vt",
                     "line_method": "full",
                     "n": 15, "score": 90.0, "needle_kept": 1.0})  # fmt: skip
        for la, score in ((1.0, 12.0), (8.0, 56.0 if length == 2048 else 78.7)):
            rows.append({"model": "m", "length": length, "budget": budget, "lookahead": la, "task": "vt", "n": 15,
                         "line_method": "specprefill",
                         "score": score, "needle_kept": 0.5})  # fmt: skip
    text = "\n".join(study._task_table(pd.DataFrame(rows), ["length", "budget"]))
    assert "| 2048 | 256 | vt | 15 | 90.0 (1.00) | 12.0 (0.50) | 56.0 (0.50) |" in text
    assert "| 4096 | 512 | vt | 15 | 90.0 (1.00) | 12.0 (0.50) | 78.7 (0.50) |" in text
    assert text.count("| vt |") == 2, text


def test_specpc_s_look_ahead_is_its_lookahead_tokens_and_every_line_is_timed_in_one_job(tmp_path):
    """``--methods specprefill specpc``: SpecPC's look-ahead is set by its own option on the
    command line and in the latency job's ``also`` entries, which the job itself composes."""
    cmds = study.eval_commands(tmp_path, "m", 2048, ["vt"], 15, 256, [1, 8], ("specprefill", "specpc"))
    assert [c[-2:] for c in cmds[1:]] == [
        ["method=specprefill", "keep_tokens=256", "lookahead=1"][1:],
        ["keep_tokens=256", "lookahead=8"],
        ["keep_tokens=256", "method.lookahead_tokens=1"],
        ["keep_tokens=256", "method.lookahead_tokens=8"],
    ]
    assert [c for c in cmds[3] if c.startswith("method=")] == ["method=specpc"]
    cmd = study.latency_command(tmp_path, "m", 2048, "niah_single_2", 256, 10, 16, [8, 1], ("specprefill", "specpc"))
    also = "also=[{name:specprefill,lookahead:8},{name:specpc,lookahead_tokens:1},{name:specpc,lookahead_tokens:8}]"
    assert also in cmd and "method=specprefill" in cmd and "lookahead=1" in cmd
    args = [a for a in cmd if "=" in a and not a.startswith(("out=", "model="))]
    tiny = [a.replace("{name:specpc,", "{name:specpc,starting_layer_index:0,") for a in args]  # a 1-layer draft
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=tiny-random", f"out={tmp_path}", *tiny])
    job = lat.prepare(lat.LatencyConfig.from_hydra(cfg))
    got = [(m.name, study.line_of(m.name, m.options()), m.options()["keep_tokens"]) for _, m in job.timed[2:]]
    assert got == [("specprefill", 1, 256), ("specprefill", 8, 256), ("specpc", 1, 256), ("specpc", 8, 256)]
    # SpecKV-PC's `lookahead_tokens: null` is generate's default length, 20 tokens
    assert study.line_of("specpc", {"lookahead_tokens": None}) == 20 and study.line_of("speckv", {}) is None


def test_two_methods_each_paired_with_its_own_baseline_and_with_specprefill(tmp_path, tiny_ruler_eval):
    """A folder with SpecPrefill and SpecPC at look-aheads 1 and 3: each method's look-ahead 3
    against its own look-ahead 1, full prefill against each baseline, and SpecPC against
    SpecPrefill at the same look-ahead; scores set by hand, differences worked out here."""
    tiny_ruler_eval(["method=full"])
    for la in (1, 3):
        tiny_ruler_eval(["method=specprefill", "keep_tokens=200", f"lookahead={la}"])
        tiny_ruler_eval(["method=specpc", "keep_tokens=200", "method.starting_layer_index=0", "method.window_size=8",
                         f"method.lookahead_tokens={la}"])  # fmt: skip  # the tiny model's draft: 1 layer
    a = analyze(tmp_path)
    r = a.rows
    hand = {("specprefill", 1.0): [0, 100, 0], ("specprefill", 3.0): [100, 100, 0],
            ("specpc", 1.0): [0, 0, 0], ("specpc", 3.0): [100, 100, 100]}  # fmt: skip
    for (m, look), scores in hand.items():
        la = r["method_options"].map(lambda o, m=m: study.line_of(m, o))
        for sid, v in enumerate(scores):
            r.loc[(r["method"] == m) & (la == look) & (r["sample_id"].astype(int) == sid), "score"] = v
    r.loc[r["method"] == "full", "score"] = 100.0
    df, diff = study.table(a), study.differences(a)
    assert [(m, x) for m, x in zip(df["line_method"], df["lookahead"].fillna(0), strict=True)] == [
        ("full", 0), ("specprefill", 1), ("specprefill", 3), ("specpc", 1), ("specpc", 3)]  # fmt: skip
    text = study.markdown(df, diff, study.per_task(a))
    for line in ("| SpecPrefill, look-ahead 3 | SpecPrefill, look-ahead 1 | +33.3 [",
                 "| SpecPC, look-ahead 3 | SpecPC, look-ahead 1 | +100.0 [",
                 "| full prefill | SpecPC, look-ahead 1 | +100.0 [",
                 "| full prefill | SpecPrefill, look-ahead 1 | +66.7 [",
                 "| SpecPC, look-ahead 1 | SpecPrefill, look-ahead 1 | -33.3 [",
                 "| SpecPC, look-ahead 3 | SpecPrefill, look-ahead 3 | +33.3 ["):  # fmt: skip
        assert line in text, (line, text)
    pc = diff[
        (diff["line_method"] == "specpc") & (diff["baseline_method"] == "specprefill") & (diff["measure"] == "score")
    ]
    assert [(x.lookahead, x.wins, x.losses) for x in pc.itertuples()] == [(1, 0, 1), (3, 1, 0)]
    head = "| task | n | full prefill | SpecPrefill, look-ahead 1 | SpecPrefill, look-ahead 3 | SpecPC, look-ahead 1 | "
    assert head + "SpecPC, look-ahead 3 |" in text
    row = r"\| niah_single_1 \| 3 \| 100\.0 \(1\.00\) \| 33\.3 \(\S+\) \| 66\.7 \(\S+\) \| 0\.0 \(\S+\) \| 100\.0 \(\S+\) \|"
    assert re.search(row, text), text
    study.figure(df, tmp_path / "f.png")
    # an ablation of one method is refused, naming it
    tiny_ruler_eval(["method=specpc", "keep_tokens=200", "method.starting_layer_index=0", "method.window_size=8",
                     "method.lookahead_tokens=3", "method.kernel_size=3"])  # fmt: skip
    with pytest.raises(ValueError, match=r"lookahead: SpecPC rows of .* hold 2 settings"):
        study.table(analyze(tmp_path))
