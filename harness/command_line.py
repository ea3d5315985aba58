"""What a user types, read the way they meant it or refused in one line, before Hydra runs it.

The four Hydra entry points (``harness.jobs.eval``, ``harness.jobs.latency``, ``harness.jobs.qps``,
``harness.jobs.lm_eval``) start through :func:`main`, which checks the command line first:

* **List-valued keys** (:data:`LIST_KEYS`: ``tasks``, ``rates``, ...): Hydra reads
  ``tasks=a,b`` as a sweep (one job per task), and since the task list is not part of a
  run's identity, the sweeper ran the first task and dropped the rest as a duplicate. The
  comma form of a list of names or numbers is taken as the list the user meant
  (``tasks=[a,b]``). A grid (:data:`POINT_LIST_KEYS`: ``grid``, whose elements are
  themselves ``[batch, length]`` lists) refuses the comma form: ``grid=[1,256],[1,512]``
  reads exactly like Hydra's sweep of two values, and ``grid=1,256`` could mean a point or
  two values, so one bracketed spelling (``grid=[[1,256],[1,512]]``) is asked for instead.
  An explicit sweep of lists (``tasks=[a],[b]``, ``grid=[[1,256]],[[1,512]]``) stays a sweep.
* **Hydra's own refusals** (override grammar, a value of the wrong type, an unknown config
  group option, an unknown key) become one line naming the key, the value and what is
  allowed, instead of Hydra's multi-line messages. Every value of a comma sweep is checked.

``HYDRA_FULL_ERROR=1`` raises instead of printing the line. The validating sweeper
(``hydra_plugins/specprefill_sweeper``) applies the same list rule to sweeps that come from
a config (``hydra.sweeper.params``).
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import io
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from harness.benchmarks.base import BenchmarkConfig
from harness.config import CONF, ConfigError, EvalSchema, LatencySchema, LMEvalSchema, QPSSchema, check_explicit
from harness.models.catalog import ModelConfig
from specprefill.options import Allowed, declarations

#: Keys whose value is a list of names or numbers: the comma form is that list.
LIST_KEYS = (
    "tasks",
    "benchmark.tasks",
    "benchmark.default_tasks",
    "rates",
    "qps.rates",
    "method.force_tokens",
    "also",
)
#: Keys whose value is a list of lists: the comma form is refused.
POINT_LIST_KEYS = ("grid",)
#: Each entry point's config and its schema: what a key allows is said from the schema's
#: declaration (:mod:`specprefill.options`), as the job's own checks say it.
CONFIG_SCHEMAS = {"config": EvalSchema, "latency": LatencySchema, "qps": QPSSchema, "lm_eval": LMEvalSchema}
#: Hydra flags after which the command prints, or composes another config: not composed here.
PRINT_OR_ELSEWHERE = (
    "help",
    "hydra_help",
    "cfg",
    "info",
    "shell_completion",
    "config_path",
    "config_name",
    "config_dir",
    "experimental_rerun",
)
TYPE_WORDS = {"Integer": "an int", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def _key(o: Override) -> str:
    return str(o.key_or_group)


def key_of(text: str) -> str:
    """The key an override's text sets (``+model.seed=3`` -> ``model.seed``), unparsed."""
    return text.split("=", 1)[0].lstrip("+~")


def _text(o: Override) -> str:
    return str(o.input_line) if o.input_line else f"{o.get_key_element()}={o.get_value_element_as_str()}"


def list_form(o: Override) -> str | None:
    """The override to run instead of ``o`` when ``o`` is the comma form of a list-valued
    key (``tasks=a,b`` -> ``tasks=[a,b]``); None when ``o`` stays as it is. The comma form
    of a key whose elements are lists (``grid``) is a :class:`ConfigError`."""
    if not o.is_sweep_override():
        return None
    sweep = o.value()
    if not isinstance(sweep, ChoiceSweep) or not sweep.simple_form:  # choice(...), range(...): meant as sweeps
        return None
    values = list(sweep.list)
    key = _key(o)
    if key in POINT_LIST_KEYS:
        if all(isinstance(v, list) and v and all(isinstance(p, list) for p in v) for v in values):
            return None  # a sweep of whole grids
        points = [s for v, s in zip(values, o.sweep_string_iterator(), strict=True) if isinstance(v, list)]
        if len(points) == len(values):
            example = f"[{','.join(points)}]"
        elif len(values) == 2 and not points:  # grid=1,256: the point [1, 256]
            example = f"[[{','.join(o.sweep_string_iterator())}]]"
        else:
            example = "[[1,4096],[2,2048]]"
        raise ConfigError(
            f"{_text(o)}: a comma list is a sweep (one job per value), and each value of {key} must be a whole list of "
            f"[batch, length] points; allowed: '{o.get_key_element()}={example}' (one job, quoted for the shell)"
        )
    if key in LIST_KEYS and not any(isinstance(v, list | dict) for v in values):
        return f"{o.get_key_element()}=[{','.join(o.sweep_string_iterator())}]"
    return None


def declared(key: str, config_name: str | None = None) -> Allowed | None:
    """The declaration of a dotted key: a top-level key's in its entry point's schema (any
    entry point's without ``config_name``), ``model.*`` in :class:`ModelConfig`,
    ``benchmark.*`` in :class:`BenchmarkConfig`; None where none is known here (a method's
    options depend on the method)."""
    head, _, leaf = key.partition(".")
    if not leaf:
        schemas = [CONFIG_SCHEMAS[config_name]] if config_name in CONFIG_SCHEMAS else list(CONFIG_SCHEMAS.values())
        found = [declarations(s).get(head) for s in schemas]
        return next((a for a in found if a is not None), None)
    cls = {"model": ModelConfig, "benchmark": BenchmarkConfig}.get(head)
    return declarations(cls).get(leaf) if cls is not None and "." not in leaf else None


def _allowed(key: str, wanted: str | None, config_name: str | None = None) -> str:
    a = declared(key, config_name)
    return a.describe() if a is not None else TYPE_WORDS.get(wanted or "", "a value of the key's type")


def _close(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def describe(
    e: BaseException,
    text: str = "",
    keys: Sequence[str] = (),
    config_name: str | None = None,
    left_out: str | None = None,
) -> str:
    """One line for Hydra's refusal ``e`` of the override ``text``: the key, the value, what
    is allowed (from the declaration of the key in ``config_name``'s schema). ``keys``: the
    keys allowed where an unknown one was given (when known); ``left_out``: where the key was
    refused as unknown but its record declares it (:func:`left_out_by`), whose config file
    leaves it out: Hydra overrides only keys the file has, so ``+key=value`` is the form."""
    if isinstance(e, OverrideParseException):
        if text.rstrip().endswith(","):
            what = "ends with a comma"
        elif text.count("[") != text.count("]") or text.count("'") % 2 or text.count('"') % 2:
            what = "has an unclosed bracket or quote"
        else:
            what = "is not in Hydra's override grammar"
        key = key_of(text)
        many = "the list" if key in LIST_KEYS else "a sweep"
        return (
            f"{text} {what}; allowed: {key}=<{_allowed(key, None, config_name)}>, or {key}=a,b ({many}, no trailing comma); "
            f"quote a value holding , [ ] = or spaces"
        )
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, name = e.missing_cfg_file.rpartition("/")
        options = list(e.options or [])
        where = f"Hydra's {group} plugins" if group.startswith("hydra/") else f"conf/{group}/"
        return f"{group}={name!r} is not in {where}; allowed: {options}{_close(name, options)}"
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
    lines = str(cause if cause is not None else e).splitlines()
    first = lines[0] if lines else type(e).__name__
    key = str(getattr(cause, "full_key", "") or key_of(text))
    value = text.split("=", 1)[1] if "=" in text else ""
    m = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", first)
    if m:
        kind, wanted = m.group(2), m.group(3)
        if kind == "list":
            return f"{key}={value} is a list; allowed: one value, {_allowed(key, wanted, config_name)} ({key}={value.strip('[]')} sweeps several)"
        what = "is a dict" if kind == "dict" else f"is not {TYPE_WORDS.get(wanted, wanted)}"
        return f"{key}={value} {what}; allowed: {_allowed(key, wanted, config_name)}"
    if "is not a valid bool" in first:
        return f"{key}={value} is not true or false; allowed: true or false"
    if "is not Optional" in first:
        return f"{key}={value}: {key} cannot be null; allowed: {_allowed(key, None, config_name)}"
    if "Could not override" in str(e) or "not in struct" in first or re.match(r"Key '.*' not in", first):
        if left_out is not None and text and not text.startswith(("+", "~")):
            leaf = key.rsplit(".", 1)[-1]
            return (
                f"{text}: {left_out} takes {leaf!r}, but its config file leaves it out (Hydra overrides only keys a "
                f"file has); allowed: '+{text}' (the + adds the key)"
            )
        known = f"; allowed: {sorted(keys)}{_close(key.rsplit('.', 1)[-1], list(keys))}" if keys else ""
        return f"{text or key}: unknown key {key!r}{known}"
    return f"{text + ': ' if text else ''}{first}"


def _keys_at(config_name: str, overrides: list[str], key: str) -> tuple[list[str], str | None]:
    """The keys of the config node that holds ``key`` (composed without the unknown key), and
    :func:`left_out_by` of ``key`` there."""
    from hydra import compose
    from omegaconf import DictConfig, OmegaConf

    parent = key.rsplit(".", 1)[0] if "." in key else ""
    try:
        cfg = compose(config_name, overrides=overrides)
    except Exception:
        return [], None
    node = OmegaConf.select(cfg, parent) if parent else cfg
    keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
    return keys, left_out_by(cfg, key) if key.rsplit(".", 1)[-1] not in keys else None


def left_out_by(cfg: Any, key: str) -> str | None:
    """What declares ``key`` (dotted) where the composed ``cfg``'s files leave it out: the
    record of its node (``model.*``: :class:`ModelConfig`; ``benchmark.*``:
    :class:`BenchmarkConfig`; ``benchmark.options.*``: the benchmark's declared options;
    ``method.*``, and a composed method's ``method.<part>_options.*``: the method's options),
    named (e.g. ``"model 'smollm2-135m'"``); None where nothing declares it."""
    from harness.registry import benchmark_class, method_names, method_option_names
    from specprefill.plan import method_class

    *parent, leaf = key.split(".")

    def name(node: Any) -> str:
        return str(node.get("name", "")) if hasattr(node, "get") else ""

    model, bench, method = (cfg.get(g) for g in ("model", "benchmark", "method"))
    if parent == ["model"] and leaf in declarations(ModelConfig):
        return f"model {name(model)!r}"
    if parent == ["benchmark"] and leaf in declarations(BenchmarkConfig):
        return f"benchmark {name(bench)!r}"
    if parent == ["benchmark", "options"]:
        try:
            declared = benchmark_class(name(bench)).allowed_options
        except ValueError:  # an unknown benchmark: its own check names it
            return None
        return f"benchmark {name(bench)!r}" if leaf in declared else None
    if not parent or parent[0] != "method" or name(method) not in method_names():
        return None
    if parent == ["method"]:
        return f"method {name(method)!r}" if leaf in method_option_names(name(method)) else None
    part = parent[1].removesuffix("_options") if len(parent) == 2 else ""
    if part in getattr(method_class(name(method)), "parts", ()):
        chosen = str(method.get(part))
        if chosen in method_names() and leaf in method_option_names(chosen):
            return f"method {chosen!r} (method.{part})"
    return None


def _compose(config_name: str, overrides: list[Override], extra: Override | None = None) -> Any:
    """Compose the config as Hydra will (``overrides`` plain, plus one value of a sweep)."""
    from hydra import compose

    given = [*overrides, *([extra] if extra is not None else [])]
    try:
        return compose(config_name, overrides=[_text(o) for o in given])
    except (HydraException, OmegaConfBaseException) as e:
        bad = extra
        if bad is None:  # which override: the one whose key the error names, else the message's
            named = str(getattr(e.__cause__, "full_key", "") or "")
            bad = next((o for o in overrides if _key(o) == named or f" {_text(o)}" in str(e)), None)
        keys: list[str] = []
        left_out = None
        if bad is not None and ("Could not override" in str(e)):
            keys, left_out = _keys_at(config_name, [_text(o) for o in given if o is not bad], _key(bad))
        raise ConfigError(describe(e, _text(bad) if bad is not None else "", keys, config_name, left_out)) from e


def _check_bool(o: Override, text: str, config_name: str) -> None:
    """A yes/no key (a bool in its schema) given a number other than 1 or 0: OmegaConf reads any
    int as a bool (``dry_run=2`` would run as true, ``dry_run=-1`` too), so it is refused here."""
    a = declared(_key(o), config_name)
    if a is None or a.kind is not bool:
        return
    values = list(o.sweep_iterator()) if o.is_sweep_override() and isinstance(o.value(), ChoiceSweep) else [o.value()]
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool) and v not in (0, 1):
            raise ConfigError(f"{text} is not true or false; allowed: true or false (or 1 / 0)")


def checked_overrides(config_name: str, texts: Sequence[str], compose_check: bool = True) -> list[str]:
    """The command line's overrides as they will run (list-valued keys' comma forms as
    lists), each one parsed and composed first: a :class:`ConfigError` (one line) for the
    first that Hydra would refuse."""
    from hydra import initialize_config_dir

    parser = OverridesParser.create()
    out: list[str] = []
    parsed: list[Override] = []
    for text in texts:
        try:
            o = parser.parse_overrides([text])[0]
        except OverrideParseException as e:
            raise ConfigError(describe(e, text, config_name=config_name)) from e
        new = list_form(o)
        if new is not None:
            text, o = new, parser.parse_overrides([new])[0]
        _check_bool(o, text, config_name)
        out.append(text)
        parsed.append(o)
    if not compose_check:
        return out
    plain = [o for o in parsed if not o.is_sweep_override()]
    sweeps = [o for o in parsed if o.is_sweep_override()]
    single = any(_key(o) == "hydra.mode" and str(o.value()) == "RUN" for o in plain)
    if single and sweeps:
        raise ConfigError(
            f"{_text(sweeps[0])} is a sweep, but hydra.mode=RUN runs one job; allowed: one value, or drop hydra.mode=RUN"
        )
    keys = [_key(o) for o in plain]
    swept = {_key(s) for s in sweeps}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        try:
            check_explicit(_compose(config_name, plain), keys)
        except ConfigError as e:
            group = next((k.split(".", 1)[0] for k in keys if "." in k and k.split(".", 1)[0] in swept), None)
            if group is None:
                raise
            raise ConfigError(
                f"{e} (Hydra composes a sweep's shared overrides against conf's default {group} before the sweep's "
                f"values; run one {group} per command to give it its own options)"
            ) from e
        for s in sweeps:
            if isinstance(s.value(), ChoiceSweep):
                for v in s.sweep_string_iterator():
                    one = parser.parse_overrides([f"{s.get_key_element()}={v}"])[0]
                    try:
                        check_explicit(_compose(config_name, plain, one), [*keys, _key(one)])
                    except ConfigError as e:
                        raise ConfigError(f"{e} (a value of the sweep {_text(s)})") from e
    return out


def checked_argv(config_name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` (``sys.argv[1:]``) with its overrides checked and rewritten
    (:func:`checked_overrides`); Hydra's flags pass unchanged. With a flag that changes what
    is composed or only prints (``--help``, ``--cfg``, ``--config-name``, ...) overrides are
    rewritten but not composed here."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:  # a flag Hydra will refuse itself
        return list(argv)
    plain = not any(getattr(args, f, None) for f in PRINT_OR_ELSEWHERE)
    overrides = list(args.overrides)
    rewritten = checked_overrides(config_name, overrides, compose_check=plain)
    pairs = iter(zip(overrides, rewritten, strict=True))
    pending = next(pairs, None)
    out: list[str] = []
    for a in argv:
        if pending is not None and a == pending[0]:
            out.append(pending[1])
            pending = next(pairs, None)
        else:
            out.append(a)
    return out


#: What Hydra appends to every error it reports, a traceback or not.
HYDRA_HINT = "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"


class _OneLineErrors(io.TextIOBase):
    """stderr, less Hydra's :data:`HYDRA_HINT` after a compact error (a
    :class:`~hydra.errors.CompactHydraException` such as :class:`ConfigError`: the message is
    the whole story, and the hint would make a one-line refusal three). Hydra writes the hint
    while handling the exception, so ``sys.exc_info()`` says which kind it follows; after a
    real traceback the hint stays."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, s: str) -> int:
        from hydra.errors import CompactHydraException

        if s == HYDRA_HINT and isinstance(sys.exc_info()[1], CompactHydraException):
            return len(s)
        return int(self.stream.write(s))

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def exit_without_teardown(status: int = 0) -> NoReturn:
    """End a process whose work is done and written: stop and wait for its threads as Python's
    own exit does (an executor left running included), run its ``atexit`` handlers (logging's
    flush, multiprocessing's children, the finalizers of temporary directories), flush stdout
    and stderr, and leave without the interpreter's teardown.

    That teardown frees whatever is still alive (the model's tensors, Arrow's pools, lm-eval's
    tasks and datasets) in an order nobody chose, and a C++ destructor that fails there aborts
    the finished process: "terminate called without an active exception", exit status 134, and
    make reports the command failed. CI saw it once at the end of ``make lm-eval`` (not
    reproduced in 20 runs here); Arrow (apache/arrow#45017, #34314) and datasets
    (huggingface/datasets#7566) report the same abort at shutdown, and PyTorch's tensor
    destructor is ``noexcept`` around a decref that can throw (pytorch/pytorch#176747).
    Skipping the teardown loses nothing: the rows, summaries and report are on disk and the
    ``atexit`` handlers have run."""
    # What the interpreter does first on exit: threading's own exit hooks (an executor never shut
    # down is told to stop), then every non-daemon thread joined.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(hydra_main: Callable[[], Any], config_name: str) -> None:
    """Run a Hydra entry point (its ``@hydra.main`` function) after :func:`checked_argv`:
    a refused override is one line on stderr and exit status 1; so is a :class:`ConfigError`
    raised later (the validating sweeper's, a check inside the job), without Hydra's hint.
    A job that returns ends through :func:`exit_without_teardown` (status 0); one that fails
    exits as Python does."""
    try:
        sys.argv[1:] = checked_argv(config_name, sys.argv[1:])
    except ConfigError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.stderr.write(f"{e}\n")
        sys.exit(1)
    stderr = sys.stderr
    sys.stderr = _OneLineErrors(stderr)  # type: ignore[assignment]
    try:
        hydra_main()
    finally:
        sys.stderr = stderr
    exit_without_teardown()
