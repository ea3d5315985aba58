"""A sweeper that validates every sweep point before the first one runs, and runs each
distinct job once.

Hydra's basic sweeper composes each job's config up front but only checks that it
composes. This one also builds each job with ``validate`` (a dotted path to a function
taking the job's composed config and returning the job's identity, e.g. its run folder;
``harness.jobs.eval.validate``) and refuses the whole sweep, naming every bad point, before any
model loads: a typo in the last of twelve sweep points must not surface hours into the
first eleven. Points with the same identity (full prefill swept over keep rates, which
it ignores) run once; points that differ in anything but the method's shorthands (``keep``,
``lookahead``: what a method may ignore) all run, even into one run folder (``tasks``,
``limit``, ``grid`` and ``rates`` choose rows of a folder, not the folder). The comma form
of a list-valued key (``tasks=a,b``) is the list, as on the command line
(:func:`harness.command_line.list_form`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.utils import get_method
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

#: Keys a method reads and may ignore (full prefill ignores keep): points differing only in
#: these (and so in the method's composed options) and mapping to one run folder run once.
SHORTHANDS = ("method", "keep", "lookahead")


def sweep_values(batch: Sequence[Sequence[str]], points: Sequence[Sequence[str]]) -> str:
    """The swept keys' values at ``points`` (some of ``batch``), in the command's own form:
    ``method=specprefill`` for the SpecPrefill half of a method x keep sweep. Only keys
    whose failing values are some of the batch's: one value over the whole batch (the
    command says it), or every value failing, tells nothing."""

    def values(pts: Sequence[Sequence[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for overrides in pts:
            for o in overrides:
                key, _, value = o.partition("=")
                if value not in out.setdefault(key, []):
                    out[key].append(value)
        return out

    every, bad = values(batch), values(points)
    told = {k for k, v in bad.items() if len(every[k]) > 1 and len(v) < len(every[k])}  # the values that fail
    return " ".join(f"{k}={','.join(v)}" for k, v in bad.items() if k in told)


class ValidatingSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: Any = None, validate: str | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.validate = validate

    def sweep(self, arguments: list[str]) -> Any:
        """Check ``out`` before Hydra makes its sweep folder under it; after a dry run, remove
        the folders Hydra made for it; after the last job, exit 1 (one message naming the
        runs) if rows failed, unless ``allow_failures``."""
        from harness.config import ConfigError, check_out  # deferred: Hydra imports every plugin when any app starts
        from harness.failures import RunFailures, failure_message

        assert self.config is not None
        out = Path(str(self.config.out)).expanduser() if "out" in self.config and str(self.config.out).strip() else None
        # the folders check_out is about to make (out and any missing parents), deepest first
        made_dirs = [] if out is None else [d for d in (out, *out.parents) if not d.exists()]
        if "out" in self.config:
            check_out(self.config.out)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        made = not sweep_dir.exists()
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"hydra.sweep.dir={self.config.hydra.sweep.dir!r} cannot be made: {e}") from None

        def tidy(dry: bool) -> None:
            """Remove the sweep's log folder (a dry run's whole, a refused sweep's while it
            holds only multirun.yaml), then ``out/.hydra``, ``out`` and the parents made for it
            if that left them empty."""
            if made and (dry or {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml"}):
                shutil.rmtree(sweep_dir, ignore_errors=True)
                with contextlib.suppress(OSError):
                    sweep_dir.parent.rmdir()  # out/.hydra, when this was its only sweep
            for d in made_dirs:  # made by check_out above, and still empty
                try:
                    d.rmdir()
                except OSError:
                    break

        try:
            returns = super().sweep(arguments)
        except ConfigError:  # refused before any job ran: no log folder of a sweep that never was
            tidy(dry=False)
            raise
        # A dry run plans and loads nothing, and leaves nothing: in this process (Hydra's basic
        # launcher) its plans went to stdout. Under another launcher (submitit) the plans are in
        # the jobs' logs inside the sweep folder: kept.
        in_process = str(self.config.hydra.launcher.get("_target_", "")).endswith(".BasicLauncher")
        if self.config.get("dry_run", False) and in_process:
            tidy(dry=True)
        outcomes = [
            r.return_value
            for batch in returns or []
            for r in batch
            if isinstance(getattr(r, "_return_value", None), dict) and "failed" in r.return_value
        ]
        if any(o["failed"] for o in outcomes) and not self.config.get("allow_failures", False):
            raise RunFailures(failure_message(outcomes))
        return returns

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:  # type: ignore[override]
        """Hydra's split into jobs, after the comma form of a list-valued key became the list."""
        from harness.command_line import list_form  # deferred: Hydra imports every plugin when any app starts

        parser = OverridesParser.create()
        as_lists = []
        for o in overrides:
            new = list_form(o)
            as_lists.append(parser.parse_overrides([new])[0] if new is not None else o)
        return BasicSweeper.split_arguments(as_lists, max_batch_size)

    def get_job_batch(self) -> Sequence[Sequence[str]]:
        batch = super().get_job_batch()
        if not self.validate:
            return batch
        from harness.command_line import describe, key_of  # deferred: Hydra imports every plugin when any app starts
        from harness.config import (
            check_explicit,
            check_unread,
        )  # deferred: Hydra imports every plugin when any app starts

        assert self.hydra_context is not None and self.config is not None
        check = get_method(self.validate)
        errors: list[tuple[str, str]] = []
        failing: list[Sequence[str]] = []
        seen, keep = set(), []
        composed = []  # every valid point's job config, for the sweep-wide checks
        for overrides in batch:
            point = f"  {' '.join(overrides) or '(defaults)'}"
            try:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except (HydraException, OmegaConfBaseException) as e:  # a value of the wrong type, an unknown option
                bad = next((o for o in overrides if f" {o}" in str(e)), "")
                errors.append((point, describe(e, bad)))
                failing.append(overrides)
                continue
            with open_dict(cfg):
                del cfg["hydra"]  # what the job itself receives
            try:
                check_explicit(cfg, [key_of(o) for o in overrides])
                folder = str(check(cfg))
            except ValueError as e:
                errors.append((point, str(e)))
                failing.append(overrides)
                continue
            composed.append(cfg)
            rest = OmegaConf.to_container(cfg, resolve=True)
            assert isinstance(rest, dict)
            key = json.dumps(
                [folder, {k: v for k, v in rest.items() if k not in SHORTHANDS}], sort_keys=True, default=str
            )
            if key not in seen:
                seen.add(key)
                keep.append(overrides)
        if not errors:  # what the command typed (not the sweep's own params) that no job reads
            task = self.config.hydra.overrides.get("task", []) if "overrides" in self.config.hydra else []
            presets = {o.split("=", 1)[1] for b in keep for o in b if o.startswith("method=")}
            check_unread(composed, [key_of(str(o)) for o in task], sorted(presets))
        if errors:
            from harness.config import ConfigError  # deferred: Hydra imports every plugin when any app starts

            reasons = {e for _, e in errors}
            if len(errors) == len(batch) and len(reasons) == 1:  # one reason for every point: one line
                every = f" (all {len(batch)} sweep points; nothing ran)" if len(batch) > 1 else ""
                raise ConfigError(reasons.pop() + every)
            if len(reasons) == 1:  # one reason for some points: one line naming them
                which = sweep_values(batch, failing)
                raise ConfigError(
                    f"{reasons.pop()} ({len(errors)} of {len(batch)} sweep points{': ' + which if which else ''}; "
                    f"nothing ran)"
                )
            raise ConfigError(
                f"{len(errors)} of {len(batch)} sweep point(s) are invalid; nothing ran:\n"
                + "\n".join(f"{p}: {e}" for p, e in errors)
            )
        return keep
