"""A sweeper that validates every sweep point before the first one runs, and runs each
distinct job once.

Hydra's basic sweeper composes each job's config up front but only checks that it
composes. This one also builds each job with ``validate`` (a dotted path to a function
taking the job's composed config and returning the job's identity, e.g. its run folder;
``harness.run.validate``) and refuses the whole sweep, naming every bad point, before any
model loads: a typo in the last of twelve sweep points must not surface hours into the
first eleven. Points with the same identity (full prefill swept over keep rates, which
it ignores) run once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.utils import get_method
from omegaconf import open_dict


class ValidatingSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: Any = None, validate: str | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.validate = validate

    def sweep(self, arguments: list[str]) -> Any:
        """Check ``out`` before Hydra makes its sweep folder under it; after the last job,
        exit 1 (one message naming the runs) if rows failed, unless ``allow_failures``."""
        from harness.config import ConfigError, RunFailures, check_out, failure_message

        assert self.config is not None
        if "out" in self.config:
            check_out(self.config.out)
        try:
            Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"hydra.sweep.dir={self.config.hydra.sweep.dir!r} cannot be made: {e}") from None
        returns = super().sweep(arguments)
        outcomes = [
            r.return_value
            for batch in returns or []
            for r in batch
            if isinstance(getattr(r, "_return_value", None), dict) and "failed" in r.return_value
        ]
        if any(o["failed"] for o in outcomes) and not self.config.get("allow_failures", False):
            raise RunFailures(failure_message(outcomes))
        return returns

    def get_job_batch(self) -> Sequence[Sequence[str]]:
        batch = super().get_job_batch()
        if not self.validate:
            return batch
        assert self.hydra_context is not None and self.config is not None
        check = get_method(self.validate)
        errors, seen, keep = [], set(), []
        for overrides in batch:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                del cfg["hydra"]  # what the job itself receives
            try:
                key = str(check(cfg))
            except ValueError as e:
                errors.append(f"  {' '.join(overrides) or '(defaults)'}: {e}")
                continue
            if key not in seen:
                seen.add(key)
                keep.append(overrides)
        if errors:
            from harness.config import ConfigError

            raise ConfigError(
                f"{len(errors)} of {len(batch)} sweep point(s) are invalid; nothing ran:\n" + "\n".join(errors)
            )
        return keep
