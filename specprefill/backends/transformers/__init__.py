"""The transformers backend: every reach into model internals lives in this package
(:mod:`~.hooks`: the attention hooks; :mod:`~.capture`: the speculator's pass; :mod:`~.backend`:
:class:`TransformersBackend`).

Written against ``transformers==5.19.0`` Llama-family models (``LlamaForCausalLM`` and
architectures sharing its attention layout). ``tests/test_backend_transformers.py``
fails when an upgrade changes what this package relies on:

* ``LlamaAttention.forward`` receives ``hidden_states`` (post input-norm) and
  ``position_embeddings=(cos, sin)`` as keyword arguments, and computes its query as
  ``q_proj`` -> ``apply_rotary_pos_emb`` (no query norm): we recompute the query of the
  rows we need from those inputs in a forward hook.
* The ``DynamicCache`` stores post-RoPE keys at ``cache.layers[i].keys``
  ``[batch, kv_heads, seq, d]``.
* ``create_causal_mask`` treats non-contiguous ``position_ids`` *without* a cache and
  *without* an attention mask as packed sequences (no attention across the gaps). We
  always pass an explicit 2-D attention mask, so the kept tokens see each other; its
  length is the cache's length plus the new tokens (a KV press may have shortened the
  cache). A 4-D mask (``[batch, 1, q, kv]``, float, additive) is passed to attention as
  is: a conversation's revived tokens, prefilled after later ones, attend by position
  (:func:`position_mask`).
* ``DynamicCache.crop(-n)`` drops the last n entries (a conversation's decoded tokens,
  the speculator's look-ahead).
* ``LlamaModel.forward`` no longer passes ``cache_position`` to the attention layers
  (transformers 5.3 removed it); kvpress's hooks read it, so
  :func:`cache_positions_restored` gives it back as 4.56-5.2 computed it.
"""

from specprefill.backends.transformers.backend import Conversation, TransformersBackend
from specprefill.backends.transformers.hooks import (
    TESTED_TRANSFORMERS,
    attention_layers,
    cache_positions_restored,
    cache_size,
    capture_last_queries,
    compressing_cache,
    early_exit_view,
    position_mask,
)

__all__ = [
    "TESTED_TRANSFORMERS",
    "Conversation",
    "TransformersBackend",
    "attention_layers",
    "cache_positions_restored",
    "cache_size",
    "capture_last_queries",
    "compressing_cache",
    "early_exit_view",
    "position_mask",
]
