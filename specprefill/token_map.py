"""A speculator from another model family: its token importances carried onto the base's tokens.

SpecPrefill (Liu, Chen & Zhang, ICML 2025) scores the base model's prompt tokens with a
speculator that shares the base's tokenizer. A speculator with another tokenizer reads the
same prompt *text* and scores its own tokens; this module carries those scores onto the
base's tokens through character offsets, after which selection runs as usual (chunks, the
base's original positions). The rule, ``max_overlap``:

* The prompt text is the base's prompt ids decoded (special tokens kept as their text);
  each base token's character span comes from re-tokenizing that text with offsets, which
  must give back the same ids. Where it does not (random token ids, a byte split inside a
  character), each base token's span is its own decoded text laid end to end, and that
  concatenation is the text the speculator reads.
* The speculator tokenizes the text with its own conventions (its special tokens added
  where it adds them) and offsets; its tokens with an empty span (an added BOS) score no
  base token.
* A base token's score is the **maximum** over the speculator tokens whose character span
  overlaps its own (``s_i < e_j`` and ``s_j < e_i``). A base token that no speculator token
  overlaps (an empty span) takes the score of the last speculator token starting at or
  before it (the first one if none does).

The maximum keeps a needle found by any of the speculator tokens that cover it: a base
token split across two speculator tokens is as important as its most important part.
Pooling (``pool_kernel``) applies to the speculator's own tokens, before the mapping.
Both tokenizers must be "fast" (Rust) tokenizers, the only ones that give offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

RULES = ("max_overlap",)


def check_offsets(tokenizer: Any, which: str) -> None:
    """A tokenizer that cannot give character offsets cannot take part in a cross-family pair."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"the {which} tokenizer ({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '?')}) gives no "
            f"character offsets; allowed for a speculator from another family: fast (Rust) tokenizers only"
        )


def char_spans(tokenizer: Any, ids: list[int]) -> tuple[str, np.ndarray]:
    """The text of ``ids`` and each id's character span ``[start, end)`` in it (``[N, 2]``)."""
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) == list(ids):
        return text, np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    pieces = [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
    return "".join(pieces), np.stack([ends - np.asarray([len(p) for p in pieces], dtype=np.int64), ends], axis=1)


def map_scores(spec_scores: np.ndarray, spec_spans: np.ndarray, base_spans: np.ndarray) -> np.ndarray:
    """The ``max_overlap`` rule: per base token, the max score of the speculator tokens whose
    span overlaps its span; with none, the last speculator token starting at or before it."""
    spec_scores = np.asarray(spec_scores, dtype=np.float64)
    spec_spans = np.asarray(spec_spans, dtype=np.int64).reshape(-1, 2)
    base_spans = np.asarray(base_spans, dtype=np.int64).reshape(-1, 2)
    if len(spec_scores) != len(spec_spans):
        raise ValueError(f"{len(spec_scores)} speculator scores for {len(spec_spans)} speculator tokens")
    real = spec_spans[:, 1] > spec_spans[:, 0]
    scores, spans = spec_scores[real], spec_spans[real]
    if len(scores) == 0:
        raise ValueError("the speculator's tokens cover no character of the prompt text")
    starts, ends = spans[:, 0], spans[:, 1]
    if np.any(np.diff(starts) < 0) or np.any(np.diff(ends) < 0):
        raise ValueError("speculator token spans are not in text order")
    lo = np.searchsorted(ends, base_spans[:, 0], side="right")  # first speculator token ending after the start
    hi = np.searchsorted(starts, base_spans[:, 1], side="left")  # first one starting at or after the end
    before = np.clip(np.searchsorted(starts, base_spans[:, 0], side="right") - 1, 0, len(scores) - 1)
    out = np.empty(len(base_spans), dtype=np.float64)
    for j in range(len(base_spans)):
        out[j] = scores[lo[j] : hi[j]].max() if hi[j] > lo[j] else scores[before[j]]
    return out


@dataclass(frozen=True)
class TokenMap:
    """One prompt read by a speculator with another tokenizer: its ids, and the spans that
    carry its scores onto the base's tokens."""

    speculator_ids: torch.Tensor  # int64 [M]
    speculator_spans: np.ndarray  # [M, 2]
    base_spans: np.ndarray  # [N, 2]
    rule: str = "max_overlap"

    @classmethod
    def of(cls, base_ids: torch.Tensor, base_tokenizer: Any, speculator_tokenizer: Any) -> TokenMap:
        text, base_spans = char_spans(base_tokenizer, [int(i) for i in base_ids.tolist()])
        enc = speculator_tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
        return cls(
            torch.tensor(enc["input_ids"], dtype=torch.int64),
            np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2),
            base_spans,
        )

    def to_base(self, speculator_scores: torch.Tensor) -> torch.Tensor:
        """float32 ``[N]`` base-token scores from ``[M]`` speculator-token scores."""
        mapped = map_scores(speculator_scores.detach().float().cpu().numpy(), self.speculator_spans, self.base_spans)
        return torch.from_numpy(mapped).to(torch.float32)
