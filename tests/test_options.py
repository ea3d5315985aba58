"""The property test of the method options (issue 43): every option of every registered
method declares what it takes (specprefill/options.py), and every value its declaration
refuses (a wrong type, each bound crossed, an unknown choice, null where not allowed) is
refused at the front door in one line naming the method, the option and the value, before
anything loads; each method's defaults still plan. Values are generated from the
declarations, so a new option is covered the day it is declared, and an undeclared one
fails here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from harness.jobs.eval import validate
from harness.registry import build_method, method_names
from specprefill.options import Allowed, bad_values, declarations, undeclared
from specprefill.plan import method_class

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
METHODS = method_names()


def _override(value: object) -> str:
    """A value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    return repr(value)


def _cases() -> list[tuple[str, str, object]]:
    out = []
    for name in METHODS:
        for opt, allowed in declarations(method_class(name)).items():
            if allowed is not None:
                out += [(name, opt, bad) for bad in bad_values(allowed)]
    return out


CASES = _cases()


def test_every_option_of_every_method_is_declared():
    missing = {name: undeclared(method_class(name)) for name in METHODS}
    assert not {k: v for k, v in missing.items() if v}, missing
    assert len(CASES) > 3 * len(METHODS)  # the generator reaches every method


def test_a_removed_declaration_is_caught(monkeypatch):
    """The check above on a class with one field's declaration taken away."""

    @dataclasses.dataclass(frozen=True)
    class Bare:
        keep_rate: float = 0.3

    assert undeclared(Bare) == ["keep_rate"]


@pytest.mark.parametrize(("method", "option", "bad"), CASES, ids=[f"{m}.{o}={b!r}" for m, o, b in CASES])
def test_each_refused_value_is_one_line_naming_it(method, option, bad):
    with pytest.raises(ValueError) as e:
        build_method(method, {option: bad})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"method {method!r}: {option}={bad!r}; allowed: "), msg


def test_each_refused_value_is_refused_at_the_front_door_before_loading():
    """The same values through the entry point's own path (Hydra's composition of
    ``method=<name> method.<option>=<value>``, then the job's ``validate``, which builds the
    plan and loads nothing), with the dry run on."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        for method, option, bad in CASES:
            cfg = compose(
                config_name="config",
                overrides=[f"method={method}", f"method.{option}={_override(bad)}", "dry_run=true", "out=/tmp/opts"],
            )
            with pytest.raises(ValueError) as e:
                validate(cfg)
            msg = str(e.value)
            assert "\n" not in msg and f"{option}=" in msg and "allowed: " in msg, (method, option, bad, msg)


@pytest.mark.parametrize("method", METHODS)
def test_the_defaults_still_plan(method):
    """Each method's defaults pass its declarations and plan; the one refusal allowed is a
    side model this machine has not got (LLMLingua-2's classifier offline), never an option."""
    build_method(method, {})
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"method={method}", "dry_run=true", "out=/tmp/opts"])
    try:
        validate(cfg)
    except ValueError as e:
        assert f"method {method!r} needs the model" in str(e) and "from the hub" in str(e), str(e)


def test_the_declarations_read_as_the_message_says():
    assert Allowed(float, gt=0, le=1).describe() == "a number in (0, 1]"
    assert Allowed(int, ge=1, odd=True, null=True).describe() == "null or an odd int >= 1"
    assert Allowed(str, choices=("a", "b")).problem("c") == "choice"
    assert Allowed(float, choices=(1.0,)).problem(True) == "type"  # True == 1.0, but no number
    assert Allowed(int, ge=0).problem(2.0) == "type" and Allowed(float, ge=0).problem(2) is None


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def test_python_m_make_and_the_lm_eval_cli_each_refuse_in_one_line(tmp_path):
    """One declared refusal through each command a user types (the property test above
    covers every value in-process, on the path these take)."""
    line = "method 'snapkv': window_size=-1; allowed: an int >= 1"
    r = _run(sys.executable, "-m", "harness.jobs.eval", "method=snapkv", "method.window_size=-1", "dry_run=true",
             f"out={tmp_path}")  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith(line) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _run("make", "eval", "method=snapkv", "method.window_size=-1", "dry_run=true", f"out={tmp_path}")
    assert r.returncode != 0 and line in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _run(sys.executable, "-m", "harness.lm_eval.cli", "run", "--model", "specprefill", "--model_args",
             "method=snapkv,window_size=-1", "--tasks", "niah_single_1", "--limit", "1",
             "--output_path", str(tmp_path / "lm"))  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("--model_args: method 'snapkv': window_size=-1"), r.stderr


# --- the rest of the surface: models, benchmarks and their options, every job kind's keys ---

from harness.benchmarks.base import BenchmarkConfig  # noqa: E402
from harness.config import GROUP, SCHEMAS  # noqa: E402
from harness.models.catalog import ModelConfig  # noqa: E402
from harness.registry import benchmark_class, benchmark_names  # noqa: E402

#: Each job kind: its Hydra config, its schema, its module's front door (validate).
JOBS = {
    "eval": ("config", SCHEMAS["eval_schema"], "harness.jobs.eval"),
    "latency": ("latency", SCHEMAS["latency_schema"], "harness.jobs.latency"),
    "qps": ("qps", SCHEMAS["qps_schema"], "harness.jobs.qps"),
    "lm_eval": ("lm_eval", SCHEMAS["lm_eval_schema"], "harness.jobs.lm_eval"),
}


def test_every_field_of_every_model_benchmark_and_job_schema_is_declared():
    records = {
        "ModelConfig": ModelConfig,
        "BenchmarkConfig": BenchmarkConfig,
        **{k: s for k, (_, s, _) in JOBS.items()},
    }
    missing = {name: undeclared(cls) for name, cls in records.items()}
    assert not {k: v for k, v in missing.items() if v}, missing
    for name in benchmark_names():  # a benchmark's own options, each declared
        opts = benchmark_class(name).allowed_options
        assert all(isinstance(a, Allowed) for a in opts.values()), (name, opts)


def _front_door(config_name: str, module: str, overrides: list[str]) -> None:
    """What a command line goes through before anything loads: the override check
    (:func:`harness.command_line.checked_overrides`, Hydra's refusals in one line), Hydra's
    composition, then the job's ``validate``."""
    import importlib

    from harness.command_line import checked_overrides

    overrides = checked_overrides(config_name, overrides)  # composes in its own Hydra context
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    importlib.import_module(module).validate(cfg)


def _model_cases() -> list[tuple[str, object]]:
    return [(f, bad) for f, a in declarations(ModelConfig).items() if a is not None for bad in bad_values(a)]


MODEL_CASES = _model_cases()
SMOLLM2 = yaml.safe_load((ROOT / "conf" / "model" / "smollm2-135m.yaml").read_text())


def test_each_refused_model_value_is_one_line_at_the_front_door():
    """Every value a model field's declaration refuses, as ``model.<field>=<value>``: one
    line naming the model and the field, before anything loads; the same through
    :func:`model_config` (Python use)."""
    assert len(MODEL_CASES) > 2 * len(declarations(ModelConfig))
    for field, bad in MODEL_CASES:
        with pytest.raises(ValueError) as e:
            ModelConfig(**{**SMOLLM2, field: bad})
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("model ") and f"{field}={bad!r}; allowed: " in msg, msg
        if field == "name":  # model.name also names the run folder: refused by its own path check too
            continue
        with pytest.raises(ValueError) as e:
            _front_door("config", "harness.jobs.eval",
                        [f"model.{field}={_override(bad)}", "dry_run=true", "out=/tmp/opts"])  # fmt: skip
        msg = str(e.value)
        assert "\n" not in msg and f"{field}=" in msg and "allowed: " in msg, (field, bad, msg)


def _benchmark_cases() -> list[tuple[str, str, object]]:
    out = []
    for name in benchmark_names():
        for opt, a in benchmark_class(name).allowed_options.items():
            out += [(name, opt, bad) for bad in bad_values(a)]
    for field, a in declarations(BenchmarkConfig).items():
        if a is not None:
            out += [("", field, bad) for bad in bad_values(a)]
    return out


BENCHMARK_CASES = _benchmark_cases()


def test_each_refused_benchmark_value_is_one_line():
    """A benchmark's own options (``benchmark.options.<name>``) and the benchmark config's
    fields, each value its declaration refuses: one line naming the option and the value,
    when the benchmark is built (before any data or model loads)."""
    from harness.registry import build_benchmark

    assert {n for n, _, _ in BENCHMARK_CASES} >= {"", "longbench", "infinitebench", "multiturn"}
    for name, opt, bad in BENCHMARK_CASES:
        with pytest.raises(ValueError) as e:
            if name:
                build_benchmark(BenchmarkConfig(name=name, options={opt: bad}))
            else:
                build_benchmark(BenchmarkConfig(**{"name": "ruler", opt: bad}))
        msg = str(e.value)
        assert "\n" not in msg and f"{opt}={bad!r}; allowed: " in msg, (name, opt, bad, msg)


def _job_cases() -> list[tuple[str, str, object]]:
    out = []
    for kind, (_, schema, _) in JOBS.items():
        for f in dataclasses.fields(schema):
            a = f.metadata.get("option")
            if a is None or a is GROUP:  # a config group: refused by its own record (above) or group name
                continue
            for bad in bad_values(a):
                typed = str(f.type).replace(" | None", "")
                # Hydra types the key: OmegaConf reads 7 as the text "7" for a str key, and an
                # int as a bool for a bool key (0 false, any other true); not a refusal there.
                if typed in ("str", "bool") and isinstance(bad, int) and not isinstance(bad, bool):
                    continue
                out.append((kind, f.name, bad))
    return out


JOB_CASES = _job_cases()


def test_each_refused_job_value_is_one_line_at_the_front_door():
    """Every job kind's keys, each value its schema declaration refuses, through the
    command line's path (override check, composition, the job's validate) with the dry run
    on: a one-line refusal naming the key."""
    assert {k for k, _, _ in JOB_CASES} == set(JOBS) and len(JOB_CASES) > 60
    wrong = []
    for kind, key, bad in JOB_CASES:
        config_name, _, module = JOBS[kind]
        extra = [o for o in ("dry_run=true", "out=/tmp/opts") if not o.startswith(f"{key}=")]
        if kind == "lm_eval" and key != "tasks":
            extra.append("tasks=[niah_single_1]")
        try:
            _front_door(config_name, module, [f"{key}={_override(bad)}", *extra])
            wrong.append((kind, key, bad, "accepted"))
        except ValueError as e:
            msg = str(e)
            if "\n" in msg or f"{key}=" not in msg or "allowed" not in msg:
                wrong.append((kind, key, bad, msg))
    assert not wrong, wrong


@pytest.mark.parametrize("kind", sorted(JOBS))
def test_each_job_kinds_defaults_plan(kind):
    config_name, _, module = JOBS[kind]
    extra = ["tasks=[niah_single_1]"] if kind == "lm_eval" else []
    _front_door(config_name, module, ["dry_run=true", "out=/tmp/opts", *extra])


def test_a_removed_schema_declaration_is_caught():
    """The declaration check above on a schema with one key's declaration taken away."""

    @dataclasses.dataclass
    class Schema:
        keep: float = 0.3

    assert undeclared(Schema) == ["keep"]
