"""The lazy registry: a new method is one module and one yaml, a new benchmark one module, one
yaml and its fixtures; nothing else in the project changes, and ``make eval`` runs them."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.registry import benchmark_names, build_method, method_names, task_family
from harness.store import read_results

ROOT = Path(__file__).resolve().parents[1]
CODE = ("harness", "specprefill", "baselines", "conf", "hydra_plugins")


def copy_project(dest: Path) -> Path:
    """The project's code and configs, as a clone has them, in ``dest``."""
    for d in CODE:
        shutil.copytree(ROOT / d, dest / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def touched(copy: Path) -> list[str]:
    """The files of ``copy`` that differ from the project's or are new (relative paths)."""
    out = []
    for d in CODE:
        for f in (copy / d).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                rel = f.relative_to(copy)
                if not (ROOT / rel).exists() or not filecmp.cmp(f, ROOT / rel, shallow=False):
                    out.append(str(rel))
    return sorted(out)


def run_eval(copy: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.jobs.eval", "model=tiny-random", "limit=2", f"out={out}", *overrides],
        cwd=copy, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


STRIDE = '''\
"""``stride``: keep every s-th prompt token (s = 1 / keep rate), at its original position."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specprefill.plan import Backend, Method, Plan, Prompt, check_keep, kept_plan, register_method


@register_method("stride")
@dataclass(frozen=True)
class Stride(Method):
    keep_rate: float = 0.25

    def __post_init__(self) -> None:
        check_keep(self.keep_rate)

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        step = max(1, round(1 / float(self.keep_rate)))
        return kept_plan(prompt, torch.arange(0, prompt.n, step, dtype=torch.int64), "original", {})
'''


def test_a_new_method_is_one_module_and_one_yaml(tmp_path):
    copy = copy_project(tmp_path / "clone")
    (copy / "baselines" / "stride.py").write_text(STRIDE)
    (copy / "conf" / "method" / "stride.yaml").write_text("name: stride\nkeep_rate: ${keep}\n")
    assert touched(copy) == ["baselines/stride.py", "conf/method/stride.yaml"]
    r = run_eval(copy, tmp_path / "res", "length=1024", "tasks=[niah_single_1]", "method=stride", "keep=0.25")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = read_results(tmp_path / "res")
    assert set(rows["method"]) == {"stride"} and set(rows["status"]) == {"ok"} and len(rows) == 2
    assert rows["kept_fraction"].between(0.24, 0.26).all()
    assert json.loads(rows["method_options"].iloc[0]) == {"keep_rate": 0.25}


QUOTES = '''\
"""``quotes``: who said a line, from a local file of quotes (a demonstration benchmark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.types import Sample
from specprefill.options import Allowed


@register_benchmark
class Quotes(Benchmark):
    name = "quotes"
    version = "quotes-1"
    metrics_version = "quotes-exact-1"
    all_tasks = ("who_said",)
    allowed_options = {"data_dir": Allowed(str, null=True)}

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        rows = [json.loads(line) for line in (Path(self.cfg.options["data_dir"]) / "quotes.jsonl").open()]
        out = []
        for i, row in enumerate(rows[: self.cfg.limit]):
            instruction, context, question = "Read the quotes.\\n", row["context"], "\\nWho said it?"
            prompt = tok.fmt.wrap(instruction, context, question)
            out.append(Sample(benchmark=self.name, task="who_said", sample_id=i, length=self.cfg.length,
                              instruction=instruction, context=context, question=question, answer_prefix="",
                              prompt=prompt, references=(row["answer"],), max_new_tokens=4, metric="exact",
                              add_special_tokens=tok.fmt.add_special_tokens))
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return 100.0 * (prediction.strip().lower() == sample.references[0].lower())
'''
QUOTES_YAML = """\
name: quotes
length: 512
tasks: ${tasks}
default_tasks: all
limit: ${limit}
max_new_tokens_cap: ${max_new}
options:
  data_dir: ${data_dir}
"""


def test_a_new_benchmark_is_one_module_one_yaml_and_its_fixtures(tmp_path):
    copy = copy_project(tmp_path / "clone")
    (copy / "harness" / "benchmarks" / "quotes.py").write_text(QUOTES)
    (copy / "conf" / "benchmark" / "quotes.yaml").write_text(QUOTES_YAML)
    data = tmp_path / "fixtures"  # the benchmark's fixture, outside the code
    data.mkdir()
    (data / "quotes.jsonl").write_text(
        "".join(
            json.dumps({"context": f"Quote {i}: 'to be or not to be'", "answer": "Hamlet"}) + "\n" for i in range(3)
        )
    )
    assert touched(copy) == ["conf/benchmark/quotes.yaml", "harness/benchmarks/quotes.py"]
    r = run_eval(copy, tmp_path / "res", "benchmark=quotes", f"data_dir={data}", "method=full", "tasks=all")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = read_results(tmp_path / "res")
    assert set(rows["benchmark"]) == {"quotes"} and set(rows["status"]) == {"ok"} and len(rows) == 2
    assert rows["score"].isin([0.0, 100.0]).all()


def test_the_registry_loads_on_first_use_and_lists_every_entry():
    assert {"full", "specprefill", "gemfilter", "rag_bm25", "truncate", "llmlingua2"} <= set(method_names())
    assert {"ruler", "longbench", "longbench_e", "infinitebench"} <= set(benchmark_names())
    with pytest.raises(ValueError, match=r"unknown method 'nope'; allowed: \[.*'truncate'"):
        build_method("nope", {})


def test_no_module_imports_the_method_or_benchmark_packages_for_their_side_effect():
    for f in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "baselines").rglob("*.py")]:
        text = f.read_text()
        assert "import baselines  # noqa" not in text, f
    assert "import" not in (ROOT / "baselines" / "__init__.py").read_text().split('"""')[-1]
    assert "import" not in (ROOT / "harness" / "benchmarks" / "__init__.py").read_text().split('"""')[-1]
    src = textwrap.dedent((ROOT / "harness" / "config.py").read_text())
    assert "filter_layer" not in src and "gemfilter" not in src.lower()  # the config knows no method by name


def test_a_benchmark_names_its_task_families_where_rows_carry_no_category():
    """The paper's tables group RULER rows by family without knowing RULER: the benchmark says."""
    assert task_family("ruler", "niah_multikey_2") == "niah" and task_family("ruler", "qa_1") == "qa"
    assert task_family("longbench", "hotpotqa") == "hotpotqa"  # its rows carry their category
    assert task_family("no-such-benchmark", "t") == "t"
