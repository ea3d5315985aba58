"""Every method option declares its type and what values it takes, once, on its field.

A method is a frozen dataclass; each of its fields is an option a config may set
(``method.window_size=32``). The field is declared with :func:`option`: its default and an
:class:`Allowed` (type, bounds, choices, whether ``null`` is allowed, odd-only). One
validator, :func:`check_options`, derived from those declarations, runs where a config
becomes a method (:func:`specprefill.plan.build_method`, the path of every entry point: the
Hydra jobs, their dry runs, the lm-eval CLI) and refuses a bad value in one line naming
the option, the value and what is allowed. Rules that tie options together or need the
model stay in the method (``__post_init__``, ``check_model``).

:func:`bad_values` derives, from a declaration, values it must refuse (a wrong type, each
bound crossed, an unknown choice); the property test (``tests/test_options.py``) feeds
them to every registered method through the front door, and fails on a field without a
declaration.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The metadata key of a declared field.
OPTION = "option"


@dataclass(frozen=True)
class Allowed:
    """What one option takes: ``kind`` (``bool``, ``int``, ``float``: an int is a float too,
    never a bool; ``str``; ``list``: a list or tuple of ``item``), inclusive bounds ``ge`` /
    ``le``, exclusive ``gt`` / ``lt``, ``choices`` (for any kind), ``null`` (``None``
    allowed), ``odd`` (ints), ``pattern`` (a regular expression a string must match in full)
    and ``note`` (words for the message, e.g. what the value means)."""

    kind: type | tuple[type, ...]  # bool, int, float, str, list, dict (a mapping); a tuple: any of them
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    null: bool = False
    odd: bool = False
    pattern: str | None = None
    item: type | None = None
    note: str = ""
    #: The kind in words where "a number" / "an int" undersells it (``a fraction``).
    what: str = ""

    def describe(self) -> str:
        """What is allowed, in a few words (``int >= 1``, ``a number in (0, 1]``, ``one of [...]``)."""
        if isinstance(self.kind, tuple):
            text = " or ".join(dataclasses.replace(self, kind=k, null=False, note="").describe() for k in self.kind)
        elif self.choices is not None:
            text = f"one of {list(self.choices)}"
        elif self.kind is bool:
            text = "true or false"
        elif self.kind is list:
            text = f"a list of {self.item.__name__ if self.item else 'values'}"
        elif self.kind is dict:
            text = "a mapping (key: value, ...)"
        elif self.kind is str:
            text = "a string" + (f" matching {self.pattern}" if self.pattern else "")
        else:
            what = self.what or {int: "an odd int" if self.odd else "an int", float: "a number"}[self.kind]
            lo = f"{'[' if self.ge is not None else '('}{self.ge if self.ge is not None else self.gt}"
            hi = f"{self.le if self.le is not None else self.lt}{']' if self.le is not None else ')'}"
            has_lo, has_hi = self.ge is not None or self.gt is not None, self.le is not None or self.lt is not None
            if has_lo and has_hi:
                text = f"{what} in {lo}, {hi}"
            elif has_lo:
                text = f"{what} {'>=' if self.ge is not None else '>'} {self.ge if self.ge is not None else self.gt}"
            elif has_hi:
                text = f"{what} {'<=' if self.le is not None else '<'} {self.le if self.le is not None else self.lt}"
            else:
                text = what
        text = f"null or {text}" if self.null else text
        return f"{text} ({self.note})" if self.note else text

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed, or None."""
        if value is None:
            return None if self.null else "null"
        if isinstance(self.kind, tuple):
            why = [dataclasses.replace(self, kind=k).problem(value) for k in self.kind]
            return None if None in why else next((w for w in why if w != "type"), "type")
        if self.choices is not None:
            if isinstance(value, bool) and not any(isinstance(c, bool) for c in self.choices):
                return "type"  # True == 1: a bool is no number here
            return None if value in self.choices else "choice"
        if self.kind is bool:
            return None if isinstance(value, bool) else "type"
        if self.kind is list:
            if not isinstance(value, list | tuple):
                return "type"
            if self.item is not None and any(Allowed(self.item).problem(v) is not None for v in value):
                return "type"
            return None
        if self.kind is dict:
            return None if isinstance(value, Mapping) else "type"
        if self.kind is str:
            if not isinstance(value, str):
                return "type"
            return None if self.pattern is None or re.fullmatch(self.pattern, value) else "pattern"
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else int | float):
            return "type"
        if (self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt):
            return "range"
        if (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt):
            return "range"
        if self.odd and value % 2 == 0:
            return "range"
        return None

    def check(self, name: str, value: Any) -> None:
        """A ``ValueError`` in one line: ``name=value; allowed: ...``."""
        if self.problem(value) is not None:
            raise ValueError(f"{name}={value!r}; allowed: {self.describe()}")


#: ``keep_rate``: the fraction of prompt tokens (or KV entries) a method keeps.
KEEP = Allowed(float, gt=0, le=1, note="the fraction of prompt tokens kept")
#: A budget in tokens instead of the fraction (``keep_tokens=``); null: ``keep_rate``.
KEEP_TOKENS = Allowed(int, ge=1, null=True, note="prompt tokens kept (capped at the prompt); null: keep_rate")
#: A seed: any int.
SEED = Allowed(int)
#: A bool option.
FLAG = Allowed(bool)


_NO_DEFAULT: Any = dataclasses.MISSING


def option(default: Any = _NO_DEFAULT, allowed: Allowed | None = None, *, factory: Any = _NO_DEFAULT) -> Any:
    """A dataclass field with its default (or ``factory`` for a mutable one; neither: a
    required field) and what it takes."""
    if allowed is None:
        raise TypeError("option() needs what the option allows (an Allowed)")
    return dataclasses.field(default=default, default_factory=factory, metadata={OPTION: allowed})


def declarations(cls: type) -> dict[str, Allowed | None]:
    """Each field of a method class with its declaration (None: undeclared)."""
    return {f.name: f.metadata.get(OPTION) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


def undeclared(cls: type) -> list[str]:
    """The fields of ``cls`` without a declaration (each a defect: the test fails on it)."""
    return [name for name, a in declarations(cls).items() if a is None]


def check_options(cls: type | Mapping[str, Allowed | None], options: Mapping[str, Any], where: str = "") -> None:
    """Every given option against its declaration (a dataclass's fields, or a mapping of
    name -> :class:`Allowed`); unknown names are the caller's check. ``where`` prefixes the
    message (``model 'x': ``)."""
    decl = cls if isinstance(cls, Mapping) else declarations(cls)
    for name, value in options.items():
        allowed = decl.get(name)
        if allowed is not None:
            allowed.check(f"{where}{name}", value)


def check_declared(obj: Any, where: str = "") -> None:
    """Every field of a dataclass instance against its declaration (``__post_init__``)."""
    check_options(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)


def bad_values(allowed: Allowed) -> list[Any]:
    """Values the declaration must refuse: a wrong type, each bound crossed, an even
    number where odd, an unknown choice, ``null`` where not allowed."""
    out: list[Any] = []
    if isinstance(allowed.kind, tuple):  # what every kind refuses
        each = [bad_values(dataclasses.replace(allowed, kind=k, null=True)) for k in allowed.kind]
        out += [v for vs in each for v in vs if allowed.problem(v) is not None and v is not None]
        return _unique(out) + ([] if allowed.null else [None])
    if allowed.choices is not None:
        out.append("no_such_choice" if all(isinstance(c, str) for c in allowed.choices) else 12345.5)
    elif allowed.kind is bool:
        out += ["maybe", 2]
    elif allowed.kind is list:
        out += ["not-a-list", 7]
    elif allowed.kind is dict:
        out += ["not-a-mapping", 7]
    elif allowed.kind is str:
        out.append(7)
        if allowed.pattern is not None:
            out.append("@@not a match@@")
    else:
        out.append("abc")
        if allowed.kind is int:
            out.append(1.5)
        for bound, step in ((allowed.ge, -1), (allowed.gt, 0), (allowed.le, 1), (allowed.lt, 0)):
            if bound is not None:
                out.append(type(bound)(bound + step) if allowed.kind is int else bound + step * 0.5)
        if allowed.odd:
            out.append(int(allowed.ge or allowed.gt or 0) + 1 if int(allowed.ge or 1) % 2 else 2)
    if not allowed.null:
        out.append(None)
    return out


def _unique(values: list[Any]) -> list[Any]:
    """``values`` without repeats, in order (by their repr: they may be unhashable)."""
    return list({repr(v): v for v in values}.values())
