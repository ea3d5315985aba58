"""The paper's tables beside ours (``python -m harness.paper``; what it does in
:mod:`harness.paper.cli`), by role:

* :mod:`~harness.paper.data`: the published numbers, each table's experiment and folders,
  our rows of a variant (:class:`~harness.paper.data.Ours`) and the committed point files;
* :mod:`~harness.paper.cells`: a cell (ours, the paper's, Δ or why none);
* :mod:`~harness.paper.figures`: a table's figure;
* :mod:`~harness.paper.tables`: one builder per table and the report that writes them all.

Running a table's experiment is :mod:`harness.experiments`'s; the command line adds the
point file and the report after it.
"""
