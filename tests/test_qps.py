"""`make qps`: rate search, SLO verdicts, summaries, validation, and a real served smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.analysis.serving import (
    NO_MATCHING_REFERENCE,
    SETTINGS,
    SEVERAL_REFERENCES,
    point_stats,
    summarize_qps,
    summarize_qps_rates,
)
from harness.jobs import qps
from harness.jobs.qps import QPSConfig, next_rate, passes, prepare, request_text, truncate_at_stop
from harness.parquet import read_parquet
from harness.serving import processes
from harness.store import RunStore, record
from harness.types import Sample

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(*overrides: str) -> QPSConfig:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return QPSConfig.from_hydra(compose(config_name="qps", overrides=list(overrides)))


def _q(*overrides: str) -> qps.QPSSettings:
    return _cfg(*overrides).qps


def test_rate_search_ramps_then_bisects_once():
    c = _q("qps.start_rate=0.05", "qps.growth=2", "qps.max_points=4", "qps.bisect_steps=1")
    assert next_rate(c, {}) == 0.05
    assert next_rate(c, {0.05: True}) == 0.1
    assert next_rate(c, {0.05: True, 0.1: True, 0.2: False}) == 0.15
    assert next_rate(c, {0.05: True, 0.1: True, 0.2: False, 0.15: True}) is None
    assert next_rate(c, {0.05: False}) is None  # nothing passes: max QPS is 0 below start_rate
    assert next_rate(c, {0.05: True, 0.1: True, 0.2: True, 0.4: True}) is None  # ramp exhausted


def test_rate_search_bisects_towards_the_boundary():
    c = _q("qps.start_rate=1", "qps.max_points=3", "qps.bisect_steps=2")
    assert next_rate(c, {1.0: True, 2.0: False}) == 1.5
    assert next_rate(c, {1.0: True, 2.0: False, 1.5: False}) == 1.25
    assert next_rate(c, {1.0: True, 2.0: False, 1.5: True}) == 1.75
    assert next_rate(c, {1.0: True, 2.0: False, 1.5: True, 1.75: True}) is None


def test_a_resumed_search_on_another_ramp_still_bisects():
    """A run resumed with another start_rate keeps its verdicts (a rate's does not depend on
    the search); the old ramp's rates outside the new bracket are not counted as bisections."""
    old = {0.05: True, 0.1: True, 0.2: True, 0.4: True}  # start_rate 0.05, max_points 4: all passed
    c = _q("qps.start_rate=0.3", "qps.growth=2", "qps.max_points=4", "qps.bisect_steps=1")
    assert next_rate(c, old) == 0.3
    assert next_rate(c, {**old, 0.3: True}) == 0.6
    assert next_rate(c, {**old, 0.3: True, 0.6: True, 1.2: False}) == 0.9  # one bisection of 0.6 .. 1.2
    assert next_rate(c, {**old, 0.3: True, 0.6: True, 1.2: False, 0.9: True}) is None
    # an old rate inside the bracket refines it as a bisection would, and counts as one
    assert next_rate(c, {**old, 0.8: True, 0.3: True, 0.6: True, 1.2: False}) is None


def test_explicit_rates_are_measured_in_order():
    c = _q("rates=[0.2,0.1]")
    assert next_rate(c, {}) == 0.2 and next_rate(c, {0.2: False}) == 0.1 and next_rate(c, {0.2: 1, 0.1: 1}) is None
    assert _q("rates=0.3").rates == (0.3,)  # one rate (a sweep point of `rates=0.1,0.3`)


def _rows(ttfts: list[float], e2es: list[float], timeout_s: float = 10.0, failed: int = 0) -> pd.DataFrame:
    rows = [
        {"status": "ok", "ttft_s": t, "e2e_s": e, "tpot_s": (e - t) / 9, "timed_out": e > timeout_s,
         "score": 100.0 if i % 2 else 0.0, "kept_tokens": 30, "prompt_tokens": 100, "speculator_s": 0.1}
        for i, (t, e) in enumerate(zip(ttfts, e2es, strict=True))
    ]  # fmt: skip
    rows += [{"status": "failed", "ttft_s": None, "e2e_s": None, "tpot_s": None, "timed_out": True, "score": None,
              "kept_tokens": 30, "prompt_tokens": 100, "speculator_s": None}] * failed  # fmt: skip
    return pd.DataFrame(rows)


def test_slo_verdicts_follow_the_timeout_rule_and_the_ttft_p90():
    c = _q("qps.timeout_s=10", "qps.max_timeouts=1", "qps.ttft_p90_slo_s=2")
    good = point_stats(_rows([1.0] * 10, [5.0] * 10))
    assert good["timeouts"] == 0 and good["score"] == 50.0 and good["kept_fraction"] == pytest.approx(0.3)
    assert passes(good, c) == {"pass_timeout_rule": True, "pass_ttft_slo": True, "passed": True}
    # two requests over the timeout: more than max_timeouts=1
    slow = point_stats(_rows([1.0] * 10, [5.0] * 8 + [11.0, 12.0]))
    assert passes(slow, c)["pass_timeout_rule"] is False and passes(slow, c)["passed"] is False
    # a failed request counts as a timeout; one is allowed
    assert passes(point_stats(_rows([1.0] * 9, [5.0] * 9, failed=1)), c)["pass_timeout_rule"] is True
    # TTFT p90 above the SLO
    late = point_stats(_rows([1.0] * 8 + [3.0, 3.0], [5.0] * 10))
    assert late["ttft_p90_s"] == pytest.approx(3.0) and passes(late, c)["pass_ttft_slo"] is False


def _served(method: str, rates: list[tuple[float, bool, float]], **run) -> pd.DataFrame:
    parts = []
    for rate, ok, score in rates:
        r = _rows([1.0] * 4, [2.0] * 4).assign(
            score=score, rate=rate, pass_timeout_rule=ok, pass_ttft_slo=True, passed=ok, request_throughput=rate,
            model="m", method=method, keep_rate=0.3, benchmark="ruler", length=2048, arrival="poisson",
            reference_method="full", **{"hardware": "cpu", "dtype": "float32", "run_id": method, **run},
        )  # fmt: skip
        parts.append(r)
    return pd.concat(parts, ignore_index=True)


def test_summary_takes_the_highest_passing_rate_and_its_score():
    rows = _served("specprefill", [(0.1, True, 80.0), (0.2, True, 60.0), (0.4, False, 40.0)])
    assert list(summarize_qps_rates(rows)["rate"]) == [0.1, 0.2, 0.4]
    best = summarize_qps(rows).iloc[0]
    assert best["max_qps"] == 0.2 and best["score_at_max_qps"] == 60.0 and best["max_qps_ttft_slo"] == 0.4
    assert pd.isna(best["qps_ratio_to_reference"])  # no reference run


def test_ratio_to_the_reference_only_on_the_same_machine_and_dtype():
    rows = pd.concat([
        _served("full", [(0.1, True, 80.0), (0.2, False, 80.0)]),
        _served("specprefill", [(0.1, True, 70.0), (0.2, True, 70.0), (0.4, False, 70.0)]),
        _served("full", [(0.1, False, 80.0)], hardware="gpu", run_id="full-gpu"),  # another machine: never joined
        _served("specprefill", [(0.1, True, 70.0)], dtype="bfloat16", run_id="spec-bf16"),  # no bf16 reference
    ], ignore_index=True)  # fmt: skip
    s = summarize_qps(rows).set_index("run_id")
    assert s.loc["specprefill", "qps_ratio_to_reference"] == pytest.approx(2.0)
    assert s.loc["full", "qps_ratio_to_reference"] == pytest.approx(1.0)
    assert pd.isna(s.loc["spec-bf16", "qps_ratio_to_reference"])


def test_a_cpu_of_the_same_name_with_other_flags_is_another_machine():
    rows = pd.concat([
        _served("full", [(0.1, True, 80.0), (0.2, False, 80.0)], cpu_flags="avx2 avx512f"),
        _served("specprefill", [(0.1, True, 70.0), (0.2, True, 70.0), (0.4, False, 70.0)], cpu_flags="avx2"),
    ], ignore_index=True)  # fmt: skip
    s = summarize_qps(rows).set_index("run_id")
    assert pd.isna(s.loc["specprefill", "qps_ratio_to_reference"])  # hardware alike, kernels not
    same = summarize_qps(rows.assign(cpu_flags="avx2")).set_index("run_id")
    assert same.loc["specprefill", "qps_ratio_to_reference"] == pytest.approx(2.0)


def test_a_max_qps_at_the_top_of_the_search_is_a_lower_bound():
    exact_full = _served("full", [(0.1, True, 80.0), (0.2, False, 80.0)])
    top = _served("specprefill", [(0.1, True, 70.0), (0.2, True, 70.0), (0.4, True, 70.0)])  # never failed
    s = summarize_qps(pd.concat([exact_full, top], ignore_index=True)).set_index("run_id")
    assert not s.loc["full", "max_qps_censored"] and s.loc["specprefill", "max_qps_censored"]
    assert s.loc["specprefill", "qps_ratio_to_reference"] == pytest.approx(4.0)
    assert s.loc["specprefill", "qps_ratio_bound"] == "lower bound" and s.loc["full", "qps_ratio_bound"] == "exact"
    # over a reference that never failed either, the ratio is unknown, not 1.0
    top_full = _served("full", [(0.1, True, 80.0), (0.2, True, 80.0), (0.4, True, 80.0)])
    s = summarize_qps(pd.concat([top_full, top], ignore_index=True)).set_index("run_id")
    assert (
        pd.isna(s.loc["specprefill", "qps_ratio_to_reference"]) and s.loc["specprefill", "qps_ratio_bound"] == "unknown"
    )
    # an exact max over a reference that never failed: at most their ratio (the reference's is higher)
    exact = _served("specprefill", [(0.1, True, 70.0), (0.2, False, 70.0)])
    s = summarize_qps(pd.concat([top_full, exact], ignore_index=True)).set_index("run_id")
    assert s.loc["specprefill", "qps_ratio_bound"] == "upper bound"
    assert s.loc["specprefill", "qps_ratio_to_reference"] == pytest.approx(0.25)
    from harness.paper.builders import _qps_ratio

    assert _qps_ratio(s.loc["specprefill"], None, None, "not run", "")[0].startswith("<=0.25")


def _slo(slo: float, **more) -> dict:
    """A run's recorded serving settings (harness.analysis.serving.SETTINGS) at a TTFT p90 SLO."""
    return {"timeout_s": 60.0, "max_timeouts": 4, "ttft_p90_slo_s": slo, "warmup_requests": 1, "arrival_seed": 0,
            **more}  # fmt: skip


def test_a_max_qps_is_compared_only_with_the_reference_under_the_same_settings():
    """Full prefill at a 30 s and a 10 s SLO, SpecPrefill at 10 s: its ratio is over the 10 s
    reference's max QPS (2.0), never the 30 s one's (0.5); at an SLO no reference ran under,
    no ratio, flagged."""
    rows = pd.concat([
        _served("full", [(0.1, True, 80.0), (0.2, True, 80.0), (0.4, True, 80.0), (0.8, False, 80.0)],
                run_id="full-30", **_slo(30.0)),
        _served("specprefill", [(0.1, True, 70.0), (0.2, True, 70.0), (0.4, False, 70.0)],
                run_id="spec-10", **_slo(10.0)),
        _served("full", [(0.1, True, 80.0), (0.2, False, 80.0)], run_id="full-10", **_slo(10.0)),
        _served("specprefill", [(0.1, True, 70.0), (0.2, True, 70.0), (0.4, False, 70.0)],
                run_id="spec-10-seed1", **_slo(10.0, arrival_seed=1)),
    ], ignore_index=True)  # fmt: skip
    s = summarize_qps(rows).set_index("run_id")
    assert s.loc["spec-10", "qps_ratio_to_reference"] == pytest.approx(2.0)
    assert s.loc["spec-10", "qps_ratio_bound"] == "exact" and s.loc["spec-10", "ttft_p90_slo_s"] == 10.0
    assert pd.isna(s.loc["spec-10-seed1", "qps_ratio_to_reference"])
    assert s.loc["spec-10-seed1", "qps_ratio_bound"] == NO_MATCHING_REFERENCE
    assert s.loc["full-30", "qps_ratio_to_reference"] == 1.0 and s.loc["full-10", "qps_ratio_to_reference"] == 1.0
    # the paper table says why there is no ratio instead of printing one
    from harness.paper.builders import _qps_ratio

    assert _qps_ratio(s.loc["spec-10-seed1"], None, None, "not run", "")[0].startswith("? (full ran only under other")
    # rows written before the settings were recorded (none in either run) are compared as before;
    # a reference whose settings are known is not taken for one whose are not
    old = rows[rows["run_id"].isin(["full-10", "spec-10"])].drop(columns=list(_slo(0.0)))
    assert summarize_qps(old).set_index("run_id").loc["spec-10", "qps_ratio_to_reference"] == pytest.approx(2.0)
    mixed = pd.concat([old[old["run_id"] == "spec-10"], rows[rows["run_id"] == "full-10"]], ignore_index=True)
    s = summarize_qps(mixed).set_index("run_id")
    assert pd.isna(s.loc["spec-10", "qps_ratio_to_reference"]) and pd.isna(s.loc["spec-10", "ttft_p90_slo_s"])
    assert s.loc["spec-10", "qps_ratio_bound"] == NO_MATCHING_REFERENCE


def _burst(rate: float, ttfts: list[float], ok: bool = True, **run) -> pd.DataFrame:
    """One rate's requests sent 1/rate apart (``start_time``) with these TTFTs."""
    n = len(ttfts)
    return _rows(ttfts, [t + 1.0 for t in ttfts]).assign(
        start_time=[100.0 + i / rate for i in range(n)], task="t", sample_id=range(n), rate=rate,
        pass_timeout_rule=ok, pass_ttft_slo=True, passed=ok, request_throughput=run.pop("thru", rate),
        model="m", method=run.pop("method", "full"), keep_rate=0.3, benchmark="ruler", length=2048,
        arrival="poisson", reference_method="full", **{"hardware": "cpu", "dtype": "float32", "run_id": "r", **run},
    )  # fmt: skip


def test_a_queue_that_grows_over_the_burst_is_seen_and_a_flat_one_is_not():
    """TTFT rising with each request's send time (the server falls behind the offered rate)
    gives a slope whose interval lies above 0; noise around a flat TTFT does not; rows
    without send times (written before they were recorded) leave it unknown."""
    noise = [0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.04, -0.03, 0.01, 0.02, -0.02]
    flat = point_stats(_burst(1.0, [1.0 + e for e in noise]))
    assert flat["queue_grows"] is False and flat["ttft_growth_lo"] < 0 < flat["ttft_growth_hi"]
    # offered 1 req/s, served 1/1.5 req/s: each request waits 0.5 s more than the one before
    rising = point_stats(_burst(1.0, [1.0 + 0.5 * i + e for i, e in enumerate(noise)]))
    assert rising["queue_grows"] is True and rising["ttft_growth"] == pytest.approx(0.5, abs=0.02)
    # a gentle trend beyond noise (0.03 s/s: the burst's start, the task order) is not a growing queue
    gentle = point_stats(_burst(1.0, [1.0 + 0.03 * i + e / 10 for i, e in enumerate(noise)]))
    assert 0 < gentle["ttft_growth_lo"] < 0.1 and gentle["queue_grows"] is False
    unknown = point_stats(_burst(1.0, [1.0] * 12).drop(columns=["start_time"]))
    assert unknown["queue_grows"] is None and pd.isna(unknown["ttft_growth"])
    assert point_stats(_burst(1.0, [1.0, 2.0, 3.0]))["queue_grows"] is None  # 3 requests: no trend fitted


def test_a_burst_that_passes_while_its_queue_grows_is_not_a_steady_rate():
    """12 requests can pass a rate the server cannot sustain: the steady max QPS is the
    highest passing rate whose queue did not grow; the peak throughput is what was delivered."""
    flat = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95]
    grow = [1.0 + 0.8 * i for i in range(12)]
    full = pd.concat([_burst(0.5, flat, thru=0.45, run_id="full"), _burst(1.0, grow, thru=0.6, run_id="full"),
                      _burst(2.0, grow, ok=False, thru=0.62, run_id="full")], ignore_index=True)  # fmt: skip
    spec = pd.concat([_burst(r, flat, thru=0.9 * r, method="specprefill", run_id="spec") for r in (0.5, 1.0)]
                     + [_burst(2.0, grow, thru=1.2, method="specprefill", run_id="spec")], ignore_index=True)  # fmt: skip
    s = summarize_qps(pd.concat([full, spec], ignore_index=True)).set_index("run_id")
    assert s.loc["full", "max_qps"] == 1.0 and s.loc["full", "max_qps_steady"] == 0.5
    assert s.loc["spec", "max_qps"] == 2.0 and s.loc["spec", "max_qps_steady"] == 1.0
    assert s.loc["spec", "max_qps_censored"] and not s.loc["spec", "max_qps_steady_censored"]
    assert s.loc["spec", "steady_qps_ratio"] == pytest.approx(2.0)
    assert s.loc["spec", "peak_throughput"] == 1.2
    assert s.loc["spec", "peak_throughput_ratio"] == pytest.approx(1.2 / 0.62)
    # every rate passed with a flat queue: the steady max is a lower bound too, and no ratio is
    # taken over a reference's such bound
    calm = pd.concat([_burst(r, flat, run_id="full") for r in (0.5, 1.0)], ignore_index=True)
    s = summarize_qps(pd.concat([calm, spec], ignore_index=True)).set_index("run_id")
    assert s.loc["full", "max_qps_steady"] == 1.0 and s.loc["full", "max_qps_steady_censored"]
    assert pd.isna(s.loc["spec", "steady_qps_ratio"])
    rates = summarize_qps_rates(full).set_index("rate")
    assert rates.loc[1.0, "delivered_fraction"] == pytest.approx(0.6) and bool(rates.loc[1.0, "queue_grows"])


def test_a_max_qps_is_compared_only_with_the_reference_on_the_same_requests():
    """Every rate's verdict is over all its requests: a reference that served other samples
    (another limit) is not the method's reference, and two matching references give no
    ratio rather than the last one's."""
    flat = [1.0] * 12
    spec = _burst(1.0, flat, method="specprefill", run_id="spec")
    other = _burst(0.5, flat, run_id="full-other").assign(sample_id=range(100, 112))
    s = summarize_qps(pd.concat([spec, other], ignore_index=True)).set_index("run_id")
    assert pd.isna(s.loc["spec", "qps_ratio_to_reference"])
    assert s.loc["spec", "qps_ratio_bound"] == NO_MATCHING_REFERENCE
    assert s.loc["spec", "request_set"] != s.loc["full-other", "request_set"]
    same = pd.concat([_burst(0.5, flat, run_id="full-a"), _burst(1.0, flat, ok=False, run_id="full-a")])
    same = same.sample(frac=1.0, random_state=0)  # the same requests in another order
    s = summarize_qps(pd.concat([spec, same], ignore_index=True)).set_index("run_id")
    assert s.loc["spec", "qps_ratio_to_reference"] == pytest.approx(2.0)
    twice = pd.concat([spec, same, _burst(0.25, flat, run_id="full-b")], ignore_index=True)
    s = summarize_qps(twice).set_index("run_id")
    assert pd.isna(s.loc["spec", "qps_ratio_to_reference"]) and s.loc["spec", "qps_ratio_bound"] == SEVERAL_REFERENCES
    assert s.loc["full-a", "qps_ratio_bound"] == SEVERAL_REFERENCES


def test_the_request_set_is_the_job_so_a_larger_limit_is_a_new_run():
    """12 requests at a rate cannot be resumed into 48: limit and tasks are in the qps
    job's identity (an eval's are not: its rows are per sample)."""
    base = prepare(_cfg("method=full", "limit=2")).folder
    assert prepare(_cfg("method=full", "limit=8")).folder != base
    assert prepare(_cfg("method=full", "limit=2", "tasks=[niah_single_1]")).folder != base
    assert prepare(_cfg("method=full", "limit=2")).folder == base


def test_requests_go_out_in_one_seeded_shuffle_unless_the_benchmark_order_is_asked_for():
    """vLLM's load generator shuffles by default; the harness sends its own order (request i
    is sample i in the rows), by default one permutation of qps.seed: the same at every rate,
    for every method and on a resume, so no task always lands at the end of the burst."""
    samples = [Sample(benchmark="ruler", task=f"t{i // 4}", sample_id=i % 4, length=1, instruction="", context="",
                      question="", answer_prefix="", prompt=str(i), references=("x",), max_new_tokens=4, metric="m")
               for i in range(24)]  # fmt: skip
    shuffled = qps.request_order(samples, _q())
    assert sorted(s.prompt for s in shuffled) == sorted(s.prompt for s in samples)
    assert [s.prompt for s in shuffled] != [s.prompt for s in samples]
    assert shuffled == qps.request_order(samples, _q())  # the same every time
    assert qps.request_order(samples, _q("qps.seed=1")) != shuffled
    assert qps.request_order(samples, _q("qps.request_order=benchmark")) == samples
    with pytest.raises(ValueError, match=r"request_order='by_task'.*allowed"):
        _q("qps.request_order=by_task")
    # another order is another load: another run, and not the reference of a shuffled one
    assert prepare(_cfg("method=full", "qps.request_order=benchmark")).folder != prepare(_cfg("method=full")).folder
    flat = [1.0] * 12
    spec = _burst(1.0, flat, method="specprefill", run_id="spec").assign(request=range(12))
    ref = pd.concat([_burst(0.5, flat, run_id="full"), _burst(1.0, flat, ok=False, run_id="full")])
    same = ref.assign(request=list(range(12)) * 2)
    other = ref.assign(request=list(range(11, -1, -1)) * 2)
    assert summarize_qps(pd.concat([spec, same])).set_index("run_id").loc["spec", "qps_ratio_bound"] == "lower bound"
    s = summarize_qps(pd.concat([spec, other])).set_index("run_id")
    assert s.loc["spec", "qps_ratio_bound"] == NO_MATCHING_REFERENCE


def test_every_row_records_the_settings_its_verdicts_depend_on(tmp_path, monkeypatch):
    """The timeout rule, the TTFT SLO, the warm-ups and the arrival seed (the front's settings
    too, for a method served behind one) are columns of each row the job writes."""
    sample = Sample(benchmark="ruler", task="t", sample_id=0, length=1, instruction="", context="", question="",
                    answer_prefix="", prompt="hi", references=("x",), max_new_tokens=4, metric="m")  # fmt: skip
    monkeypatch.setattr(qps, "check_runnable", lambda model: None)
    monkeypatch.setattr(qps, "benchmark_samples", lambda model, bench: (_BosTokenizer(), [sample]))
    over = ("qps.timeout_s=10", "qps.max_timeouts=2", "qps.ttft_p90_slo_s=5", "qps.warmups=0", "qps.seed=3")
    for method in ("full", "specprefill"):
        job = prepare(_cfg(f"method={method}", "keep=0.3", "length=1024", "tasks=[niah_single_1]", "rates=[0.5]",
                           f"out={tmp_path}", *over))  # fmt: skip
        store = RunStore(job.folder)  # its one rate measured: the session opens without servers
        store.append([record("qps", run_id=job.folder.name, row_key="0.5/0", unit="rate-0.5", rate=0.5, passed=True,
                             timestamp=1.0, status="ok")])  # fmt: skip
        with job.session(store) as session:
            got = session.common  # what every row of the job starts from
        assert {k: got[k] for k in SETTINGS} == _slo(5.0, timeout_s=10.0, max_timeouts=2, warmup_requests=0,
                                                     arrival_seed=3)  # fmt: skip
        front = got["front_options"]
        assert front is None if method == "full" else json.loads(front)["max_batch"] == 16
        row = record("qps", **got)  # the record has a field for each
        assert row.ttft_p90_slo_s == 5.0 and row.arrival_seed == 3


def test_a_request_the_front_did_not_log_has_no_kept_count():
    job = prepare(_cfg("method=specprefill", "keep=0.3", "length=1024", "tasks=[niah_single_1]"))
    samples = [
        Sample(benchmark="ruler", task="t", sample_id=i, length=1, instruction="", context="", question="",
               answer_prefix="", prompt="p", references=("x",), max_new_tokens=4, metric="string_match_all")
        for i in range(2)
    ]  # fmt: skip
    result = {"errors": ["", ""], "generated_texts": ["x", "y"], "ttfts": [0.1, 0.2], "latencies": [1.0, 1.0],
              "output_lens": [2, 2], "start_times": [0.0, 0.5]}  # fmt: skip
    rows = qps.request_rows(job, samples, result, {"r1-0": {"kept_tokens": 30}}, [100, 100], 1.0, "r1-")
    assert [(r["kept_tokens"], r["kept_source"]) for r in rows] == [(30, "front"), (None, "missing")]
    direct = qps.request_rows(job, samples, result, None, [100, 90], 1.0, "r1-")
    assert [(r["kept_tokens"], r["kept_source"]) for r in direct] == [(100, "prompt"), (90, "prompt")]
    stats = point_stats(pd.DataFrame(rows))
    assert stats["kept_missing"] == 1 and stats["kept_fraction"] == pytest.approx(0.3)  # the known one only


class _BosTokenizer:
    """Adds a BOS id (1) with add_special_tokens=True, and reads the text "<s>" as it."""

    def __call__(self, text, add_special_tokens=True):
        ids = [1] if add_special_tokens else []
        if text.startswith("<s>"):
            ids, text = [*ids, 1], text[3:]
        return type("Enc", (), {"input_ids": ids + [ord(c) for c in text]})()

    def decode(self, ids, skip_special_tokens=False):
        return "".join("<s>" if i == 1 else chr(i) for i in ids)


def test_request_text_writes_the_special_tokens_each_sample_asks_for():
    """LongBench mixes chat tasks (no tokenizer BOS) and no-chat tasks (tokenizer BOS): every
    request goes with add_special_tokens=false and still gets exactly its sample's ids."""
    tok = _BosTokenizer()

    def sample(add):
        return Sample(benchmark="b", task="t", sample_id=0, length=1, instruction="", context="", question="",
                      answer_prefix="", prompt="hi", references=(), max_new_tokens=1, metric="m",
                      add_special_tokens=add)  # fmt: skip

    for add in (True, False):
        s = sample(add)
        text = request_text(s, tok)
        assert tok(text, add_special_tokens=False).input_ids == tok(s.prompt, add_special_tokens=add).input_ids
    assert request_text(sample(True), tok) == "<s>hi" and request_text(sample(False), tok) == "hi"


def test_stop_strings_cut_the_served_text_like_vllm():
    assert truncate_at_stop("Alice: hi\nBob: yo", ("\n",)) == "Alice: hi"
    assert truncate_at_stop("no stop here", ()) == "no stop here"


@pytest.mark.parametrize(
    "override,match",
    [
        ("qps.arrival=bursty", r"arrival='bursty'; allowed: \['poisson', 'constant'\]"),
        ("rates=[0.1,-1]", r"rates contains -1"),
        ("qps.growth=1", r"growth=1.0"),
        ("qps.max_points=0", r"max_points=0"),
        ("qps.timeout_s=0", r"timeout_s=0.0"),
        ("qps.front.max_batch=0", r"front.max_batch=0; allowed: int >= 1"),
        ("+qps.front.max_batchs=4", r"front settings \['max_batchs'\] are unknown"),
    ],
)
def test_bad_settings_are_named(override, match):
    with pytest.raises(ValueError, match=match):
        _cfg(override)


def test_methods_that_need_the_prompt_split_cannot_be_served():
    with pytest.raises(ValueError, match=r"rag_bm25.*cannot be served"):
        prepare(_cfg("method=rag_bm25"))
    with pytest.raises(ValueError, match=r"backend='transformers'; allowed: \['vllm'\]"):
        _cfg("backend=transformers")


def test_the_server_command_disables_prefix_caching(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECPREFILL_CACHE", str(tmp_path))
    job = prepare(_cfg("model=tiny-random", "method=full", "length=1024"))
    cmd = processes.serve_command(job.cfg.model, 8123)
    assert "--no-enable-prefix-caching" in cmd and cmd[cmd.index("--port") + 1] == "8123"
    # a small random model's seeded weights are written for vLLM (the transformers backend's own)
    assert cmd[cmd.index("--load-format") + 1] == "auto"
    assert (Path(cmd[cmd.index("serve") + 1]) / "model.safetensors").exists()
    log = tmp_path / "serve.log"
    log.write_text("... with config: model='x', enable_prefix_caching=True, ...")
    with pytest.raises(RuntimeError, match="prefix"):
        processes.assert_no_prefix_cache(log)


def test_dry_run_prints_the_plan_and_starts_nothing(capsys):

    job = prepare(_cfg("method=specprefill", "keep=0.1"))
    text = job.describe()
    assert "a specprefill front" in text and "poisson" in text and "qps-specprefill-" in text
    assert "front" not in prepare(_cfg("method=full")).describe().split(";")[0]


@pytest.mark.slow
def test_served_full_and_specprefill_smoke(tmp_path):
    """Real servers on CPU: vllm serve (+ the front for SpecPrefill), one rate, two RULER
    prompts each; rows, percentiles, scores and the cross-method summary are written and
    the servers are gone afterwards."""
    import psutil

    out = tmp_path / "qps"
    common = ["length=1024", "limit=2", "tasks=[niah_single_1]", "max_new=16", f"out={out}", "rates=[0.5]",
              "qps.warmups=0", "qps.server_timeout_s=600"]  # fmt: skip

    def servers() -> set[tuple[int, str]]:
        out = set()
        for p in psutil.process_iter():
            try:
                cmd = " ".join(p.cmdline())
            except psutil.Error:  # exited, or a zombie waiting to be reaped
                continue
            if "harness.serving.vllm_cli" in cmd or "harness.serving.front" in cmd:
                out.add((p.pid, cmd[:120]))
        return out

    before = servers()
    folders = [qps.execute(prepare(_cfg(f"method={m}", "keep=0.3", *common))) for m in ("full", "specprefill")]
    assert not servers() - before, f"servers left running: {servers() - before}"
    for folder in folders:
        rows = RunStore(folder).read()
        assert len(rows) == 2 and (rows["status"] == "ok").all(), rows[["status", "error"]]
        assert rows["ttft_s"].gt(0).all() and rows["e2e_s"].ge(rows["ttft_s"]).all()
        assert rows["prediction"].str.len().gt(0).all() and rows["score"].notna().all()
        # the engine was checked: V1 runner pinned, the position canary passed over HTTP
        assert set(rows["engine_runner"]) == {"vllm serve (V1; VLLM_USE_V2_MODEL_RUNNER=0 pinned)"}
        assert rows["position_check"].str.startswith("canary passed").all()
    spec = RunStore(folders[1]).read()
    assert (spec["kept_tokens"] < spec["prompt_tokens"]).all() and spec["speculator_s"].gt(0).all()
    assert set(spec["kept_source"]) == {"front"} and set(RunStore(folders[0]).read()["kept_source"]) == {"prompt"}
    front = [json.loads(x) for x in (folders[1] / "logs" / "front_requests.jsonl").read_text().splitlines()]
    assert {f["request_id"] for f in front} >= {"r0.5-0", "r0.5-1"}
    summary = pd.read_csv(out / "qps_summary.csv")
    assert set(summary["method"]) == {"full", "specprefill"} and summary["max_qps"].notna().all()
    # What was served equals the offline reference (transformers backend, same plan):
    # the position hook holds inside `vllm serve` too, and the front plans as the runner does.
    from harness.jobs.eval import EvalConfig, execute
    from harness.jobs.eval import prepare as prepare_run

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        for m, folder in zip(("full", "specprefill"), folders, strict=True):
            cfg = compose(
                config_name="config", overrides=[f"method={m}", "keep=0.3", *common[:4], f"out={tmp_path}/ref"]
            )
            ref = read_parquet(execute(prepare_run(EvalConfig.from_hydra(cfg))) / "rows.parquet")
            served = RunStore(folder).read().sort_values("sample_id")
            assert list(served["kept_tokens"]) == list(ref.sort_values("sample_id")["kept_tokens"])
            assert list(served["prediction"].str.strip()) == list(
                ref.sort_values("sample_id")["prediction"].str.strip()
            )


def _served_processes() -> dict[int, list[str]]:
    import psutil

    out = {}
    for p in psutil.process_iter():
        try:
            cmd = p.cmdline()
        except psutil.Error:  # exited, or a zombie waiting to be reaped
            continue
        if any("harness.serving" in c for c in cmd):
            out[p.pid] = cmd
    return out


@pytest.mark.slow
def test_a_server_that_dies_mid_rate_stops_the_run_cleanly_and_the_rate_is_measured_again(tmp_path):
    """Fault: `vllm serve` is SIGKILLed while the second rate's requests are in flight. The
    run stops with one ServerStopped line naming the rate and the server, writes
    job_error.txt, stops the front, keeps the first rate's rows and records none of the
    interrupted rate (a crash is not overload); the same command then measures only that
    rate, and every request appears once per rate."""
    import os
    import signal
    import threading
    import time

    out = tmp_path / "qps"
    args = ["method=specprefill", "keep=0.3", "length=1024", "limit=4", "tasks=[niah_single_1]", "max_new=8",
            f"out={out}", "rates=[2.0,0.5]", "qps.warmups=0", "qps.server_timeout_s=600"]  # fmt: skip
    before = set(_served_processes())
    killed: list[str] = []

    def kill_vllm_during_the_second_rate() -> None:
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            procs = _served_processes()
            in_rate = any("bench" in c and "0.5" in c for c in procs.values())
            log = next(iter(out.rglob("front_requests.jsonl")), None)
            served = log is not None and log.exists() and '"r0.5-' in log.read_text()
            if in_rate and served:  # the rate has begun and at least one of its requests was answered
                for pid, cmd in procs.items():
                    if "serve" in cmd and "bench" not in cmd and pid not in before:
                        os.killpg(pid, signal.SIGKILL)
                        killed.append(" ".join(cmd))
            time.sleep(0.2)

    killer = threading.Thread(target=kill_vllm_during_the_second_rate, daemon=True)
    killer.start()
    with pytest.raises(processes.ServerStopped, match=r"during rate 0\.5: vllm serve exited with code -9") as e:
        qps.execute(prepare(_cfg(*args)))
    killer.join(timeout=5)
    assert killed and "running the same command again measures rate 0.5" in str(e.value)
    assert not set(_served_processes()) - before, "the front (or the client) was left running"
    folder = next(out.rglob("job_error.txt")).parent
    assert "ServerStopped" in (folder / "job_error.txt").read_text()
    rows = RunStore(folder).read()
    assert set(rows["rate"]) == {2.0} and len(rows) == 4  # the interrupted rate left no rows

    folder2 = qps.execute(prepare(_cfg(*args)))  # resume: only rate 0.5 runs
    assert folder2 == folder and not (folder / "job_error.txt").exists()
    rows = RunStore(folder).read()
    assert sorted(rows["row_key"]) == sorted(f"{r:g}/{i}" for r in (2.0, 0.5) for i in range(4))
    assert set(rows[rows["rate"] == 0.5]["status"]) == {"ok"}
    assert not set(_served_processes()) - before


def test_a_served_engine_without_the_position_hook_is_refused(tmp_path, monkeypatch):
    """`vllm serve` answering the canary the same at any positions (no hook, or Model Runner
    V2) is refused in one line before any rate runs; one that moves with them is recorded."""
    from harness.models.catalog import model_config
    from harness.models.factory import EngineRefused

    log = tmp_path / "vllm_serve.log"
    log.write_text("INFO ... Using V2 Model Runner\n")
    monkeypatch.setattr(processes, "served_canary", lambda url: lambda tokens, extra: [{"1": -1.0}, {"1": -2.0}])
    with pytest.raises(
        EngineRefused, match=r"not active in vLLM's vllm serve \(V2; VLLM_USE_V2_MODEL_RUNNER=0 pinned\)"
    ):
        processes.check_served_positions("http://x", model_config("tiny-random"), 4096, log)

    def moves(url):
        def run(tokens, extra):
            shift = 0.0 if extra is None else 1e-3 * (extra["specprefill_positions"][1] + extra["specprefill_next"])
            return [{"1": -1.0 - shift}, {"1": -2.0 - 2 * shift}]

        return run

    log.write_text("INFO ... started\n")
    monkeypatch.setattr(processes, "served_canary", moves)
    runner, checked = processes.check_served_positions("http://x", model_config("tiny-random"), 4096, log)
    assert runner == "vllm serve (V1; VLLM_USE_V2_MODEL_RUNNER=0 pinned)" and checked.startswith("canary passed")


@pytest.mark.parametrize(
    "override,match",
    [
        ("qps.server_timeout_s=abc", r"server_timeout_s='abc'; allowed: a number"),
        ("qps.growth=abc", r"growth='abc'; allowed: a number"),
        ("qps.seed=abc", r"seed='abc'; allowed: int >= 0"),
        ("qps.seed=-1", r"seed=-1; allowed: int >= 0"),
        ("rates=[]", r"rates=\[\]; allowed: a request rate or a non-empty list"),
        ("rates=[0.1,0.1]", r"rates=\[0.1, 0.1\] names a rate twice"),
    ],
)
def test_settings_found_unchecked_are_refused(override, match):
    """Each was a traceback (a string compared with a number) or ran silently (a seed numpy
    would refuse at run time, an empty list read as "search", a rate twice)."""
    with pytest.raises(ValueError, match=match):
        _cfg(override)


def test_a_search_setting_beside_explicit_rates_is_refused():
    with pytest.raises(ValueError, match=r"^start_rate=0.2 with rates=\[0.1\]: explicit rates run no search"):
        _cfg("rates=[0.1]", "qps.start_rate=0.2")
    _cfg("rates=[0.1]")  # the search settings at their defaults: nothing set and unused


def test_a_rates_time_limit_shorter_than_one_requests_is_refused():
    with pytest.raises(ValueError, match=r"point_timeout_s=10.0 is shorter than timeout_s=100.0"):
        _cfg("qps.timeout_s=100", "qps.point_timeout_s=10")
    _cfg("qps.timeout_s=100", "qps.point_timeout_s=100")  # equal: allowed
