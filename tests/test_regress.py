"""The regression gate on hand-made results folders: a copy passes, real degradations fail
naming the method, noise passes, folders that cannot be compared exit 2."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.parquet import read_parquet
from harness.regress.__main__ import main
from harness.regress.compare import compare
from harness.regress.suite import MARKER
from harness.regress.verdict import INCOMPARABLE, NO_BASELINE, OK, REFUSED, REGRESSED, ROOT
from harness.store import RunStore, record

TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "qa_1")


def _eval_rows(
    method: str,
    keep: float | None,
    run: str,
    scores: dict[str, list[float]],
    ttft: float,
    speculator: str = "s:8",
    load: dict | None = None,
) -> list:
    opts = json.dumps({"keep_rate": keep} if keep is not None else {})
    return [
        record(
            "eval",
            run_id=run,
            row_key=f"{t}/{i}",
            unit=f"{t}/{i}",
            timestamp=1.0,
            status="ok",
            model="m",
            benchmark="ruler",
            length=2048,
            task=t,
            sample_id=i,
            method=method,
            method_options=opts,
            keep_rate=keep,
            reference_method="full",
            speculator=speculator,
            score=s,
            ttft_s=ttft * (1 + 0.1 * (i % 3)),
            hardware="cpu",
            references=["x"],
            **(load or {}),
        )
        for t, ss in scores.items()
        for i, s in enumerate(ss)
    ]


def _latency_rows(run: str, full_s: list[float], spec_s: list[float], aa: float = 1.0, order: bool = True) -> list:
    """A latency run under the paired protocol: one warm-up, then 10 timed pairs (the given
    times repeated), the reference's A/A copy at ``aa`` times its speed, the order turned
    over every iteration (``order=False``: rows of the older protocol, no order, no A/A)."""
    n = 10
    full = [9.0, *(full_s * n)[:n]]
    methods = [("full", None, full), ("specprefill", 0.3, [9.0, *(spec_s * n)[:n]])]
    if order:  # the A/A check: the reference's times, a hair apart, over ``aa``
        methods.append(("aa_check", None, [t * (1 + (0.004 if i % 2 else -0.004)) / aa for i, t in enumerate(full)]))
    rows = []
    for method, keep, times in methods:
        opts = json.dumps({"keep_rate": keep} if keep is not None else {})
        rows += [
            record(
                "latency",
                run_id=run,
                row_key=f"b1-n2048/{i}/{method}",
                unit="b1-n2048",
                timestamp=1.0,
                status="ok",
                model="m",
                backend="transformers",
                prompt_source="random",
                batch=1,
                length=2048,
                iteration=i,
                warmup=i == 0,
                method=method,
                method_options=opts,
                keep_rate=keep,
                reference_method="full",
                ttft_s=t,
                ideal_speedup=1.0 if keep is None else 4.5,
                order=(i + (method == "full")) % 2 if order else None,
            )
            for i, t in enumerate(times)
        ]
    return rows


def _folder(
    root, spec_scores=None, spec_ttft=1.0, lat_spec=None, speculator="s:8", latency=True, spec_load=None, **lat_kw
):
    rng = np.random.default_rng(0)
    full = {t: [100.0 if x < 0.8 else 0.0 for x in rng.random(10)] for t in TASKS}
    spec = spec_scores or {t: [100.0 if x < 0.6 else 0.0 for x in np.random.default_rng(1).random(10)] for t in TASKS}
    lat = _latency_rows("lat", [4.0, 4.1, 3.9, 4.0], lat_spec or [1.0, 1.05, 0.95, 1.0], **lat_kw)
    for name, rows in (
        ("full", _eval_rows("full", None, "full", full, 4.0)),
        ("spec", _eval_rows("specprefill", 0.3, "spec", spec, spec_ttft, speculator, spec_load)),
        *((("lat", lat),) if latency else ()),
    ):
        store = RunStore(root / name)
        store.write_config({"name": name})
        store.append(rows)
    return root


@pytest.fixture
def base(tmp_path):
    return _folder(tmp_path / "base")


def _spec_scores(base_dir):
    rows = RunStore(base_dir / "spec").read()
    return {t: list(g.sort_values("sample_id")["score"]) for t, g in rows.groupby("task")}


def test_a_copy_passes(base, tmp_path):
    shutil.copytree(base, tmp_path / "cand")
    code, rows, text = compare(base, tmp_path / "cand")
    assert code == OK and "no regression" in text and "In one folder only" not in text
    assert any(r.point.endswith("full keep=1 ALL") for r in rows)  # the reference's own scores too
    assert {r.verdict for r in rows} == {"same"} and any(
        r.point.endswith("specprefill keep=0.3 speculator=s:8 ALL") for r in rows
    )
    assert any(r.kind == "speed" and "latency 1x2048" in r.point for r in rows)


def test_half_of_the_correct_answers_zeroed_regresses_naming_specprefill(base, tmp_path):
    scores = _spec_scores(base)
    for t in scores:
        correct = [i for i, s in enumerate(scores[t]) if s > 0]
        for i in correct[: len(correct) // 2]:
            scores[t][i] = 0.0
    cand = _folder(tmp_path / "cand", spec_scores=scores)
    code, rows, text = compare(base, cand)
    assert code == REGRESSED and "REGRESSED" in text
    bad = [r for r in rows if r.verdict == "regressed"]
    assert bad and all("specprefill" in r.point for r in bad) and any(r.point.endswith("ALL") for r in bad)


def test_a_ttft_two_and_a_half_times_longer_regresses_the_speedup(base, tmp_path):
    cand = _folder(tmp_path / "cand", spec_ttft=2.5, lat_spec=[2.5, 2.6, 2.4, 2.5])
    code, rows, _ = compare(base, cand)
    bad = [r for r in rows if r.verdict == "regressed"]
    assert code == REGRESSED and {r.kind for r in bad} == {"speed"}
    assert len(bad) == 1 and "specprefill" in bad[0].point and "latency 1x2048" in bad[0].point
    code, rows, _ = compare(base, cand, eval_speed=True)  # the eval TTFT ratio too, when asked
    bad = sorted(r.point for r in rows if r.verdict == "regressed")
    assert code == REGRESSED and len(bad) == 2
    assert bad[0].endswith("latency 1x2048") and bad[1].endswith("ALL TTFT (between runs)")


def test_a_speedup_above_its_ideal_is_not_comparable_never_passed(base, tmp_path):
    """A planted anomaly: the candidate's SpecPrefill at 5.7x against a FLOP ideal of 4.5x
    (more than 15 % over) is "not comparable" (exit 2), not an improvement that passes."""
    cand = _folder(tmp_path / "cand", lat_spec=[0.7, 0.72, 0.68, 0.7])
    code, rows, text = compare(base, cand)
    (sp,) = [r for r in rows if r.kind == "speed"]
    assert code == INCOMPARABLE and sp.verdict == "not comparable" and sp.candidate > 4.5 * 1.15
    assert "NOT COMPARABLE (1)" in text and "anomaly" in text and "above its FLOP ideal 4.50x" in text
    assert "no regression" not in text
    # the same candidate within its ideal passes
    assert compare(base, _folder(tmp_path / "ok", lat_spec=[0.95, 1.0, 1.05, 1.0]))[0] == OK


def test_a_failed_aa_check_refuses_the_candidates_speed(base, tmp_path):
    cand = _folder(tmp_path / "cand", aa=1.12)  # the reference timed against itself reads 1.12x
    code, rows, text = compare(base, cand)
    assert code == INCOMPARABLE and "A/A check FAILED in the candidate" in text
    assert [r.verdict for r in rows if r.kind == "speed"] == ["not comparable"]
    assert "cannot compare speed" in text.splitlines()[1]


def test_without_latency_rows_the_first_lines_say_speed_was_not_compared(tmp_path):
    base = _folder(tmp_path / "base", latency=False)
    cand = _folder(tmp_path / "cand", latency=False, spec_ttft=2.0)  # eval TTFT doubled: not a speed claim
    code, rows, text = compare(base, cand)
    assert code == OK and {r.kind for r in rows} == {"quality"}
    head = text.splitlines()[:2]
    assert head[1].startswith("Speed NOT compared: no latency rows in the baseline and candidate"), head
    assert "speed not compared" in text.splitlines()[-1] and "speed from the latency rows" not in text
    code, _, text = compare(tmp_path / "base", _folder(tmp_path / "c2"))  # only the candidate has them
    assert "Speed NOT compared: no latency rows in the baseline" in text.splitlines()[1]


def test_a_baseline_of_the_older_protocol_gives_no_speed_baseline(tmp_path):
    base = _folder(tmp_path / "base", order=False)  # the reference always first, no A/A check
    code, rows, text = compare(base, _folder(tmp_path / "cand"))
    assert code == NO_BASELINE and not [r for r in rows if r.kind == "speed"]
    assert "predate the paired, order-balanced protocol" in text.splitlines()[1]


def test_speed_is_gated_on_the_latency_rows_only(base, tmp_path):
    """The eval runs' TTFTs are timed minutes apart (they drift ~15 % on a shared CPU): an
    eval TTFT 2.5 times longer with the interleaved latency rows unchanged passes, and is
    not even compared unless asked (--eval-speed)."""
    cand = _folder(tmp_path / "cand", spec_ttft=2.5)
    code, rows, text = compare(base, cand)
    assert code == OK and [r.point.split()[-1] for r in rows if r.kind == "speed"] == ["1x2048"]
    assert "speed from the latency rows" in text
    assert compare(base, cand, eval_speed=True)[0] == REGRESSED


def test_an_eval_speedup_timed_on_a_loaded_machine_says_so(base, tmp_path):
    """Eval rows record the machine's load; with --eval-speed, a between-runs speedup whose
    candidate rows shared the machine is compared and named loaded (read with care)."""
    cand = _folder(tmp_path / "cand", spec_load={"foreign_cpu": 0.4, "loadavg_1m": 3.5, "cpus": 2})
    _, _, text = compare(base, cand, eval_speed=True)
    assert "Loaded machine while timing m specprefill keep=0.3" in text and "ALL TTFT (between runs)" in text
    _, _, quiet = compare(base, _folder(tmp_path / "quiet"), eval_speed=True)
    assert "Loaded machine" not in quiet


def test_one_flipped_sample_is_noise(base, tmp_path):
    scores = _spec_scores(base)
    i = scores["qa_1"].index(100.0)
    scores["qa_1"][i] = 0.0
    code, rows, _ = compare(base, _folder(tmp_path / "cand", spec_scores=scores))
    assert code == OK
    qa = next(r for r in rows if r.point.endswith("specprefill keep=0.3 speculator=s:8 qa_1"))
    assert qa.delta.value == pytest.approx(-10.0) and qa.delta.hi >= 0 and qa.verdict == "same"


def test_improvements_are_reported_both_ways(base, tmp_path):
    scores = {t: [100.0] * 10 for t in TASKS}
    code, rows, text = compare(base, _folder(tmp_path / "cand", spec_scores=scores))
    better = [r for r in rows if r.verdict == "improved"]
    assert code == OK and better and f"Improved ({len(better)}):" in text
    assert all(f"  quality specprefill keep=0.3 {r.point.split()[-1]} " in text for r in better)


def test_a_removed_point_is_listed_and_fails_with_require_all(base, tmp_path):
    cand = tmp_path / "cand"
    shutil.copytree(base, cand)
    shutil.rmtree(cand / "spec")
    code, _, text = compare(base, cand)
    assert code == OK and "In one folder only" in text and "specprefill" in text.split("In one folder only")[1]
    assert compare(base, cand, require_all=True)[0] == INCOMPARABLE


def test_another_speculator_is_another_point_never_compared(base, tmp_path):
    """A deeper speculator scores better and runs slower: compared with the baseline's it would
    read as a quality gain and a speed regression. It is a point of its own, in one folder only."""
    scores = {t: [100.0] * 10 for t in TASKS}
    cand = _folder(tmp_path / "cand", spec_scores=scores, spec_ttft=3.0, speculator="s:20")
    code, rows, text = compare(base, cand, skip_speed=False)
    assert code == OK and not [
        r for r in rows if r.kind == "quality" and r.point.startswith("m ruler-2048 specprefill")
    ]
    only = text.split("In one folder only")[1]
    assert "specprefill keep=0.3 speculator=s:20" in only and "specprefill keep=0.3 speculator=s:8" in only
    assert compare(base, cand, require_all=True)[0] == INCOMPARABLE


def test_folders_that_cannot_be_compared_exit_2(base, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(base), "--candidate", str(tmp_path / "empty")])
    assert e.value.code == INCOMPARABLE
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(base), "--candidate", str(base)])
    assert e.value.code == OK


def _candidate(tmp_path, name="cand"):
    """A candidate as ``run`` leaves it: the gate's marker, the rows, the suite's record."""
    from harness.regress.suite import claim_candidate, write_suite_record

    folder = tmp_path / name
    claim_candidate(folder)
    _folder(folder)
    suite = tmp_path / "suite.yaml"
    if not suite.exists():
        suite.write_text("commands:\n  - module: regress\n    args: ['--help']\n")
    write_suite_record(folder, suite)
    return folder


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_accept_promotes_the_candidate_with_its_reason(base, tmp_path, monkeypatch, capsys):
    from harness.regress import suite as regress

    monkeypatch.setattr(regress, "hardware_class", lambda: "cpu-test")
    cand = _candidate(tmp_path)
    regress.accept(cand, tmp_path / "baselines", "first baseline")
    stored = tmp_path / "baselines" / "cpu-test"
    assert "first baseline" in (stored / "ACCEPTED.md").read_text()
    assert compare(stored / "rows", base)[0] == OK
    assert "prediction" not in read_parquet(next((stored / "rows").rglob("rows.parquet"))).columns
    assert "replacing no earlier baseline" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give a reason"):
        regress.accept(cand, tmp_path / "baselines", " ")
    regress.accept(cand, tmp_path / "baselines", "again")  # a second accept says what it replaces
    assert "replacing the earlier baseline (3 run folder(s)" in capsys.readouterr().out
    assert sorted(p.name for p in stored.iterdir()) == ["ACCEPTED.md", "rows"]  # no rows.previous left behind


def test_accept_refuses_a_folder_the_suite_did_not_produce_and_leaves_the_baseline(base, tmp_path, monkeypatch):
    """``make regress-accept candidate=<typo or any folder>`` must not replace the baseline:
    no marker, an unfinished suite, a changed suite, a folder changed since: each refused in
    one line, the committed baseline byte for byte as it was."""
    from harness.regress import suite as regress

    monkeypatch.setattr(regress, "hardware_class", lambda: "cpu-test")
    baselines = tmp_path / "baselines"
    regress.accept(_candidate(tmp_path, "first"), baselines, "first baseline")
    before = _tree(baselines)

    def refused(folder, why):
        with pytest.raises(SystemExit) as e:
            main(["accept", "--candidate", str(folder), "--baselines", str(baselines), "--reason", "x"])
        msg = str(e.value.code)
        assert msg.startswith("regress accept: ") and why in msg and "\n" not in msg, msg
        assert _tree(baselines) == before

    refused(tmp_path / "typo", "does not exist")
    refused(base, "not a folder the gate made")  # rows, but not the gate's
    unfinished = _candidate(tmp_path, "unfinished")
    (unfinished / regress.SUITE_RECORD).unlink()
    refused(unfinished, "the suite did not finish")
    changed = _candidate(tmp_path, "changed")
    (tmp_path / "suite.yaml").write_text("commands: []\n")
    refused(changed, "a suite that has changed since")
    (tmp_path / "suite.yaml").write_text("commands:\n  - module: regress\n    args: ['--help']\n")
    grown = _candidate(tmp_path, "grown")
    shutil.copytree(base / "spec", grown / "someone_elses")
    refused(grown, "added ['someone_elses']")
    damaged = _candidate(tmp_path, "damaged")
    (damaged / regress.SUITE_RECORD).write_text("{")
    refused(damaged, "is damaged")


def test_run_records_a_finished_suite_only(tmp_path):
    """The record ``accept`` needs is written after the last suite command succeeds, not
    after a failed one."""
    from harness.regress.suite import SUITE_RECORD, run_suite

    (tmp_path / "baselines").mkdir()
    log = (tmp_path / "log.txt").open("w")
    ok = run_suite(tmp_path / "ok", tmp_path / "baselines", 2.0, 0.15, Path(_harmless_suite(tmp_path)), log=log)
    assert ok.code == NO_BASELINE and (tmp_path / "ok" / SUITE_RECORD).is_file()
    failing = tmp_path / "failing.yaml"
    failing.write_text("commands:\n  - module: regress\n    args: ['--no-such-option']\n")
    bad = run_suite(tmp_path / "bad", tmp_path / "baselines", 2.0, 0.15, failing, log=log)
    assert bad.code == INCOMPARABLE and not (tmp_path / "bad" / SUITE_RECORD).exists()


def test_an_empty_baseline_folder_is_refused_before_the_suite_runs(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    cand = tmp_path / "cand"
    with pytest.raises(SystemExit) as e:
        main(["run", "--baseline", str(empty), "--candidate", str(cand), "--suite", _harmless_suite(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == REFUSED and f"baseline folder {empty} holds no rows" in err and not cand.exists()


def test_compare_without_the_subcommand_as_the_issue_spells_it(base, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--baseline", str(base), "--candidate", str(base)])
    assert e.value.code == OK and "no regression" in capsys.readouterr().out


def test_history_records_retention_and_plots(base, tmp_path):
    from harness.regress.history import append_history

    cand = _folder(tmp_path / "cand", spec_scores={t: [100.0] * 10 for t in TASKS})
    _, rows, _ = compare(base, cand)
    history = tmp_path / "history.csv"
    append_history(history, rows, "cpu-test")
    append_history(history, rows, "cpu-test")
    h = pd.read_csv(history)
    assert len(h) == 2 * len(rows) and history.with_suffix(".png").stat().st_size > 10_000
    spec_all = h[h["point"].str.endswith("specprefill keep=0.3 speculator=s:8 ALL")].iloc[0]
    # every candidate SpecPrefill answer right; full prefill right where _folder's draw was < 0.8
    rng = np.random.default_rng(0)
    full_mean = np.mean([100.0 if x < 0.8 else 0.0 for _ in TASKS for x in rng.random(10)])
    assert spec_all["candidate"] == pytest.approx(100.0)
    assert spec_all["retention"] == pytest.approx(100.0 / full_mean)
    assert spec_all["retention_lo"] <= spec_all["retention"] <= spec_all["retention_hi"]
    assert h[h["point"].str.contains(" full ")]["retention"].isna().all()


@pytest.mark.parametrize("suite", ["regress.yaml", "regress-gpu.yaml"])
def test_every_suite_command_plans(suite, tmp_path):
    """The CPU suite and the GPU runner's suite are valid commands: each dry-runs (plans,
    loads nothing) with exit 0."""
    from harness.regress.suite import suite_commands

    cmds = suite_commands(tmp_path / "cand", ROOT / "conf" / suite)
    assert [c[2] for c in cmds] == ["harness.jobs.eval", "harness.jobs.latency"]
    for cmd in cmds:
        r = subprocess.run([*cmd, "dry_run=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "specprefill" in r.stdout and str(tmp_path / "cand") in r.stdout


def test_a_missing_suite_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--suite", str(tmp_path / "nope.yaml"), "--candidate", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert e.value.code == REFUSED and re.fullmatch(r"regress: suite file .*nope.yaml does not exist.*\n", err)


# --------------------------------------------------------------------------- the verdict


def _regressed_folder(base, tmp_path):
    """A candidate whose SpecPrefill lost half its correct answers (quality regressions)."""
    scores = _spec_scores(base)
    for t in scores:
        correct = [i for i, s in enumerate(scores[t]) if s > 0]
        for i in correct[: len(correct) // 2]:
            scores[t][i] = 0.0
    return _folder(tmp_path / "cand", spec_scores=scores)


def test_the_text_verdict_is_one_screen_of_short_labels(base, tmp_path):
    """No method-option JSON: each point by what tells it apart (method, keep, task or grid
    point), what all share said once, the unchanged points folded into one line."""
    code, rows, text = compare(base, _regressed_folder(base, tmp_path))
    lines = text.splitlines()
    assert code == REGRESSED and "{" not in text and max(map(len, lines)) <= 160 and len(lines) <= 15
    assert "Shared by the points: m, ruler-2048, transformers, random prompts, speculator=s:8" in lines
    bad = [r for r in rows if r.verdict == "regressed"]
    assert f"REGRESSED ({len(bad)}):" in lines
    listed = [ln.split()[1:4] for ln in lines if ln.startswith("  quality")]
    assert len(listed) == len(bad) and all(x[:2] == ["specprefill", "keep=0.3"] for x in listed)
    assert f"{len(rows) - len(bad)} points unchanged" in lines
    assert lines[-1].startswith("REGRESSED") and lines[-1].endswith("exit 1")
    everything = main_out(["compare", "--baseline", str(base), "--candidate", str(tmp_path / "cand"), "--all"])
    assert sum(ln.startswith(("  quality", "  speed")) for ln in everything.splitlines()) == len(rows)


def main_out(argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(argv)
    return buf.getvalue()


def test_short_labels_show_only_what_differs():
    from harness.regress.verdict import short_labels

    opts = {"pool_kernel": 13, "chunk_size": 32}
    pts = [
        {"model": "m", "benchmark": "ruler-2048", "method": "specprefill", "keep": "keep=0.1",
         "speculator": "speculator=s:8", "options": json.dumps(opts), "where": "ALL"},
        {"model": "m", "benchmark": "ruler-2048", "method": "specprefill", "keep": "keep=0.1",
         "speculator": "speculator=s:8", "options": json.dumps(opts | {"pool_kernel": 5}), "where": "ALL"},
        {"model": "m", "benchmark": "ruler-4096", "method": "full", "keep": "", "speculator": "", "options": "",
         "where": "ALL"},
    ]  # fmt: skip
    labels, common = short_labels(pts)
    assert labels == [
        "ruler-2048 specprefill keep=0.1 pool_kernel=13 ALL",
        "ruler-2048 specprefill keep=0.1 pool_kernel=5 ALL",
        "ruler-4096 full ALL",
    ]
    assert common == ["m", "speculator=s:8"]


def test_json_verdict_parses_with_the_exit_status(base, tmp_path, capsys):
    cand = _regressed_folder(base, tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(base), "--candidate", str(cand), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert e.value.code == doc["exit_code"] == REGRESSED and doc["verdict"] == "regressed"
    assert set(doc["exit_codes"]) == {"0", "1", "2", "3", "4"}
    bad = [p for p in doc["points"] if p["verdict"] == "regressed"]
    assert doc["counts"]["regressed"] == len(bad) > 0 and all(p["label"].startswith("specprefill") for p in bad)
    assert doc["counts"]["same"] + len(bad) + doc["counts"]["improved"] == len(doc["points"])


def test_junit_verdict_is_a_testcase_per_point_failing_the_regressions(base, tmp_path, capsys):
    cand = _regressed_folder(base, tmp_path)
    _, rows, _ = compare(base, cand)
    with pytest.raises(SystemExit):
        main(["compare", "--baseline", str(base), "--candidate", str(cand), "--format", "junit"])
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert len(cases) == int(suite.get("tests", -1)) == len(rows)
    assert len(failed) == int(suite.get("failures", -1)) == sum(r.verdict == "regressed" for r in rows) > 0
    assert all(str(n).startswith("specprefill keep=0.3") for n in failed)
    # a gate that could not compare is one erroring testcase
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(base), "--candidate", str(tmp_path / "empty"), "--format", "junit"])
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert e.value.code == INCOMPARABLE and suite is not None and suite.get("errors") == "1"


def test_markdown_verdict_fits_a_step_summary(base, tmp_path, capsys):
    """The default suite's committed baseline against itself, and against a candidate with
    every point regressed, each in at most 25 lines; --summary appends the same markdown."""
    from harness.analysis.stats import Estimate
    from harness.regress.formats import render_markdown
    from harness.regress.verdict import Verdict

    rows_dir = ROOT / "results" / "baseline" / "cpu-avx2" / "rows"
    summary = tmp_path / "summary.md"
    argv = ["compare", "--baseline", str(rows_dir), "--candidate", str(rows_dir), "--format", "markdown"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--summary", str(summary)])
    out = capsys.readouterr().out
    assert e.value.code == OK and len(out.splitlines()) <= 25 and out.startswith("### ✅ Regression gate: pass")
    assert summary.read_text() == out and "17 points unchanged" in out and "{" not in out
    _, rows, _ = compare(rows_dir, rows_dir)
    worse = [dataclasses.replace(r, delta=Estimate(-50.0, -60.0, -40.0, 8), verdict="regressed") for r in rows]
    md = render_markdown(Verdict(REGRESSED, rows=worse, baseline="b", candidate="c"))
    assert len(md.splitlines()) <= 25 and "❌ regressed" in md and f"and {len(worse) - 10} more" in md


def _harmless_suite(tmp_path) -> str:
    """A suite whose one command does nothing (a broken guard must not run the real one)."""
    suite = tmp_path / "suite.yaml"
    suite.write_text("commands:\n  - module: regress\n    args: ['--help']\n")
    return str(suite)


def test_the_gate_removes_only_candidate_folders_it_made(tmp_path, capsys):
    from harness.regress.suite import claim_candidate

    mine = tmp_path / "mine"
    claim_candidate(mine)  # made: carries the marker
    (mine / "old.txt").write_text("x")
    claim_candidate(mine)  # its own folder: removed and made again
    assert (mine / MARKER).is_file() and not (mine / "old.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    claim_candidate(empty)
    assert (empty / MARKER).is_file()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    (tmp_path / "baselines").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["run", "--candidate", str(theirs), "--baselines", str(tmp_path / "baselines"),
              "--suite", _harmless_suite(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == REFUSED and (theirs / "thesis.tex").read_text() == "years of work"
    assert len(err.splitlines()) == 1 and str(theirs) in err and "left alone" in err


def test_a_missing_baseline_folder_is_refused_in_one_line(base, tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(missing), "--candidate", str(base)])
    err = capsys.readouterr().err
    assert e.value.code == REFUSED and err == f"regress: baseline folder {missing} does not exist\n"
    cand = tmp_path / "cand"  # run: refused before the suite runs or the candidate is touched
    with pytest.raises(SystemExit) as e:
        main(["run", "--baseline", str(missing), "--candidate", str(cand), "--format", "json",
              "--suite", _harmless_suite(tmp_path)])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert e.value.code == doc["exit_code"] == REFUSED and str(missing) in doc["note"] and not cand.exists()


def test_a_corrupt_baseline_is_refused_naming_the_file(base, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(base, broken)
    bad = broken / "spec" / "rows.parquet"
    if not bad.exists():
        bad = next((broken / "spec").rglob("*.parquet"))
    bad.write_bytes(bad.read_bytes()[:200])
    with pytest.raises(SystemExit) as e:
        main(["compare", "--baseline", str(broken), "--candidate", str(base)])
    err = capsys.readouterr().err
    assert e.value.code == REFUSED and len(err.splitlines()) == 1
    assert f"baseline file {bad} is corrupt or unreadable" in err


def test_make_regress_passes_baseline_and_refuses_unknown_variables():
    def make(*args: str) -> subprocess.CompletedProcess:
        cmd = ["make", "-n", "-o", ".venv/.installed", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)

    r = make("regress", "baseline=/nonexistent", "format=markdown")
    assert r.returncode == 0 and "-m harness.regress run --baseline /nonexistent --format markdown" in r.stdout
    r = make("regress", "baselines=/nonexistent")
    assert r.returncode != 0 and "unknown variable(s) baselines" in r.stderr and "harness.regress" not in r.stdout
    r = make("regress-accept", "reason=first amx baseline, float32")
    assert r.returncode == 0 and 'accept --reason "first amx baseline, float32"' in r.stdout


def test_history_plot_legends_tell_the_keeps_apart():
    """The legend labels of history rows (old ones with method-option JSON too) keep only
    what differs between the points; what they share is the panel's title."""
    from harness.regress.history import plot_labels

    opts = '{"chunk_size": 32, "pool_kernel": 13, "position_mode": "original"}'
    points = [f"smollm2-135m ruler-2048 specprefill keep={k} {opts} speculator=self_layers:8 ALL" for k in (0.1, 0.3)]
    labels, shared = plot_labels([*points, "smollm2-135m ruler-2048 full keep=1 ALL"])
    assert labels[points[0]] == "specprefill keep=0.1 speculator=self_layers:8"
    assert labels[points[1]] == "specprefill keep=0.3 speculator=self_layers:8"
    assert shared == "smollm2-135m ruler-2048 ALL"


def _flaky_suite(tmp_path, monkeypatch, firsts: int):
    """A stand-in suite: one command that writes the eval and latency run folders (resuming,
    as the jobs do: only what is missing), from a folder whose A/A check fails for its first
    ``firsts`` calls, then from a clean one."""
    import sys

    from harness.regress import suite as regress

    _folder(tmp_path / "flagged", aa=1.12)
    _folder(tmp_path / "clean")
    script = tmp_path / "suite.py"
    script.write_text(
        "import shutil, sys\nfrom pathlib import Path\n"
        f"calls = Path({str(tmp_path / 'calls')!r})\n"
        "n = int(calls.read_text()) if calls.exists() else 0\ncalls.write_text(str(n + 1))\n"
        f"src = Path({str(tmp_path)!r}) / ('flagged' if n < {firsts} else 'clean')\n"
        "out = Path(sys.argv[1])\n"
        "for run in ('full', 'spec', 'lat'):\n"
        "    if not (out / run).exists():\n"
        "        shutil.copytree(src / run, out / run)\n"
    )
    monkeypatch.setattr(regress, "suite_commands", lambda out, suite_file: [[sys.executable, str(script), str(out)]])
    return tmp_path / "calls"


@pytest.mark.parametrize(("firsts", "remeasure", "code"), [(1, 1, OK), (2, 1, INCOMPARABLE), (1, 0, INCOMPARABLE)])
def test_a_flagged_latency_run_is_measured_once_more_and_said(base, tmp_path, monkeypatch, firsts, remeasure, code):
    """A candidate whose A/A check fails (a neighbour's burst on a shared CI machine) has its
    latency run measured again, the first measurement set aside and named in the verdict; a
    second failure stays not comparable, and ``remeasure=0`` never measures again."""
    from harness.regress.formats import render_text
    from harness.regress.suite import SET_ASIDE, SUITE_RECORD, run_suite

    calls = _flaky_suite(tmp_path, monkeypatch, firsts)
    cand = tmp_path / "cand"
    log = (tmp_path / "log.txt").open("w")
    v = run_suite(cand, tmp_path, 2.0, 0.15, baseline=base, log=log, remeasure=remeasure)
    assert v.code == code, render_text(v)
    assert int(calls.read_text()) == 1 + remeasure
    if remeasure:
        (line,) = v.remeasured
        assert line.startswith("Measured again: lat ") and "A/A check failed: 1.12" in line, line
        assert (cand / SET_ASIDE / "1" / "lat" / "config.yaml").is_file()
        assert line in render_text(v)
    else:
        assert not v.remeasured and not (cand / SET_ASIDE).exists()
    assert json.loads((cand / SUITE_RECORD).read_text())["runs"] == ["full", "lat", "spec"]


def test_a_negative_remeasure_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--remeasure", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith("--remeasure -1: allowed: 0 (never) or more times"), err
