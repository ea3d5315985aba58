"""Benchmarks. Importing the package registers every benchmark with :func:`build_benchmark`."""

from harness.benchmarks import infinitebench, longbench, ruler  # noqa: F401  (registration)
