"""Break-even lengths (harness/analysis/speed.py ``break_even``): on constructed latency
summaries, each value worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.speed import break_even
from harness.rendering.plots import speedup_vs_length
from harness.rendering.tables import break_even_lines, decode_notes, latency_markdown

LENGTHS = [1024, 2048, 4096, 8192]


def _line(keep: float, lo: list[float], ideal: list[float], lengths: list[int] = LENGTHS) -> list[dict]:
    return [
        {"model": "m", "backend": "transformers", "dtype": "float32", "prompt_source": "random", "method": "specprefill",
         "method_name": "specprefill", "keep_rate": keep, "length": n, "batch": 1, "speedup": v + 0.1,
         "speedup_lo": v, "speedup_hi": v + 0.2, "ideal_speedup": i, "is_reference": False, "reference": "full",
         "n": 10}
        for n, v, i in zip(lengths, lo, ideal, strict=True)
    ]  # fmt: skip


@pytest.fixture
def lat() -> pd.DataFrame:
    ref = [{**r, "method": "full", "method_name": "full", "keep_rate": math.nan, "is_reference": True}
           for r in _line(1.0, [1.0] * 4, [1.0] * 4)]  # fmt: skip
    return pd.DataFrame([
        *ref,
        *_line(0.1, [0.8, 0.9, 1.2, 1.5], [0.9, 1.1, 1.3, 1.6]),  # crosses between 2048 and 4096
        *_line(0.3, [0.5, 0.6, 0.7, 0.9], [0.7, 0.8, 0.9, 0.95]),  # never
        *_line(0.5, [1.1, 1.2, 1.3, 1.4], [1.2, 1.3, 1.4, 1.5]),  # already at the shortest
        *_line(0.7, [0.9, 1.1, 0.95, 1.2], [1.0, 1.05, 1.1, 1.2]),  # up, down, up
        *_line(0.9, [1.5], [1.5], [4096]),  # one length: nothing to bracket
    ])  # fmt: skip


def test_break_even_by_hand(lat):
    be = break_even(lat).set_index("keep_rate")
    assert sorted(be.index) == [0.1, 0.3, 0.5, 0.7]  # the reference and the one-length line left out
    # keep 0.1: lower bounds 0.9 at 2048 and 1.2 at 4096: a third of the way on log2, 2048 * 2^(1/3)
    assert be.loc[0.1, "break_even_how"] == "interpolated"
    assert be.loc[0.1, "break_even_tokens"] == pytest.approx(2048 * 2 ** (1 / 3))
    # its ideal: 0.9 at 1024, 1.1 at 2048: half way, 1024 * sqrt(2)
    assert be.loc[0.1, "ideal_break_even_tokens"] == pytest.approx(1024 * 2**0.5)
    assert (be.loc[0.3, "break_even_how"], be.loc[0.3, "ideal_break_even_how"]) == ("not reached", "not reached")
    assert math.isnan(be.loc[0.3, "break_even_tokens"])
    assert (be.loc[0.5, "break_even_tokens"], be.loc[0.5, "break_even_how"]) == (1024, "at or below")
    # keep 0.7: 0.9 -> 1.1 crosses half way between 1024 and 2048, then falls back at 4096;
    # its ideal is exactly 1.0 at 1024 (not above 1), 1.05 at 2048: the crossing is 1024 itself
    assert be.loc[0.7, "break_even_tokens"] == pytest.approx(1024 * 2**0.5) and be.loc[0.7, "regresses"]
    assert (be.loc[0.7, "ideal_break_even_tokens"], be.loc[0.7, "ideal_break_even_how"]) == (1024, "interpolated")
    assert not be.loc[0.1, "regresses"]


def test_the_lines_and_the_figure(lat, tmp_path):
    text = "\n".join(break_even_lines(break_even(lat)))
    assert "specprefill at keep 0.1 (m, transformers, float32, prompts random, batch 1,1,1,1): break-even at ~2,580 tokens " \
           "(interpolated on log2 length between 2,048 and 4,096)" in text  # fmt: skip
    assert "break-even not reached up to 8,192 tokens" in text
    assert "break-even at or below 1,024 tokens (the shortest length measured)" in text
    assert text.count("falls back to 1 or below") == 1
    # one length timed at two batch sizes: a line per batch size
    two = pd.concat([lat, pd.DataFrame(_line(0.1, [0.5, 0.7, 0.9, 1.1], [1.0] * 4)).assign(batch=4)])
    be = break_even(two)
    assert sorted(be.loc[be["keep_rate"] == 0.1, "batch"]) == ["1", "4"]
    assert be.loc[(be["keep_rate"] == 0.1) & (be["batch"] == "4"), "break_even_tokens"].item() == pytest.approx(
        4096 * 2**0.5
    )
    assert speedup_vs_length(lat, tmp_path / "s.png") is not None and (tmp_path / "s.png").stat().st_size > 0
    assert speedup_vs_length(lat[lat["keep_rate"].isin([0.9]) | lat["is_reference"]], tmp_path / "t.png") is None


def test_a_slower_decode_after_the_prefill_is_said_with_its_size(lat):
    d = lat.assign(decode_s_per_token=0.02, decode_speedup=1.0, decode_speedup_lo=0.9, decode_speedup_hi=1.1)
    slow = (d["keep_rate"] == 0.1) & (d["length"] == 4096)
    d.loc[slow, ["decode_s_per_token", "decode_speedup", "decode_speedup_lo", "decode_speedup_hi"]] = [
        0.03, 0.8, 0.75, 0.85]  # fmt: skip
    notes = decode_notes(d)
    assert notes == [
        "specprefill keep 0.1 at 1x4096: decodes slower than full after its prefill, 25% more time per output token "
        "(0.0300 s; decode speedup 0.80x [0.75, 0.85])"
    ]  # 1 / 0.8 = 1.25; intervals holding 1 say nothing
    assert "Decoding after the prefill:" in latency_markdown(d.assign(flags="", anomaly="", pairs=10))
