"""TTFT grid: the FLOPs model by hand, batched planning, any method through the one store,
prompt sources, failures recorded per point, config errors, dry runs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.analysis.speed import summarize_latency
from harness.jobs import latency as lat
from harness.models.catalog import model_config
from harness.models.loading import load
from harness.store import RunStore, read_results
from harness.timing import flops
from specprefill import SpecPrefill
from specprefill.backends.transformers import TransformersBackend
from specprefill.flops import Shape, causal_pairs, prefill_flops, speculator_flops
from specprefill.plan import Prompt

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_flops_model_by_hand():
    s = Shape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)
    # per layer: q 8*8, k and v 8*4 each, o 8*8, MLP 3*8*16 -> 64+64+64+384 = 576 MACs, x2 FLOPs, x2 layers
    assert s.linear_per_token == 2304
    assert s.attention_per_pair == 64  # 2 layers x 4 x 2 heads x 4 dims
    assert causal_pairs(4) == 10
    assert prefill_flops(s, 4, 10) == 4 * 2304 + 10 * 64 + 160  # LM head: 2 x 8 x 10
    # look-ahead: two decode steps attending to 101 and 102 keys
    assert speculator_flops(s, 100, 3) - speculator_flops(s, 100, 1) == (2304 + 101 * 64 + 160) + (
        2304 + 102 * 64 + 160
    )


def test_ideal_flops_of_a_batch():
    s = Shape(layers=1, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=4, vocab=2)
    prompts = [Prompt(torch.arange(10)), Prompt(torch.arange(10))]
    kept = [torch.tensor([0, 5, 9])] * 2

    from specprefill.plan import kept_plan, text_plan

    plans = [kept_plan(p, k, "original", {}) for p, k in zip(prompts, kept, strict=True)]
    full, method = flops(s, prompts, plans, overhead=1000)
    assert full == 2 * (10 * s.linear_per_token + 55 * s.attention_per_pair + 2 * 4 * 2)
    assert method == 1000 + 2 * (3 * s.linear_per_token + 6 * s.attention_per_pair + 2 * 4 * 2)

    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return type("E", (), {"input_ids": [1, 2]})()

    rewritten = [text_plan(p, type("B", (), {"tokenizer": Tok()})(), "x", {}) for p in prompts]
    assert math.isnan(flops(s, prompts, rewritten, overhead=0)[1])  # its compressor is not counted


@pytest.fixture(scope="module")
def tiny_backend(smollm2_tokenizer):
    cfg = model_config("tiny-random", speculator="self_layers:1")
    lm = load(cfg)
    return TransformersBackend(lm.base, lm.tokenizer, lm.speculator)


def test_batched_capture_equals_one_prompt_at_a_time(tiny_backend):
    ids = torch.randint(0, 1000, (3, 50), generator=torch.Generator().manual_seed(0))
    caps = tiny_backend.speculate_batch(ids, 3)
    for i in range(3):
        one = tiny_backend.speculate(ids[i], 3)
        torch.testing.assert_close(caps[i].queries, one.queries, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(caps[i].keys, one.keys, rtol=1e-4, atol=1e-5)
        assert caps[i].lookahead_ids == one.lookahead_ids


def test_batched_planning_keeps_what_one_at_a_time_keeps_and_counts_the_speculator(tiny_backend):
    prompts = [Prompt(x) for x in torch.randint(0, 1000, (3, 96), generator=torch.Generator().manual_seed(1))]
    m = SpecPrefill(keep_rate=0.3, lookahead=2, chunk_size=16, pool_kernel=3)
    tiny_backend.method_flops = 0
    batch = m.plan_batch(prompts, tiny_backend)
    shape = Shape.of(tiny_backend.speculator.config)
    assert tiny_backend.method_flops == 3 * speculator_flops(shape, 96, 2)
    for p, b in zip(prompts, batch, strict=True):
        one = m.plan(p, tiny_backend)
        assert torch.equal(one.kept_indices, b.kept_indices) and torch.equal(one.position_ids, b.position_ids)
        assert set(b.timings) == {"speculator_s", "selection_s"}


def test_prefill_of_unequal_plans_left_pads_and_gives_each_plan_its_own_first_token(tiny_backend):
    """The latency path's batched prefill (padding masked out) predicts the same first token
    as each plan's own prefill in the eval path."""
    from specprefill.plan import kept_plan

    p = Prompt(torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(2)))
    plans = [kept_plan(p, torch.arange(0, 64, 2), "original", {}), kept_plan(p, torch.arange(40), "contiguous", {})]
    seen = []
    real = tiny_backend.base.forward

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out.logits[:, -1].argmax(-1).tolist())
        return out

    tiny_backend.base.forward = spy
    try:
        assert tiny_backend.prefill(plans) > 0
    finally:
        del tiny_backend.base.forward
    assert seen[0] == [int(tiny_backend.generate(x, 1).first_logits.argmax()) for x in plans]


def _lat(tmp_path, *overrides: str) -> lat.LatencyJob:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=tiny-random", f"out={tmp_path}", *overrides])
    return lat.prepare(lat.LatencyConfig.from_hydra(cfg))


def test_any_method_is_timed_beside_the_reference_into_the_one_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plots/ go under the test's folder
    common = ["grid=[[2,96],[1,192]]", "warmup=1", "iters=2", "keep=0.3", "method.chunk_size=16"]
    folder = lat.execute(_lat(tmp_path, "method=specprefill", "method.pool_kernel=3", *common))
    lat.execute(_lat(tmp_path, "method=truncate", *common[:-1]))
    rows = read_results(tmp_path)
    assert set(rows["kind"]) == {"latency"}
    assert set(rows["method"]) == {"full", "aa_check", "specprefill", "truncate"}
    spec = rows[rows["run_id"] == folder.name]
    # 2 points x 3 iterations x (reference + its A/A copy + method), warm-up flagged
    assert len(spec) == 2 * 3 * 3 and spec["warmup"].sum() == 2 * 3
    # every iteration times the three in an order of its own, recorded: the two timed ones
    # reverse each other (the reference first, then last)
    for _, it in spec.groupby(["unit", "iteration"]):
        assert sorted(it["order"]) == [0, 1, 2]
    timed = spec[~spec["warmup"]]
    assert sorted(timed.loc[timed["order"] == 0, "method"]) == ["full", "full", "specprefill", "specprefill"]
    # the machine's load while each row was timed
    assert spec["cpus"].ge(1).all() and spec["loadavg_1m"].notna().all()
    assert (rows["status"] == "ok").all() and (rows["ttft_s"] > 0).all() and not rows["prefix_cache"].any()
    assert set(rows["prompt_source"]) == {"random"} and set(rows["reference_method"]) == {"full"}
    sp = spec[spec["method"] == "specprefill"]
    # A batch's parts are shares of its cost: summed over the batch they fit inside the
    # method's own wall time (a speculator forward counted once per prompt would not).
    parts = sp["method_timings"].map(lambda t: sum(json.loads(t).values()))
    assert (parts <= sp["method_s"] * 1.0001).all()
    assert set(sp["kept_tokens"][sp["length"] == 192]) == {64.0}  # whole chunks of 16: ceil(12 * 0.3) = 4
    assert (sp["ideal_speedup"] < 1 / 0.3).all() and (sp["flops_method"] > sp["flops_full"] * 0.3).all()
    summary = (tmp_path / "summary.md").read_text()
    assert "## Latency" in summary and "| truncate | 0.3 | 2 |" in summary and "few pairs" in summary
    # resume: nothing re-measured
    before = {p.name for p in (folder / "parts").glob("*.parquet")} | {"rows.parquet"}
    lat.execute(_lat(tmp_path, "method=specprefill", "method.pool_kernel=3", *common))
    assert {p.name for p in folder.iterdir() if p.suffix == ".parquet"} <= before
    assert len(RunStore(folder).read()) == 18
    # a grid point added later extends the same run
    lat.execute(_lat(tmp_path, "method=specprefill", "method.pool_kernel=3", *common[1:], "grid=[[1,128]]"))
    assert len(RunStore(folder).read()) == 18 + 9


def test_summary_speedup_pairs_the_iterations_of_the_same_run():
    from harness.analysis.speed import summarize_latency

    def rows(run, method, ttfts, warm=9.0):
        return [
            {"run_id": run, "model": "m", "backend": "b", "prompt_source": "random", "batch": 1, "length": 8,
             "method": method, "keep_rate": None if method == "full" else 0.3, "reference_method": "full",
             "iteration": i, "warmup": i == 0, "status": "ok", "ttft_s": t, "method_s": 0.0, "base_prefill_s": t,
             "kept_fraction": 1.0, "ideal_speedup": 4.0, "method_options": "{}", "config_hash": run, "dtype": "x",
             "benchmark_options": float("nan")}  # NaN as in a folder that also holds eval rows
            for i, t in enumerate([warm, *ttfts])
        ]  # fmt: skip

    df = pd.DataFrame(rows("a", "full", [4.0, 6.0, 5.0]) + rows("a", "x", [1.0, 3.0, 2.0])
                      + rows("b", "full", [40.0, 40.0, 40.0]) + rows("b", "y", [10.0, 10.0, 10.0]))  # fmt: skip
    s = summarize_latency(df).set_index("method")
    assert s.loc["x", "speedup"] == pytest.approx(2.5)  # 5 / 2, warm-up (9 s) left out
    assert s.loc["x", "efficiency"] == pytest.approx(2.5 / 4.0)
    assert s.loc["y", "speedup"] == pytest.approx(4.0)  # against run b's own reference
    # pairs by iteration: 4/1, 6/3, 5/2 -> median 2.5; three pairs give no interval (MIN_PAIRS)
    assert math.isnan(s.loc["x", "speedup_lo"]) and s.loc["x", "pairs"] == 3
    assert "too few pairs" in s.loc["x", "flags"] and not s.loc["x", "comparable"]
    assert math.isnan(s.loc["full", "speedup_lo"])
    assert s.loc["full", "n"] == 6 and s.loc["full", "ttft_median_s"] == pytest.approx(
        23.0
    )  # pooled: median of 4 5 6 40 40 40
    assert math.isnan(s.loc["x", "kv_mib"])  # rows without kv_bytes (older runs, vLLM): NaN, not 0
    # kv_mib: the median over the timed iterations of the bytes one prompt left, in MiB
    kv = pd.DataFrame(rows("a", "full", [4.0, 6.0, 5.0]) + rows("a", "x", [1.0, 3.0, 2.0]))
    kv["kv_bytes"] = [9, 1, 3, 5, 9, 2, 8, 4]  # the warm-ups (9) left out
    kv["kv_bytes"] *= 2**20
    s = summarize_latency(kv).set_index("method")
    assert (s.loc["full", "kv_mib"], s.loc["x", "kv_mib"]) == (3.0, 4.0)
    assert math.isnan(s.loc["x", "decode_s_per_token"]) and math.isnan(s.loc["x", "e2e_speedup"])  # none decoded
    # decode_tokens > 0: seconds per decoded token (median), and the speedup on TTFT + decode
    kv["decode_tokens"] = 4
    kv["decode_s"] = [9.0, 1.0, 1.0, 1.0, 9.0, 0.5, 0.5, 0.5]
    s = summarize_latency(kv).set_index("method")
    assert (s.loc["full", "decode_s_per_token"], s.loc["x", "decode_s_per_token"]) == (0.25, 0.125)
    # pairs of TTFT + decode: 5/1.5, 7/3.5, 6/2.5 -> median 2.4
    assert s.loc["x", "e2e_speedup"] == pytest.approx(2.4) and s.loc["full", "e2e_speedup"] == 1.0


def _paired_rows(ref: list[float], timed: list[float], aa: list[float] | None = None, ideal: float = 4.0,
                 order: bool = True) -> pd.DataFrame:  # fmt: skip
    """One run's latency rows: a warm-up, then the given timed iterations of the reference,
    the method ``x`` and (``aa``) the A/A check."""
    rows = []
    for method, times in (("full", ref), ("x", timed), *((("aa_check", aa),) if aa else ())):
        for i, t in enumerate([9.0, *times]):
            rows.append({"run_id": "a", "model": "m", "backend": "b", "prompt_source": "random", "batch": 1,
                         "length": 8, "method": method, "keep_rate": 0.3 if method == "x" else None,
                         "reference_method": "full", "iteration": i, "warmup": i == 0, "status": "ok", "ttft_s": t,
                         "method_s": 0.0, "base_prefill_s": t, "kept_fraction": 1.0,
                         "ideal_speedup": ideal if method == "x" else 1.0, "method_options": "{}",
                         "config_hash": "a", "dtype": "x", "order": (i + (method == "x")) % 2 if order else None,
                         "foreign_cpu": 0.01, "loadavg_1m": 2.0, "cpus": 2})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_speedup_interval_resamples_pairs_computed_by_hand():
    """Twelve pairs timed while the machine slows down (each pair's two members slow
    together): the per-pair ratio is 2 within 1 %, so the interval over pairs is narrow,
    where resampling each side on its own (the old estimator) mixes slow and fast minutes
    and gives a wide one. The expected interval is computed here from the rows, by hand."""
    import numpy as np

    drift = [1 + 0.1 * i for i in range(12)]
    jitter = [1.0, 1.01, 0.99, 1.005, 0.995, 1.0, 1.008, 0.992, 1.0, 1.003, 0.997, 1.0]
    ref = [2.0 * d for d in drift]
    method = [d * j for d, j in zip(drift, jitter, strict=True)]
    s = summarize_latency(_paired_rows(ref, method)).set_index("method")
    ratios = np.array(ref) / np.array(method)
    idx = np.random.default_rng(0).integers(0, 12, size=(2000, 12))  # harness.analysis.stats.SEED, RESAMPLES
    lo, hi = np.percentile(np.median(ratios[idx], axis=1), [2.5, 97.5])
    assert s.loc["x", "speedup"] == pytest.approx(np.median(ratios))
    assert (s.loc["x", "speedup_lo"], s.loc["x", "speedup_hi"]) == pytest.approx((lo, hi))
    assert hi - lo < 0.05 and s.loc["x", "pairs"] == 12
    assert s.loc["x", "comparable"] and s.loc["x", "flags"] == ""
    # pairs are matched by iteration, not by row order: shuffled rows give the same interval
    shuffled = summarize_latency(_paired_rows(ref, method).sample(frac=1, random_state=3)).set_index("method")
    assert shuffled.loc["x", "speedup_lo"] == pytest.approx(lo)


def test_the_aa_check_anomalies_and_old_rows_are_flagged():
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02, 1.98, 2.0, 2.01]
    # the A/A copy reads 1.0: fine; a method at 1.3x with an ideal of 1.0 is an anomaly
    s = summarize_latency(_paired_rows(base, [t / 1.3 for t in base], aa=[t * 1.001 for t in base], ideal=1.0))
    s = s.set_index("method")
    assert s.loc["aa_check", "aa_ok"] and s.loc["x", "aa_ok"]
    assert s.loc["x", "aa_speedup"] == pytest.approx(1 / 1.001)
    assert s.loc["x", "anomaly"].startswith("anomaly: 1.30x is above its FLOP ideal 1.00x by 30%")
    assert not s.loc["x", "comparable"] and s.loc["aa_check", "comparable"]
    # an A/A copy 10 % faster than the reference fails the check, and every point of its run says so
    s = summarize_latency(_paired_rows(base, [t / 2 for t in base], aa=[t / 1.1 for t in base])).set_index("method")
    assert not s.loc["x", "aa_ok"] and "A/A check failed" in s.loc["x", "flags"] and not s.loc["x", "comparable"]
    assert s.loc["x", "anomaly"] == ""  # 2.0x under its ideal 4.0x
    # rows of the older protocol (no order recorded): flagged, not comparable
    s = summarize_latency(_paired_rows(base, [t / 2 for t in base], order=False)).set_index("method")
    assert "order not balanced" in s.loc["x", "flags"] and not s.loc["x", "comparable"]
    # a loaded machine is said, not refused
    rows = _paired_rows(base, [t / 2 for t in base], aa=base)
    rows.loc[3, "foreign_cpu"] = 0.4
    s = summarize_latency(rows).set_index("method")
    assert s.loc["x", "loaded"] and "loaded" in s.loc["x", "flags"] and s.loc["x", "comparable"]


def test_the_aa_line_of_a_point_timed_in_several_runs_shows_its_worst_run():
    """Three jobs at one point, two whose A/A holds 1.0 and one whose copy runs 10 % fast: the
    A/A line fails (the median run would pass and hide it), and each method's line carries
    its own run's check."""
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02, 1.98, 2.0, 2.01]
    runs = [
        _paired_rows(base, [t / 2 for t in base], aa=[t * 1.001 for t in base]).assign(run_id="a"),
        _paired_rows(base, [t / 1.9 for t in base], aa=[t / 1.1 for t in base]).assign(run_id="b"),
        _paired_rows(base, [t / 2.1 for t in base], aa=[t * 0.999 for t in base]).assign(run_id="c"),
    ]
    s = summarize_latency(pd.concat(runs, ignore_index=True)).set_index("method")
    assert s.loc["aa_check", "aa_speedup"] == pytest.approx(1.1) and not s.loc["aa_check", "aa_ok"]
    assert "A/A check failed: 1.100x" in s.loc["aa_check", "flags"]
    assert s.loc["x", "speedup"] == pytest.approx(2.0) and s.loc["x", "aa_speedup"] == pytest.approx(1 / 1.001)
    assert s.loc["x", "aa_ok"]  # x's median run is "a" (1.9x, 2.0x, 2.1x): its own run's check
    one = summarize_latency(runs[0]).set_index("method")  # one run: its check, as before
    assert one.loc["aa_check", "aa_speedup"] == pytest.approx(1 / 1.001) and one.loc["aa_check", "aa_ok"]


def test_the_ideal_per_engine_from_a_calibrated_speculator_rate(tmp_path, monkeypatch):
    """``engine_ideal=true`` (by default only where the speculator runs on another engine
    than the base: backend vllm): each point measures the speculator's FLOP rate and the
    summary gives the ideal at each engine's own rate, computed here by hand from the rows;
    the one-rate FLOP ideal stays beside it."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    job = _lat(tmp_path, "method=specprefill", "grid=[[1,192]]", "warmup=1", "iters=5", "engine_ideal=true")
    assert job.calibrates
    assert not _lat(tmp_path, "method=specprefill").calibrates  # auto on one engine: no calibration
    vllm_cfg = dataclasses.replace(_lat(tmp_path, "method=specprefill").cfg, backend="vllm")
    assert dataclasses.replace(job, cfg=vllm_cfg).calibrates  # auto with the base on vLLM
    rows = RunStore(lat.execute(job)).read()
    timed = rows[~rows["warmup"]]
    rate = timed["speculator_flop_rate"]
    assert rate.notna().all() and rate.nunique() == 1 and rate.iloc[0] > 0
    ref = timed[timed["method"] == "full"].set_index("iteration")
    sp = timed[timed["method"] == "specprefill"].set_index("iteration").loc[ref.index]
    assert (sp["flops_speculator"] > 0).all() and (sp["flops_speculator"] < sp["flops_method"]).all()
    base_rate = ref["flops_full"] / ref["ttft_s"]
    t = (sp["flops_method"] - sp["flops_speculator"]) / base_rate + sp["flops_speculator"] / sp["speculator_flop_rate"]
    s = summarize_latency(rows).set_index("method")
    assert s.loc["specprefill", "ideal_engine_speedup"] == pytest.approx(float(np.median(ref["ttft_s"] / t)))
    assert s.loc["specprefill", "ideal_speedup"] == pytest.approx(float(sp["ideal_speedup"].median()))
    e = s.loc["specprefill", "efficiency_engine"]
    assert e == pytest.approx(s.loc["specprefill", "speedup"] / s.loc["specprefill", "ideal_engine_speedup"])
    assert math.isnan(s.loc["aa_check", "ideal_engine_speedup"])  # the reference's work: one engine
    with pytest.raises(ValueError, match="engine_ideal='maybe'; allowed"):
        _lat(tmp_path, "engine_ideal=maybe")


@pytest.mark.parametrize("k", [1, 2, 3, 4, 12])
def test_iteration_order_balances_places_and_pairs(k):
    from harness.timing import iteration_order

    orders = [iteration_order(i, k, 2 * k) for i in range(2 * k)]
    assert all(sorted(o) == list(range(k)) for o in orders)
    for m in range(k):  # every method in every place equally often over 2k iterations
        assert sorted(o.index(m) for o in orders) == sorted(list(range(k)) * 2)
    for i in range(0, 2 * k, 2):  # each two consecutive iterations: every pair in both orders
        a, b = orders[i], orders[i + 1]
        for x in range(k):
            for y in range(x + 1, k):
                assert (a.index(x) < a.index(y)) != (b.index(x) < b.index(y))


@pytest.mark.parametrize("k,n", [(12, 10), (11, 10), (3, 10), (5, 10)])
def test_iteration_order_spreads_every_method_over_the_places_in_a_short_run(k, n):
    """Fewer iterations than places (an ``also=[...]`` job: 12 methods, 10 pairs): every
    method still spends as much time at the ends of an iteration as the others (mean distance
    from the nearest end within one place), so a slow first or last slot cannot read as a
    speedup. A rotation moving one place per two iterations left the reference at the ends
    (mean distance 1.2) and the middle methods in the middle (4.2), and fails this."""
    from harness.timing import iteration_order

    orders = [iteration_order(i, k, n) for i in range(n)]
    ends = [sum(min(o.index(j), k - 1 - o.index(j)) for o in orders) / n for j in range(k)]
    assert max(ends) - min(ends) <= 1.0, ends


def test_machine_load_sees_another_process_on_the_cores():
    """A CPU burner that is not this process's child (its parent shell exits at once) shows
    as foreign CPU while this process sleeps; without it, a sleep reads near zero."""
    import subprocess
    import sys
    import time

    from harness.timing import machine_load

    with machine_load() as quiet:
        time.sleep(0.6)
    burn = (
        f"{sys.executable} -c 'import time; t = time.time() + 3\nwhile time.time() < t: pass' >/dev/null 2>&1 & echo $!"
    )
    pid = int(subprocess.run(["sh", "-c", burn], capture_output=True, text=True, check=True).stdout.strip())
    try:
        time.sleep(0.3)
        with machine_load() as busy:
            time.sleep(1.0)
    finally:
        subprocess.run(["kill", str(pid)], check=False)
    assert busy["foreign_cpu"] > quiet["foreign_cpu"] + 0.25 and busy["foreign_cpu"] > 0.3
    assert busy["cpus"] >= 1 and busy["loadavg_1m"] is not None


def test_several_methods_share_one_reference_and_one_aa_check(tmp_path, monkeypatch):
    """``also=[...]``: more methods in the same iterations, each at the job's keep, beside one
    reference and one A/A check (a comparison of many methods costs one reference per
    iteration); each gets its paired speedup; the reference or a method twice is refused."""
    monkeypatch.chdir(tmp_path)
    job = _lat(tmp_path, "method=specprefill", "also=[truncate,random]", "grid=[[1,96]]", "warmup=1", "iters=4")
    assert [n for n, _ in job.timed] == ["full", "aa_check", "specprefill", "truncate", "random"]
    assert "truncate" in job.describe() and job.folder != _lat(tmp_path, "method=specprefill").folder
    rows = RunStore(lat.execute(job)).read()
    assert len(rows) == 5 * 5 and set(rows["keep_rate"].dropna()) == {0.3}
    for _, it in rows.groupby("iteration"):
        assert sorted(it["order"]) == [0, 1, 2, 3, 4]
    s = summarize_latency(rows).set_index("method")
    assert s.loc[["specprefill", "truncate", "random"], "pairs"].tolist() == [4, 4, 4]
    assert s.loc["truncate", "aa_speedup"] == s.loc["specprefill", "aa_speedup"]  # one A/A check serves all
    for bad, match in (("also=[full]", "names \\['full'\\] twice"), ("also=[specprefill]", "specprefill"),
                       ("also=[truncat]", "unknown method config 'truncat'")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            _lat(tmp_path, "method=specprefill", bad)


def test_variants_of_one_method_are_timed_side_by_side_and_labelled_apart(tmp_path, monkeypatch):
    """``also=[{name: specprefill, lookahead: 3}]``: the job's method and a variant of it in the
    same iterations, each its own row key and its own line, labelled by the option that
    differs (one run, one config hash: a label from the run alone would give both lines one
    name); an option the method does not take, or a variant equal to the method, is refused."""
    monkeypatch.chdir(tmp_path)
    job = _lat(tmp_path, "method=specprefill", "also=[{name:specprefill,lookahead:3}]", "grid=[[1,96]]",
               "warmup=0", "iters=5", "keep_tokens=32", "method.chunk_size=16")  # fmt: skip
    assert [(n, m.options()["lookahead"]) for n, m in job.timed[2:]] == [("specprefill", 1), ("specprefill", 3)]
    assert (
        job.timed[3][1].options()["keep_tokens"] == 32
    )  # the job's budget; the preset's chunks (32), not the method's
    rows = RunStore(lat.execute(job)).read()
    assert len(rows) == 4 * 5 and rows["row_key"].is_unique
    s = summarize_latency(rows).set_index("method")
    variants = [
        "specprefill (chunk_size=16, lookahead=1) (32 tokens)",
        "specprefill (chunk_size=32, lookahead=3) (32 tokens)",
    ]
    assert set(variants) <= set(s.index), s.index.tolist()
    assert (s.loc[[i for i in s.index if i.startswith("specprefill")], "pairs"] == 5).all()
    for bad, match in (
        ("also=[{name:specprefill,lookahed:3}]", r"sets \['lookahed'\], which 'specprefill' does not take; allowed: "),
        ("also=[{lookahead:3}]", "also entry .* is invalid; allowed: a conf/method name, or a mapping"),
        ("also=[{name:specprefill,keep_rate:0.5}]", "sets keep_rate beside a budget in tokens"),
        ("also=[{name:specprefill,chunk_size:16}]", "names \\['specprefill'\\] twice"),
    ):
        with pytest.raises(ValueError, match=match):
            _lat(tmp_path, "method=specprefill", "keep_tokens=32", "method.chunk_size=16", bad)


def test_text_rewriting_methods_time_on_benchmark_prompts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = _lat(tmp_path, "method=rag_bm25", "grid=[[2,1024]]", "warmup=0", "iters=1")
    assert job.prompt_source == "ruler/qa_1"
    rows = RunStore(lat.execute(job)).read()
    assert len(rows) == 3 and (rows["status"] == "ok").all() and set(rows["prompt_source"]) == {"ruler/qa_1"}
    rag = rows[rows["method"] == "rag_bm25"].iloc[0]
    assert 0.2 < rag["kept_fraction"] < 0.4 and math.isnan(rag["ideal_speedup"])
    assert "retriever_s" in rag["method_timings"] and rows["prompt_tokens"].between(900, 1024).all()
    with pytest.raises(ValueError, match=r"prompts=random: method\(s\) \['rag_bm25'\]"):
        _lat(tmp_path, "method=rag_bm25", "prompts=random")


def test_a_failing_method_is_a_failed_row_and_the_grid_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = []

    def boom(self, prompts, backend):
        calls.append(len(prompts))
        raise RuntimeError("out of memory")

    monkeypatch.setattr(SpecPrefill, "plan_batch", boom)
    folder = lat.execute(_lat(tmp_path, "method=specprefill", "grid=[[1,64],[1,96]]", "warmup=0", "iters=1"))
    rows = RunStore(folder).read()
    assert len(calls) == 2 and len(rows) == 6
    assert set(rows[rows["method"].isin(["full", "aa_check"])]["status"]) == {"ok"}
    failed = rows[rows["method"] == "specprefill"]
    assert set(failed["status"]) == {"failed"} and failed["error"].str.contains("out of memory").all()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    lat.execute(_lat(tmp_path, "method=specprefill", "grid=[[1,64],[1,96]]", "warmup=0", "iters=1"))
    assert set(RunStore(folder).read()["status"]) == {"ok"}  # failed points are measured again


def test_config_errors_name_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"grid point \[0, 96\]"):
        _lat(tmp_path, "grid=[[0,96]]")
    with pytest.raises(ValueError, match=r"keep=1\.5; allowed"):
        _lat(tmp_path, "keep=1.5")
    with pytest.raises(ValueError, match="beyond the model's context window"):
        _lat(tmp_path, "grid=[[1,10000000]]")
    with pytest.raises(ValueError, match="needs a speculator"):
        _lat(tmp_path, "model.speculator=null")
    with pytest.raises(ValueError, match="backend='sglang'"):
        _lat(tmp_path, "backend=sglang")
    with pytest.raises(ValueError, match=r"reference='fulll'; allowed: a conf/method name.*did you mean 'full'"):
        _lat(tmp_path, "reference=fulll")
    with pytest.raises(ValueError, match=r"config: unknown key\(s\) \['keeps'\]"):
        _lat(tmp_path, "+keeps=[0.1]")


def test_dry_run_plans_without_loading(monkeypatch, tmp_path):
    from harness.models import loading as models

    def boom(*a, **k):
        raise AssertionError("dry run loaded a model")

    monkeypatch.setattr(models, "_load", boom)
    monkeypatch.setattr(models, "load_tokenizer", boom)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="latency", overrides=["model=synth8b", "grid=[[4,131072],[128,4096]]"])
    text = lat.prepare(lat.LatencyConfig.from_hydra(cfg)).describe()
    assert "synth8b" in text and "batch=4 length=131072" in text and "batch=128 length=4096" in text
    assert "GiB" in text and "full {} vs specprefill" not in text and "specprefill" in text


def test_latency_prompts_come_from_any_registered_benchmark(tmp_path, monkeypatch):
    """LongBench (local fixtures) prompts a latency grid, cut to each point's length; a point
    its contexts cannot fill is a failed row naming the shortfall, and the grid goes on."""
    monkeypatch.chdir(tmp_path)
    data = Path(__file__).parent / "fixtures" / "longbench"
    common = ["method=rag_bm25", "prompt_benchmark=longbench", "prompt_task=hotpotqa", "warmup=0", "iters=1",
              f"prompt_options={{data_dir:{data}}}"]  # fmt: skip
    job = _lat(tmp_path, *common, "grid=[[1,192],[1,2048]]")
    assert job.prompt_source == f'longbench/hotpotqa {{"data_dir": "{data}"}}'
    rows = RunStore(lat.execute(job)).read().set_index(["unit", "method"])
    ok = rows.loc["b1-n192"]
    assert (ok["status"] == "ok").all() and (ok["prompt_tokens"] > 0.8 * (192 - 32)).all()
    assert (ok["prompt_tokens"] <= 192).all()  # middle-truncated to the point, not the model's window
    short = rows.loc["b1-n2048"]
    assert (short["status"] == "failed").all() and short["error"].str.contains("allowed: 1612..2048 tokens").all()
    with pytest.raises(ValueError, match="unknown benchmark 'longbenc'"):
        _lat(tmp_path, *common, "prompt_benchmark=longbenc", "grid=[[1,192]]")
    with pytest.raises(ValueError, match="unknown longbench task 'hotpot'"):
        _lat(tmp_path, *common, "prompt_task=hotpot", "grid=[[1,192]]")


def test_decode_tokens_time_decoding_beside_the_prefill_and_keep_old_identities(tmp_path, monkeypatch):
    """``decode_tokens=n``: every row also times n decode steps after its prefill (outside
    TTFT), the summary gives seconds per token and the end-to-end speedup; a run under the
    paired protocol never shares a folder with one timed before it (the reference always
    first); vLLM refuses decode_tokens."""
    monkeypatch.chdir(tmp_path)
    job = _lat(tmp_path, "method=specprefill", "grid=[[1,96]]", "warmup=0", "iters=2", "decode_tokens=3")
    before = _lat(tmp_path, "method=specprefill", "grid=[[1,96]]", "warmup=0", "iters=2").folder.name
    # "specprefill-e3717ecead47": this config's folder before the paired protocol (its rows: no order, no A/A)
    assert before != "specprefill-e3717ecead47" and before != job.folder.name
    rows = RunStore(lat.execute(job)).read()
    assert set(rows["decode_tokens"]) == {3} and (rows["decode_s"] > 0).all()
    s = summarize_latency(rows).set_index("method_name")
    assert s.loc["full", "e2e_speedup"] == 1.0 and s.loc["specprefill", "decode_s_per_token"] == pytest.approx(
        float((rows[rows["method"] == "specprefill"]["decode_s"] / 3).median())
    )
    # decode speed after the prefill, paired by iteration: the median of full's per-token time over the method's
    timed = rows[~rows["warmup"].astype(bool)].set_index(["method", "iteration"])["decode_s"]
    by_hand = (timed["full"] / timed["specprefill"]).median()
    assert s.loc["full", "decode_speedup"] == 1.0 and s.loc["specprefill", "decode_speedup"] == pytest.approx(by_hand)
    dataclasses.replace(job.cfg, backend="vllm")  # the vLLM backend times decoding through its engine's clock


def test_random_ids_for_a_cross_family_speculator_are_called_out(capsys):
    """Random ids decode to text another tokenizer splits into far more tokens than a real
    prompt's: a latency point timing such a pair on them says so (once, on stderr)."""
    from types import SimpleNamespace

    from harness.jobs.latency import RANDOM_CROSS_FAMILY, PromptSource

    job = SimpleNamespace(prompt_source="random", cfg=SimpleNamespace(seed=0))
    PromptSource(job, SimpleNamespace(speculator_tokenizer=object()), 1, 64)  # type: ignore[arg-type]
    assert RANDOM_CROSS_FAMILY in capsys.readouterr().err
    PromptSource(job, SimpleNamespace(speculator_tokenizer=None), 1, 64)  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""


def test_prompt_settings_that_random_ids_would_ignore_are_refused(tmp_path):
    """prompts=auto with methods that need no text times random ids: a prompt task, benchmark
    or options the command set would be silently unused, so they are refused in one line."""
    with pytest.raises(ValueError, match=r"^prompt_task=bogus: with prompts=auto these methods time on random"):
        _lat(tmp_path, "prompt_task=bogus")
    with pytest.raises(
        ValueError, match=r"^prompt_task=hotpotqa, prompt_benchmark=longbench: .*drop prompt_task, prompt_benchmark$"
    ):
        _lat(tmp_path, "prompt_benchmark=longbench", "prompt_task=hotpotqa")
    assert _lat(tmp_path, "prompt_task=qa_1").prompt_source == "random"  # the default, typed: nothing ignored
    # prompts=random said outright: the same (an unknown task was accepted and never read)
    with pytest.raises(ValueError, match=r"^prompt_task=nosuch: with prompts=random the methods time on random token"):
        _lat(tmp_path, "prompts=random", "prompt_task=nosuch")


def test_a_seed_that_benchmark_prompts_would_ignore_is_refused(tmp_path):
    """The seed draws random token ids only: where every point times benchmark prompts (the same
    samples for any seed) a seed other than the default is refused in one line, rather than
    hashed into a new folder for the same measurement; under random ids it is the run's seed."""
    grid = "grid=[[1,1024]]"
    with pytest.raises(
        ValueError, match=r"^seed=3: every point times ruler/qa_1 prompts .*allowed: drop seed \(its default, 0\)$"
    ):
        _lat(tmp_path, grid, "method=rag_bm25", "seed=3")  # needs text: benchmark prompts, no other choice
    with pytest.raises(ValueError, match=r"^seed=3: .*, or prompts=random to time on random token ids$"):
        _lat(tmp_path, grid, "prompts=benchmark", "seed=3")
    assert _lat(tmp_path, grid, "prompts=benchmark", "seed=0").prompt_source == "ruler/qa_1"  # the default, typed
    random_ids = [_lat(tmp_path, grid, f"seed={s}") for s in (0, 3)]
    assert [j.prompt_source for j in random_ids] == ["random", "random"]
    assert random_ids[0].folder != random_ids[1].folder  # there it draws other ids: another run
