"""The analysis layer: every number a table, figure or verdict shows, defined once.

Rows are normalized once when read (:mod:`~harness.analysis.rows`: the reference's keep
rate, the point key, labels). The measures, each with one estimator and the interval of
that same estimator, live in :mod:`~harness.analysis.quality` (eval rows: score,
retention, TTFT ratio and speedup, kept fraction, needle kept, ideal speedup, efficiency,
over tasks, categories and ``ALL``; the gate's paired difference),
:mod:`~harness.analysis.speed` (the interleaved speedup over the grid) and
:mod:`~harness.analysis.serving` (max QPS); :mod:`~harness.analysis.stats` holds the
seeded bootstrap they share. The summary, ``report.html``, the figures, the regression
gate, the paper tables and the harness's own sweeps read these and compute nothing of
their own; nothing here imports a renderer.
"""
