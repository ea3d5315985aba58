"""``minference``: dynamic sparse attention for the prefill, through the ``minference`` package.

MInference keeps every prompt token (the kept fraction is 1.0) and makes the prefill's
attention sparse with per-head patterns (the official per-model pattern files where one
exists). Its kernels are Triton/CUDA and the package does not build or import without
CUDA, so on a machine without a CUDA GPU every sample is recorded as ``unsupported``
with the reason, and the sweep goes on.

On a CUDA machine with the package installed, the base model is patched once, in place,
with ``MInference(attn_type, model_name)`` (``pattern_model``: the hub id whose official
pattern to use; default the base model's own name). Not yet run by this project: no GPU
session has had the package (see the issue notes).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specprefill.plan import Backend, Method, Plan, Prompt, Unsupported, full_plan, register_method

ATTN_TYPES = ("minference", "a_shape", "tri_shape", "dilated1", "streaming", "inf_llm", "hf")


def unsupported_reason() -> str | None:
    """Why MInference cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "minference needs a CUDA GPU (Triton/CUDA sparse-attention kernels); no CUDA device here"
    if importlib.util.find_spec("minference") is None:
        return "minference needs the minference package (pip install minference on a CUDA machine; it builds CUDA code)"
    return None


@register_method("minference")
@dataclass(frozen=True)
class MInference(Method):
    """Full prompt, sparse prefill attention (the package patches the base model)."""

    scope: ClassVar[str] = "prompt"
    attn_type: str = "minference"
    pattern_model: str | None = None  # official pattern to use; default: the base model's name
    keep_rate: float = 1.0  # not a knob: every token is prefilled (recorded for the summary)

    def __post_init__(self) -> None:
        if self.attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type={self.attn_type!r}; allowed: {list(ATTN_TYPES)}")
        if self.keep_rate != 1.0:
            raise ValueError(f"minference keeps every token; keep_rate={self.keep_rate!r}, allowed: 1.0")

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        reason = unsupported_reason()
        if reason is not None:
            raise Unsupported(reason)
        t0 = time.perf_counter()
        base: Any = getattr(backend, "base", None)
        if base is None:
            raise Unsupported(f"minference patches a transformers model; backend {type(backend).__name__} has none")
        if not getattr(base, "_minference_patched", False):
            from minference import MInference as Patch  # type: ignore[import-not-found]

            name = self.pattern_model or base.config._name_or_path
            Patch(self.attn_type, name)(base)
            base._minference_patched = True
        plan = full_plan(prompt)
        return Plan(plan.input_ids, plan.position_ids, plan.next_position, plan.kept_indices,
                    {"patch_s": time.perf_counter() - t0})  # fmt: skip
