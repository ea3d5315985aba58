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
