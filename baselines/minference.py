"""``minference``: dynamic sparse attention for the prefill, through the ``minference`` package.

MInference keeps every prompt token (the kept fraction is 1.0) and makes the prefill's
attention sparse with per-head patterns (the official per-model pattern files where one
exists). Its kernels are Triton/CUDA and the package does not build or import without
CUDA, so on a machine without a CUDA GPU every sample is recorded as ``unsupported``
with the reason (:meth:`MInference.plan` raises :class:`Unsupported`), and the sweep goes on.

It acts inside the model, so it patches only inside its scoped hook
(:meth:`MInference.applied`), which the runners enter around MInference's own turn:
``MInference(attn_type, model_name)(base)`` (``pattern_model``: the hub id whose official
pattern to use; default the base model's own name) patches the transformers base model in
place on entry, and :func:`baselines.inplace.restoring` undoes it on exit. The package has
no unpatch; what it replaces was read in microsoft/MInference v0.1.6 (commit fb56c91,
``minference/models_patch.py`` and ``minference/patch.py``: ``new_patch``,
``minference_patch_with_kvcompress``, ``patch_hf``): instance attributes only, namely
``forward`` of every attention and decoder-layer module (plus ``init_minference_parameters``
and ``gather_last_q_vertical_slash_topk_v4`` on attention modules), the model's
``_prepare_cache_for_generation`` and ``prepare_inputs_for_generation``, ``model.forward``,
``model.model.forward`` / ``_old_forward`` / ``_use_sdpa`` /
``_prepare_decoder_attention_mask``, ``model.model.position_bias`` and ``hf_position_bias``
(registered submodules), and ``starting_layer`` / ``config_path`` / ``dilated1`` on the
config. ``restoring`` puts back every instance attribute, registered submodule and config
attribute of every submodule (and any class attribute of their classes), so the model
after the hook is the model before it, object for object; the full prefill measured beside
MInference in one latency job never runs patched. (The package's ``kv_cache_cpu`` path
also patches ``transformers.cache_utils.DynamicCache`` globally; it is not an option here.)
An early-exit speculator shares the base's layers, so it too runs patched inside the hook;
MInference uses no speculator.

The hook needs the base model in this process: backend ``transformers`` (a vLLM engine's
model is out of its reach; the harness refuses that pairing before anything loads). Not
yet run by this project: no GPU session has had the package (see the issue notes).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from baselines.inplace import restoring
from specprefill.options import Allowed, option
from specprefill.plan import Backend, Method, Plan, Prompt, Unsupported, full_plan, register_method

ATTN_TYPES = ("minference", "a_shape", "tri_shape", "dilated1", "streaming", "inf_llm", "hf")
#: The attribute :meth:`MInference.applied` sets on the base model while it is patched (the method it applied).
APPLIED = "_minference_applied"


class _Probe(tuple):
    """``(exists, version)`` as transformers 5 returns it, whose truth value is ``exists``."""

    def __bool__(self) -> bool:
        return bool(self[0])


@contextlib.contextmanager
def package_probe_as_bool() -> Iterator[None]:
    """Around MInference's import only: MInference 0.1.6.0 guards optional CUDA extensions
    with ``if _is_package_available("kivi_gemv"): import kivi_gemv`` (``modules/kivi.py``;
    ``papyfaiss`` in ``modules/retr_attn.py``), reading the name from
    ``transformers.utils.import_utils``. transformers 5 returns ``(exists, version)`` there,
    a tuple that is always truthy, so the import of an absent extension runs and fails. For
    the body, that function returns a tuple whose truth value is ``exists`` (indexing and
    unpacking unchanged, so transformers' own callers still work; a transformers 4 bool
    passes through); the original is back on exit, even on error."""
    from transformers.utils import import_utils

    original = import_utils._is_package_available

    @functools.wraps(original)
    def probe(pkg_name: str, *args: Any, **kwargs: Any) -> Any:
        result = original(pkg_name, *args, **kwargs)
        return _Probe(result) if isinstance(result, tuple) else result

    import_utils._is_package_available = probe
    try:
        yield
    finally:
        import_utils._is_package_available = original


def import_minference() -> Any:
    """The ``minference`` package, imported through :func:`package_probe_as_bool` (the one
    place this project imports it; ``make setup gpu=1``'s import check uses it too)."""
    with package_probe_as_bool():
        return importlib.import_module("minference")


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
    """Full prompt, sparse prefill attention (the package patches the base model inside :meth:`applied`)."""

    scope: ClassVar[str] = "prompt"
    acts_in_model: ClassVar[bool] = True
    attn_type: str = option("minference", Allowed(str, choices=ATTN_TYPES))
    # official pattern to use; default: the base model's name
    pattern_model: str | None = option(None, Allowed(str, null=True, note="null: the base model's own"))
    # not a knob: every token is prefilled (recorded for the summary)
    keep_rate: float = option(1.0, Allowed(float, choices=(1.0,), note="every token is prefilled"))

    @contextlib.contextmanager
    def applied(self, backend: Backend) -> Iterator[None]:
        """Patch the backend's base model for the body, and restore it exactly on exit.
        Where MInference cannot run (no CUDA, no package, no transformers model) nothing is
        patched; :meth:`plan` raises :class:`Unsupported` with the reason."""
        base: Any = getattr(backend, "base", None)
        if unsupported_reason() is not None or base is None:
            yield
            return
        if getattr(base, APPLIED, None) is not None:
            raise RuntimeError(f"minference: the base model is already patched by {getattr(base, APPLIED)!r}")
        Patch = import_minference().MInference

        with restoring(base):
            Patch(self.attn_type, self.pattern_model or base.config._name_or_path)(base)
            setattr(base, APPLIED, self)
            yield

    def plan(self, prompt: Prompt, backend: Backend) -> Plan:
        reason = unsupported_reason()
        if reason is not None:
            raise Unsupported(reason)
        base: Any = getattr(backend, "base", None)
        if base is None:
            raise Unsupported(f"minference patches a transformers model; backend {type(backend).__name__} has none")
        if getattr(base, APPLIED, None) != self:
            raise RuntimeError(
                "minference: plan() ran outside MInference.applied(backend), so the base model is not patched and "
                "its prefill would be full prefill recorded as minference; runners enter method.applied(backend) "
                "around the method's turn"
            )
        return full_plan(prompt)
