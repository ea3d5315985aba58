"""The hooks into a transformers model's attention layers: the queries SpecPrefill scores
with (:func:`capture_last_queries`), a cache rewritten after its prefill
(:func:`compressing_cache`: SpecKV), the cache positions kvpress reads
(:func:`cache_positions_restored`), an early-exit view of the base's first layers, a
cache's size and the 4-D mask of a conversation's revived tokens (:func:`position_mask`).
What they rely on in transformers is listed in :mod:`specprefill.backends.transformers`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

#: The transformers release this package is written and tested against.
TESTED_TRANSFORMERS = "5.19.0"


def _rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q_rot, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return q_rot


def attention_layers(model: Any) -> list[Any]:
    """The self-attention modules of a Llama-style ``*ForCausalLM``, in layer order."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no .model.layers; only Llama-style decoders are supported")
    n = getattr(inner, "config", model.config).num_hidden_layers
    out = []
    for layer in list(layers)[:n]:
        attn = getattr(layer, "self_attn", None)
        if attn is None or not hasattr(attn, "q_proj") or hasattr(attn, "q_norm"):
            raise TypeError(
                f"layer {type(layer).__name__} is not a Llama-style attention layer (q_proj, no q_norm); "
                f"SpecPrefill's query capture supports Llama-family models with transformers=={TESTED_TRANSFORMERS}"
            )
        out.append(attn)
    return out


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """An attention layer's input (post input-norm) from its forward's arguments."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _last_queries(module: Any, hidden: torch.Tensor, kwargs: dict, rows: int) -> torch.Tensor:
    """The layer's post-RoPE queries of the forward's last ``rows`` rows (all where it has
    fewer), ``[batch, heads, r, d]``, recomputed from its inputs (``q_proj`` of those rows)."""
    cos, sin = kwargs["position_embeddings"]
    h = hidden[:, -rows:, :]
    b, r = h.shape[0], h.shape[1]
    q = module.q_proj(h).view(b, r, -1, module.head_dim).transpose(1, 2)
    return _rope(q, cos[:, -r:], sin[:, -r:])


@contextmanager
def _forward_hooks(model: Any, make_hook: Any) -> Iterator[None]:
    """``make_hook(i)`` as a forward hook (with kwargs) on each attention layer ``i`` of
    ``model`` for the body; removed on exit."""
    handles = []
    try:
        for i, attn in enumerate(attention_layers(model)):
            handles.append(attn.register_forward_hook(make_hook(i), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def capture_last_queries(model: Any, rows: int = 1) -> Iterator[list[list[torch.Tensor]]]:
    """Record, for every forward of ``model``, each layer's post-RoPE queries of the last
    ``rows`` rows (all of a forward's where it has fewer).

    Yields ``captured[layer]``: a list with one ``[batch, heads, r, d]`` tensor per forward.
    Only those rows are recomputed (``q_proj`` of ``rows`` tokens), so the cost is negligible.
    """
    captured: list[list[torch.Tensor]] = [[] for _ in attention_layers(model)]

    def make_hook(i: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict, output: object) -> None:
            captured[i].append(_last_queries(module, _hidden(args, kwargs), kwargs, rows).detach())

        return hook

    with _forward_hooks(model, make_hook):
        yield captured


@contextmanager
def compressing_cache(model: Any, compress: Any) -> Iterator[None]:
    """Let ``compress`` rewrite each attention layer's cache after the forward that prefills
    it from empty (more than one token; every later forward is left alone), as kvpress's
    presses do. ``compress(layer, queries, keys, values)`` gets the layer's index, a function
    ``queries(r)`` giving its post-RoPE queries of the forward's last ``r`` rows ``[batch,
    heads, r, d]`` (recomputed from the layer's inputs), and the cache's post-RoPE keys and
    values ``[batch, kv_heads, seq, d]``; it returns the keys and values the cache holds from
    then on. The forward's own output is untouched: each layer attended over its full keys
    before its cache shrank. Removed on exit."""

    def make_hook(i: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict, output: object) -> None:
            hidden = _hidden(args, kwargs)
            cache = kwargs.get("past_key_values")
            q_len = int(hidden.shape[1])
            if cache is None or q_len < 2:
                return
            layer = cache.layers[i]
            if int(layer.keys.shape[2]) != q_len:  # the cache held tokens before this forward
                return
            layer.keys, layer.values = compress(
                i, lambda r: _last_queries(module, hidden, kwargs, r), layer.keys, layer.values
            )

        return hook

    with _forward_hooks(model, make_hook):
        yield


@contextmanager
def cache_positions_restored(model: Any) -> Iterator[None]:
    """Give every attention layer of ``model`` the ``cache_position`` keyword transformers
    4.56-5.2 passed (``arange(past, past + q_len)``, ``past`` the cache's length before the
    forward), for hooks written against those versions (kvpress's presses). A forward
    pre-hook on the decoder stack reads the cache's length; one on each attention layer
    adds the keyword where the caller gave none. Removed on exit."""
    inner = model.model
    past = [0]

    def stack_pre(module: Any, args: tuple, kwargs: dict) -> None:
        cache = kwargs.get("past_key_values")
        past[0] = int(cache.get_seq_length()) if cache is not None else 0

    def attn_pre(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if kwargs.get("cache_position") is not None:
            return None
        hidden = _hidden(args, kwargs)
        kwargs["cache_position"] = torch.arange(past[0], past[0] + hidden.shape[1], device=hidden.device)
        return args, kwargs

    handles = [inner.register_forward_pre_hook(stack_pre, with_kwargs=True)]
    try:
        for attn in attention_layers(model):
            handles.append(attn.register_forward_pre_hook(attn_pre, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def cache_size(cache: Any) -> tuple[int, int]:
    """(tokens held, the most over layers; bytes of keys and values over all layers) of a
    ``DynamicCache``."""
    tokens, nbytes = 0, 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if isinstance(t, torch.Tensor) and t.numel():
                nbytes += t.numel() * t.element_size()
        if isinstance(layer.keys, torch.Tensor) and layer.keys.dim() == 4:
            tokens = max(tokens, int(layer.keys.shape[2]))
    return tokens, nbytes


def early_exit_view(base: Any, num_layers: int) -> Any:
    """The base model's first ``num_layers`` layers + final norm + LM head, sharing weights.

    No parameter is copied: the view holds the same modules. Its look-ahead tokens come
    from early-exit logits (final norm and LM head applied after layer ``num_layers``).
    """
    total = base.config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"self_layers:{num_layers} is invalid for a {total}-layer base; allowed: 1..{total}")
    cfg = copy.deepcopy(base.config)
    cfg.num_hidden_layers = num_layers
    inner = copy.copy(base.model)
    inner._modules = dict(base.model._modules)
    inner.layers = nn.ModuleList(list(base.model.layers)[:num_layers])
    inner.config = cfg
    view = copy.copy(base)
    view._modules = dict(base._modules)
    view.model = inner
    view.config = cfg
    return view


def position_mask(cached: torch.Tensor, new: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask for prefilling tokens at positions ``new`` into a cache holding
    positions ``cached`` (in cache order): query i may attend key j iff key j's position
    <= query i's. When every new position follows the cache, in order, that is the causal
    mask, returned in its fast form (the 2-D all-ones mask transformers turns into it);
    otherwise a float ``[1, 1, q, cached + q]`` additive mask (0 or the dtype's
    minimum), which transformers passes to attention as is."""
    q = int(new.numel())
    last = int(cached.max()) if cached.numel() else -1
    if q and int(new[0]) > last and bool((new[1:] > new[:-1]).all()):
        return torch.ones(1, int(cached.numel()) + q, dtype=torch.long)
    keys = torch.cat([cached, new])
    allowed = keys.unsqueeze(0) <= new.unsqueeze(1)  # [q, cached + q]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
