"""Undo what a method changed in place on a model: the restoring half of a ``Method.applied`` hook.

Packages that act inside a model (MInference, kvpress-style presses) patch it by
assignment: an instance ``forward`` on every attention and decoder layer, instance methods
on the model (``prepare_inputs_for_generation``), attributes on its config, a registered
submodule, at worst a class attribute. Few offer an undo, so :func:`restoring` saves what
such a patch can replace and puts every original object back on exit:

* every submodule's instance attributes (``vars(m)``): keys the patch added are deleted,
  replaced values are put back (the same objects), and the contents of the dicts and sets
  among them (``_modules``, ``_parameters``, ``_buffers``, the hook dicts) are restored in
  place;
* the ``config`` object of every submodule (attributes added or changed on it);
* the class attributes of every submodule's class (a patch on the class itself).

Not restored: tensor values changed in place (no patch this project uses writes weights),
and globals outside the model (module-level state of the patching package).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


@dataclass
class Snapshot:
    """What :func:`restoring` puts back: per object, its attributes and its containers' contents."""

    objects: list[tuple[Any, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    classes: list[tuple[type, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def of(cls, model: Any) -> Snapshot:
        modules = list(model.modules()) if hasattr(model, "modules") else [model]
        snap, seen = cls(), set()
        configs = [getattr(m, "config", None) for m in modules]
        for obj in [*modules, *(c for c in configs if c is not None and hasattr(c, "__dict__"))]:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            attrs = dict(vars(obj))
            contents = {k: v.copy() for k, v in attrs.items() if isinstance(v, dict | set)}
            snap.objects.append((obj, attrs, contents))
        if hasattr(model, "modules"):  # the module classes (an nn.Module's), not built-in types
            snap.classes = [(k, dict(vars(k))) for k in dict.fromkeys(type(m) for m in modules)]
        return snap

    def restore(self) -> None:
        for obj, attrs, contents in self.objects:
            d = vars(obj)
            for k in [k for k in d if k not in attrs]:
                del d[k]
            for k, v in attrs.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v
            for k, content in contents.items():
                container = d[k]
                container.clear()
                container.update(content)
        for klass, attrs in self.classes:
            current = dict(vars(klass))
            for k in current.keys() - attrs.keys():
                delattr(klass, k)
            for k, v in attrs.items():
                if current.get(k, _MISSING) is not v:
                    setattr(klass, k, v)


@contextlib.contextmanager
def restoring(model: Any) -> Iterator[Snapshot]:
    """Save ``model`` (an ``nn.Module``, or any object with a ``__dict__``) on entry and put
    every saved object back on exit, also when the body raises."""
    snap = Snapshot.of(model)
    try:
        yield snap
    finally:
        snap.restore()
