"""One lazy registry for methods and benchmarks: entries by name, loaded on first use.

A method is a class decorated with :func:`specprefill.plan.register_method` in a module of
:mod:`specprefill.method` or the ``baselines`` package; a benchmark one decorated with
:func:`harness.benchmarks.base.register_benchmark` in a module of ``harness.benchmarks``.
Nothing imports those modules for their side effect: the first time a name is asked for and
is not yet known, the registry imports the modules of its packages (each cheap: heavy
dependencies load inside the methods) and looks again. So adding a method is one module in
``baselines/`` and one ``conf/method/<name>.yaml``; adding a benchmark one module in
``harness/benchmarks/``, one ``conf/benchmark/<name>.yaml`` and its fixtures.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from harness.benchmarks import base as benchmarks
from specprefill import plan as methods

#: Where methods and benchmarks live (modules or packages, imported on the first miss).
METHOD_HOMES = ("specprefill.method", "baselines")
_loaded: set[str] = set()


def _load(homes: tuple[str, ...]) -> None:
    """Import every module of ``homes`` once (a package: each module in it, recursively)."""
    for home in homes:
        if home in _loaded:
            continue
        mod = importlib.import_module(home)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=f"{home}."):
            importlib.import_module(info.name)
        _loaded.add(home)


def build_method(name: str, options: Mapping[str, Any]) -> methods.Method:
    """The method registered as ``name`` with ``options`` (unknown names and options: a
    ``ValueError`` listing what is allowed)."""
    if name not in methods.registered_methods():
        _load(METHOD_HOMES)
    return methods.build_method(name, options)


def method_option_names(name: str) -> set[str]:
    """The options (dataclass fields) of the method registered as ``name``."""
    import dataclasses

    if name not in methods.registered_methods():
        _load(METHOD_HOMES)
    cls = methods.method_class(name)
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def method_names() -> list[str]:
    """Every registered method's name."""
    _load(METHOD_HOMES)
    return methods.registered_methods()


def build_benchmark(cfg: benchmarks.BenchmarkConfig) -> benchmarks.Benchmark:
    """The benchmark registered as ``cfg.name`` (unknown: a ``ValueError`` listing them);
    the benchmarks package loads its own modules on first use."""
    return benchmarks.build_benchmark(cfg)


def benchmark_names() -> list[str]:
    """Every registered benchmark's name."""
    return benchmarks.registered_benchmarks()


def benchmark_class(name: str) -> type[benchmarks.Benchmark]:
    """The class registered as ``name`` (its ``allowed_options``, tasks, ...)."""
    return benchmarks.benchmark_class(name)


def task_family(benchmark: str, task: str) -> str:
    """The group ``benchmark`` puts ``task`` in (:meth:`Benchmark.family`); an unknown
    benchmark's task is its own group."""
    try:
        return benchmarks.benchmark_class(benchmark).family(task)
    except ValueError:
        return task
