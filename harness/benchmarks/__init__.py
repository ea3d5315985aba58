"""Benchmarks. Importing the package registers every benchmark with :func:`build_benchmark`."""

from harness.benchmarks import longbench, ruler  # noqa: F401  (registration)
