"""Whether the Hugging Face hub can be reached, asked once per process and quickly.

Loading from an unreachable hub costs minutes of retries (``datasets`` retries five times
with back-off) before it fails; a hub-only model or dataset that is not in the local cache
is refused up front instead, in one line, when :func:`hub_unreachable` says why it cannot
be fetched. ``HF_HUB_OFFLINE=1`` is respected (no request is made).
"""

from __future__ import annotations

import functools
import os


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (also when set after its import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return bool(env or constants.HF_HUB_OFFLINE)


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (``HF_HUB_OFFLINE`` set, no network), or None."""
    return "HF_HUB_OFFLINE is set" if hub_offline() else _no_network()


@functools.lru_cache(maxsize=1)
def _no_network(timeout_s: float = 5.0) -> str | None:
    """One HEAD request to the hub's endpoint through huggingface_hub's own HTTP session (its
    proxies and endpoint), once per process; any HTTP answer counts as reachable."""
    from huggingface_hub import constants

    try:
        from huggingface_hub.utils import get_session

        get_session().head(constants.ENDPOINT, timeout=timeout_s)
    except Exception as e:  # DNS, refused, timeout, proxy: all mean no hub here
        detail = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        return f"the hub ({constants.ENDPOINT}) is unreachable ({detail})"
    return None


def hub_cached(repo_id: str, filename: str = "config.json", repo_type: str = "model") -> bool:
    """Whether ``filename`` of hub repo ``repo_id`` is in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, filename, repo_type=repo_type), str)
    except Exception:  # not a valid repo id
        return False
