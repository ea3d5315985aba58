"""SpecPrefill and every baseline as an lm-evaluation-harness model (``specprefill``).

``python -m harness.lm_eval.cli --model specprefill --model_args
pretrained=smollm2-135m,speculator=self_layers:20,method=specprefill,keep=0.1 --tasks ...``
(lm-eval's own command line, :mod:`harness.lm_eval.cli`), ``lm_eval.simple_evaluate(model=
"specprefill", model_args={"pretrained": "smollm2-135m", "method": "specprefill", "keep": 0.1},
tasks=[...])`` (after ``import harness.lm_eval.model``, which registers it), or ``make
lm-eval`` (:mod:`harness.jobs.lm_eval`) runs any lm-eval task with any of our methods on our
backends. ``pretrained`` is a ``conf/model`` name or, as for lm-eval's ``hf`` model, a hub id
or a local checkpoint folder (a model config built on the fly: ``source: hub``). What each
request type does:

* ``generate_until``: the prompt lm-eval built (its template, few-shot examples, chat
  template when asked) is tokenized, the method plans it exactly as in ``make eval``
  (SpecPrefill: the speculator scores the tokens, the base prefills the kept ones at
  their original positions), and the base decodes greedily from the plan until a stop
  string, EOS or ``max_gen_toks``.
* ``loglikelihood`` (multiple choice): the *context* is planned; the *continuation* is
  always prefilled whole, at the positions generation would give it (after the context's
  last position), and scored token by token (:meth:`TransformersBackend.score`). A context
  shared by several choices is planned once per call. Pairs are split into tokens as
  lm-eval's own HF model does (trailing spaces of the context move to the continuation; the
  continuation's ids are those of the whole string after the context's); an empty context
  is the EOS token (lm-eval's ``prefix_token_id``).
* ``loglikelihood_rolling`` (perplexity): refused; there is no prompt to plan.

lm-eval hands a model one prompt string, with no context/question split, so a method that
shortens only the context sees the whole prompt as its context (``prompt_split`` in the
rows), and a method that needs the question (``query_aware_context``: RAG, LongLLMLingua) is
refused. Decoding is greedy only. Every request's cost (prompt and kept tokens, the
method's own seconds by part, base prefill and decode) is kept in :attr:`SpecPrefillLM.costs`
by (task, doc id), for one parquet row per document.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from harness.config import CONF, ConfigError, check_parts, check_prompt_scope, container
from harness.models.catalog import ModelConfig
from harness.models.factory import make_backend
from specprefill.plan import Backend, Method, Plan, Prompt

#: What a method that shortens the context takes as the context of an lm-eval prompt.
PROMPT_SPLIT = "whole prompt as context"
#: Arguments lm-eval passes to every model (``batch_size``, ``device``, ...) that have no
#: meaning here beyond what is said at each; ``tokenizer`` is for lm-eval's RULER tasks
#: (lm-eval merges model args into the tasks' metadata; they size prompts with it).
LM_EVAL_EXTRAS = ("max_batch_size", "device", "tokenizer")
#: The model when model args name none.
DEFAULT_MODEL = "smollm2-135m"


@dataclass
class DocCost:
    """What one lm-eval document cost: summed over its requests, with the context planned
    once per distinct context."""

    prompt_tokens: int = 0
    kept_tokens: int = 0
    method_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    base_prefill_s: float = 0.0
    decode_s: float = 0.0
    output_tokens: int = 0
    max_new_tokens: int | None = None
    requests: int = 0
    #: The prompt was cut to its last tokens to leave the output budget in the window.
    truncated: bool = False
    #: The most prompts planned together with one of this document's (the method's seconds
    #: are its equal share of what planning them cost: one batched speculator forward).
    plan_batch_size: int = 0

    def add_plan(self, prompt_tokens: int, plan: Plan) -> None:
        self.prompt_tokens = max(self.prompt_tokens, prompt_tokens)
        self.kept_tokens = max(self.kept_tokens, plan.k)
        self.method_s += plan.method_s
        for k, v in plan.timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + float(v)


def model_entry(pretrained: str, revision: str | None = None) -> tuple[str, dict[str, Any] | None]:
    """(the ``conf/model`` name to compose, the model entry replacing it or None) for
    ``pretrained=``: a ``conf/model`` name as it is; a hub id (``org/name``) or a local
    checkpoint folder as a model built on the fly (``source: hub``, ``path``, ``dtype: auto``,
    its context window from the checkpoint's config where that can be read, no speculator
    unless ``speculator=`` gives one)."""

    known = sorted(q.stem for q in (CONF / "model").glob("*.yaml"))
    if pretrained in known:
        return pretrained, None
    folder = Path(pretrained).expanduser()
    if not folder.is_dir() and not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", pretrained):
        raise ValueError(
            f"pretrained={pretrained!r}: not a conf/model name {known}, a hub id (org/name) or a local folder"
        )
    path = str(folder.resolve()) if folder.is_dir() else pretrained
    name = re.sub(r"[^A-Za-z0-9._+=-]+", "-", folder.name if folder.is_dir() else pretrained.replace("/", "--"))
    entry: dict[str, Any] = {"name": name.strip("-.") or "hub-model", "source": "hub", "path": path, "dtype": "auto"}
    entry |= {"revision": revision} if revision else {}
    try:  # the checkpoint's context window, where its config is at hand (a folder, the cache, the hub)
        from transformers import AutoConfig

        window = getattr(AutoConfig.from_pretrained(path, revision=revision), "max_position_embeddings", None)
        entry |= {"max_context": int(window)} if window else {}
    except (OSError, ValueError):
        pass
    return DEFAULT_MODEL, entry


def compose_run_parts(
    model: str,
    method: str,
    keep: float,
    lookahead: int,
    backend: str | None,
    options: dict[str, Any],
    model_fields: dict[str, Any] | None = None,
    entry: dict[str, Any] | None = None,
) -> tuple[ModelConfig, Method, str]:
    """The model config, method and backend name an ``lm-eval --model_args`` string names,
    composed and validated by the same Hydra configs and checks as ``make eval``:
    ``conf/model/<model>`` (or ``entry``, a model built on the fly) with ``model_fields``
    (``speculator``, ``dtype``, ...) set on it."""
    import tempfile

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [f"model={model}", f"method={method}", f"keep={keep}", f"lookahead={lookahead}"]
    overrides += [f"backend={backend}"] if backend else []
    overrides += [f"method.{k}={v}" for k, v in options.items()]
    overrides += [f"out={tempfile.gettempdir()}"]
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app: compose from its search path
        cfg = compose(config_name="config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    c = container(cfg)
    c["model"] = {**(entry if entry is not None else c["model"]), **(model_fields or {})}
    return check_parts(c)


def parts_from_model_args(
    pretrained: str | None = None,
    method: str = "specprefill",
    keep: float = 0.3,
    lookahead: int = 1,
    backend: str | None = None,
    speculator: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    max_length: int | None = None,
    model: str | None = None,
    **options: Any,
) -> tuple[ModelConfig, Method, str]:
    """The model config, method and backend name of :class:`SpecPrefillLM`'s model args,
    checked (a :class:`ConfigError` or ``ValueError`` in one line) and nothing loaded: what
    ``python -m harness.lm_eval.cli`` checks before lm-eval starts."""
    for k in (*LM_EVAL_EXTRAS, "batch_size"):
        options.pop(k, None)
    methods = sorted(q.stem for q in (CONF / "method").glob("*.yaml"))
    if method not in methods:  # before Hydra, whose missing-config error is a page
        close = difflib.get_close_matches(str(method), methods, n=1)
        raise ValueError(
            f"method={method!r}; allowed: a conf/method name {methods}"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    from harness.registry import method_option_names

    unknown = sorted(set(options) - method_option_names(method))
    if unknown:  # before Hydra, whose refusal names the key but not what is allowed
        raise ValueError(
            f"method {method!r} has no option(s) {unknown}; allowed: {sorted(method_option_names(method))}"
        )
    if pretrained is not None and model is not None and str(pretrained) != str(model):
        raise ValueError(f"pretrained={pretrained!r} and model={model!r}; give one (pretrained=)")
    name, entry = model_entry(str(pretrained or model or DEFAULT_MODEL), revision)
    fields = {"speculator": speculator, "dtype": dtype, "max_context": max_length}
    fields |= {"revision": revision} if revision and entry is None else {}
    fields = {k: v for k, v in fields.items() if v is not None}
    try:
        return compose_run_parts(name, method, keep, lookahead, backend, options, fields, entry)
    except ConfigError as e:
        if "needs a speculator" not in str(e):
            raise
        raise ConfigError(f"{e}; give one in the model args: speculator=self_layers:M or hub:<id>") from None


@register_model("specprefill")
class SpecPrefillLM(LM):
    """An lm-eval model that runs one of our methods on one of our backends.

    Model args: ``pretrained`` (a ``conf/model`` name, a hub id or a local checkpoint
    folder; ``model`` is the same, for a ``conf/model`` name), ``speculator``
    (``self_layers:M``, ``hub:<id>``, ...: default the model config's), ``dtype``,
    ``revision``, ``max_length`` (the context window), ``method`` (a ``conf/method`` name),
    ``keep``, ``lookahead``, ``backend`` (default: the model's), ``batch_size`` (prompts
    planned together: a method whose model runs batched, SpecPrefill's speculator, plans a
    batch in one call; the base decodes one at a time), and any option of the method by
    name (``pool_kernel=13``)."""

    def __init__(
        self,
        pretrained: str | None = None,
        method: str = "specprefill",
        keep: float = 0.3,
        lookahead: int = 1,
        backend: str | None = None,
        batch_size: int | str = 1,
        speculator: str | None = None,
        dtype: str | None = None,
        revision: str | None = None,
        max_length: int | None = None,
        model: str | None = None,
        **options: Any,
    ) -> None:
        model_cfg, built, backend_name = parts_from_model_args(
            pretrained=pretrained,
            method=method,
            keep=keep,
            lookahead=lookahead,
            backend=backend,
            speculator=speculator,
            dtype=dtype,
            revision=revision,
            max_length=max_length,
            model=model,
            **options,
        )
        backend_obj = make_backend(model_cfg, backend_name, built.needs_speculator)
        self._setup(model_cfg, built, backend_name, backend_obj, batch_size)

    @classmethod
    def from_parts(
        cls, model: ModelConfig, method: Method, backend_name: str, backend: Backend, batch_size: int = 1
    ) -> SpecPrefillLM:
        """The model from already validated parts (``make lm-eval`` builds them from its config)."""
        self = cls.__new__(cls)
        self._setup(model, method, backend_name, backend, batch_size)
        return self

    def _setup(
        self, model: ModelConfig, method: Method, backend_name: str, backend: Backend, batch_size: int | str
    ) -> None:
        LM.__init__(self)

        check_prompt_scope(method)
        if str(batch_size).startswith("auto"):
            batch_size = 1
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size!r}; allowed: int >= 1")
        self.model_cfg, self.method, self.backend_name, self.backend = model, method, backend_name, backend
        self.batch_size = int(batch_size)
        self.tokenizer = backend.tokenizer
        self.costs: dict[tuple[str, int], DocCost] = defaultdict(DocCost)

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records in its results' ``config``: the model and method that ran."""
        return {
            "model": self.model_cfg.name,
            "model_source": self.model_cfg.source,
            "model_path": self.model_cfg.path,
            "speculator": self.model_cfg.speculator,
            "dtype": self.model_cfg.dtype,
            "backend": self.backend_name,
            "method": {"name": self.method.name, **self.method.options()},
        }

    # ------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                chat_history,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
            )
        )

    def encode(self, text: str) -> tuple[list[int], bool]:
        """Ids of ``text`` as lm-eval's HF model makes them: the tokenizer's own special
        tokens, unless the text already starts with the BOS token's text."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add = not (bos and text.startswith(bos))
        return list(self.tokenizer(text, add_special_tokens=add).input_ids), add

    def _prompt(self, text: str, ids: list[int], add_special_tokens: bool) -> Prompt:
        return Prompt(
            input_ids=torch.tensor(ids, dtype=torch.int64), context=text, add_special_tokens=add_special_tokens
        )

    @staticmethod
    def _key(request: Any) -> tuple[str, int]:
        return str(request.task_name), int(request.doc_id if request.doc_id is not None else -1)

    # ------------------------------------------------------------------ requests

    # A method acting inside the model (MInference) patches it for each call's requests only.
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        with self.method.applied(self.backend):
            return self._generate_until(requests, disable_tqdm)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        with self.method.applied(self.backend):
            return self._loglikelihood(requests, disable_tqdm)

    def _generate_until(self, requests: list[Any], disable_tqdm: bool) -> list[str]:
        out: list[str] = []
        window = self.model_cfg.max_context
        for start in tqdm(range(0, len(requests), self.batch_size), desc="generate_until", disable=disable_tqdm):
            batch = requests[start : start + self.batch_size]
            prompts, budgets, truncated = [], [], []
            for r in batch:
                text, kwargs = r.args
                kwargs = dict(kwargs or {})
                if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                    raise ValueError(f"task {r.task_name!r} asks for sampling {kwargs}; allowed: greedy decoding")
                max_new = int(kwargs.get("max_gen_toks", 256))
                ids, add = self.encode(text)
                cut = len(ids) > window - max_new  # lm-eval's HF model keeps the last tokens
                if cut:
                    ids = ids[-max(1, window - max_new) :]
                prompts.append(self._prompt(text, ids, add))
                budgets.append((max(1, min(max_new, window - len(ids))), kwargs.get("until") or []))
                truncated.append(cut)
            plans = self.method.plan_batch(prompts, self.backend)
            for r, p, plan, (max_new, until), cut in zip(batch, prompts, plans, budgets, truncated, strict=True):
                stops = [until] if isinstance(until, str) else list(until)
                gen = self.backend.generate(plan, max_new, stop=stops)
                cost = self.costs[self._key(r)]
                cost.add_plan(p.n, plan)
                cost.base_prefill_s += gen.prefill_s
                cost.decode_s += gen.decode_s
                cost.output_tokens += len(gen.token_ids)
                cost.max_new_tokens = max_new
                cost.requests += 1
                cost.truncated |= cut
                cost.plan_batch_size = max(cost.plan_batch_size, len(batch))
                out.append(gen.text)
                self.cache_hook.add_partial("generate_until", r.args, gen.text)
        return out

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int], bool]:
        if not context:
            return [self.eot_token_id], self.encode(continuation)[0], False
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, add = self.encode(context + continuation)
        ctx, _ = self.encode(context)
        return ctx, whole[len(ctx) :], add

    def _loglikelihood(self, requests: list[Any], disable_tqdm: bool) -> list[tuple[float, bool]]:
        score = getattr(self.backend, "score", None)
        if score is None:
            raise ValueError(
                f"backend={self.backend_name!r} cannot score continuations (loglikelihood); allowed: transformers"
            )
        plans: dict[tuple[int, ...], Plan] = {}
        out: list[tuple[float, bool]] = []
        for r in tqdm(requests, desc="loglikelihood", disable=disable_tqdm):
            context, continuation = r.args
            ctx, cont, add = self._pair(context, continuation)
            cost = self.costs[self._key(r)]
            key = tuple(ctx)
            if key not in plans:
                plans[key] = self.method.plan(self._prompt(context, ctx, add), self.backend)
                cost.add_plan(len(ctx), plans[key])
                cost.plan_batch_size = max(cost.plan_batch_size, 1)
            logprob, greedy, seconds = score(plans[key], cont)
            cost.base_prefill_s += seconds
            cost.requests += 1
            out.append((logprob, greedy))
            self.cache_hook.add_partial("loglikelihood", r.args, (logprob, greedy))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise ValueError(
            "loglikelihood_rolling (perplexity tasks) scores a whole text with no prompt to plan; allowed here: "
            "generate_until and loglikelihood tasks (run perplexity tasks with lm-eval's own hf model)"
        )

    def cost_columns(self, task: str, doc_id: int) -> dict[str, Any]:
        """The row fields of one document's cost (empty when the document made no request
        here, e.g. answered from lm-eval's request cache on a resumed run)."""
        c = self.costs.get((task, doc_id))
        if c is None or not c.requests:
            return {}
        return {
            "prompt_tokens": c.prompt_tokens,
            "kept_tokens": c.kept_tokens,
            "kept_fraction": c.kept_tokens / c.prompt_tokens if c.prompt_tokens else None,
            "ttft_s": c.method_s + c.base_prefill_s,
            "method_s": c.method_s,
            "speculator_s": c.timings.get("speculator_s"),
            "selection_s": c.timings.get("selection_s"),
            "method_timings": json.dumps(c.timings, sort_keys=True),
            "base_prefill_s": c.base_prefill_s,
            "decode_s": c.decode_s,
            "timing_source": "wall",
            "output_tokens": c.output_tokens,
            "max_new_tokens": c.max_new_tokens,
            "truncated": c.truncated,
            "plan_batch_size": c.plan_batch_size,
        }
