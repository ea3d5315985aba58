"""The regression gate (``python -m harness.regress``; the command line and its exit codes
in :mod:`harness.regress.__main__`), by role:

* :mod:`~harness.regress.verdict`: the verdict as data (exit codes, compared points, labels);
* :mod:`~harness.regress.compare`: two folders' rows compared point by point;
* :mod:`~harness.regress.formats`: the verdict as text, markdown, JSON or JUnit;
* :mod:`~harness.regress.suite`: the quick suite run into a candidate, and ``accept``;
* :mod:`~harness.regress.history`: the history and its plot beside each baseline.
"""
