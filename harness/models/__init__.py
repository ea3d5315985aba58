"""Models: the catalog (``conf/model`` as :class:`~harness.models.catalog.ModelConfig`, the
speculator spec), placement (GPUs, memory, parallelism), random replicas of paper
checkpoints, loading (whether a model runs here, weights, tokenizers, vLLM engine
arguments) and a backend for a model."""
