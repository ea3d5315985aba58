"""The transformers backend itself: a base model, its tokenizer and a speculator; prefill of a
method's plans, decoding, scoring and a conversation's turns. What it relies on in
transformers is listed in :mod:`specprefill.backends.transformers`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specprefill.backends.transformers.capture import capture_batch, capture_window, draft_tokens
from specprefill.backends.transformers.hooks import cache_size, early_exit_view, position_mask
from specprefill.plan import Generation, Plan, SpeculatorCapture
from specprefill.token_map import RULES, check_offsets


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
        #: Set by the caller around a timed call (harness.energy.energy_window): called with
        #: ``prefill_end``, ``decode_start`` and ``decode_end`` at those points, as the clocks stop.
        self.energy_mark: Callable[[str], None] | None = None

    @property
    def base_config(self) -> Any:
        return self.base.config

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _mark(self, name: str) -> None:
        if self.energy_mark is not None:
            self.energy_mark(name)

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
    def speculate_window(self, input_ids: torch.Tensor, window: int, draft: int = 0) -> SpeculatorCapture:
        """The speculator's prefill of one prompt with the queries of its last ``window``
        tokens, then (``draft`` > 0) its greedy continuation of up to ``draft`` tokens with
        each decode step's query
        (:func:`~specprefill.backends.transformers.capture.capture_window`)."""
        self._own_tokenizer("a window capture")
        cap, flops = capture_window(
            self.speculator, input_ids, window, self.device, self.prefill_chunk, draft, self._draft_eos()
        )
        self.method_flops += flops
        self._sync()
        return cap

    def _own_tokenizer(self, what: str) -> None:
        """Refuse a missing speculator, or one with its own tokenizer, naming ``what`` needs it."""
        if self.speculator is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        if self.speculator_tokenizer is not None:
            raise ValueError(f"{what} needs a speculator sharing the base's tokenizer; this one has its own")

    def _draft_eos(self) -> list[int]:
        """The speculator's EOS ids: its own generation config's, else the base's."""
        eos = getattr(getattr(self.speculator, "generation_config", None), "eos_token_id", None)
        return sorted({eos} if isinstance(eos, int) else set(eos or ()) or self.eos_ids)

    @torch.inference_mode()
    def draft(self, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
        """The speculator's greedy continuation of one prompt (``[n]``), up to
        ``max_new_tokens`` tokens, its first EOS included (its own generation config's EOS
        ids, else the base's), as ``generate`` writes it; its FLOPs counted in
        :attr:`method_flops`."""
        self._own_tokenizer("a draft continuation")
        tokens, flops = draft_tokens(self.speculator, input_ids, max_new_tokens, self._draft_eos(), self.device)
        self.method_flops += flops
        self._sync()
        return tokens

    @torch.inference_mode()
    def _capture_batch(
        self, model: Any, input_ids: torch.Tensor | Sequence[torch.Tensor], lookahead: int, cache: Any = None
    ) -> list[SpeculatorCapture]:
        """:func:`~specprefill.backends.transformers.capture.capture_batch` on this backend's
        device and chunking, its FLOPs counted in :attr:`method_flops`."""
        captures, flops = capture_batch(model, input_ids, lookahead, self.device, self.prefill_chunk, cache)
        self.method_flops += flops
        self._sync()
        return captures

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
        self._mark("prefill_end")
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
        self._mark("decode_start")
        t0 = time.perf_counter()
        for step in range(n):
            mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=self.device)], dim=1)
            out = self.base(
                input_ids=nxt,
                position_ids=pos + step,
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            decoded.append(nxt)
        self._sync()
        elapsed = time.perf_counter() - t0
        self._mark("decode_end")
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
