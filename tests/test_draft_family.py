"""The draft-family study (harness/studies/draft_family.py): its jobs ask what the README says
(one budget for every method, the cascades' split), and its tables read real rows: a tiny
run of full prefill, SpecPrefill and both cascades, lines told apart by their parts, each
method paired with SpecPrefill on the same samples."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.analysis.folder import analyze
from harness.studies import draft_family as study


def test_every_method_runs_at_one_budget_and_the_cascades_halve_it(tmp_path):
    cmds = study.eval_commands(tmp_path, "qwen2.5-coder-1.5b", 2048, ["qa_1"], 10, 512)
    assert len(cmds) == len(study.METHODS) and "method=full" in cmds[0] and not any("keep_tokens" in c for c in cmds[0])
    assert all("keep_tokens=512" in c for c in cmds[1:])
    cascades = [c for c in cmds if "method.then_keep_rate=0.5" in c]
    assert len(cascades) == 2 and any("method=speckvpc" in c for c in cascades)
    lat = study.latency_command(tmp_path, "m", 2048, "qa_1", 512, 10, 16)
    assert "also=[specpc,speckv]" in lat and "prompts=benchmark" in lat and "keep_tokens=512" in lat
    assert study.line_of("compose", '{"first": "specpc", "then": "speckv"}') == "speckvpc"
    assert study.line_of("compose", {"first": "specprefill", "then": "keydiff"}) == "specprefill+keydiff"


def test_tables_from_a_tiny_run(tmp_path, tiny_ruler_eval):
    tiny_ruler_eval(["method=full"])
    tiny_ruler_eval(["method=specprefill", "keep_tokens=200"])
    tiny_ruler_eval(["method=speckvpc", "keep_tokens=200", "method.then_keep_rate=0.5",
                     "method.first_options.starting_layer_index=0"])  # fmt: skip
    tiny_ruler_eval(["method=compose", "method.first=specprefill", "method.then=keydiff", "keep_tokens=200",
                     "method.then_keep_rate=0.5"])  # fmt: skip
    a = analyze(tmp_path)
    df, diff = study.table(a), study.differences(a)
    assert df["line"].tolist() == ["full", "specprefill", "speckvpc", "specprefill+keydiff"]
    assert (df["n"] == 3).all()
    held = df.set_index("line")["kv_fraction"]
    assert held["speckvpc"] < held["specprefill"] and held["specprefill+keydiff"] < held["specprefill"]
    assert set(diff["line"]) == {"full", "speckvpc", "specprefill+keydiff"} and (diff["n"] == 3).all()
    text = study.markdown(df, diff)
    assert "SpecKV-PC: SpecPC N tokens, SpecKV N/2 entries" in text and "| 3 |" in text
    study.figure(df, tmp_path / "f.png")
    # the study reads a folder without running anything
    study.main(["--no-run", "--out", str(tmp_path)])
    assert pd.read_csv(tmp_path / "draft_family.csv")["line"].tolist() == df["line"].tolist()
    assert (tmp_path / "draft_family.md").exists() and (tmp_path / "draft_family.png").exists()


def test_one_folder_with_two_budgets_keeps_them_apart(tmp_path, tiny_ruler_eval):
    """The study run at two budgets into one --out (or an experiment's keep_tokens sweep): each
    budget's lines and pairs are its own, full prefill pairs with both, and the tables say
    which budget a line is."""
    tiny_ruler_eval(["method=full"])
    for n in (100, 200):
        tiny_ruler_eval(["method=specprefill", f"keep_tokens={n}"])
        tiny_ruler_eval(["method=speckvpc", f"keep_tokens={n}", "method.then_keep_rate=0.5",
                         "method.first_options.starting_layer_index=0"])  # fmt: skip
    a = analyze(tmp_path)
    df, diff = study.table(a), study.differences(a)
    assert df["line"].tolist() == ["full", "specprefill", "speckvpc", "specprefill", "speckvpc"]
    assert df["budget"].tolist()[1:] == [100, 100, 200, 200] and pd.isna(df["budget"].iloc[0])
    held = df.set_index(["line", "budget"])["kept_fraction"]
    assert held[("specprefill", 100)] < held[("specprefill", 200)]
    # each difference pairs the budget's own rows. The tiny model scores 0 everywhere, so the
    # scores are set by hand (per budget and method, by sample) and the differences worked out here
    hand = {("specprefill", 100): [0, 0, 0], ("compose", 100): [100, 0, 100],
            ("specprefill", 200): [100, 100, 100], ("compose", 200): [100, 100, 0]}  # fmt: skip
    r = a.rows
    budget = pd.Series([study.budget_of(o) for o in r["method_options"]], index=r.index)
    for (method, n), scores in hand.items():
        for sid, v in enumerate(scores):
            r.loc[(r["method"] == method) & (budget == n) & (r["sample_id"].astype(int) == sid), "score"] = v
    diff = study.differences(a)
    for n, want in ((100, 200 / 3), (200, -100 / 3)):
        got = diff[(diff["budget"] == n) & (diff["line"] == "speckvpc") & (diff["task"] == "ALL")]
        assert len(got) == 1 and got["difference"].iloc[0] == pytest.approx(want) and got["n"].iloc[0] == 3
        assert (got["wins"].iloc[0], got["losses"].iloc[0]) == ((2, 0) if n == 100 else (0, 1))
    assert len(diff[(diff["line"] == "full") & (diff["task"] == "ALL")]) == 2  # full against each budget
    text = study.markdown(df, diff)
    assert "| budget N | method |" in text and "| 100 | SpecPrefill: N prompt tokens |" in text
    assert "| - | full prefill |" in text
    study.figure(df, tmp_path / "f.png")  # one point per budget and method, each labelled with its budget
    # an ablation run into the same folder (another look-ahead at one budget) is refused, not mixed in
    tiny_ruler_eval(["method=specprefill", "keep_tokens=100", "lookahead=2"])
    for read in (study.table, study.differences):
        with pytest.raises(ValueError, match=r"specprefill at budget 100 .* 2 variants .*allowed: one variant"):
            read(analyze(tmp_path))
