"""lm-evaluation-harness integration: our methods as an lm-eval model (``model``), its
CLI with our tasks on the path (``cli``) and two small offline tasks (``tasks/``)."""
