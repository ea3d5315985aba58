"""The benchmark interface: samples in, scores out. One subclass per benchmark."""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.metrics import score_one
from harness.types import PromptFormat, Sample


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

    name: str
    length: int = 4096
    tasks: tuple[str, ...] = ()
    limit: int = 10
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"limit={self.limit!r} is invalid; allowed: int >= 1 (samples per task)")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length={self.length!r} is invalid; allowed: int >= 1 (tokens)")


class Benchmark(ABC):
    name: ClassVar[str]
    version: ClassVar[str]
    #: Version of the metric code this benchmark scores with (stored in every row).
    metrics_version: ClassVar[str]
    all_tasks: ClassVar[tuple[str, ...]]

    def __init__(self, cfg: BenchmarkConfig) -> None:
        self.cfg = cfg
        tasks = tuple(cfg.tasks) or self.all_tasks
        for t in tasks:
            if t not in self.all_tasks:
                close = difflib.get_close_matches(t, self.all_tasks, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown {self.name} task {t!r}; allowed: {list(self.all_tasks)}{hint}")
        self.tasks = tasks

    def check_model(self, max_context: int) -> None:
        """Reject, before any work, a run the model's context window cannot hold."""
        n = self.cfg.length
        if n > max_context:
            raise ValueError(
                f"length={n} is beyond the model's context window ({max_context} tokens); allowed: length <= {max_context}"
            )

    @abstractmethod
    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        """The first ``limit`` samples of each selected task, prompts built for ``tok``."""

    def score(self, sample: Sample, prediction: str) -> float:
        return score_one(sample.metric, prediction, sample.references)

    def options(self) -> dict[str, Any]:
        """What shapes the samples, recorded with results and hashed into the run id."""
        return {"name": self.name, "version": self.version, "length": self.cfg.length, **self.cfg.options}


_BENCHMARKS: dict[str, type[Benchmark]] = {}


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    _BENCHMARKS[cls.name] = cls
    return cls


def build_benchmark(cfg: BenchmarkConfig) -> Benchmark:
    if cfg.name not in _BENCHMARKS:
        raise ValueError(f"unknown benchmark {cfg.name!r}; allowed: {sorted(_BENCHMARKS)}")
    return _BENCHMARKS[cfg.name](cfg)
