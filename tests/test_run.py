"""The Hydra runner: validation before work, rows, resume, failures, summary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.jobs import eval as run_mod
from harness.jobs.eval import EvalConfig, execute, prepare
from harness.models.catalog import ModelConfig
from harness.models.loading import check_runnable
from harness.parquet import read_parquet

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _job(*overrides: str):
    return prepare(EvalConfig.from_hydra(_cfg(*overrides)))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["keep=1.5"], r"keep=1.5; allowed: a fraction in \(0, 1\]"),
        (["keep=0"], r"keep=0.0; allowed: a fraction in \(0, 1\]"),
        (["+foo=1"], r"config: unknown key\(s\) \['foo'\]"),
        (["+kep=0.3"], r"unknown key\(s\) \['kep'\].*did you mean 'keep' for 'kep'\?"),
        (["+benchmark.options.foo=1"], r"ruler: unknown option\(s\) \['foo'\]; allowed: \['vt_hops'\]"),
        (["benchmark.options.vt_hops=-1"], r"ruler: vt_hops=-1; allowed: null or an int in \[0, 20\]"),
        (["benchmark.options.vt_hops=8", "tasks=[qa_1]"], r"ruler: vt_hops=8 sets variable tracking's chain length"),
        (
            ["benchmark=longbench", "+benchmark.options.trunc=none"],
            r"longbench: unknown option\(s\) \['trunc'\]; allowed: \['truncation', 'data_dir', 'hub_id', 'revision'\]",
        ),
        (["+model.foo=1"], r"model config: unknown key\(s\) \['foo'\]"),
        (["tasks=[]"], r"tasks is empty; give task names, or tasks=all"),
        (["backend=sglang"], r"backend='sglang'; allowed: one of \['transformers', 'vllm'\]"),
        (
            ["tasks=[niah_single_1,nia_multikey_1]"],
            r"unknown ruler task 'nia_multikey_1'.*did you mean 'niah_multikey_1'",
        ),
        (["length=16384"], r"length=16384 is beyond the model's context window \(8192 tokens\)"),
        (["limit=0"], r"limit=0; allowed"),
        (["lookahead=0"], r"lookahead=0; allowed: an int >= 1"),
        (
            ["method.position_mode=shifted"],
            r"position_mode='shifted'; allowed: one of \['original', 'contiguous', 'spread', 'even_gaps'\]",
        ),
        (["+method.keep=0.3"], r"method 'specprefill' has no option\(s\) \['keep'\]"),
        (["method.name=specprefil"], r"unknown method 'specprefil'.*did you mean 'specprefill'"),
        (["model.speculator=null"], r"needs a speculator"),
    ],
)
def test_bad_config_is_rejected_before_any_work(overrides, match):
    with pytest.raises(ValueError, match=match):
        _job(*overrides)


def test_models_that_cannot_run_here_fail_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, match in (("llama405b", r"needs 8 GPUs"), ("llama8b", r"needs about [\d.]+ GiB|from the model hub")):
        cfg = EvalConfig.from_hydra(_cfg(f"model={name}")).model
        with pytest.raises(RuntimeError, match=match) as e:
            check_runnable(cfg)
        assert "smollm2-135m" in str(e.value)
    # A hub model given as a local folder is accepted.
    check_runnable(ModelConfig(name="local", source="hub", path=str(Path(__file__).parent), params_b=0.001))


def test_full_prefill_at_several_keeps_shares_one_run():
    a = _job("method=full", "keep=0.1")
    b = _job("method=full", "keep=0.5")
    c = _job("method=specprefill", "keep=0.1")
    d = _job("method=specprefill", "keep=0.5")
    assert a.folder == b.folder and c.folder != d.folder


@pytest.fixture
def tiny_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plots/ go under the test's folder
    out = tmp_path / "res"
    common = ["model=tiny-random", "length=1024", "tasks=[niah_single_1,vt]", "limit=2", f"out={out}"]
    return out, common


def test_end_to_end_rows_resume_and_failures(tiny_run, monkeypatch):
    out, common = tiny_run
    execute(_job("method=full", *common))
    folder = execute(_job("method=specprefill", "keep=0.3", *common))

    df = read_parquet(folder / "rows.parquet")
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    row = df.iloc[0]
    opts = json.loads(row["method_options"])
    assert row["method"] == "specprefill" and row["keep_rate"] == 0.3
    assert (opts["chunk_size"], opts["pool_kernel"]) == (32, 13)
    assert "pool_kernel" not in df  # the generic store names no method's options but the keep rate
    assert row["model_weights"] == "random" and row["benchmark_version"] == "ruler-1" and row["length"] == 1024
    # every deliberate difference from RULER's official generator, and the model's settings
    assert row["benchmark_notes"].startswith("bisect haystack search") and "niah keys" in row["benchmark_notes"]
    assert row["chat_template"] in (True, False) and row["model_seed"] == 0
    assert json.loads(row["method_options"])["position_mode"] == "original"
    assert 0.3 <= row["kept_fraction"] <= 0.45  # chunk mode rounds up to whole chunks
    assert row["ttft_s"] == pytest.approx(row["speculator_s"] + row["selection_s"] + row["base_prefill_s"])
    assert 0.0 <= row["needle_kept"] <= 1.0 and row["git_sha"] and row["hardware"]
    # a piece is kept whole only where all its tokens are: whole pieces never outnumber kept tokens
    assert (df["needle_whole"].between(0.0, 1.0) & (df["needle_whole"] <= df["needle_kept"] + 1e-9)).all()
    assert ((df["needle_whole"] == 1.0) == (df["needle_kept"] == 1.0)).all()
    assert df["needle_depth"].between(0.0, 1.0).all()  # where the evidence sits in the context, every task
    assert df["question_kept"].between(0.0, 1.0).all()  # every task has a question after its context
    # the machine's load over each sample's work (foreign_cpu None for a window under 0.25 s)
    assert (df["cpus"] >= 1).all() and df["loadavg_1m"].notna().all()
    assert df["foreign_cpu"].dropna().between(0.0, 1.0).all()
    assert set(df["weights_hash"]) == {"random-seed0"} and df["sample_hash"].str.fullmatch("[0-9a-f]{16}").all()
    assert df["sample_hash"].nunique() == 4  # four samples, four prompts
    assert "torch" in json.loads(row["versions"])
    summary = (out / "summary.md").read_text()
    assert "| tiny-random | ruler | 1024 | niah_single_1 | specprefill | 0.3 |" in summary
    assert (out / "plots" / "score_vs_keep.png").exists() and (out / "report.html").exists()

    # Resume: nothing is redone, nothing duplicated.
    calls = []
    real = run_mod.run_sample
    monkeypatch.setattr(run_mod, "run_sample", lambda *a, **k: calls.append(1) or real(*a, **k))
    execute(_job("method=specprefill", "keep=0.3", *common))
    assert calls == [] and len(read_parquet(folder / "rows.parquet")) == 4

    # A sample that raises is a failed row; the run goes on; a later run retries it.
    monkeypatch.setattr(run_mod, "run_sample", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    f2 = execute(_job("method=specprefill", "keep=0.5", *common))
    df2 = read_parquet(f2 / "rows.parquet")
    assert len(df2) == 4 and set(df2["status"]) == {"failed"} and "RuntimeError: boom" in df2.iloc[0]["error"]
    monkeypatch.setattr(run_mod, "run_sample", real)
    execute(_job("method=specprefill", "keep=0.5", *common))
    df3 = read_parquet(f2 / "rows.parquet")
    assert len(df3) == 4 and set(df3["status"]) == {"ok"}


def test_needle_helpers():
    import torch

    from harness.diagnostics import needle_kept, needle_tokens

    offsets = [(0, 3), (3, 5), (5, 9), (9, 12), (0, 0)]
    toks = needle_tokens(offsets, ((4, 10),))
    assert toks.tolist() == [1, 2, 3]
    assert needle_kept(torch.tensor([0, 2, 3]), toks) == pytest.approx(2 / 3)
    assert needle_kept(torch.tensor([0]), torch.tensor([], dtype=torch.int64)) is None


def test_pieces_whole_counts_the_spans_kept_to_their_last_token():
    """Two statements of a chain, four tokens each: keeping six of the eight tokens is 0.75 of
    the chain's tokens and, whichever six, at most one statement whole."""
    import torch

    from harness.diagnostics import needle_kept, needle_tokens, pieces_whole

    offsets = [(i, i + 1) for i in range(10)]  # one character a token
    spans = ((1, 5), (6, 10))  # tokens 1-4 and 6-9
    assert pieces_whole(torch.tensor([1, 2, 3, 4, 6, 7]), offsets, spans) == 0.5
    assert pieces_whole(torch.tensor([1, 2, 3, 6, 7, 8]), offsets, spans) == 0.0
    assert needle_kept(torch.tensor([1, 2, 3, 6, 7, 8]), needle_tokens(offsets, spans)) == 0.75
    assert pieces_whole(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), offsets, spans) == 1.0
    assert pieces_whole(None, offsets, spans) is None  # nothing maps back to the prompt
    assert pieces_whole(torch.tensor([1]), offsets, ()) is None  # no evidence to track
    assert pieces_whole(torch.tensor([1]), [(0, 0)] * 3, ((0, 2),)) is None  # a span over no token


def test_question_kept_counts_the_tokens_after_the_context():
    """A prompt ``<s>I: ctx ctx|Q? A:`` (head, instruction, context, question, tail, answer
    prefix), one character a token: the question span starts after the context and runs to the
    prompt's end, tail and answer prefix included."""
    import torch

    from harness.diagnostics import question_kept, question_span

    prompt = "<s>I: abcdefQ?|A:"
    span = question_span(prompt, "I: ", "abcdef", "Q?")
    assert span == (12, 17) and prompt[span[0] : span[1]] == "Q?|A:"
    offsets = [(i, i + 1) for i in range(len(prompt))]
    assert question_kept(torch.tensor([12, 13, 16]), offsets, span) == pytest.approx(3 / 5)
    assert question_kept(torch.arange(12), offsets, span) == 0.0  # the context kept, nothing after it
    assert question_kept(torch.arange(17), offsets, span) == 1.0
    assert question_kept(None, offsets, span) is None  # a rewritten text
    assert question_span(prompt, "I: ", "", "Q?") is None  # no context: nothing to place it after
    assert question_span(prompt, "I: ", "abcdef", "") is None  # no question
    assert question_span(prompt, "I: ", "abcdeX", "Q?") is None  # the parts are not in the prompt
    # the context's text repeated in the question does not move the span (found as one body)
    assert question_span("xx abc abc?", "xx ", "abc", " abc?") == (6, 11)


def test_hub_loading_code_runs_on_a_local_folder(tmp_path, smollm2_tokenizer):
    """The `source: hub` path (from_pretrained) exercised on local files, speculator included."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.models.loading import load

    cfg = LlamaConfig(
        vocab_size=len(smollm2_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
    )
    for name in ("base", "spec"):
        LlamaForCausalLM(cfg).save_pretrained(tmp_path / name)
        smollm2_tokenizer.save_pretrained(tmp_path / name)
    mc = ModelConfig(
        name="local-pair",
        source="hub",
        path=str(tmp_path / "base"),
        dtype="float32",
        max_context=2048,
        speculator=f"hub:{tmp_path / 'spec'}",
        params_b=0.001,
        weights="random",
    )
    lm = load(mc)
    assert lm.base.config.num_hidden_layers == 2 and lm.speculator is not None and lm.speculator is not lm.base
    assert lm.tokenizer("hello").input_ids == smollm2_tokenizer("hello").input_ids


@pytest.mark.parametrize("model", sorted(p.stem for p in (Path(CONF) / "model").glob("*.yaml")))
def test_every_model_config_is_valid(model):
    cfg = EvalConfig.from_hydra(_cfg(f"model={model}")).model
    assert cfg.name == model and cfg.max_context >= 4096


def yaml_name(stem: str) -> str:
    import yaml

    return str(yaml.safe_load((Path(CONF) / "method" / f"{stem}.yaml").read_text())["name"])


@pytest.mark.parametrize("method", sorted(p.stem for p in (Path(CONF) / "method").glob("*.yaml")))
def test_every_method_config_builds(method, monkeypatch):
    # as where the hub is reachable (offline, llmlingua2's hub-only classifier is refused before
    # anything loads: tests/test_failures.py)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("harness.hub._no_network", lambda *a, **k: None)
    job = _job(f"method={method}")
    assert job.method.name == yaml_name(method)


def test_max_new_tokens_cap_is_a_named_recorded_deviation():
    capped, official = _job("max_new=8"), _job()
    assert (
        capped.benchmark.options()["max_new_tokens_cap"] == 8
        and "max_new_tokens_cap" not in official.benchmark.options()
    )
    assert capped.folder != official.folder
    with pytest.raises(ValueError, match="max_new=0; allowed: null or an int >= 1"):
        _job("max_new=0")


def test_unsupported_methods_are_recorded_and_the_run_goes_on(tiny_run):
    from dataclasses import dataclass

    from specprefill.plan import Method, Unsupported, register_method

    @register_method("needs_gpu_probe")
    @dataclass(frozen=True)
    class NeedsGpu(Method):
        keep_rate: float = 0.3

        def plan(self, prompt, backend):
            raise Unsupported("needs_gpu_probe needs a CUDA GPU")

    _out, common = tiny_run

    job = prepare(
        EvalConfig.from_hydra(_cfg("method=full", "+method.keep_rate=0.3", "method.name=needs_gpu_probe", *common))
    )
    df = read_parquet(execute(job) / "rows.parquet")
    assert len(df) == 4 and set(df["status"]) == {"unsupported"}
    assert df.iloc[0]["error"].startswith("needs_gpu_probe needs a CUDA GPU (hardware: ")


def test_baseline_rows_record_scope_and_method_cost(tiny_run):

    _out, common = tiny_run
    df = read_parquet(execute(_job("method=rag_bm25", "keep=0.5", *common)) / "rows.parquet")
    assert set(df["status"]) == {"ok"} and set(df["scope"]) == {"query_aware_context"}
    assert all("retriever_s" in json.loads(t) for t in df["method_timings"])
    # vt's few-shot example sits in the (uncompressed) instruction, so at 1K tokens the
    # achieved keep can exceed the request: it is measured and recorded, not assumed.
    assert (df["ttft_s"] >= df["method_s"]).all() and df["kept_fraction"].between(0.3, 0.65).all()


def test_dry_run_prints_the_plan_and_resources_without_loading(monkeypatch, capsys):
    from harness.jobs.eval import main
    from harness.models import loading as models

    def boom(*a, **k):
        raise AssertionError("a dry run loaded a model")

    monkeypatch.setattr(models, "_load", boom)
    monkeypatch.setattr(models, "load_tokenizer", boom)
    main.__wrapped__(_cfg("model=llama405b", "backend=vllm", "dry_run=true"))  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "[dry run] llama405b specprefill" in out and "backend=vllm" in out
    assert "tensor_parallel 8, pipeline_parallel 1" in out and "needs 8 GPU(s)" in out and "base weights" in out


def test_run_identity_is_stable_across_added_model_fields():
    """Adding a model-config field must not orphan stored runs: fields added later are
    left out of the identity at their defaults (golden hashes of stored sweeps)."""
    from harness.config import LATER_MODEL_FIELDS, model_identity

    # Stored sweeps ran in bfloat16 (dtype: auto resolves to it on AMX CPUs and GPUs), with
    # the speculator that was the default then (self_layers:8).
    old = ("model.dtype=bfloat16", "model.speculator=self_layers:8")
    assert _job("method=full", *old).config_hash == "3d22664f151f"
    assert _job("method=specprefill", "keep=0.3", *old).config_hash == "c024a3517659"
    cfg = EvalConfig.from_hydra(_cfg()).model
    assert not set(LATER_MODEL_FIELDS) & set(model_identity(cfg))
    changed = dataclasses.replace(cfg, pipeline_parallel=2)
    assert model_identity(changed)["pipeline_parallel"] == 2


def test_vllm_plans_an_early_exit_speculator_beside_the_engine(capsys):
    """`backend=vllm` with `speculator: self_layers:M`: the engine serves the base, and the
    transformers copy of the base's first M layers speculates beside it."""
    from harness.jobs.eval import main

    assert _job("backend=vllm", "method=specprefill").cfg.backend == "vllm"
    main.__wrapped__(_cfg("model=tiny-random", "backend=vllm", "dry_run=true"))  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "backend=vllm" in out and "base on a vLLM engine" in out
    assert "speculator self_layers:1 on transformers beside it" in out


def test_tasks_all_means_every_task():
    assert len(_job("tasks=all").benchmark.tasks) == 13
    assert len(_job("tasks=[all]").benchmark.tasks) == 13
    assert _job("tasks=vt").benchmark.tasks == ("vt",)


def test_every_method_gets_the_same_decode_budget():
    """A method that re-numbers its kept tokens from 0 (next position K < N) must not get
    a longer answer than full prefill: the budget is counted after the whole prompt."""
    from harness.jobs.eval import decode_budget
    from harness.models.catalog import model_config
    from harness.types import Sample

    s = Sample(benchmark="b", task="t", sample_id=0, length=1, instruction="", context="", question="",
               answer_prefix="", prompt="p", references=(), max_new_tokens=1200, metric="m")  # fmt: skip
    model = model_config("smollm2-135m")  # 8192-token window
    assert decode_budget(s, 7500, model, None) == 692
    assert decode_budget(s, 100, model, None) == 1200
    assert decode_budget(s, 7500, model, 128) == 128
    assert decode_budget(s, 9000, model, None) == 1  # never below one token


def test_decode_budget_is_recorded_and_equal_across_position_modes(tiny_run, monkeypatch):

    from harness.benchmarks.base import Benchmark
    from harness.models.catalog import ModelConfig

    _out, common = tiny_run
    # A 950-token window under RULER's 1024-token samples (prompt + answer): the window,
    # not the benchmark, bounds the answer, and the kept prompt (~300 tokens) must not
    # free more room for truncate's re-numbered positions than for its original ones.
    monkeypatch.setattr(ModelConfig, "__post_init__", lambda self: object.__setattr__(self, "max_context", 950))
    monkeypatch.setattr(Benchmark, "check_model", lambda self, n: None)
    rows = [
        read_parquet(execute(_job("method=truncate", "keep=0.3", f"method.position_mode={m}", *common))
                        / "rows.parquet")
        for m in ("contiguous", "original")
    ]  # fmt: skip
    budgets = [dict(zip(r["task"] + r["sample_id"].astype(str), r["max_new_tokens"], strict=True)) for r in rows]
    assert budgets[0] == budgets[1] and all(v < 128 for k, v in budgets[0].items() if k.startswith("niah"))
    assert all((r["output_tokens"] <= r["max_new_tokens"]).all() for r in rows)


def test_multi_node_models_plan_ray_and_say_what_they_need(monkeypatch, capsys):
    from harness.jobs.eval import main
    from harness.models import loading as models
    from harness.models.catalog import model_config
    from harness.models.loading import check_runnable, vllm_engine_args

    main.__wrapped__(_cfg("model=llama405b-bf16-2node", "backend=vllm", "dry_run=true"))  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "tensor_parallel 8, pipeline_parallel 2" in out and "needs 16 GPU(s) on 2 nodes" in out
    cfg = model_config("llama405b-bf16-2node")
    args = vllm_engine_args(cfg)
    assert args["distributed_executor_backend"] == "ray" and args["pipeline_parallel_size"] == 2
    import torch

    with monkeypatch.context() as m:  # a one-node GPU run: vLLM's own executor choice (on CPU ranks: mp)
        m.setattr(torch.cuda, "is_available", lambda: True)
        assert "distributed_executor_backend" not in vllm_engine_args(model_config("llama70b"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: object())  # as if ray were installed
    with pytest.raises(RuntimeError, match=r"spans 2 nodes: RAY_ADDRESS is not set; start one \(`ray start --head`"):
        check_runnable(cfg)
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match=r"ray is not installed \(pip install -e '\.\[cluster\]'\)"):
        check_runnable(cfg)
    with pytest.raises(ValueError, match=r"only backend=vllm runs across nodes"):
        _job("model=llama405b-bf16-2node", "backend=transformers")
    with pytest.raises(ValueError, match=r"nodes=3 must divide pipeline_parallel=2"):
        model_config("llama405b-bf16-2node", nodes=3)


def test_slurm_launcher_config_resolves_the_models_gpus():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["hydra/launcher=slurm", "model=llama70b"], return_hydra_config=True
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.gpus_per_node == 8 and launcher.nodes == 1 and launcher.timeout_min == 1440


@pytest.mark.slow
def test_submitit_launcher_runs_sweep_points_as_jobs(tmp_path):
    """The submitit path end to end on this machine (hydra/launcher=local): each sweep
    point runs as its own submitit job (dry runs: nothing loads)."""
    import subprocess
    import sys

    out = tmp_path / "r"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.jobs.eval", "--multirun", "hydra/launcher=local", "method=full,specprefill",
         "keep=0.3", "dry_run=true", f"out={out}"],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = "".join(p.read_text() for p in out.rglob("*_log.out"))
    assert logs.count("[dry run] smollm2-135m") == 2, logs[-2000:]


def test_a_new_model_config_field_keeps_the_run_folders_of_earlier_runs(tmp_path):
    """Run identities are pinned to folders committed before later fields existed (here
    ``transport``, ``speculator_chunk``, ``nodes`` ...): a field at its default stays out of
    the identity, so earlier runs still resume. The folder is the committed kv comparison's."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model.dtype=bfloat16", "method=full", f"out={tmp_path}"])
    folder = prepare(EvalConfig.from_hydra(cfg)).folder
    assert folder.name == "full-082635776495"
    assert list(
        (Path(CONF).parent / "results" / "reference").glob(f"kv_compare*/smollm2-135m/ruler-4096/{folder.name}")
    )
