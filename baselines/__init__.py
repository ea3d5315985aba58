"""Baseline prefill methods, siblings of full prefill and SpecPrefill behind
:class:`specprefill.plan.Method`. Importing the package registers them all."""

from baselines import gemfilter, llmlingua, minference, rag, random_keep, truncate  # noqa: F401  (registration)
