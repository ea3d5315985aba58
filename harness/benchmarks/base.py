"""The benchmark interface: samples in, scores out. One subclass per benchmark."""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import harness.benchmarks as package
from harness.types import PromptFormat, Sample
from specprefill.options import Allowed, check_declared, check_options, option


@dataclass(frozen=True)
class TokenizerInfo:
    """What a benchmark needs of the target model's tokenizer.

    ``id`` keys caches; ``count`` counts tokens of a prompt in ``fmt`` (the model's chat
    format); ``tokenizer`` (encode/decode, chat template) and ``max_input_length``
    (LongBench-style truncation budget) are there for benchmarks that truncate."""

    id: str
    count: Callable[[str], int]
    fmt: PromptFormat
    tokenizer: Any = None
    max_input_length: int = 0


@dataclass(frozen=True)
class BenchmarkConfig:
    """``conf/benchmark/*.yaml``. ``tasks`` empty means all tasks."""

    name: str = option(allowed=Allowed(str))
    length: int = option(4096, Allowed(int, ge=1, note="tokens"))
    tasks: tuple[str, ...] = option((), Allowed(list, item=str, note="task names; empty: every task"))
    limit: int = option(10, Allowed(int, ge=1, note="samples per task"))
    options: dict[str, Any] = option(allowed=Allowed(dict, note="the benchmark's own options"), factory=dict)
    #: Cap on tokens to generate (None = the benchmark's official lengths). A named
    #: deviation for quick CPU runs (InfiniteBench math_calc asks for 30000 tokens);
    #: recorded in every row and part of the run identity.
    max_new_tokens_cap: int | None = option(None, Allowed(int, ge=1, null=True, note="tokens; null: official"))

    def __post_init__(self) -> None:
        check_declared(self)


class Benchmark(ABC):
    name: ClassVar[str]
    version: ClassVar[str]
    #: Version of the metric code this benchmark scores with (stored in every row).
    metrics_version: ClassVar[str]
    #: The deliberate differences from the benchmark's official code, in a few words (stored
    #: in every row as ``benchmark_notes``; "" where there is none).
    notes: str = ""  # a class's own; a run may add its deviations (RULER's vt_hops)
    all_tasks: ClassVar[tuple[str, ...]]
    #: The keys ``options`` may hold, each with what it takes (anything else is refused,
    #: so it cannot silently change the run's hash; a bad value is refused in one line).
    allowed_options: ClassVar[dict[str, Allowed]] = {}
    #: Whether a sample is a conversation of several turns (``turns(sample)``, one row per
    #: turn, methods by their multi-turn policy: :mod:`specprefill.conversation`).
    multiturn: ClassVar[bool] = False

    def __init__(self, cfg: BenchmarkConfig) -> None:
        self.cfg = cfg
        unknown = sorted(set(cfg.options) - set(self.allowed_options))
        if unknown:
            raise ValueError(f"{self.name}: unknown option(s) {unknown}; allowed: {list(self.allowed_options)}")
        check_options(self.allowed_options, cfg.options, f"{self.name}: ")
        tasks = tuple(cfg.tasks) or self.all_tasks
        for t in tasks:
            if t not in self.all_tasks:
                close = difflib.get_close_matches(t, self.all_tasks, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown {self.name} task {t!r}; allowed: {list(self.all_tasks)}{hint}")
        self.tasks = tasks

    @classmethod
    def family(cls, task: str) -> str:
        """The group a task's rows fall in where they carry no ``category`` (the paper's
        tables group by it): the task itself unless the benchmark says otherwise."""
        return task

    def require_single_turn(self, job: str, key: str) -> None:
        """Refuse a multi-turn benchmark where ``job`` takes one prompt per sample (a served
        request, a timed prompt): its turn 1 alone would run under the benchmark's name."""
        if self.multiturn:
            single = [n for n in registered_benchmarks() if not benchmark_class(n).multiturn]
            raise ValueError(
                f"{key}={self.name}: its samples are conversations of several turns and {job}, so only turn 1 "
                f"would run, under the multi-turn benchmark's name; allowed: {key}= one of {single} (turn 1 is "
                f"RULER's sample: {key}=ruler), or make eval / make multiturn for the conversations"
            )

    def check_model(self, max_context: int) -> None:
        """Reject, before any work, a run the model's context window cannot hold."""
        n = self.cfg.length
        if n > max_context:
            raise ValueError(
                f"length={n} is beyond the model's context window ({max_context} tokens); allowed: length <= {max_context}"
            )

    def check_data(self) -> None:
        """Reject, before any work, a ``data_dir`` that lacks a selected task's file (a benchmark
        of official files: one with ``source(task)``); a benchmark that builds its samples has
        nothing to check."""
        source = getattr(self, "source", None)
        if source is None or not getattr(self, "data_dir", None):
            return
        from harness.benchmarks.sources import check_local

        check_local([source(t) for t in self.tasks])

    def max_new_tokens(self) -> int | None:
        """The most tokens a selected task generates (its official answer length, before
        ``max_new_tokens_cap``), known before any sample is built; None where unknown."""
        return None

    @abstractmethod
    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        """The first ``limit`` samples of each selected task, prompts built for ``tok``."""

    @abstractmethod
    def score(self, sample: Sample, prediction: str) -> float:
        """One sample's score on the 0-100 scale, by the benchmark's official metric (its
        ``metrics`` module, beside it)."""

    def options(self) -> dict[str, Any]:
        """What shapes the samples, recorded with results and hashed into the run id."""
        opts = {"name": self.name, "version": self.version, "length": self.cfg.length, **self.cfg.options}
        if self.cfg.max_new_tokens_cap is not None:
            opts["max_new_tokens_cap"] = self.cfg.max_new_tokens_cap
        return opts


_BENCHMARKS: dict[str, type[Benchmark]] = {}


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    _BENCHMARKS[cls.name] = cls
    return cls


def _load_all() -> None:
    """Import every benchmark module of this package (each registers itself): on the first
    name not yet registered, so nothing imports them for their side effect."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(package.__path__, prefix="harness.benchmarks."):
        importlib.import_module(info.name)


def registered_benchmarks() -> list[str]:
    """Every benchmark's name (all loaded)."""
    _load_all()
    return sorted(_BENCHMARKS)


def benchmark_class(name: str) -> type[Benchmark]:
    """The class registered as ``name``, its module loaded on first use."""
    if name not in _BENCHMARKS:
        _load_all()
    if name not in _BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; allowed: {sorted(_BENCHMARKS)}")
    return _BENCHMARKS[name]


def build_benchmark(cfg: BenchmarkConfig) -> Benchmark:
    """The benchmark registered as ``cfg.name``, its module loaded on first use."""
    return benchmark_class(cfg.name)(cfg)
