"""The job kinds ``make`` runs: ``eval`` (quality), ``latency`` (the TTFT grid), ``qps``
(serving) and ``lm_eval``, each a :class:`~harness.jobs.lifecycle.Job` that
:func:`harness.jobs.lifecycle.execute` runs the same way."""
