"""Option checks shared by the baselines."""

from __future__ import annotations

POSITION_MODES = ("original", "contiguous")


def check_keep(keep_rate: object) -> None:
    if isinstance(keep_rate, bool) or not isinstance(keep_rate, int | float) or not 0.0 < float(keep_rate) <= 1.0:
        raise ValueError(f"keep_rate={keep_rate!r} is outside (0, 1]; e.g. keep=0.3 keeps 30% of prompt tokens")


def check_position_mode(mode: str) -> None:
    if mode not in POSITION_MODES:
        raise ValueError(f"position_mode={mode!r} is invalid; allowed: {list(POSITION_MODES)}")
