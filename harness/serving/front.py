"""A planning method's serving path (``make qps``): an OpenAI-compatible front before ``vllm serve``.

Two engines behind one async server: the method (SpecPrefill: its speculator) runs here, on transformers, under
the same load as the base model, so its cost and its contention count; the base model
runs in vLLM's own OpenAI server (``vllm serve``), which loads this project's position
hook through its plugin entry point (:mod:`specprefill.backends.vllm`).

For each ``POST /v1/completions`` the front

1. tokenizes the prompt text as vLLM's completions endpoint would (``add_special_tokens``
   from the request, default true);
2. plans it with the configured method (SpecPrefill: speculator prefill and look-ahead,
   scoring, top-k) on one worker thread: requests queue for the speculator, and the
   wait is logged;
3. forwards the request to vLLM with the kept token ids as the prompt and their original
   positions in ``vllm_xargs`` (``specprefill_positions``, ``specprefill_next``), and
   streams vLLM's answer back unchanged, so the client measures TTFT from its own send
   to the first streamed token: tokenization, queueing, speculator and selection included.

Per request it appends one JSON line to ``--log`` (the client's ``x-request-id``, prompt
and kept tokens, queue, plan and forward times). Only methods that select tokens of the
whole prompt (``scope == "prompt"``) can be served this way: the request carries no
instruction/context/question split.

Run: ``python -m harness.serving.front --spec spec.json --upstream http://127.0.0.1:PORT --port P``
where ``spec.json`` holds ``{"model": <model config>, "method": {"name": ..., options}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

#: Response headers not copied from vLLM (aiohttp sets its own framing).
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "date", "server"}


class Planner:
    """Tokenizer, speculator backend and method; plans one prompt at a time (worker thread)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import baselines  # noqa: F401  (registers the methods)
        from harness.models import ModelConfig, load
        from specprefill.backends.transformers import TransformersBackend
        from specprefill.plan import build_method

        model = ModelConfig(**spec["model"])
        options = dict(spec["method"])
        name = str(options.pop("name"))
        self.method = build_method(name, options)
        if self.method.scope != "prompt":
            raise ValueError(
                f"method {name!r} (scope {self.method.scope!r}) cannot be served by the front: a request carries one "
                f"prompt text, no instruction/context/question split; allowed: methods with scope 'prompt' (specprefill)"
            )
        # The base runs in vLLM; here only the tokenizer and the speculator (an early-exit
        # speculator is the base's first layers, loaded for it).
        lm = load(model, with_base=False)
        if self.method.needs_speculator and lm.speculator is None:
            raise ValueError(f"method {name!r} needs a speculator, but model {model.name!r} has speculator: null")
        self.tokenizer = lm.tokenizer
        self.backend = TransformersBackend(lm.speculator, lm.tokenizer, lm.speculator)

    def plan(self, prompt: str | list[int], add_special_tokens: bool) -> tuple[list[int], dict[str, Any] | None, dict]:
        """(kept token ids, vllm_xargs or None, log fields) for one prompt."""
        from specprefill.backends.vllm import extra_args
        from specprefill.plan import Prompt

        t0 = time.perf_counter()
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids
        else:
            ids = [int(t) for t in prompt]
        t1 = time.perf_counter()
        with torch.inference_mode():
            plan = self.method.plan(Prompt(torch.tensor(ids, dtype=torch.int64)), self.backend)
        t2 = time.perf_counter()
        log = {"prompt_tokens": len(ids), "kept_tokens": plan.k, "tokenize_s": t1 - t0, "plan_s": t2 - t1,
               **{k: float(v) for k, v in plan.timings.items()}}  # fmt: skip
        return [int(t) for t in plan.input_ids.tolist()], extra_args(plan), log


def make_app(planner: Planner, upstream: str, log_path: Path | None) -> Any:
    from aiohttp import ClientSession, ClientTimeout, web

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speculator")  # one speculator, requests queue
    state: dict[str, Any] = {}

    async def on_startup(app: web.Application) -> None:
        state["session"] = ClientSession(timeout=ClientTimeout(total=None))

    async def on_cleanup(app: web.Application) -> None:
        await state["session"].close()
        pool.shutdown(wait=False, cancel_futures=True)

    def write_log(entry: dict[str, Any]) -> None:
        if log_path is not None:
            with log_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")

    async def completions(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.json()
        rid = request.headers.get("x-request-id", "")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            return web.json_response({"error": "the front serves one prompt per request"}, status=400)
        if not isinstance(prompt, str | list):
            return web.json_response({"error": f"prompt must be a string or token ids, got {type(prompt).__name__}"},
                                     status=400)  # fmt: skip
        loop = asyncio.get_running_loop()
        queued = time.perf_counter()
        started: list[float] = []

        def work() -> tuple[list[int], dict[str, Any] | None, dict]:
            started.append(time.perf_counter())
            return planner.plan(prompt, bool(body.get("add_special_tokens", True)))

        try:
            ids, xargs, log = await loop.run_in_executor(pool, work)
        except Exception as e:  # a bad prompt fails its request, not the server
            write_log({"request_id": rid, "error": f"{type(e).__name__}: {e}"})
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=500)
        body["prompt"] = ids
        body.pop("add_special_tokens", None)
        if xargs:
            body["vllm_xargs"] = {**(body.get("vllm_xargs") or {}), **xargs}
        headers = {"Content-Type": "application/json"}
        if rid:
            headers["x-request-id"] = rid
        forwarded = time.perf_counter()
        async with state["session"].post(f"{upstream}/v1/completions", json=body, headers=headers) as up:
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in HOP_HEADERS:
                    resp.headers[k] = v
            await resp.prepare(request)
            first: float | None = None
            async for chunk in up.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                await resp.write(chunk)
            await resp.write_eof()
        write_log({"request_id": rid, "status": up.status, **log, "queue_s": started[0] - queued,
                   "front_s": forwarded - arrived, "upstream_first_byte_s": (first or forwarded) - forwarded,
                   "arrived": arrived})  # fmt: skip
        return resp

    async def passthrough(request: web.Request) -> web.Response:
        async with state["session"].get(f"{upstream}{request.path}") as up:
            return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)

    app = web.Application(client_max_size=64 * 2**20)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", passthrough)
    app.router.add_get("/v1/models", passthrough)
    return app


def main(argv: list[str] | None = None) -> None:
    from aiohttp import web

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--spec", required=True, help="JSON file: {'model': {...}, 'method': {'name': ..., ...}}")
    ap.add_argument("--upstream", required=True, help="base URL of the vLLM OpenAI server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", type=Path, default=None, help="JSON lines, one per request")
    args = ap.parse_args(argv)
    planner = Planner(json.loads(Path(args.spec).read_text()))
    # Warm the speculator once (first-call allocations are not any request's cost).
    planner.plan(list(range(1, 65)), False)
    web.run_app(make_app(planner, args.upstream.rstrip("/"), args.log), host=args.host, port=args.port,
                print=None, access_log=None)  # fmt: skip


if __name__ == "__main__":
    main()
