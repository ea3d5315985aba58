"""Baseline prefill methods, siblings of full prefill and SpecPrefill behind
:class:`specprefill.plan.Method`, each registered by name in its own module
(:func:`specprefill.plan.register_method`); :mod:`harness.registry` imports them on first use."""
