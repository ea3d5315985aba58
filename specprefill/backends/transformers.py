"""The transformers backend: every reach into model internals lives here.

Written against ``transformers==5.19.0`` Llama-family models (``LlamaForCausalLM`` and
architectures sharing its attention layout). ``tests/test_backend_transformers.py``
fails when an upgrade changes what this module relies on:

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

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specprefill.flops import Shape, speculator_flops
from specprefill.plan import Generation, Plan, SpeculatorCapture
from specprefill.token_map import RULES, check_offsets

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


@contextmanager
def capture_last_queries(model: Any) -> Iterator[list[list[torch.Tensor]]]:
    """Record, for every forward of ``model``, each layer's post-RoPE query of the last row.

    Yields ``captured[layer]``: a list with one ``[batch, heads, 1, d]`` tensor per forward.
    Only the last row is recomputed (``q_proj`` of one token), so the cost is negligible.
    """
    layers = attention_layers(model)
    captured: list[list[torch.Tensor]] = [[] for _ in layers]
    handles = []

    def make_hook(i: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict, output: object) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            h = hidden[:, -1:, :]
            b = h.shape[0]
            q = module.q_proj(h).view(b, 1, -1, module.head_dim).transpose(1, 2)
            captured[i].append(_rope(q, cos[:, -1:], sin[:, -1:]).detach())

        return hook

    try:
        for i, attn in enumerate(layers):
            handles.append(attn.register_forward_hook(make_hook(i), with_kwargs=True))
        yield captured
    finally:
        for h in handles:
            h.remove()


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
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
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


@dataclass
class Conversation:
    """The caches a conversation keeps between turns: the base model's (``positions``: the
    conversation position of each entry, in cache order) and the speculator's own, which
    holds every conversation token (KV revival re-scores from it)."""

    cache: Any
    positions: torch.Tensor
    speculator_cache: Any | None = None

    def speculator_bytes(self) -> int:
        """Bytes of the speculator's own cache (keys and values, all layers): memory the
        conversation holds beside the base's cache (0 when it keeps none)."""
        return 0 if self.speculator_cache is None else cache_size(self.speculator_cache)[1]


class TransformersBackend:
    """Owns a base model, its tokenizer and (optionally) a speculator: with the same
    tokenizer, or with its own (``speculator_tokenizer``: a speculator from another family,
    whose scores :mod:`specprefill.token_map` carries onto the base's tokens)."""

    name = "transformers"

    def __init__(
        self,
        base: Any,
        tokenizer: Any,
        speculator: Any | None = None,
        prefill_chunk: int | None = None,
        speculator_tokenizer: Any | None = None,
    ) -> None:
        """``prefill_chunk``: the speculator prefills long prompts this many tokens at a time
        into its cache (None: in one forward). The result is the same; the activations of
        one forward are a chunk's, not the whole prompt's (at 128K tokens an 8B model's MLP
        would otherwise hold gigabytes). ``speculator_tokenizer``: None when the speculator
        shares the base's tokenizer; both must give character offsets otherwise."""
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk!r}; allowed: None or int >= 1")
        if speculator_tokenizer is not None:
            check_offsets(tokenizer, "base")
            check_offsets(speculator_tokenizer, "speculator")
        self.prefill_chunk = prefill_chunk
        self.speculator_tokenizer = speculator_tokenizer
        #: What rows record of a speculator from another family (None: the same tokenizer).
        self.speculator_tokenizer_id = (
            getattr(speculator_tokenizer, "name_or_path", None) if speculator_tokenizer else None
        )
        self.token_map = RULES[0] if speculator_tokenizer is not None else None
        self.base = base.eval()
        self.tokenizer = tokenizer
        self.speculator = speculator.eval() if speculator is not None else None
        self.device = next(base.parameters()).device
        eos = getattr(base.generation_config, "eos_token_id", None) if hasattr(base, "generation_config") else None
        ids: set[int] = set()
        for e in (eos, getattr(tokenizer, "eos_token_id", None)):
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, list | tuple):
                ids.update(int(x) for x in e)
        self.eos_ids = ids
        self._views: dict[int, Any] = {}
        #: Model FLOPs of the captures run for methods (speculator, early layers), cumulative.
        self.method_flops = 0
        self.last_kv: tuple[int, int] | None = None  # (tokens, bytes per prompt) of the last prefill
        self.last_decode_s: float | None = None  # seconds of the decode_tokens after the last prefill
        self.last_decoded: torch.Tensor | None = None  # [b, decode_tokens] token ids it decoded

    @property
    def base_config(self) -> Any:
        return self.base.config

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def speculate(self, input_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture:
        """Prefill the speculator on the prompt, decode ``lookahead-1`` greedy tokens, and
        return post-RoPE queries of the last prompt token and each look-ahead token,
        with the post-RoPE keys of the prompt tokens only."""
        if self.speculator is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self._capture(self.speculator, input_ids, lookahead)

    def base_capture(self, input_ids: torch.Tensor, num_layers: int) -> SpeculatorCapture:
        """The same capture from the base model's own first ``num_layers`` layers (L=1):
        what GemFilter-style methods select with, no draft model involved."""
        if num_layers not in self._views:
            self._views[num_layers] = early_exit_view(self.base, num_layers)
        return self._capture(self._views[num_layers], input_ids, 1)

    def _capture(self, model: Any, input_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture:
        return self._capture_batch(model, input_ids.unsqueeze(0), lookahead)[0]

    def speculate_batch(
        self, input_ids: torch.Tensor | Sequence[torch.Tensor], lookahead: int
    ) -> list[SpeculatorCapture]:
        """:meth:`speculate` for a batch of prompts in one forward; one capture per prompt.

        ``input_ids``: int64 ``[B, N]`` (equal lengths), or B int64 ``[n_i]`` tensors of any
        lengths >= 1, padded in one batch (see :meth:`_capture_batch`).
        Capture i is what :meth:`speculate` gives for prompt i alone (within float error):
        ``queries`` ``[layers, heads, L, d]``, ``keys`` ``[layers, kv_heads, n_i, d]``."""
        if self.speculator is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self._capture_batch(self.speculator, input_ids, lookahead)

    @torch.inference_mode()
    def _capture_batch(
        self, model: Any, input_ids: torch.Tensor | Sequence[torch.Tensor], lookahead: int, cache: Any = None
    ) -> list[SpeculatorCapture]:
        """Prefill ``model`` on B prompts at once (``[B, N]``, or B ``[n_i]`` tensors) and decode
        ``lookahead - 1`` greedy tokens per prompt, capturing what SpecPrefill scores with.

        Equal lengths: one (chunked) prefill of ``[B, N]``, whose last column is every
        prompt's last token, where the query hook looks. Unequal lengths: each prompt's first
        n_i - 1 tokens are prefilled right-padded to M = max n_i - 1 columns, at positions
        0..M-1, with no padding mask: the padding comes after every real token of its row, so
        causal attention already keeps it out of the real tokens, and SDPA keeps its fast
        causal path (a left-padding mask costs ~30% more on CPU and the flash/GQA kernels on
        GPU). Then every prompt's last token runs in one single-token step at its own position
        n_i - 1, its 2-D mask showing it its own n_i - 1 tokens only: that step's query is the
        captured one. No query ever has nothing to attend to, so the padding cannot make NaNs;
        the last logits are checked finite anyway. Look-ahead token j of row i is decoded at
        position n_i + j. Returns per row: ``queries`` ``[layers, heads, L, d]`` (last prompt
        token, then the look-ahead tokens), ``keys`` ``[layers, kv_heads, n_i, d]`` (the
        row's own prompt tokens only, padding and look-ahead excluded).

        ``cache``: a cache already holding earlier tokens of one prompt (a conversation's, at
        positions 0..P-1): the B = 1 prompt is its continuation, prefilled at P.., the keys
        are every cached token's and the new ones', and the look-ahead tokens are dropped from
        the cache afterwards."""
        from transformers import DynamicCache

        if isinstance(input_ids, torch.Tensor):
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids of shape {tuple(input_ids.shape)}; allowed: [B, N] or a list of [n_i]")
            rows = list(input_ids.unbind(0))
        else:
            rows = list(input_ids)
        if not rows or any(r.dim() != 1 or r.shape[0] < 1 for r in rows):
            raise ValueError(
                f"prompt shapes {[tuple(r.shape) for r in rows]}; allowed: one or more 1-D prompts of >= 1 token"
            )
        vocab = model.get_input_embeddings().num_embeddings
        if max(int(r.max()) for r in rows) >= vocab:  # another family's ids would index garbage, or crash
            raise ValueError(
                f"token ids up to {max(int(r.max()) for r in rows)} for a model of {vocab} embeddings: the ids come "
                f"from another tokenizer; a speculator from another family needs its own tokenizer "
                f"(TransformersBackend(speculator_tokenizer=...))"
            )
        lengths = [int(r.shape[0]) for r in rows]
        b, n = len(rows), max(lengths)
        if cache is not None and b != 1:
            raise ValueError(f"a batch of {b} prompts with an existing cache; allowed: one prompt continuing it")
        past = int(cache.get_seq_length()) if cache is not None else 0
        shape = Shape.of(model.config)
        self.method_flops += sum(speculator_flops(shape, past + k, lookahead) for k in lengths)  # padding not counted
        if past:  # what the cache holds was read before
            self.method_flops -= speculator_flops(shape, past, 1)
        ragged = min(lengths) != n
        m = n - 1 if ragged else n  # prefilled columns
        ids = torch.zeros(b, m, dtype=torch.int64)  # [B, M]: row i's first n_i - 1 tokens, then padding
        for i, r in enumerate(rows):
            ids[i, : lengths[i] - 1 if ragged else n] = r[:-1] if ragged else r
        ids = ids.to(self.device)
        lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)  # [B]
        mask = torch.ones(b, past + m, dtype=torch.int64, device=self.device)  # nothing to hide in the prefill
        kept_cache = cache is not None
        cache = cache if kept_cache else DynamicCache(config=model.config)
        generated: list[list[int]] = [[] for _ in range(b)]
        chunk = self.prefill_chunk or m
        with capture_last_queries(model) as captured:
            for start in range(0, m, chunk):
                end = min(m, start + chunk)
                for per_layer in captured:  # only the prompt's last row (the last chunk's) counts
                    per_layer.clear()
                out = model(
                    input_ids=ids[:, start:end],
                    position_ids=torch.arange(past + start, past + end, device=self.device)
                    .unsqueeze(0)
                    .expand(b, end - start),
                    attention_mask=mask[:, : past + end],
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            if ragged:  # the last tokens: [B, 1] at positions n_i - 1, each seeing its row's n_i - 1 tokens and itself
                for per_layer in captured:
                    per_layer.clear()
                own = torch.arange(m, device=self.device).unsqueeze(0) < (lens - 1).unsqueeze(1)  # [B, M]
                mask = torch.cat([own.to(torch.int64), mask.new_ones(b, 1)], dim=1)
                last = torch.stack([r[-1] for r in rows]).to(self.device)
                out = model(
                    input_ids=last.unsqueeze(1),
                    position_ids=(lens - 1).unsqueeze(1),
                    attention_mask=mask,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            if not bool(torch.isfinite(out.logits[:, -1]).all()):
                bad = (~torch.isfinite(out.logits[:, -1])).any(-1).nonzero().flatten().tolist()
                raise FloatingPointError(
                    f"the speculator gave non-finite logits for the prompts of {[lengths[i] for i in bad]} tokens "
                    f"(batch rows {bad}): an overflow in {next(model.parameters()).dtype}?"
                )
            # Keys of the prompt only (later look-ahead steps append to the cache), gathered on the first
            # device when the model's layers are spread over several: [B, layers, kv_heads, M (+1), d].
            p = m + 1 if ragged else n
            keys = torch.stack([layer.keys[:, :, : past + p, :].to(self.device) for layer in cache.layers], dim=1)  # type: ignore[union-attr,index]
            for step in range(lookahead - 1):
                nxt = out.logits[:, -1].argmax(-1)  # [B]
                for row, t in zip(generated, nxt.tolist(), strict=True):
                    row.append(int(t))
                mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
                out = model(
                    input_ids=nxt.unsqueeze(1),
                    position_ids=(lens + past + step).unsqueeze(1),
                    attention_mask=mask,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
        if kept_cache and lookahead > 1:  # the look-ahead tokens leave a kept cache
            cache.crop(-(lookahead - 1))
        queries = torch.stack(
            [torch.cat([q.to(self.device) for q in per_layer], dim=2) for per_layer in captured], dim=1
        )  # [B, layers, H, L, d]
        self._sync()
        if not ragged:
            return [SpeculatorCapture(queries[i], keys[i], generated[i]) for i in range(b)]
        return [  # row i's keys: its first n_i - 1 columns and its last token's (column M)
            SpeculatorCapture(queries[i], torch.cat([keys[i, :, :, : k - 1], keys[i, :, :, m:]], dim=2), generated[i])
            for i, k in enumerate(lengths)
        ]

    @torch.inference_mode()
    def prefill(self, plans: Sequence[Plan], decode_tokens: int = 0) -> float:
        """Prefill a batch of plans into a fresh KV cache (transformers has no prefix cache)
        up to each one's first token, and return the seconds it took (latency grids).

        Plans of different lengths are left-padded (padding masked out, so the last column
        is every plan's last kept token). After the clock stops, ``last_kv`` holds what the
        cache kept; with ``decode_tokens``, that many greedy tokens are then decoded from it
        (every row of the batch, no early stop) and ``last_decode_s`` holds their seconds."""
        from transformers import DynamicCache

        b, k = len(plans), max(p.k for p in plans)
        cache = DynamicCache(config=self.base.config)
        mask = torch.ones(1, k, dtype=torch.int64)
        if any(p.prefix is not None for p in plans):  # two parts into one cache: one prompt at a time
            if b > 1:
                raise ValueError(
                    f"plans prefilled in two parts (a query-agnostic KV press) time one prompt at a time; got a "
                    f"batch of {b}; allowed: batch 1 for such a method"
                )
            self._sync()
            t0 = time.perf_counter()
            out = self.prefill_into(plans[0], cache)
        else:
            ids = torch.zeros(b, k, dtype=torch.int64)
            pos = torch.zeros(b, k, dtype=torch.int64)
            mask = torch.zeros(b, k, dtype=torch.int64)
            for i, p in enumerate(plans):
                ids[i, k - p.k :], pos[i, k - p.k :], mask[i, k - p.k :] = p.input_ids, p.position_ids, 1
            ids, pos, mask = ids.to(self.device), pos.to(self.device), mask.to(self.device)
            self._sync()
            t0 = time.perf_counter()
            out = self.base(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        out.logits[:, -1].argmax(-1).tolist()  # the first tokens, as a server would need them
        self._sync()
        elapsed = time.perf_counter() - t0
        tokens, nbytes = cache_size(cache)  # after the clock: what a KV press left, untimed
        self.last_kv = (tokens, nbytes // b)  # per prompt; a left-padded batch counts its padding
        self.last_decode_s = self._decode(plans, cache, out, mask, decode_tokens) if decode_tokens else None
        return elapsed

    def _decode(self, plans: Sequence[Plan], cache: Any, out: Any, mask: torch.Tensor, n: int) -> float:
        """Seconds to decode ``n`` greedy tokens per row from a prefilled ``cache`` (``out``:
        the prefill's output, ``mask``: its padding mask)."""
        b, held = len(plans), int(cache.get_seq_length())
        if held != mask.shape[1]:  # a KV press shortened the cache: the padding columns are gone
            if len({p.k for p in plans}) > 1:
                raise ValueError(
                    f"decode_tokens after a KV press on prompts of different lengths ({sorted({p.k for p in plans})}):"
                    f" the padding left the cache with the evicted entries; allowed: prompts of one length"
                )
            mask = torch.ones(1, held, dtype=torch.int64)
        mask = mask.expand(b, -1).to(self.device)
        pos = torch.tensor([[p.next_position] for p in plans], device=self.device)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        decoded = [nxt]
        self._sync()
        t0 = time.perf_counter()
        for step in range(n):
            mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=self.device)], dim=1)
            out = self.base(
                input_ids=nxt, position_ids=pos + step, attention_mask=mask, past_key_values=cache, use_cache=True,
                logits_to_keep=1,
            )  # fmt: skip
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            decoded.append(nxt)
        self._sync()
        elapsed = time.perf_counter() - t0
        self.last_decoded = torch.cat(decoded[:n], dim=1).cpu()  # [b, n]: the first token, then n - 1 more
        return elapsed

    def prefill_into(self, plan: Plan, cache: Any) -> Any:
        """Prefill ``plan`` into ``cache``: its first ``plan.prefix`` tokens, then the rest
        (one forward where ``prefix`` is None); the mask covers what the cache holds after
        the first part (a KV press may have shortened it) and the new tokens."""
        ids = plan.input_ids.to(self.device).unsqueeze(0)
        pos = plan.position_ids.to(self.device).unsqueeze(0)
        cut = plan.prefix if plan.prefix is not None and 0 < plan.prefix < plan.k else plan.k
        out = None
        for a, b in ((0, cut), (cut, plan.k)):
            if a == b:
                continue
            held = int(cache.get_seq_length())
            out = self.base(
                input_ids=ids[:, a:b],
                position_ids=pos[:, a:b],
                attention_mask=torch.ones(1, held + b - a, dtype=torch.long, device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out

    @torch.inference_mode()
    def score(self, plan: Plan, continuation: Sequence[int]) -> tuple[float, bool, float]:
        """Log-probability of ``continuation`` after the plan (lm-eval's ``loglikelihood``):
        the plan's tokens at its position ids, then every continuation token, whole, at
        ``plan.next_position``, ``+1``, ... (where generation would put them). The first
        continuation token is scored from the last planned token's logits, each later one from
        its predecessor's. Returns (summed log-probability, whether greedy decoding gives the
        continuation, seconds of the forward)."""
        if not continuation:
            raise ValueError("continuation is empty; allowed: at least one token to score")
        cont = torch.tensor(list(continuation), dtype=torch.int64)
        ids = torch.cat([plan.input_ids, cont[:-1]]).to(self.device).unsqueeze(0)
        tail = plan.next_position + torch.arange(cont.shape[0] - 1, dtype=torch.int64)
        pos = torch.cat([plan.position_ids, tail]).to(self.device).unsqueeze(0)
        self._sync()
        t0 = time.perf_counter()
        out = self.base(
            input_ids=ids,
            position_ids=pos,
            attention_mask=torch.ones_like(ids),
            use_cache=False,
            logits_to_keep=int(cont.shape[0]),
        )
        logp = out.logits[0].float().log_softmax(-1).cpu()  # row j predicts continuation token j
        self._sync()
        seconds = time.perf_counter() - t0
        total = float(logp.gather(1, cont.unsqueeze(1)).sum())
        return total, bool((logp.argmax(-1) == cont).all()), seconds

    @torch.inference_mode()
    def generate(self, plan: Plan, max_new_tokens: int, stop: Sequence[str] = ()) -> Generation:
        """Prefill the plan's tokens at its position ids, then decode greedily from
        ``plan.next_position``; stops at EOS, a stop string or ``max_new_tokens``."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.base.config)
        self._sync()
        t0 = time.perf_counter()
        out = self.prefill_into(plan, cache)
        return self._greedy(cache, out, t0, plan.next_position, max_new_tokens, stop)

    def _greedy(
        self, cache: Any, out: Any, t0: float, next_position: int, max_new_tokens: int, stop: Sequence[str]
    ) -> Generation:
        """Decode greedily from a prefill's output ``out`` (started at ``t0``) into ``cache``,
        the first generated token at ``next_position``; stops at EOS, a stop string or
        ``max_new_tokens``. Every cache entry precedes the decoded tokens, so the mask is all
        ones."""
        model: Any = self.base
        first_logits = out.logits[0, -1].float()
        nxt = int(first_logits.argmax())
        self._sync()
        t1 = time.perf_counter()
        kv_tokens, kv_bytes = cache_size(cache)
        held = int(cache.get_seq_length())
        tokens: list[int] = []
        text = ""
        for step in range(max_new_tokens):
            if nxt in self.eos_ids:
                break
            tokens.append(nxt)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if stop and any(s in text for s in stop):
                break
            if step == max_new_tokens - 1:
                break
            out = model(
                input_ids=torch.tensor([[nxt]], device=self.device),
                position_ids=torch.tensor([[next_position + step]], device=self.device),
                attention_mask=torch.ones(1, held + step + 1, dtype=torch.long, device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            nxt = int(out.logits[0, -1].argmax())
        self._sync()
        t2 = time.perf_counter()
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return Generation(
            text=text,
            token_ids=tokens,
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
            timing_source="wall",
            first_logits=first_logits,
            kv_tokens=kv_tokens,
            kv_bytes=kv_bytes,
        )

    # ------------------------------------------------------------------ conversations

    def open_conversation(self) -> Conversation:
        """Empty caches for a conversation whose turns extend them (:meth:`conversation_turn`,
        :meth:`speculate_conversation`)."""
        from transformers import DynamicCache

        spec = self.speculator
        return Conversation(
            cache=DynamicCache(config=self.base.config),
            positions=torch.zeros(0, dtype=torch.int64),
            speculator_cache=DynamicCache(config=spec.config) if spec is not None else None,
        )

    @torch.inference_mode()
    def conversation_turn(
        self,
        conv: Conversation,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        next_position: int,
        max_new_tokens: int,
        stop: Sequence[str] = (),
    ) -> Generation:
        """One turn of a conversation on the base model: prefill ``input_ids`` at
        ``position_ids`` (conversation positions, none already in the cache) into the
        conversation's cache, then decode greedily from ``next_position``.

        Attention is by position: a new token at position p sees exactly the cached and new
        tokens at positions <= p, wherever they sit in the cache. Tokens revived before
        later cached ones (KV revival) need that 4-D mask; tokens that all come after the
        cache, in order, get the plain causal one (the same attention, SDPA's causal path).
        The decoded tokens are dropped from the cache afterwards: the next turn prefills the
        answer with its new text, so the cache holds exactly the positions it records."""
        ids = input_ids.to(torch.int64)
        pos = position_ids.to(torch.int64)
        if ids.dim() != 1 or ids.shape != pos.shape or ids.numel() == 0:
            raise ValueError(
                f"input_ids {tuple(ids.shape)} and position_ids {tuple(pos.shape)}: allowed equal [K], K >= 1"
            )
        clash = sorted(set(pos.tolist()) & set(conv.positions.tolist()))
        if clash or pos.unique().numel() != pos.numel():
            raise ValueError(
                f"positions {clash or pos.tolist()} are already in the cache or repeated; allowed: new positions"
            )
        if next_position <= int(pos.max()):
            raise ValueError(
                f"next_position={next_position} is not after the prefilled positions (max {int(pos.max())})"
            )
        held = int(conv.cache.get_seq_length())
        if held != int(conv.positions.numel()):
            raise RuntimeError(f"the conversation cache holds {held} entries for {conv.positions.numel()} positions")
        self._sync()
        t0 = time.perf_counter()
        mask = position_mask(conv.positions, pos, self.base.dtype).to(self.device)
        out = self.base(
            input_ids=ids.to(self.device).unsqueeze(0),
            position_ids=pos.to(self.device).unsqueeze(0),
            attention_mask=mask,
            past_key_values=conv.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        gen = self._greedy(conv.cache, out, t0, next_position, max_new_tokens, stop)
        added = int(conv.cache.get_seq_length()) - held - int(ids.numel())
        if added:  # the decoded tokens: the next turn prefills the answer itself
            conv.cache.crop(-added)
        conv.positions = torch.cat([conv.positions, pos])
        return gen

    @torch.inference_mode()
    def speculate_conversation(self, conv: Conversation, new_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture:
        """Extend the speculator's own cache of the whole conversation by ``new_ids`` (at the
        positions after it) and capture, as :meth:`speculate` does for a prompt: the queries
        of the last new token and ``lookahead - 1`` greedy look-ahead tokens, and the keys of
        *every* conversation token so far. The look-ahead tokens are dropped from the cache
        afterwards. Used by KV revival: the speculator has read every token, so it can score
        the whole conversation for each new question at the cost of the new tokens only."""
        if self.speculator is None or conv.speculator_cache is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self._capture_batch(self.speculator, [new_ids.to(torch.int64)], lookahead, conv.speculator_cache)[0]
