"""LongBench / LongBench-E: loading, official prompts, truncation, chat rule, scoring."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.benchmarks import longbench as lb
from harness.benchmarks.base import BenchmarkConfig

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"


@pytest.fixture(scope="module")
def tok(smollm2_info):
    return smollm2_info


def _bench(name: str = "longbench", **options):
    cls = lb.LongBench if name == "longbench" else lb.LongBenchE
    return cls(BenchmarkConfig(name=name, length=7500, limit=2, options={"data_dir": str(FIXTURES), **options}))


def test_tables_cover_the_21_and_13_datasets():
    assert len(lb.DATASETS) == 21 and len(lb.E_DATASETS) == 13 and set(lb.E_DATASETS) <= set(lb.DATASETS)
    for table in (lb.MAX_NEW_TOKENS, lb.METRIC, lb.CATEGORY):
        assert set(table) == set(lb.DATASETS)
    assert {lb.MAX_NEW_TOKENS[t] for t in ("hotpotqa", "2wikimqa", "musique", "triviaqa", "passage_count")} == {32}
    assert {lb.MAX_NEW_TOKENS[t] for t in ("gov_report", "qmsum", "multi_news", "vcsum")} == {512}
    assert sorted(set(lb.CATEGORY.values())) == [
        "code",
        "few-shot",
        "multi-doc QA",
        "single-doc QA",
        "summarization",
        "synthetic",
    ]


def test_every_task_loads_from_fixtures_with_official_prompt_and_chat_rule(tok):
    samples = _bench().samples(tok)
    assert {s.task for s in samples} == set(lb.DATASETS) and len(samples) == 42
    for s in samples:
        chat = s.task not in lb.NO_CHAT
        assert s.prompt.startswith(tok.fmt.head) == chat
        assert s.add_special_tokens == (not chat)
        body = s.instruction + s.context + s.question
        assert s.prompt == (tok.fmt.head + body + tok.fmt.tail if chat else body)
        assert s.max_new_tokens == lb.MAX_NEW_TOKENS[s.task] and s.metric == lb.METRIC[s.task]
        assert s.stop == (("\n",) if s.task == "samsum" else ())
        assert s.category == lb.CATEGORY[s.task]
    hq = next(s for s in samples if s.task == "hotpotqa")
    assert hq.instruction.startswith("Answer the question based on the given passages.")
    assert hq.question.endswith("Question: How long did Mara keep the lighthouse?\nAnswer:")
    trec = next(s for s in samples if s.task == "trec")
    assert trec.all_classes and "Numeric value" in trec.all_classes


def test_middle_truncation_is_the_official_rule(tok, smollm2_tokenizer):
    long_ctx = " ".join(f"word{i}" for i in range(3000))
    row = {"input": "What is it?", "context": long_ctx, "answers": ["x"], "length": 3000, "all_classes": None}
    s = lb.build_sample("hotpotqa", 0, row, tok, "middle", 500, "longbench", False)
    ids = smollm2_tokenizer(lb.PROMPTS["hotpotqa"].format(context=long_ctx, input="What is it?")).input_ids
    expected = smollm2_tokenizer.decode(ids[:250], skip_special_tokens=True) + smollm2_tokenizer.decode(
        ids[-250:], skip_special_tokens=True
    )
    assert s.instruction + s.context + s.question == expected
    assert s.instruction.startswith("Answer the question") and s.question.endswith("Question: What is it?\nAnswer:")
    assert abs(len(smollm2_tokenizer(expected).input_ids) - 500) <= 3
    # context_only keeps instruction and question whole and fits the budget
    c = lb.build_sample("hotpotqa", 0, row, tok, "context_only", 500, "longbench", False)
    assert c.instruction == s.instruction and c.question == s.question
    assert len(smollm2_tokenizer(c.instruction + c.context + c.question).input_ids) <= 503
    # none keeps everything; left keeps the end
    n = lb.build_sample("hotpotqa", 0, row, tok, "none", 500, "longbench", False)
    assert n.context == long_ctx
    left = lb.build_sample("hotpotqa", 0, row, tok, "left", 500, "longbench", False)
    body = left.instruction + left.context + left.question
    assert body.endswith("Question: What is it?\nAnswer:") and "word0 " not in body and left.instruction == ""


def test_longbench_e_buckets(tok):
    samples = _bench("longbench_e").samples(tok)
    assert {s.task for s in samples} == set(lb.E_DATASETS)
    assert {s.bucket for s in samples} == {"0-4k", "8k+"}
    assert lb.bucket(3999) == "0-4k" and lb.bucket(4000) == "4-8k" and lb.bucket(8000) == "8k+"


def test_scoring_is_x100_with_first_line(tok):
    b = _bench()
    samples = {s.task: s for s in b.samples(tok) if s.sample_id == 0}
    assert b.score(samples["trec"], "Numeric value\nEntity") == 100.0
    assert b.score(samples["passage_retrieval_en"], "Paragraph 2") == 100.0
    assert b.score(samples["passage_count"], "4") == 100.0
    assert b.score(samples["lcc"], "        return math.pi * self.radius ** 2") == 100.0


def test_missing_data_fails_with_dataset_revision_and_how_to_fix(tmp_path, monkeypatch, tok):
    with pytest.raises(FileNotFoundError, match=r"no narrativeqa\.jsonl / \.parquet in data_dir"):
        lb.LongBench(
            BenchmarkConfig(name="longbench", tasks=("narrativeqa",), options={"data_dir": str(tmp_path)})
        ).samples(tok)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    b = lb.LongBench(BenchmarkConfig(name="longbench", tasks=("qasper",)))
    with pytest.raises(
        RuntimeError,
        match=r"Xnhyacinth/LongBench \(config 'qasper', revision 2e9ade5.*data_dir=<folder> \(benchmark\.options\.data_dir\)",
    ):
        b.samples(tok)


def test_parquet_folders_load_too(tmp_path, tok):
    import pandas as pd

    from harness.benchmarks.sources import read_local

    rows = read_local(FIXTURES / "qasper.jsonl", 10)
    pd.DataFrame(rows).to_parquet(tmp_path / "qasper.parquet")
    b = lb.LongBench(BenchmarkConfig(name="longbench", tasks=("qasper",), limit=1, options={"data_dir": str(tmp_path)}))
    assert len(b.samples(tok)) == 1


def test_bad_options():
    with pytest.raises(ValueError, match="truncation='sides'"):
        _bench(truncation="sides")
    with pytest.raises(ValueError, match="unknown option"):
        _bench(trunc="middle")
    with pytest.raises(ValueError, match="did you mean 'hotpotqa'"):
        lb.LongBench(BenchmarkConfig(name="longbench", tasks=("hotpotq",)))
