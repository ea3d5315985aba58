"""The regression gate on hand-made results folders: a copy passes, real degradations fail
naming the method, noise passes, folders that cannot be compared exit 2."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from harness.regress import INCOMPARABLE, OK, REGRESSED, compare, main
from harness.store import RunStore, record

TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "qa_1")


def _eval_rows(
    method: str, keep: float | None, run: str, scores: dict[str, list[float]], ttft: float, speculator: str = "s:8"
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
        )
        for t, ss in scores.items()
        for i, s in enumerate(ss)
    ]


def _latency_rows(run: str, full_s: list[float], spec_s: list[float]) -> list:
    rows = []
    for method, keep, times in (("full", None, full_s), ("specprefill", 0.3, spec_s)):
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
                warmup=False,
                method=method,
                method_options=opts,
                keep_rate=keep,
                reference_method="full",
                ttft_s=t,
            )
            for i, t in enumerate(times)
        ]
    return rows


def _folder(root, spec_scores=None, spec_ttft=1.0, lat_spec=None, speculator="s:8"):
    rng = np.random.default_rng(0)
    full = {t: [100.0 if x < 0.8 else 0.0 for x in rng.random(10)] for t in TASKS}
    spec = spec_scores or {t: [100.0 if x < 0.6 else 0.0 for x in np.random.default_rng(1).random(10)] for t in TASKS}
    for name, rows in (
        ("full", _eval_rows("full", None, "full", full, 4.0)),
        ("spec", _eval_rows("specprefill", 0.3, "spec", spec, spec_ttft, speculator)),
        ("lat", _latency_rows("lat", [4.0, 4.1, 3.9, 4.0], lat_spec or [1.0, 1.05, 0.95, 1.0])),
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
    assert all("specprefill" in r.point for r in bad) and len(bad) == 2  # the eval TTFT and the latency grid


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
    assert code == OK and "Improved:" in text and any(r.verdict == "improved" for r in rows)


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


def test_accept_promotes_the_candidate_with_its_reason(base, tmp_path, monkeypatch):
    from harness import regress

    monkeypatch.setattr(regress, "hardware_class", lambda: "cpu-test")
    regress.accept(base, tmp_path / "baselines", "first baseline")
    stored = tmp_path / "baselines" / "cpu-test"
    assert "first baseline" in (stored / "ACCEPTED.md").read_text()
    assert compare(stored / "rows", base)[0] == OK
    assert "prediction" not in pd.read_parquet(next((stored / "rows").rglob("rows.parquet"))).columns
    with pytest.raises(SystemExit, match="give a reason"):
        regress.accept(base, tmp_path / "baselines", " ")


def test_compare_without_the_subcommand_as_the_issue_spells_it(base, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--baseline", str(base), "--candidate", str(base)])
    assert e.value.code == OK and "no regression" in capsys.readouterr().out


def test_history_records_retention_and_plots(base, tmp_path):
    from harness.regress import append_history

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
    import subprocess

    from harness.regress import ROOT, suite_commands

    cmds = suite_commands(tmp_path / "cand", ROOT / "conf" / suite)
    assert [c[2] for c in cmds] == ["harness.run", "harness.latency"]
    for cmd in cmds:
        r = subprocess.run([*cmd, "dry_run=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "specprefill" in r.stdout and str(tmp_path / "cand") in r.stdout


def test_a_missing_suite_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"suite file .*nope.yaml does not exist"):
        main(["run", "--suite", str(tmp_path / "nope.yaml"), "--candidate", str(tmp_path / "c")])
