"""The servers a serving job runs: ``vllm serve`` for the base model (prefix caching off,
asserted from its config line; the position canary run on it) and, for a method that plans,
the async front of :mod:`harness.serving.front`; started, watched and stopped (process
group, TERM then KILL) however the job ends."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.failures import RunFailures
from harness.models.catalog import ModelConfig
from harness.models.factory import EngineRefused
from harness.models.loading import load_tokenizer, vllm_engine_args
from harness.models.placement import Placement
from harness.serving.front import FrontSettings
from specprefill.backends.vllm import (
    CANARY_TOP,
    RUNNER_SWITCH,
    PositionHookInactive,
    check_positions,
    require_positions,
)
from specprefill.plan import Method

#: The name ``vllm serve`` serves the base model under (the front and the load generator ask for it).
SERVED_NAME = "specprefill-base"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(
    model: ModelConfig, port: int, utilization: float | None = None, max_model_len: int | None = None
) -> list[str]:
    """``vllm serve`` for the base model, from the same engine arguments the offline backend
    uses (the planned share of each GPU and window: :class:`~harness.models.placement.Placement`)."""
    args = vllm_engine_args(model, utilization, max_model_len)  # also sets vLLM's CPU environment defaults
    cmd = [
        sys.executable,
        "-m",
        "harness.serving.vllm_cli",
        "serve",
        str(args.pop("model_path")),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--no-enable-prefix-caching",
        "--uvicorn-log-level",
        "warning",
    ]
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            cmd += [flag] if v else []
        else:
            cmd += [flag, str(v)]
    return cmd


def alive(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return bool(r.status == 200)
    except Exception:
        return False


def log_tail(path: Path, n: int = 30) -> str:
    """The last ``n`` lines of a server's log (for an error message)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, what: str) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {proc.returncode} before it was ready; log {log}:\n{log_tail(log)}"
            )
        if alive(url):
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} was not ready after {timeout_s:g} s; log {log}:\n{log_tail(log)}")


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop a server and everything it started (its process group): TERM, then KILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


def assert_no_prefix_cache(log: Path) -> None:
    """The engine prints its config at start-up; prefix caching must read False there."""
    text = log.read_text(errors="replace")
    if "enable_prefix_caching=False" not in text:
        raise RuntimeError(
            f"the vLLM server's config line does not say enable_prefix_caching=False (log {log}); "
            f"QPS with a prefix cache would measure the cache"
        )


def served_canary(url: str) -> Any:
    """:data:`specprefill.backends.vllm.CanaryRun` over ``vllm serve``'s completions API:
    the canary's token ids as the prompt, its positions in ``vllm_xargs`` (as the front sends
    them), greedy, two tokens, EOS ignored, top log-probabilities keyed by token id."""

    def run(tokens: list[int], extra: dict[str, Any] | None) -> list[dict[Any, float]]:
        body: dict[str, Any] = {
            "model": SERVED_NAME,
            "prompt": tokens,
            "max_tokens": 2,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": CANARY_TOP,
            "return_tokens_as_token_ids": True,
        }
        if extra:
            body["vllm_xargs"] = extra
        req = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            choice = json.loads(r.read())["choices"][0]
        return [{str(t): float(lp) for t, lp in step.items()} for step in choice["logprobs"]["top_logprobs"]]

    return run


def check_served_positions(url: str, model: ModelConfig, max_model_len: int, log: Path) -> tuple[str, str]:
    """The position canary on a running ``vllm serve`` (refused in one line when it fails):
    what the rows record of the engine's runner and of the canary."""

    runner = "V2" if "Using V2 Model Runner" in log.read_text(errors="replace") else "V1"
    where = f"vllm serve ({runner}; {RUNNER_SWITCH}=0 pinned)"
    check = check_positions(served_canary(url), len(load_tokenizer(model)), max_model_len, where)
    try:
        return where, require_positions(check).describe()
    except PositionHookInactive as e:
        raise EngineRefused(str(e)) from e


class ServerStopped(RunFailures):
    """A server stopped while the run needed it: one line (where its log is), exit 1."""


@dataclass
class Servers:
    """The running servers of a job: the URL the client calls, the front's request log
    (None when the client talks to the engine), and each server's process and log."""

    url: str
    front_log: Path | None
    procs: list[tuple[str, subprocess.Popen, Path]]
    engine_runner: str = ""  # the engine's model runner, as the rows record it
    position_check: str = ""  # the position canary on the engine (check_served_positions)

    def down(self) -> str | None:
        """Why the servers cannot serve (a process exited, or /health does not answer), or None."""
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                return f"{name} exited with code {proc.returncode} (log {log})"
        if not alive(self.url):
            return f"{self.url}/health does not answer (logs {self.procs[0][2].parent})"
        return None


@contextlib.contextmanager
def serving(
    model: ModelConfig, placement: Placement, method: Method, front: FrontSettings, timeout_s: float, logs: Path
) -> Iterator[Servers]:
    """Start the servers a serving job needs (``vllm serve`` for ``model`` as ``placement``
    planned it, and for a method that plans, the front running ``method``; each given
    ``timeout_s`` to be ready) and stop them (process group) however the job ends."""
    procs: list[subprocess.Popen] = []
    named: list[tuple[str, subprocess.Popen, Path]] = []
    logs.mkdir(parents=True, exist_ok=True)
    try:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        vlog = logs / "vllm_serve.log"
        with vlog.open("w") as f:
            cmd = serve_command(model, port, placement.gpu_memory_utilization, placement.max_model_len)
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        wait_ready(base_url, procs[-1], vlog, timeout_s, "vllm serve")
        assert_no_prefix_cache(vlog)
        named.append(("vllm serve", procs[-1], vlog))
        runner, checked = check_served_positions(base_url, model, placement.max_model_len, vlog)
        if method.identity:  # nothing to plan: the client talks to the engine
            yield Servers(base_url, None, named, runner, checked)
            return
        fport = free_port()
        spec = logs / "front_spec.json"
        spec.write_text(
            json.dumps(
                {
                    "model": dataclasses.asdict(model),
                    "method": {"name": method.name, **method.options()},
                    "front": dataclasses.asdict(front),
                }
            )
        )
        flog, requests_log = logs / "front.log", logs / "front_requests.jsonl"
        requests_log.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "harness.serving.front",
            "--spec",
            str(spec),
            "--upstream",
            base_url,
            "--port",
            str(fport),
            "--log",
            str(requests_log),
        ]
        with flog.open("w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        wait_ready(f"http://127.0.0.1:{fport}", procs[-1], flog, timeout_s, f"{method.name} front")
        named.append((f"{method.name} front", procs[-1], flog))
        yield Servers(f"http://127.0.0.1:{fport}", requests_log, named, runner, checked)
    finally:
        for p in reversed(procs):
            stop(p)
