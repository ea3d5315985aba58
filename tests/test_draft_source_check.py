"""The source check of SpecPC and SpecKV (harness/studies/draft_source_check.py) on stand-in
"authors' files": one that restates ours agrees everywhere, one that drops a kept token is
reported case by case, and the package's own imports are left out when their files run."""

from __future__ import annotations

from pathlib import Path

from harness.studies import draft_source_check as check

SPECPC_OK = """
from draft_approx_llm import SpecPCConfig
from .specpc_utils import generate_aggregated_attention
from baselines.specpc import specpc_select


def specpc_select_input_token_indices(attn_per_key, specpc_config):
    c = specpc_config
    return specpc_select(attn_per_key[0], c.max_capacity_prompt, c.window_size, kernel=c.kernel_size,
                         pool=c.pool_type, neighbors=c.neighbor_tokens)[None]
"""
SPECKV_OK = """
from baselines.speckv import speckv_compress


def compress_kv(key_states, query_states, value_states, window_size, max_capacity_prompt,
                prefill_vertical_size, reduction_type, pool_type, kernel_size):
    keep = max_capacity_prompt - window_size
    k, v = speckv_compress(query_states[..., -window_size:, :], key_states, value_states, window_size, keep,
                           reduction_type, pool_type, kernel_size)
    return k, v, None
"""


def _repo(tmp_path: Path, specpc: str, speckv: str) -> Path:
    for rel, text in ((check.SPECPC, specpc), (check.SPECKV, speckv)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_faithful_restatement_agrees_in_every_case(tmp_path):
    text = check.report(_repo(tmp_path, SPECPC_OK, SPECKV_OK), cases=12, seed=0)
    assert "| 12 | 12 |" in text and "Every case identical" in text and "Disagreements" not in text


def test_a_selection_that_drops_a_token_is_reported(tmp_path):
    wrong = SPECPC_OK.replace("neighbors=c.neighbor_tokens)[None]", "neighbors=c.neighbor_tokens)[None][:, 1:]")
    text = check.report(_repo(tmp_path, wrong, SPECKV_OK), cases=6, seed=0)
    assert "| SpecPC selection |" in text and "| 6 | 0 |" in text
    assert text.count("* SpecPC case") == 6 and "* SpecKV case" not in text
