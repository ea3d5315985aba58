"""conf/paper/published.csv against the paper (Liu et al., "Speculative Prefill", ICML 2025)
and its OpenReview rebuttal: hand-typed values from each source, the counts of each table,
and the relations the sources themselves state between their numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

CSV = Path(__file__).resolve().parents[1] / "conf" / "paper" / "published.csv"
COLUMNS = ["source", "base", "speculator", "benchmark", "task", "method", "keep", "setting", "metric", "value", "note"]


@pytest.fixture(scope="module")
def pub() -> pd.DataFrame:
    return pd.read_csv(CSV, keep_default_na=False, na_values={"value": [""], "keep": [""]})


def one(pub, **where) -> float:
    d = pub
    for k, v in where.items():
        d = d[d[k] == v]
    assert len(d) == 1, (where, len(d))
    return float(d["value"].iloc[0])


def test_columns_and_types(pub):
    assert list(pub.columns) == COLUMNS
    assert pub["keep"].dropna().between(0, 1).all()
    assert not pub.duplicated(["source", "base", "benchmark", "task", "method", "keep", "setting", "metric"]).any()
    # a missing value is only allowed where the paper prints none, and says so
    assert (pub.loc[pub["value"].isna(), "note"] != "").all()


def test_counts_per_source(pub):
    counts = pub.groupby("source").size().to_dict()
    assert counts == {
        "abstract": 2,
        "figure 3": 21 + 4,  # 21 LongBench full-prefill scores, TTFT speedups at 4 keeps
        "figure 2": 3 * 4 * 2,  # 3 categories x (70B, SpecPrefill 70B, 405B, SpecPrefill 405B) x (QPS, score)
        "rebuttal: latency grid": 6 * 6,
        "LongBench category table (8B base, 3B speculator)": 4 * 7,
        "rebuttal: claims": 3,
    }


@pytest.mark.parametrize(
    ("task", "value"),
    [("narrativeqa", 33.32), ("multifieldqa_zh", 65.65), ("2wikimqa", 68.3), ("vcsum", 18.0),
     ("passage_retrieval_zh", 100.0), ("repobench-p", 75.74)],
)  # fmt: skip
def test_figure3_full_prefill_scores(pub, task, value):
    assert one(pub, source="figure 3", task=task, method="full", metric="score") == value


def test_figure3_speedups_and_abstract(pub):
    f3 = pub[(pub["source"] == "figure 3") & (pub["metric"] == "ttft_speedup")].sort_values("keep")
    assert list(f3["keep"]) == [0.1, 0.3, 0.5, 0.7] and list(f3["value"]) == [6.69, 2.75, 1.82, 1.33]
    assert one(pub, source="abstract", metric="ttft_speedup") == 7.66
    assert one(pub, source="abstract", metric="max_qps_speedup") == 7.0
    assert set(pub.loc[pub["source"] == "figure 3", "base"]) == {"meta-llama/Llama-3.1-405B-Instruct-FP8"}


def test_figure2_qps_table(pub):
    f2 = pub[pub["source"] == "figure 2"]
    q70 = "meta-llama/Llama-3.1-70B-Instruct"
    assert one(f2, base=q70, task="multi-doc QA", method="specprefill", metric="max_qps") == 4.6
    assert one(f2, base=q70, task="multi-doc QA", method="specprefill", metric="score") == 53.84
    assert (
        one(f2, task="few-shot", method="full", metric="score", base="meta-llama/Llama-3.1-405B-Instruct-FP8") == 67.68
    )
    out = f2[(f2["task"] == "summarization") & (f2["method"] == "full") & f2["base"].str.contains("405B")]
    assert out["value"].isna().all() and (out["note"] == "times out at every rate").all()
    # keep and timeout per category, as the figure's row labels give them
    spec = f2[f2["method"] == "specprefill"].drop_duplicates("task").set_index("task")
    assert spec.loc["multi-doc QA", "keep"] == 0.1 and spec.loc["multi-doc QA", "setting"] == "timeout=10s"
    assert spec.loc["few-shot", "keep"] == 0.3 and spec.loc["few-shot", "setting"] == "timeout=20s"
    assert spec.loc["summarization", "keep"] == 0.5 and spec.loc["summarization", "setting"] == "timeout=40s"
    # the abstract's "up to 7x QPS" is the figure's best SpecPrefill / full ratio (1.4 / 0.2, 405B)
    ratios = [
        one(f2, base=b, task=t, method="specprefill", metric="max_qps") / one(f2, base=b, task=t, method="full", metric="max_qps")
        for b in f2["base"].unique()
        for t in ("multi-doc QA", "few-shot")
    ]  # fmt: skip
    assert max(ratios) == pytest.approx(7.0)


def test_latency_grid_and_the_rebuttals_minference_claims(pub):
    g = pub[pub["source"] == "rebuttal: latency grid"]
    assert one(g, task="128x4096", method="full", metric="latency_s") == 22.64
    assert one(g, task="4x131072", method="minference", metric="latency_s") == 34.56
    assert one(g, task="16x32768", method="specprefill", keep=0.5, metric="latency_s") == 18.99
    # every grid point holds the same token total (the paper's constant-total grid)
    assert {int(b) * int(n) for b, n in g["task"].str.split("x")} == {128 * 4096}
    # "2.54x-6.54x lower latency than MInference": SpecPrefill 10 % over the grid
    mi = g[g["method"] == "minference"].set_index("task")["value"]
    sp = g[(g["method"] == "specprefill") & (g["keep"] == 0.1)].set_index("task")["value"]
    ratio = mi / sp
    claims = pub[pub["source"] == "rebuttal: claims"].set_index("metric")["value"]
    assert round(ratio.min(), 2) == claims["latency_reduction_min"] == 2.54
    assert round(ratio.max(), 2) == claims["latency_reduction_max"] == 6.54


def test_8b_category_table_average_is_the_mean_of_its_categories(pub):
    t = pub[pub["source"] == "LongBench category table (8B base, 3B speculator)"]
    assert one(t, method="full", task="Code", metric="score") == 59.64
    assert one(t, method="specprefill", keep=0.5, task="Synth", metric="score") == 63.30
    assert one(t, method="specprefill", keep=0.9, task="MQA", metric="score") == 41.46
    for _, g in t.groupby(["method", "keep"]):
        cats = g[g["task"] != "Avg"]["value"]
        assert len(cats) == 6 and round(float(np.mean(cats)), 2) == float(g[g["task"] == "Avg"]["value"].iloc[0])
