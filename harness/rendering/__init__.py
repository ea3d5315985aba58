"""Renderers: text, markdown and HTML tables and figures of what :mod:`harness.analysis`
computed. They format numbers; they compute none."""
