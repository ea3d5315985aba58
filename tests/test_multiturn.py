"""Multi-turn SpecPrefill: attention by position in the conversation cache, every policy equal to
full prefill at keep 1.0, the conversation benchmark's turns, and the eval job's per-turn rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.analysis.folder import analyze_rows
from harness.parquet import read_parquet
from harness.registry import build_method
from specprefill.backends.transformers import TransformersBackend, position_mask
from specprefill.conversation import ConversationRun, check_multiturn
from specprefill.plan import Prompt, full_plan
from tests.conftest import CharTokenizer

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_position_mask_by_position_and_its_causal_fast_form():
    cached = torch.tensor([0, 1, 2, 8, 9])
    m = position_mask(cached, torch.tensor([4, 10]), torch.float32)[0, 0]  # [2, 7]
    allowed = m == 0
    # position 4 sees 0, 1, 2 and itself, not 8 / 9 (held, later) nor 10 (new, later)
    assert allowed[0].tolist() == [True, True, True, False, False, True, False]
    assert allowed[1].tolist() == [True] * 7
    assert float(m[0, 3]) == torch.finfo(torch.float32).min
    fast = position_mask(cached, torch.tensor([10, 11, 12]), torch.float32)  # after the cache, in order
    assert fast.shape == (1, 8) and bool((fast == 1).all())


def _cache_kv(cache, layer: int, index: int):
    lay = cache.layers[layer]
    return lay.keys[0, :, index], lay.values[0, :, index]


def test_revived_tokens_attend_only_to_earlier_positions(tiny_llama):
    """Positions 0-9 and 20-29 held; 12 and 15 revived with two new tokens: each revived token's
    KV (past the first layer, where attention has acted) equals a fresh prefill of exactly the
    held tokens before it, itself and the revived one before it. A mask blind to positions lets
    12 and 15 see 20-29 and fails this."""
    torch.manual_seed(1)
    seq = torch.randint(0, 97, (42,))
    be = TransformersBackend(tiny_llama, CharTokenizer())
    conv = be.open_conversation()
    first = torch.cat([torch.arange(10), torch.arange(20, 30)])
    be.conversation_turn(conv, seq[first], first, 30, max_new_tokens=1)
    revive = torch.tensor([12, 15, 40, 41])
    gen = be.conversation_turn(conv, seq[revive], revive, 42, max_new_tokens=1)
    assert conv.positions.tolist() == [*first.tolist(), 12, 15, 40, 41]
    assert int(conv.cache.get_seq_length()) == 24  # no decoded token left behind
    ref_pos = torch.tensor([*range(10), 12, 15])
    ref = tiny_llama(
        input_ids=seq[ref_pos].unsqueeze(0), position_ids=ref_pos.unsqueeze(0), use_cache=True
    ).past_key_values
    for layer in (1, 2):
        for at_conv, at_ref in ((20, 10), (21, 11)):  # 12 and 15 in the conversation cache / the reference
            k, v = _cache_kv(conv.cache, layer, at_conv)
            rk, rv = _cache_kv(ref, layer, at_ref)
            torch.testing.assert_close(k, rk, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v, rv, rtol=1e-4, atol=1e-5)
    # the new tokens see everything held and revived: the last one's logits are a full prefill's
    # of those tokens in that cache order
    assert gen.first_logits is not None and torch.isfinite(gen.first_logits).all()


def test_the_speculator_reads_each_segment_once_and_scores_the_whole_conversation(tiny_llama):
    """Extending the speculator's conversation cache segment by segment captures what one
    speculation over the whole conversation captures (queries of the last token and the
    look-ahead, keys of every token); the look-ahead tokens leave the cache."""
    torch.manual_seed(4)
    ids = torch.randint(0, 97, (50,))
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama, prefill_chunk=7)
    conv = be.open_conversation()
    be.speculate_conversation(conv, ids[:30], 3)
    assert int(conv.speculator_cache.get_seq_length()) == 30
    cap = be.speculate_conversation(conv, ids[30:], 3)
    whole = be.speculate(ids, 3)
    assert cap.keys.shape == whole.keys.shape == (3, 2, 50, 16) and cap.lookahead_ids == whole.lookahead_ids
    torch.testing.assert_close(cap.keys, whole.keys, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cap.queries, whole.queries, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"a batch of 2 prompts with an existing cache; allowed: one prompt"):
        be._capture_batch(tiny_llama, [ids[:3], ids[:4]], 2, conv.speculator_cache)


def _run(method_name: str, be, turns: list[torch.Tensor], **options) -> list[tuple[list[int], torch.Tensor]]:
    method = build_method(method_name, options)
    run = ConversationRun(method, be)
    out, new = [], turns[0]
    for i in range(len(turns)):
        if i:
            new = torch.cat([run.answer(), turns[i]])
        res = run.turn(new, max_new_tokens=4)
        out.append((res.generation.token_ids, res.generation.first_logits))
    return out


def _same(a, b, what: str) -> None:
    """Every turn decodes the same tokens, from the same first logits (float error only)."""
    assert [t for t, _ in a] == [t for t, _ in b], what
    for (_, la), (_, lb) in zip(a, b, strict=True):
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4, msg=what)


def test_keep_one_every_policy_is_full_prefill_token_for_token(tiny_llama):
    torch.manual_seed(2)
    turns = [torch.randint(0, 97, (70,)), torch.randint(0, 97, (6,)), torch.randint(0, 97, (5,))]
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    reference = _run("full", be, turns)
    # full prefill from scratch of each turn's whole conversation, as a single-turn run would
    conv, scratch = torch.zeros(0, dtype=torch.int64), []
    for i, t in enumerate(turns):
        conv = torch.cat([conv, t]) if i == 0 else torch.cat([conv, torch.tensor(scratch[-1][0]), t])
        g = be.generate(full_plan(Prompt(conv)), 4)
        scratch.append((g.token_ids, g.first_logits))
    _same(reference, scratch, "prefix cache vs from scratch")
    opts = dict(keep_rate=1.0, lookahead=2, pool_kernel=3, chunk_size=4)
    for name in ("specprefill", "specprefill_frozen", "specprefill_revival"):
        _same(_run(name, be, turns, **opts), reference, name)


def test_policies_hold_what_they_say_at_low_keep(tiny_llama):
    """At keep 0.25: frozen holds turn 1's selection plus each new segment, revival holds a
    superset of frozen's growth (revived tokens come from before the new segment), reselect
    keeps a quarter of the whole conversation each turn."""
    torch.manual_seed(3)
    turns = [torch.randint(0, 97, (80,)), torch.randint(0, 97, (6,)), torch.randint(0, 97, (6,))]
    be = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    opts = dict(keep_rate=0.25, lookahead=2, pool_kernel=None, chunk_size=None)
    results = {}
    for name in ("specprefill", "specprefill_frozen", "specprefill_revival"):
        run = ConversationRun(build_method(name, opts), be)
        new, rs = turns[0], []
        for i in range(3):
            if i:
                new = torch.cat([run.answer(), turns[i]])
            before = int(run.ids.numel())
            res = run.turn(new, max_new_tokens=3)
            rs.append((before, res))
        results[name] = rs
    for _, r in results["specprefill"]:
        assert r.prefilled == -(-r.prompt_tokens // 4) and r.revived == 0
    fz = results["specprefill_frozen"]
    assert fz[0][1].prefilled == 20
    for (before, r), (_, prev) in zip(fz[1:], fz[:-1], strict=True):
        assert r.prefilled == r.prompt_tokens - before and r.revived == 0
        assert r.held.tolist() == sorted(prev.held.tolist() + list(range(before, r.prompt_tokens)))
    rv = results["specprefill_revival"]
    assert rv[0][1].held.tolist() == fz[0][1].held.tolist()  # turn 1 is SpecPrefill's selection
    for (before, r), (_, prev) in zip(rv[1:], rv[:-1], strict=True):
        new_seg = r.prompt_tokens - before
        assert r.prefilled == r.revived + new_seg and r.revived > 0
        revived = sorted(set(r.held.tolist()) - set(prev.held.tolist()) - set(range(before, r.prompt_tokens)))
        assert len(revived) == r.revived and all(p < before for p in revived)


def test_refusals_name_what_is_allowed():
    with pytest.raises(ValueError, match=r"method 'truncate' has no multi-turn form; allowed .*specprefill_revival"):
        check_multiturn(build_method("truncate", {"keep_rate": 0.5}), "transformers")
    with pytest.raises(ValueError, match=r"backend='vllm' on a multi-turn benchmark.*allowed: backend=transformers"):
        check_multiturn(build_method("specprefill_revival", {}), "vllm")
    with pytest.raises(ValueError, match=r"position_mode='contiguous'.*allowed: position_mode=original"):
        check_multiturn(build_method("specprefill_frozen", {"position_mode": "contiguous"}), "transformers")
    check_multiturn(build_method("specprefill", {"position_mode": "contiguous"}), "transformers")  # reselect: fine
    with pytest.raises(ValueError, match=r"max_gap=8: a conversation keeps tokens .*allowed: max_gap=null"):
        check_multiturn(build_method("specprefill_revival", {"max_gap": 8}), "transformers")
    check_multiturn(build_method("specprefill", {"max_gap": 8}), "transformers")  # reselect: fine
    with pytest.raises(ValueError, match=r"random_fill=8: a conversation keeps tokens .*allowed: random_fill=null"):
        check_multiturn(build_method("specprefill_frozen", {"random_fill": 8}), "transformers")
    check_multiturn(build_method("specprefill", {"random_fill": 8}), "transformers")  # reselect: fine
    with pytest.raises(ValueError, match=r"gap_scale=0.5: a conversation keeps tokens .*allowed: gap_scale=null"):
        check_multiturn(build_method("specprefill_frozen", {"gap_scale": 0.5}), "transformers")


def _sample(fmt):
    from harness.types import Sample

    needles = [
        "One of the special magic numbers for sour-mouse is: 1111111.",
        "One of the special magic numbers for tall-river is: 2222222.",
        "One of the special magic numbers for green-hat is: 3333333.",
        "One of the special magic numbers for odd-cloud is: 4444444.",
    ]
    context = " filler text. ".join(needles)
    instruction = "A special magic number is hidden within the following text.\n"
    question = "\nWhat is the special magic number for green-hat mentioned in the provided text?"
    prefix = " The special magic number for green-hat mentioned in the provided text is"
    prompt = fmt.wrap(instruction, context, question, prefix)
    at = prompt.index(context)
    spans = [(at + context.index(n), at + context.index(n) + len(n)) for n in needles]
    return Sample("multiturn", "niah_keys", 0, 1024, instruction, context, question, prefix, prompt, ("3333333",),
                  128, "string_match_all", (spans[2],), distractor_spans=(spans[0], spans[1], spans[3]))  # fmt: skip


def test_turns_ask_each_key_once_after_the_chat_template(smollm2_info):
    from harness.benchmarks.base import BenchmarkConfig
    from harness.benchmarks.shared_context import MultiTurn, chat_pieces

    between, after = chat_pieces(smollm2_info.tokenizer, True)
    assert between.startswith("<|im_end|>") and "<|im_start|>user" in between
    assert after == smollm2_info.fmt.tail
    bench = MultiTurn(BenchmarkConfig(name="multiturn", length=1024, options={"turns": 4, "key_order": "document"}))
    bench._pieces = (between, after)
    sample = _sample(smollm2_info.fmt)
    turns = bench.turns(sample)
    assert [t.key for t in turns] == ["green-hat", "sour-mouse", "tall-river", "odd-cloud"]
    assert [t.needle for t in turns] == [3, 1, 2, 4]
    assert [t.references for t in turns] == [("3333333",), ("1111111",), ("2222222",), ("4444444",)]
    assert turns[0].text == "" and turns[0].spans == sample.spans
    assert turns[1].text == (
        between + "What is the special magic number for sour-mouse mentioned in the provided text?" + after
        + " The special magic number for sour-mouse mentioned in the provided text is"
    )  # fmt: skip
    assert [sample.prompt[a:b] for t in turns for a, b in t.spans][1].endswith("1111111.")
    assert bench.score_turn(sample, turns[1], " 1111111.") == 100.0 and bench.score_turn(sample, turns[1], "3") == 0
    with pytest.raises(ValueError, match=r"turns=5; allowed: an int in \[2, 4\] \(one per needle key\)"):
        MultiTurn(BenchmarkConfig(name="multiturn", length=1024, options={"turns": 5}))


def test_later_keys_are_shuffled_per_conversation_and_recorded(smollm2_info):
    """The default key order draws the later turns' keys per conversation (a stable seed of
    task and sample id): turn 1 stays RULER's question, the later turns are a permutation of
    the other keys, the same in every call, different across conversations, and over
    conversations each needle is asked at every later turn (turn and depth not confounded);
    a bad key order is refused naming the allowed ones."""
    from dataclasses import replace

    from harness.benchmarks.base import BenchmarkConfig
    from harness.benchmarks.shared_context import MultiTurn

    bench = MultiTurn(BenchmarkConfig(name="multiturn", length=1024, options={}))
    assert bench.options()["key_order"] == "shuffled"
    sample = _sample(smollm2_info.fmt)
    orders = []
    for i in range(24):
        turns = bench.turns(replace(sample, sample_id=i))
        assert turns[0].key == "green-hat" and turns[0].needle == 3
        assert sorted(t.key for t in turns[1:]) == ["odd-cloud", "sour-mouse", "tall-river"]
        assert [t.needle for t in turns] == [{"sour-mouse": 1, "tall-river": 2, "green-hat": 3, "odd-cloud": 4}[t.key]
                                             for t in turns]  # fmt: skip
        assert [t.key for t in bench.turns(replace(sample, sample_id=i))] == [t.key for t in turns]
        orders.append(tuple(t.needle for t in turns[1:]))
    assert len(set(orders)) >= 4  # not one fixed order
    for turn in range(3):  # every later needle is asked at every later turn in some conversation
        assert {o[turn] for o in orders} == {1, 2, 4}
    with pytest.raises(ValueError, match=r"key_order='random'; allowed: one of \['shuffled', 'document'\]"):
        MultiTurn(BenchmarkConfig(name="multiturn", length=1024, options={"key_order": "random"}))


def test_pooled_turns_resample_whole_conversations():
    """A conversation's four turns are one sample: with every turn scoring what turn 1 scores,
    ALL (the mean over turns) has exactly turn 1's interval and n counts conversations; turns
    resampled as independent samples would give a narrower one. The estimator is the Poisson
    bootstrap keyed by conversation id, computed here by hand."""
    import numpy as np

    from harness.analysis.quality import summarize
    from harness.analysis.stats import RESAMPLES, cluster_mean_draws

    rng = np.random.default_rng(5)
    scores = rng.choice([0.0, 100.0], size=30)
    rows = pd.DataFrame([
        {"kind": "eval", "status": "ok", "model": "m", "benchmark": "multiturn", "length": 1024, "task": "niah_keys",
         "sample_id": i, "turn": t, "method": "full", "reference_method": "full", "keep_rate": None, "score": sc,
         "ttft_s": 1.0, "hardware": "h", "dtype": "float32", "backend": "transformers", "speculator": "",
         "method_options": "{}", "benchmark_options": "{}", "category": None, "bucket": None, "run_id": "r"}
        for i, sc in enumerate(scores) for t in (1, 2, 3, 4)
    ])  # fmt: skip
    s = summarize(rows).set_index("task")
    assert s.loc["ALL", "n"] == 30 and s.loc["niah_keys/turn1", "n"] == 30
    assert (
        s.loc["ALL", ["score_lo", "score_hi"]].tolist() == s.loc["niah_keys/turn1", ["score_lo", "score_hi"]].tolist()
    )
    assert s.loc["niah_keys/turn1", "score_hi"] - s.loc["niah_keys/turn1", "score_lo"] > 25  # n = 30, not 120
    ids = list(range(30))
    w = np.stack([np.random.default_rng([7, i]).poisson(1.0, RESAMPLES) for i in ids], axis=1)
    assert np.allclose(cluster_mean_draws(scores, ids, 7), (w @ scores) / w.sum(axis=1))
    with_gap = scores.copy()
    with_gap[3] = np.nan  # a conversation without this turn weighs nothing in it
    w[:, 3] = 0
    assert np.allclose(cluster_mean_draws(with_gap, ids, 7), (w @ np.nan_to_num(with_gap)) / w.sum(axis=1))


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_eval_writes_one_row_per_turn_and_resumes(tmp_path, monkeypatch):
    from harness.analysis.quality import summarize
    from harness.jobs.eval import EvalConfig, execute, prepare

    monkeypatch.chdir(tmp_path)
    common = ["model=tiny-random", "benchmark=multiturn", "length=1024", "limit=2", "max_new=4", f"out={tmp_path}"]
    with pytest.raises(ValueError, match="has no multi-turn form"):
        prepare(EvalConfig.from_hydra(_cfg("method=truncate", "keep=0.5", *common)))
    execute(prepare(EvalConfig.from_hydra(_cfg("method=full", *common))))
    job = prepare(EvalConfig.from_hydra(_cfg("method=specprefill_revival", "keep=0.1", *common)))
    folder = execute(job)
    df = read_parquet(folder / "rows.parquet").sort_values("row_key")
    assert len(df) == 8 and set(df["status"]) == {"ok"}
    assert df["row_key"].tolist()[:4] == [f"niah_keys/0/turn{k}" for k in range(1, 5)]
    assert set(df["unit"]) == {"niah_keys/0", "niah_keys/1"} and set(df["turn_policy"]) == {"revival"}
    first = df[df["turn"] == 1]
    assert (first["revived_tokens"] == 0).all() and (first["prefilled_tokens"] == first["kept_tokens"]).all()
    for _, conv in df.groupby("unit"):
        assert conv["prompt_tokens"].is_monotonic_increasing and conv["kept_tokens"].is_monotonic_increasing
    later = df[df["turn"] > 1]
    assert (later["prefilled_tokens"] >= later["revived_tokens"]).all() and (later["revived_tokens"] > 0).any()
    # revival keeps the speculator's cache of the whole conversation: recorded, growing, counted in memory
    assert (df["speculator_kv_bytes"] > 0).all()
    for _, conv in df.groupby("unit"):
        assert conv.sort_values("turn")["speculator_kv_bytes"].is_monotonic_increasing
    for _, conv in df.groupby("unit"):
        assert sorted(conv["turn_needle"]) == [1, 2, 3, 4]  # every needle asked once, its place recorded
    assert execute(job) == folder and len(read_parquet(folder / "rows.parquet")) == 8  # resumed: nothing added
    rows = pd.concat([read_parquet(p) for p in tmp_path.rglob("rows.parquet")])
    s = summarize(rows)
    tasks = set(s[s["method"] == "specprefill_revival"]["task"])
    assert {f"niah_keys/turn{k}" for k in range(1, 5)} <= tasks
    per_turn = s[(s["method"] == "specprefill_revival") & s["task"].str.contains("/turn")]
    assert per_turn["n"].tolist() == [2, 2, 2, 2]  # each turn its own task, both conversations
    t4 = df[df["turn"] == 4]
    held = ((t4["kv_bytes"] + t4["speculator_kv_bytes"]).mean()) / 2**20
    assert per_turn.set_index("task").loc["niah_keys/turn4", "kv_mib"] == pytest.approx(held)
    assert s.loc[(s["method"] == "full") & (s["task"] == "niah_keys/turn4"), "speculator_kv_mib"].iloc[0] == 0
    full4 = pd.concat([read_parquet(p) for p in tmp_path.rglob("rows.parquet")])
    full4 = full4[(full4["method"] == "full") & (full4["turn"] == 4)]
    ratio = per_turn.set_index("task").loc["niah_keys/turn4", "kv_memory_ratio"]
    assert ratio == pytest.approx((t4["kv_bytes"] + t4["speculator_kv_bytes"]).sum() / full4["kv_bytes"].sum())
    from harness.rendering import plots
    from harness.studies import multiturn as study

    df = study.table(analyze_rows(None, rows))
    assert df[["turn", "method"]].values.tolist()[:2] == [[1, "full"], [1, "specprefill_revival"]]
    assert len(df) == 8 and (df[df["method"] == "full"]["prefilled_tokens"].iloc[1:] < 200).all()
    md = study.markdown(df)
    assert "| 2 | KV revival | 0.1 | 2 |" in md and "| 1 | prefix cache (full prefill) | - | 2 |" in md
    assert plots.by_turn(s, tmp_path / "by_turn.png").stat().st_size > 10_000


def test_policies_run_turn_by_turn_in_one_job_side_by_side(tmp_path, monkeypatch):
    """``also=[...]`` on a multi-turn benchmark: one job runs every policy turn by turn on the
    same conversations, in an order turned over from turn to turn (recorded), each policy
    following its own answers exactly as it does alone; the summary pairs each policy with
    that job's own full prefill and calls its speedup side by side. A single-turn benchmark
    refuses ``also`` (make latency times single-turn methods side by side)."""
    from harness.analysis.quality import summarize
    from harness.jobs.eval import EvalConfig, execute, prepare

    monkeypatch.chdir(tmp_path)
    common = ["model=tiny-random", "benchmark=multiturn", "length=1024", "limit=2", "max_new=4"]
    policies = ["specprefill_frozen", "specprefill_revival"]
    job = prepare(EvalConfig.from_hydra(_cfg("method=full", f"also=[{','.join(policies)}]", "keep=0.25", *common,
                                            f"out={tmp_path / 'together'}")))  # fmt: skip
    assert "specprefill_revival" in job.describe()
    df = read_parquet(execute(job) / "rows.parquet")
    assert len(df) == 2 * 4 * 3 and set(df["status"]) == {"ok"} and set(df["method"]) == {"full", *policies}
    for _, turn in df.groupby(["unit", "turn"]):
        assert sorted(turn["order"]) == [0, 1, 2]
    assert set(df.loc[df["order"] == 0, "method"]) == {"full", *policies}  # each runs first on some turn
    alone = execute(prepare(EvalConfig.from_hydra(_cfg("method=specprefill_revival", "keep=0.25", *common,
                                                      f"out={tmp_path / 'alone'}"))))  # fmt: skip
    one = read_parquet(alone / "rows.parquet").sort_values(["unit", "turn"])
    rev = df[df["method"] == "specprefill_revival"].sort_values(["unit", "turn"])
    assert rev["prediction"].tolist() == one["prediction"].tolist()  # interleaving changes no policy's work
    assert rev["kept_tokens"].tolist() == one["kept_tokens"].tolist()
    s = summarize(df)
    later = s[(s["method"] == "specprefill_revival") & s["task"].str.contains("/turn")]
    # (", loaded" where the machine had other work while the job ran: test_report's to check)
    assert {t.split(",")[0] for t in later["speedup_timing"]} == {"side by side"} and later["speedup"].notna().all()
    from harness.studies import multiturn as study

    diff = study.differences(analyze_rows(None, df)).set_index(["candidate", "baseline", "turn"])
    one = diff.loc[("specprefill_revival", "specprefill_frozen", "turn3")]
    by_conv = rev.set_index(["unit", "turn"])["score"] - df[df["method"] == "specprefill_frozen"].set_index(
        ["unit", "turn"])["score"]  # fmt: skip
    t3 = by_conv.xs(3, level="turn")
    assert one["difference"] == pytest.approx(t3.mean()) and one["n"] == 2
    assert (one["wins"], one["losses"]) == (int((t3 > 0).sum()), int((t3 < 0).sum()))
    pooled = diff.loc[("specprefill_revival", "specprefill_frozen", "turns 2+")]
    assert pooled["difference"] == pytest.approx(by_conv[by_conv.index.get_level_values("turn") > 1].mean())
    depth = study.by_depth(analyze_rows(None, df))
    assert set(depth["method"]) == {"full", *policies} and (depth.groupby("method")["turns"].sum() == 2 * 3).all()
    assert "| KV revival | 0.25 |" in study.depth_markdown(depth) and "turns 2+" in study.differences_markdown(
        study.differences(analyze_rows(None, df)))  # fmt: skip
    assert set(s.loc[s["method"] == "full", "speedup_timing"]) == {""}
    between = summarize(pd.concat([read_parquet(p) for p in (tmp_path / "alone").rglob("rows.parquet")]
                                  + [df[df["method"] == "full"]]))  # fmt: skip
    timing = between.loc[between["method"] == "specprefill_revival", "speedup_timing"]
    assert {t.split(",")[0] for t in timing} == {"between runs"}
    with pytest.raises(ValueError, match="names a method twice"):
        prepare(EvalConfig.from_hydra(_cfg("method=full", "also=[full]", *common, f"out={tmp_path}")))
