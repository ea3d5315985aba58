"""The paper's tables beside ours (``python -m harness.paper``; what it does in
:mod:`harness.paper.__main__`), by role:

* :mod:`~harness.paper.numbers`: the published numbers, each table's experiment and folders,
  our rows of a variant (:class:`~harness.paper.numbers.Ours`) and the committed point files;
* :mod:`~harness.paper.cells`: a cell (ours, the paper's, Δ or why none);
* :mod:`~harness.paper.figures`: a table's figure;
* :mod:`~harness.paper.builders`: one builder per table and the report that writes them all.

Running a table's experiment is :mod:`harness.experiments`'s; the command line adds the
point file and the report after it.
"""
