"""Typed configs: the schemas of the four entry points, and turning Hydra's dicts into records.

Each entry point (``harness.jobs.eval``, ``harness.jobs.latency``, ``harness.jobs.qps``,
``harness.jobs.lm_eval``) has a schema dataclass registered in Hydra's ConfigStore as the first entry of its defaults
list, so values are type-checked when Hydra composes them (``limit=abc`` is refused).
Hydra's ``+key=value`` appends even to a typed config, so :func:`check_keys` also
rejects every key no schema or record declares, at every level (top level, model,
method, benchmark and its options): an unknown key can never silently change a run's
hash. Nested groups are validated by their own dataclasses (:class:`ModelConfig`,
methods, :class:`BenchmarkConfig` and each benchmark's options).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import MISSING, DictConfig, OmegaConf

from harness import hub
from harness.benchmarks.base import BenchmarkConfig
from harness.models.catalog import BACKENDS, ModelConfig, check_backend, parse_speculator
from harness.models.placement import WINDOW_MARGIN, layer_count
from harness.registry import build_method, method_names, method_option_names
from harness.store import token_budget
from specprefill.options import FLAG, KEEP_TOKENS, SEED, Allowed, check_options, option
from specprefill.plan import LATER_OPTIONS, Method, method_class

CONF = Path(__file__).resolve().parents[1] / "conf"


#: ``prompts`` of a latency job: random token ids, a benchmark's, or whichever the methods need.
PROMPTS = ("auto", "random", "benchmark")
#: ``engine_ideal`` of a latency job (``true``/``false`` typed as YAML booleans too).
ENGINE_IDEAL = ("auto", "true", "false")
#: ``arrival`` of a QPS job's requests.
ARRIVALS = ("poisson", "constant")
#: ``ruler_data`` of an lm-eval job: RULER's packaged files, or lm-eval's own sources.
RULER_DATA = ("packaged", "lm-eval")

DEFAULT_GRID = [[1, 16], [1, 64], [1, 256], [1, 1024], [1, 4096]]
GROUP = Allowed(dict, note="a config group, checked by its own record")
NAMES = Allowed(list, item=str, null=True, note="a list of names")
#: ``also``: more methods in one job, each a ``conf/method`` name or a mapping naming one with
#: options that replace its preset's (:func:`also_methods`).
ALSO = Allowed(list, null=True, note="conf/method names or {name: <conf/method>, <option>: value} mappings, "
               "e.g. [knorm,{name:specprefill,lookahead:8}]")  # fmt: skip


@dataclass
class CommonSchema:
    """Keys every entry point shares, spelled the same way everywhere. Each declares what
    it takes (:func:`specprefill.options.option`); :func:`check_keys` checks every value
    against it before anything else."""

    model: Any = option(MISSING, GROUP)
    method: Any = option(MISSING, GROUP)
    keep: float = option(0.3, Allowed(float, gt=0, le=1, what="a fraction", note="of prompt tokens the base prefills"))
    lookahead: int = option(1, Allowed(int, ge=1, note="SpecPrefill look-ahead steps; 1 = the last prompt token"))
    keep_tokens: int | None = option(None, KEEP_TOKENS)  # a budget in tokens, instead of keep, for every method
    out: str = option("results/default", Allowed(str, note="a folder"))
    backend: str = option("transformers", Allowed(str, choices=BACKENDS))
    reference: str = option("full", Allowed(str, note="a conf/method name"))  # ratios are taken against it
    dry_run: bool = option(False, FLAG)
    #: $ per GPU-hour: the dry run prints the planned run's cost beside its GPU-hours.
    gpu_hour_usd: float | None = option(None, Allowed(float, gt=0, null=True, note="dollars per GPU-hour"))
    allow_failures: bool = option(False, FLAG)  # exit 0 even when samples (or requests, grid points) failed


@dataclass
class EvalSchema(CommonSchema):
    """``conf/config.yaml`` (``harness.jobs.eval``, ``make eval``)."""

    benchmark: Any = option(MISSING, GROUP)
    length: int = option(4096, Allowed(int, ge=1, note="tokens"))
    limit: int = option(10, Allowed(int, ge=1, note="samples per task"))
    max_new: int | None = option(None, Allowed(int, ge=1, null=True, note="tokens; null: the benchmark's own"))
    tasks: Any = option(
        None, Allowed((str, list), item=str, null=True, note="task names: tasks=[a,b], tasks=a,b or tasks=all")
    )
    data_dir: str | None = option(None, Allowed(str, null=True, note="a folder of the benchmark's files"))
    also: Any = option(None, ALSO)


@dataclass
class LatencySchema(CommonSchema):
    """``conf/latency.yaml`` (``harness.jobs.latency``, ``make latency``)."""

    grid: Any = option(
        allowed=Allowed(list, item=list, note="[batch, length] points, e.g. 'grid=[[1,4096],[2,2048]]'"),
        factory=lambda: [list(p) for p in DEFAULT_GRID],
    )
    warmup: int = option(1, Allowed(int, ge=0, note="untimed iterations"))
    iters: int = option(10, Allowed(int, ge=1, note="timed pairs"))
    seed: int = option(0, SEED)
    prompts: str = option("auto", Allowed(str, choices=PROMPTS))
    prompt_task: str = option("qa_1", Allowed(str, note="a task of prompt_benchmark"))
    prompt_benchmark: str = option("ruler", Allowed(str, note="a registered benchmark"))
    prompt_options: Any = option(None, Allowed(dict, null=True, note="the benchmark's options"))
    decode_tokens: int = option(8, Allowed(int, ge=0, note="tokens decoded after each prefill; 0: TTFT only"))
    aa_check: bool = option(True, FLAG)
    engine_ideal: Any = option("auto", Allowed(str, choices=(*ENGINE_IDEAL, True, False)))
    also: Any = option(None, ALSO)


@dataclass
class QPSSchema(EvalSchema):
    """``conf/qps.yaml`` (``harness.jobs.qps``, ``make qps``)."""

    rates: Any = option(
        None,
        Allowed(
            (float, list), item=float, null=True, note="request rates in req/s, e.g. rates=[0.1,0.2], or null to search"
        ),
    )
    arrival: str = option("poisson", Allowed(str, choices=ARRIVALS))
    qps: Any = option(MISSING, GROUP)


class ConfigError(CompactHydraException, ValueError):
    """A bad value in a config: Hydra prints its message alone (no traceback) and exits 1;
    ``HYDRA_FULL_ERROR=1`` shows the traceback."""


def check_out(out: str | Path) -> Path:
    """``out``: a folder that exists or can be made, and can be written; a file, or a place
    that cannot be written, is a :class:`ConfigError` before anything runs."""
    if not str(out).strip():
        raise ConfigError(f"out={str(out)!r} is empty; allowed: a folder (existing, or one to create)")
    path = Path(str(out)).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out={str(out)!r} is a file; allowed: a folder (existing, or one to create)")
    if (path / "plots").exists() and not (path / "plots").is_dir():
        raise ConfigError(
            f"{path / 'plots'} is a file where the report's figures go (out={str(out)!r}); allowed: move it away or "
            f"delete it"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-check-{uuid.uuid4().hex[:8]}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"out={str(out)!r} cannot be written ({e.strerror or e}); allowed: a folder this user can create and write"
        ) from None
    return path


def check_common(c: dict[str, Any]) -> None:
    """The shorthands every entry point shares, whichever method reads them: ``keep`` in
    (0, 1] (even for full prefill, which ignores it: a typo must not pass silently),
    ``lookahead`` >= 1, ``allow_failures`` a bool, ``out`` a writable folder."""
    shared = {"keep": c.get("keep"), "lookahead": c.get("lookahead"), "allow_failures": c.get("allow_failures", False)}
    if c.get("keep_tokens") is not None:
        shared["keep_tokens"] = c["keep_tokens"]
    try:  # their declarations (CommonSchema): also where no schema composed them (lm-eval's model args)
        check_options(CommonSchema, shared)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_token_budget(c.get("keep_tokens"), c.get("method"))
    ref = c.get("reference")
    methods = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
    if ref is not None and ref not in methods:
        close = difflib.get_close_matches(str(ref), methods, n=1)
        raise ConfigError(
            f"reference={ref!r}; allowed: a conf/method name {methods}"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    check_out(c["out"])


def check_token_budget(tokens: int | None, method: Any) -> None:
    """``keep_tokens=N``: refused in one line for a method that takes no token budget (its
    options have no ``keep_tokens``: MInference prefills every token); full prefill, the
    reference, ignores it as it ignores ``keep``."""
    if tokens is None or not isinstance(method, dict) or "name" not in method:
        return
    name = str(method["name"])
    if name not in method_names():
        return  # the method's own check names it
    if method_class(name).identity or "keep_tokens" in method_option_names(name):
        return
    budgeted = sorted(p.stem for p in (CONF / "method").glob("*.yaml") if "keep_tokens" in p.read_text())
    raise ConfigError(
        f"keep_tokens={tokens}: method {method['name']!r} takes no token budget; allowed: keep_tokens with one of "
        f"{budgeted} (or full, which ignores it)"
    )


def check_model_fits(model: Any, methods: list[Any], longest_prompt: int) -> None:
    """What needs the model's shape, checked from its config before anything loads: a
    speculator for each method that needs one; an early-exit speculator (``self_layers:M``)
    within the base's layers; then each method's own options against the model's shape
    (:meth:`specprefill.plan.Method.check_model`)."""

    for m in methods:
        if m.needs_speculator and model.speculator is None:
            raise ConfigError(f"method {m.name!r} needs a speculator, but model {model.name!r} has speculator: null")
    layers = layer_count(model)
    spec = parse_speculator(model.speculator) if any(m.needs_speculator for m in methods) else None
    if layers is not None and spec is not None and spec[0] == "self_layers" and int(spec[1]) > layers:
        raise ConfigError(
            f"speculator={model.speculator!r}: model {model.name!r} has {layers} layers; "
            f"allowed: self_layers:1 .. self_layers:{layers}"
        )
    # the draft's layers (SpecPC's starting layer is one of them): the base's first M, or its own model's
    draft_layers = int(spec[1]) if spec is not None and spec[0] == "self_layers" else None
    if spec is not None and spec[0] == "model":
        check_speculator_window(model, str(spec[1]), longest_prompt)
        from harness.models.catalog import model_config

        draft_layers = layer_count(model_config(str(spec[1])))
    for m in methods:  # each method checks its own options against the shape (Method.check_model)
        try:
            m.check_model(model.name, layers, model.max_context, longest_prompt, draft_layers)
        except ValueError as e:
            raise ConfigError(f"method {m.name!r}: {e}") from e


#: A speculator from another family reads the prompt in its own tokens: up to this many per
#: base token, assumed before anything loads (English text runs within ~10 % across the
#: Llama, Qwen and SmolLM2 tokenizers; code and other scripts further apart).
OTHER_TOKENIZER_MARGIN = 1.25
#: Tokens the speculator reads past the prompt (look-ahead), at most, in the check.
LOOKAHEAD_MARGIN = 16


def family(name: str) -> str:
    """A model config's family as its name says it (``qwen2.5-coder-1.5b`` -> ``qwen2.5``,
    ``llama70b`` -> ``llama``: a size the name ends with is not the family): models of one
    family share a tokenizer."""
    return re.sub(r"(?<=[a-z])\d+(\.\d+)?b$", "", name.split("-", 1)[0].lower())


#: Model sources that load a tokenizer of their own (harness.models.loading.load_tokenizer);
#: every other source (SmolLM2's package, random-weight and replica models) loads SmolLM2's.
OWN_TOKENIZER_SOURCES = ("hub", "gguf_parts")


def tokenizer_family(model: Any) -> str:
    """The family of the tokenizer a model config loads: its name's (:func:`family`) where
    its source brings its own tokenizer, else SmolLM2's (``tiny-random``, ``synth8b`` and the
    replicas carry SmolLM2's tokenizer, whatever their names say)."""
    return family(str(model.name)) if model.source in OWN_TOKENIZER_SOURCES else family("smollm2")


def check_speculator_window(model: Any, speculator: str, longest_prompt: int) -> None:
    """A ``model:<name>`` speculator reads the whole prompt: its own context window must hold
    the run's longest prompt in its tokens: the base's count for a speculator of the base's
    family (its tokenizer), else that count times :data:`OTHER_TOKENIZER_MARGIN` plus the
    look-ahead (a conservative estimate: the prompt is not tokenized before loading).
    Refused in one line before anything loads; past its window a speculator's positions are
    untrained (or its position table overflows), and its scores would be silent noise."""
    from harness.models.catalog import model_config

    try:
        other = model_config(speculator)
    except ValueError as e:
        raise ConfigError(f"speculator='model:{speculator}': {e}") from e
    same = tokenizer_family(other) == tokenizer_family(model)
    factor, margin = (1.0, 0) if same else (OTHER_TOKENIZER_MARGIN, LOOKAHEAD_MARGIN)
    need = int(longest_prompt * factor + 0.999999) + margin
    if need > other.max_context:
        allowed = int((other.max_context - margin) / factor)
        how = f"{longest_prompt} tokens of model {model.name!r}" + (
            "" if same else f", estimated at {factor:g}x for its own tokenizer, plus {margin} of look-ahead: {need}"
        )
        raise ConfigError(
            f"speculator='model:{speculator}' has a context window of {other.max_context} tokens, but the run's longest "
            f"prompt ({how}) would pass it; allowed: prompts up to {allowed} tokens (length=), or a speculator with "
            f"a longer window"
        )


#: What a ``make qps`` run can do where a refusal would say ``backend=transformers``: it serves
#: the base on ``vllm serve``, with no backend to choose; the other jobs measure there.
ELSEWHERE = "or backend=transformers in make eval (quality) or make latency (TTFT)"


def check_in_model(methods: list[Any], backend: str, model: Any = None, *, serving: bool = False) -> None:
    """A method that acts inside the base model (``acts_in_model``: MInference patches its
    attention) needs the base in this process, where its ``applied`` hook reaches it:
    backend ``transformers``. On vLLM the engine owns the model, so refuse the pairing
    before anything loads rather than record every sample unsupported beside a reference
    that ran at full cost. The same for a method that reads the base model's own attention
    (``reads_base``: a method reading the base's own attention), which only the transformers backend exposes.
    Then, given the ``model``, :func:`check_speculator_tokenizer`; and
    :func:`check_side_models`: the models a method loads beside the base. ``serving``: the base
    is served by ``vllm serve`` (``make qps``), which has no backend to choose, so a refusal
    names what such a run can do instead (another method or speculator; :data:`ELSEWHERE`)."""
    engine = "make qps's vLLM server (its only backend)" if serving else f"backend={backend!r}"
    for m in methods:
        if getattr(m, "acts_in_model", False) and backend != "transformers":
            allowed = "a method that only chooses prompt tokens (e.g. method=specprefill), " + ELSEWHERE
            raise ConfigError(
                f"method {m.name!r} acts inside the base model (it patches it in this process), but {engine} runs the "
                f"base in an engine the method cannot reach; allowed: "
                + (allowed if serving else "backend=transformers (one device)")
            )
        if getattr(m, "reads_base", False) and backend != "transformers":
            allowed = "a method that needs no base attention (e.g. method=specprefill: its speculator's), " + ELSEWHERE
            raise ConfigError(
                f"method {m.name!r} reads the base model's own attention, which {engine} does not expose (the engine "
                f"owns the model; every {'request' if serving else 'sample'} would be unsupported); allowed: "
                + (allowed if serving else "backend=transformers")
            )
    if model is not None:
        check_speculator_tokenizer(model, methods, backend, serving)
    check_side_models(methods)


def check_speculator_tokenizer(model: Any, methods: list[Any], backend: str, serving: bool = False) -> None:
    """A ``model:<name>`` speculator of another family (another tokenizer: its scores reach
    the base's tokens through :mod:`specprefill.token_map`) runs beside the base on the
    transformers backend only: an engine's prompts are the base's token ids, which nothing
    maps to the speculator's. Refused in one line before anything loads, where a method
    needs the speculator (the factory's own check, after the speculator has loaded, stays
    for what the configs cannot tell). ``serving``: as :func:`check_in_model`'s."""
    spec = parse_speculator(model.speculator) if any(m.needs_speculator for m in methods) else None
    if backend == "transformers" or spec is None or spec[0] != "model":
        return
    from harness.models.catalog import model_config

    try:
        other = model_config(str(spec[1]))
    except ValueError as e:
        raise ConfigError(f"speculator='model:{spec[1]}': {e}") from e
    if tokenizer_family(other) == tokenizer_family(model):
        return
    mine = tokenizer_family(model)
    same = [
        p.stem
        for p in sorted((CONF / "model").glob("*.yaml"))
        if p.stem != model.name and tokenizer_family(model_config(p.stem)) == mine
    ]
    where = "and make qps serves the base on vLLM (its only backend)" if serving else f"not on backend={backend!r}"
    raise ConfigError(
        f"speculator={model.speculator!r} has another tokenizer ({tokenizer_family(other)}) than model "
        f"{model.name!r} ({mine}): its token map runs on backend=transformers only, {where}; "
        f"allowed: {'' if serving else 'backend=transformers, or '}a speculator with the base's tokenizer: self_layers:M"
        + "".join(f", model:{n}" for n in same)
        + (f", {ELSEWHERE}" if serving else "")
    )


def check_side_models(methods: list[Any]) -> None:
    """A model a method loads beside the base (``side_model()``: LLMLingua's small LM or
    LLMLingua-2's classifier, rag_dense's encoder) must be a local folder, in the local hub
    cache, or on a hub this machine reaches: otherwise every sample would fail, after the
    base model (or a vLLM engine) has loaded. Refused before anything loads, in one line."""

    for m in methods:
        side = getattr(m, "side_model", None)
        path = side() if callable(side) else None
        if not path or Path(str(path)).expanduser().is_dir():
            continue
        hint = getattr(m, "side_model_hint", "")
        if str(path).startswith(("/", ".", "~")) or Path(str(path)).expanduser().exists():
            raise ConfigError(
                f"method {m.name!r}: model_path={path!r} is not a folder; allowed: a local model folder{hint}"
            )
        if hub.hub_cached(str(path)):
            continue
        why = hub.hub_unreachable()
        if why:
            raise ConfigError(
                f"method {m.name!r} needs the model {path!r} from the hub, which is not in the local hub cache and "
                f"{why}; allowed: method.model_path=<a local copy's folder>{hint}, or a machine that reaches the hub"
            )


def check_explicit(cfg: Any, keys: Sequence[str]) -> None:
    """What a command set explicitly (``keys``: the job's override keys) that the composed
    job would not use: ``length`` for a benchmark that cuts its prompts to the model's max
    input length (LongBench, InfiniteBench: ``length: ${model.max_input_length}`` in
    ``conf/benchmark``), which would otherwise run at another length than typed."""
    bench = cfg.get("benchmark") if "benchmark" in cfg else None
    if "length" not in keys or bench is None or "length" not in cfg:
        return
    used, given = bench.get("length"), cfg.get("length")
    if used != given:
        raise ConfigError(
            f"length={given}: benchmark {bench.get('name')!r} does not use it (its prompts are cut to "
            f"model.max_input_length, {used} tokens); allowed: drop length=, or set model.max_input_length=<tokens>"
        )


#: Shorthands a command may type that a method's preset may not read (``conf/method``:
#: ``${lookahead}``, ``${keep}``), each with two values that tell reading from ignoring.
UNREAD_PROBES = {"lookahead": (1, 2), "keep": (0.25, 0.5)}


def reads_shorthand(cfg: Any, key: str) -> bool:
    """Whether a composed job's method uses the shorthand ``key`` (``lookahead``, ``keep``):
    its options (:func:`method_spec`, a composed method's parts included) change with it."""
    if "method" not in cfg or key not in cfg:
        return False
    if cfg.get("also"):
        return True  # methods timed beside it (a latency job's also=) may read it
    specs = []
    for v in UNREAD_PROBES[key]:
        c = OmegaConf.merge(cfg, {key: v})
        assert isinstance(c, DictConfig)
        specs.append(method_spec(container(c)["method"], int(c.get("lookahead", 1))))
    return specs[0] != specs[1]


def _reads_data_dir(cfg: Any) -> bool:
    """Whether a composed job's benchmark takes the top-level ``data_dir`` (``conf/benchmark``:
    ``data_dir: ${data_dir}`` in its options)."""
    bench = cfg.get("benchmark") if "benchmark" in cfg else None
    return bench is not None and "data_dir" in (bench.get("options") or {})


def check_unread(points: Sequence[Any], typed: Sequence[str], presets: Sequence[str] = ()) -> None:
    """A shorthand the command typed (``typed``: its override keys) that no job of the sweep
    reads is refused in one line, naming it and what ignores it: ``lookahead=4`` with
    ``method=specprefill_lah8`` (its preset fixes 8), ``keep=0.1`` with ``minference``,
    ``data_dir`` with a benchmark that builds its own samples. A job run without it would
    look like a run with it. One job that reads it is enough (``method=full,specprefill
    lookahead=4``); the reference's jobs do not count (full prefill ignores both by design:
    ``method=full keep=1`` runs). ``presets``: the ``conf/method`` names the command typed."""
    if "data_dir" in typed and points and not any(_reads_data_dir(c) for c in points):
        names = sorted({str(c.benchmark.get("name")) for c in points if "benchmark" in c})
        raise ConfigError(
            f"data_dir={points[0].get('data_dir')}: benchmark {', '.join(names)} does not read it (it builds its "
            f"samples itself); allowed: drop data_dir=, or a benchmark of official files (longbench, longbench_e, "
            f"infinitebench)"
        )
    methods = [c for c in points if "method" in c and c.method.get("name") != c.get("reference", "full")]
    for key in UNREAD_PROBES:
        if key not in typed or not methods or any(reads_shorthand(c, key) for c in methods):
            continue  # the reference alone (it ignores both by design), or a method that reads it
        if key == "keep" and any(c.get("keep_tokens") is not None for c in points):
            continue  # a budget in tokens replaces the fraction (method_spec): said in the rows' label
        names = sorted(set(presets) or {str(c.method.get("name")) for c in points if "method" in c})
        raise ConfigError(
            f"{key}={points[0].get(key)}: no method of this command reads it ({', '.join(names)}: their "
            f"conf/method presets fix or ignore it); allowed: drop {key}=, or a method whose preset reads it "
            f"(e.g. specprefill), or set the method's own option (method.<option>=)"
        )


def longest_prompt(model: Any, benchmark: BenchmarkConfig) -> int:
    """The longest prompt a benchmark config can give this model, in tokens: the benchmark's
    length (RULER's target), never past the model's input budget (LongBench's truncation)."""
    return min(int(benchmark.length), int(model.max_input_length or model.max_context))


def longest_sequence(model: Any, benchmark: Any) -> int:
    """The longest sequence (tokens) a run of ``benchmark`` (a built :class:`Benchmark`) gives
    the engine: its longest prompt, the most tokens a task generates (capped by ``max_new``)
    and :data:`harness.models.placement.WINDOW_MARGIN` (chat-template tokens around a truncated
    prompt), never past the model's window (the decode budget stops there too). The model's
    window where a benchmark does not say what it generates."""

    answer = benchmark.max_new_tokens()
    if answer is None:
        return int(model.max_context)
    cap = benchmark.cfg.max_new_tokens_cap
    answer = min(answer, cap) if cap is not None else answer
    return min(int(model.max_context), longest_prompt(model, benchmark.cfg) + answer + WINDOW_MARGIN)


@contextmanager
def config_errors() -> Iterator[None]:
    """Validation inside a job (a single run, or a library call): a ``ValueError`` becomes a
    :class:`ConfigError`, printed by Hydra as one line."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


@dataclass
class LMEvalSchema(CommonSchema):
    """``conf/lm_eval.yaml`` (``harness.jobs.lm_eval``, ``make lm-eval``)."""

    tasks: Any = option(MISSING, Allowed((str, list), item=str, note="lm-eval task or group names"))
    limit: int | None = option(None, Allowed(int, ge=1, null=True, note="samples per task; null: all"))
    num_fewshot: int | None = option(None, Allowed(int, ge=0, null=True))
    apply_chat_template: bool = option(True, FLAG)
    length: int = option(4096, Allowed(int, ge=1, note="tokens"))
    include_path: str | None = option(None, Allowed(str, null=True, note="a folder of lm-eval task yamls"))
    ruler_data: str = option("packaged", Allowed(str, choices=RULER_DATA))
    batch_size: int = option(1, Allowed(int, ge=1))


SCHEMAS: dict[str, type] = {
    "eval_schema": EvalSchema,
    "latency_schema": LatencySchema,
    "qps_schema": QPSSchema,
    "lm_eval_schema": LMEvalSchema,
}


def register_schemas() -> None:
    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)
    # The sweeper that validates every sweep point before the first one runs.
    cs.store(
        group="hydra/sweeper",
        name="validating",
        node={
            "_target_": "hydra_plugins.specprefill_sweeper.sweeper.ValidatingSweeper",
            "max_batch_size": None,
            "params": None,
            "validate": None,
        },
    )


register_schemas()


def _unknown(given: set[str], allowed: set[str], where: str) -> None:
    extra = sorted(given - allowed)
    if extra:
        hints = [difflib.get_close_matches(k, sorted(allowed), n=1) for k in extra]
        hint = "".join(f"; did you mean {h[0]!r} for {k!r}?" for k, h in zip(extra, hints, strict=True) if h)
        raise ValueError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}{hint}")


def check_keys(c: dict[str, Any], schema: type) -> None:
    """Reject keys no schema declares, then every value against its declaration (type,
    range, choices: :mod:`specprefill.options`), in one line: top level here; model, method
    and benchmark by their own records when they are built."""
    _unknown(set(c), {f.name for f in dataclasses.fields(schema)} | {"hydra"}, "config")
    try:
        check_options(schema, {k: v for k, v in c.items() if k != "hydra"})
    except ValueError as e:
        raise ConfigError(str(e)) from None


def dataclass_from(cls: type, d: dict[str, Any], what: str) -> Any:
    """``cls(**d)``, refusing keys ``cls`` does not have (naming them and the allowed ones)."""
    _unknown(set(d), {f.name for f in dataclasses.fields(cls)}, what)
    return cls(**d)


def benchmark_config(bench: dict[str, Any]) -> BenchmarkConfig:
    """A ``conf/benchmark`` entry as composed by Hydra: ``tasks`` null -> the benchmark's
    ``default_tasks``; ``"all"`` -> every task; ``"a,b"`` or a list -> those tasks
    (``[all]`` means every task too)."""
    bench = dict(bench)
    default_tasks = bench.pop("default_tasks", None)
    tasks = bench.get("tasks") if bench.get("tasks") is not None else default_tasks
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    tasks = [str(t) for t in (tasks or [])]
    if tasks == ["all"]:
        tasks = []
    elif not tasks and bench.get("tasks") is not None:
        raise ValueError("tasks is empty; give task names, or tasks=all for every task")
    twice = sorted({t for t in tasks if tasks.count(t) > 1})
    if twice:
        raise ValueError(f"tasks={tasks} names {twice} more than once; allowed: each task once")
    bench["tasks"] = tuple(tasks)
    options = dict(bench.get("options") or {})
    if options.get("data_dir"):
        options["data_dir"] = str(Path(str(options["data_dir"])).expanduser().resolve())
        if not Path(options["data_dir"]).is_dir():
            raise ValueError(
                f"data_dir={options['data_dir']!r} is not a folder; allowed: a folder of the benchmark's files"
            )
    bench["options"] = options
    return dataclass_from(BenchmarkConfig, bench, "benchmark config")


def config_hash(identity: Any) -> str:
    """The 12-hex-digit run id of a JSON-able identity (sorted keys)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: Model-config fields added after results were first stored, with their defaults. A field
#: at its default is left out of the run identity, so adding a field does not orphan the
#: run folders of every earlier sweep (they would no longer resume).
LATER_MODEL_FIELDS: dict[str, Any] = {
    "pipeline_parallel": 1,
    "speculator_shape": {},
    "nodes": 1,
    "architecture": None,
    "speculator_architecture": None,
    "speculator_chunk": None,
    "transport": None,
}
#: Model-config fields that never change results: the default backend (the backend that
#: ran is part of the identity on its own) and the GPU size a dry run plans with.
NOT_IDENTITY = ("backend", "gpu_memory_gib")


def model_identity(model: ModelConfig) -> dict[str, Any]:
    d = {k: v for k, v in dataclasses.asdict(model).items() if k not in NOT_IDENTITY}
    return {k: v for k, v in d.items() if not (k in LATER_MODEL_FIELDS and v == LATER_MODEL_FIELDS[k])}


def container(cfg: DictConfig) -> dict[str, Any]:
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    return {str(k): v for k, v in c.items()}


def model_from(c: dict[str, Any]) -> ModelConfig:
    return dataclass_from(ModelConfig, dict(c["model"]), "model config")


def method_spec(method: dict[str, Any], lookahead: int = 1) -> tuple[str, dict[str, Any]]:
    """(name, options) of a composed ``conf/method`` entry. With a budget in tokens
    (``keep_tokens``, or SpecPC's / SpecKV's ``max_capacity_prompt``:
    :func:`harness.store.token_budget`) the keep fraction is 1 (no fraction: the tokens are the
    budget), so a sweep over ``keep`` beside it maps to one run folder, run once. A composed
    method's parts (``method=compose``) without options get their ``conf/method`` presets
    (``lookahead``: the shorthand they read)."""
    opts = dict(method)
    name = str(opts.pop("name"))
    for part in getattr(method_class(name), "parts", ()) if name in method_names() else ():
        # a composed method's part: its options from its conf/method preset where the config gives none
        if opts.get(f"{part}_options") is None and (CONF / "method" / f"{opts.get(part)}.yaml").exists():
            _, preset = method_conf(str(opts[part]), 1.0, lookahead)
            # an option added later and at its default stays out, as in Method.options (the part's identity)
            opts[f"{part}_options"] = {
                k: v
                for k, v in preset.items()
                if k not in ("keep_rate", "keep_tokens") and not (k in LATER_OPTIONS and v == LATER_OPTIONS[k])
            }
    if token_budget(opts) is not None and "keep_rate" in opts:
        opts["keep_rate"] = 1.0
    return name, opts


def method_conf(name: str, keep: float, lookahead: int, keep_tokens: int | None = None) -> tuple[str, dict[str, Any]]:
    """(name, options) of ``conf/method/<name>.yaml`` with the ``keep``, ``lookahead`` and
    ``keep_tokens`` shorthands filled in: for a second method in one job (the reference of a
    latency run)."""
    path = CONF / "method" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        close = difflib.get_close_matches(name, known, n=1)
        raise ValueError(
            f"unknown method config {name!r}; allowed: {known}" + (f"; did you mean {close[0]!r}?" if close else "")
        )
    shorthands = {"keep": keep, "lookahead": lookahead, "keep_tokens": keep_tokens}
    cfg = OmegaConf.merge(shorthands, {"m": OmegaConf.load(path)})
    assert isinstance(cfg, DictConfig)
    return method_spec(container(cfg)["m"])


def also_methods(
    also: Any, keep: float, lookahead: int, keep_tokens: int | None = None
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(name, options) of each entry of a job's ``also``: a ``conf/method`` name (its preset,
    with the ``keep``, ``lookahead`` and ``keep_tokens`` shorthands filled in), or a mapping
    ``{name: <conf/method>, <option>: value, ...}``, that preset with those options replaced, so
    one job can time or run variants of one method side by side (``[{name: specprefill,
    lookahead: 8}]``). An option the method does not have is refused, naming the entry."""
    if also is None:
        return ()
    if not isinstance(also, list | tuple):
        raise ValueError(f"also={also!r} is invalid; allowed: {ALSO.describe()}")
    out = []
    for entry in also:
        if isinstance(entry, str):
            out.append(method_conf(entry, keep, lookahead, keep_tokens))
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(
                f"also entry {entry!r} is invalid; allowed: a conf/method name, or a mapping "
                "{name: <conf/method>, <option>: value, ...}"
            )
        given = {k: v for k, v in entry.items() if k != "name"}
        name, options = method_conf(entry["name"], keep, lookahead, keep_tokens)
        unknown = sorted(set(given) - method_option_names(name))
        if unknown:
            raise ValueError(
                f"also entry {entry!r} sets {unknown}, which {name!r} does not take; allowed: "
                f"{sorted(method_option_names(name))}"
            )
        options.update(given)
        if "keep_rate" in given and token_budget(options) is not None:
            raise ValueError(
                f"also entry {entry!r} sets keep_rate beside a budget in tokens ({token_budget(options)}), which "
                f"replaces it; allowed: keep_tokens: null in the entry for a fraction"
            )
        out.append(method_spec({"name": name, **options}))  # a budget in tokens: the fraction is 1
    return tuple(out)


def check_prompt_scope(method: Method) -> None:
    """lm-eval hands a model one prompt string, so a method that shortens the context using
    the question (scope ``query_aware_context``: RAG, LongLLMLingua) has nothing to work on."""
    if method.scope == "query_aware_context":
        raise ConfigError(
            f"method={method.name!r} shortens the context using the question, which lm-eval prompts do not split "
            f"out; allowed: methods of scope 'prompt' or 'context'"
        )


def check_parts(c: dict[str, Any]) -> tuple[ModelConfig, Method, str]:
    """The model, method and backend a composed config names, checked as ``make eval``
    checks them, plus what lm-eval needs: serves ``make lm-eval`` and the ``specprefill``
    model built from lm-eval's argument string. Imports nothing of lm-eval."""
    check_common(c)
    backend = str(c["backend"])
    check_backend(backend)
    name, opts = method_spec(c["method"])
    method, model = build_method(name, opts), model_from(c)
    check_prompt_scope(method)
    check_model_fits(model, [method], 0)
    check_in_model([method], backend, model)
    return model, method, backend
