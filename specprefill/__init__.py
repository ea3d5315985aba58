"""Speculative Prefill (Liu, Chen, Zhang, ICML 2025) as a small library.

The algorithm (:func:`token_importance`, :func:`select_tokens`) is pure tensor code;
:mod:`specprefill.backends` holds the code that reaches into models.
"""

from specprefill.core import select_tokens, token_importance
from specprefill.method import FullPrefill, SpecPrefill
from specprefill.plan import Method, Plan, Prompt, build_method, register_method, registered_methods

__all__ = [
    "FullPrefill",
    "Method",
    "Plan",
    "Prompt",
    "SpecPrefill",
    "build_method",
    "register_method",
    "registered_methods",
    "select_tokens",
    "token_importance",
]
