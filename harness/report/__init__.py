"""A results folder's pages: ``summary.md`` with its CSVs, the figures and ``report.html``
(:mod:`~harness.report.summary`, ``python -m harness.report <folder>``), the page's HTML
(:mod:`~harness.report.html`, with the paper tables a folder feeds) and its check in a
browser (:mod:`~harness.report.browser`). They assemble what :mod:`harness.analysis`
computed, formatted by :mod:`harness.rendering` and :mod:`harness.paper`; this package is
above both, so neither imports it.
"""
