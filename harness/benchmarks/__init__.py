"""Benchmarks, each registered by name in its own module (:func:`harness.benchmarks.base.register_benchmark`);
:mod:`harness.registry` imports them on first use."""
