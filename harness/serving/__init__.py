"""Serving throughput: ``vllm serve`` for the base model, the planning front for methods
that need one (:mod:`harness.serving.front`), vLLM's load generator, and the QPS search
(:mod:`harness.jobs.qps`)."""
