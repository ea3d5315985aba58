"""Replicas: tiny random-weight models with a paper checkpoint's own architecture fields.

A replica takes the checkpoint's transcribed ``config.json`` (``conf/model/arch/``) and
shrinks only the sizes (``shape`` in the model config: hidden size, layers, heads, MLP),
keeping everything else the real model has: the 128256-token vocabulary, Llama-3.1's
``rope_scaling`` (type llama3) and rope theta, its 131072-token window, its GQA ratio
(chosen in the shape), its BOS/EOS ids, untied embeddings and, for the FP8 405B, its
``quantization_config``. The weights are drawn once (seeded) and saved as safetensors in
the cache, so the transformers backend and vLLM load the *same* weights and their greedy
outputs can be compared token for token. Nothing is downloaded.

The offline tokenizer is SmolLM2's (49152 tokens); the replica's vocabulary is the real
one. Token ids the tokenizer cannot spell (>= 49152) get all-zero LM-head rows, so their
logits are exactly 0 while the others are random around 0: the largest of 49152 random
logits is far above 0, so greedy decoding never picks them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from harness.integrity import ensure

#: Fields of a checkpoint's config.json that describe the file, not the architecture.
DROP = ("_name_or_path", "transformers_version", "torch_dtype")
#: Sizes a replica may shrink (everything else is the checkpoint's own).
SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def replica_config(arch: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's config with ``shape``'s sizes; refuses any other override."""
    unknown = sorted(set(shape) - set(SIZES))
    if unknown:
        raise ValueError(
            f"replica shape: {unknown} are not sizes; allowed: {list(SIZES)} (the rest is the checkpoint's)"
        )
    cfg = {k: v for k, v in arch.items() if k not in DROP}
    cfg.update(shape)
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ValueError("replica shape: num_attention_heads must be a multiple of num_key_value_heads")
    return cfg


def replica_dir(arch: dict[str, Any], shape: dict[str, Any], seed: int, tokenizer: Any, root: Path) -> Path:
    """The replica's folder (config, safetensors weights, tokenizer), built once and reused."""

    cfg = replica_config(arch, shape)
    key = hashlib.sha256(json.dumps({"cfg": cfg, "seed": seed, "vocab": len(tokenizer)}, sort_keys=True).encode())
    folder = root / "models" / "replica" / key.hexdigest()[:16]

    return ensure(folder, lambda: _build(folder, cfg, seed, tokenizer), "replica weights")


def _build(folder: Path, cfg: dict[str, Any], seed: int, tokenizer: Any) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    quant = cfg.pop("quantization_config", None)  # random weights are not FP8: the config keeps it, the tensors don't
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(LlamaConfig(**copy.deepcopy(cfg)))  # it edits nested dicts in place
    with torch.no_grad():
        head = model.lm_head.weight if not cfg.get("tie_word_embeddings") else model.model.embed_tokens.weight
        head[len(tokenizer) :] = 0.0  # ids the offline tokenizer cannot spell are never chosen
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # The config as the checkpoint writes it (rope_scaling, its quantization_config), not as
    # this transformers version would re-save it: both backends read it the way they read the real one.
    own = {**cfg, **({"quantization_config": quant} if quant is not None else {})}
    (tmp / "config.json").write_text(json.dumps(own, indent=2) + "\n")
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
