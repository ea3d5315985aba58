"""A planning method's serving path (``make qps``): an OpenAI-compatible front before ``vllm serve``.

Two engines behind one async server: the method (SpecPrefill: its speculator) runs here, on transformers, under
the same load as the base model, so its cost and its contention count; the base model
runs in vLLM's own OpenAI server (``vllm serve``), which loads this project's position
hook through its plugin entry point (:mod:`specprefill.backends.vllm`).

For each ``POST /v1/completions`` the front

1. tokenizes the prompt text as vLLM's completions endpoint would (``add_special_tokens``
   from the request, default true), off the event loop;
2. plans it with the configured method (SpecPrefill: speculator prefill and look-ahead,
   scoring, top-k) on one worker thread, batched with the other requests waiting for it
   (:class:`Batcher`: one ``method.plan_batch`` call, so one speculator forward, per
   batch of at most ``max_batch`` requests and ``max_batch_tokens`` prompt tokens, formed
   within ``max_wait_ms`` of its first request); ``max_batch: 1`` plans one request at a
   time, in arrival order;
3. forwards the request to vLLM with the kept token ids as the prompt and their original
   positions in ``vllm_xargs`` (``specprefill_positions``, ``specprefill_next``), and
   streams vLLM's answer back unchanged, so the client measures TTFT from its own send
   to the first streamed token: tokenization, queueing, speculator and selection included.

Per request it appends one JSON line to ``--log`` (the client's ``x-request-id``, prompt
and kept tokens, its batch's size and tokens, queue time (from joining the queue to its
batch's start), its share of the batch's planning time, forward times). A batch whose
planning raises fails its own requests (HTTP 500 with the error), not the server. Only
methods that select tokens of the whole prompt (``scope == "prompt"``) can be served this
way: the request carries no instruction/context/question split.

Run: ``python -m harness.serving.front --spec spec.json --upstream http://127.0.0.1:PORT --port P``
where ``spec.json`` holds ``{"model": <model config>, "method": {"name": ..., options}}`` and,
optionally, ``"front": {"max_batch": 16, "max_batch_tokens": 65536, "max_wait_ms": 5}``
(:class:`FrontSettings`; these are the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from harness.models.catalog import ModelConfig
from harness.models.factory import speculator_backend
from harness.registry import build_method
from specprefill.backends.vllm import extra_args
from specprefill.plan import Prompt

#: Response headers not copied from vLLM (aiohttp sets its own framing).
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "date", "server"}

T = TypeVar("T")
R = TypeVar("R")

#: What :meth:`Planner.plan_batch` gives per prompt: kept token ids, ``vllm_xargs`` (or None), log fields.
Planned = tuple[list[int], dict[str, Any] | None, dict[str, Any]]


@dataclass(frozen=True)
class FrontSettings:
    """How the front batches planning (the spec's ``"front"`` block).

    ``max_batch``: requests per batch (1 = one at a time, in arrival order);
    ``max_batch_tokens``: prompt tokens per batch (a request that would go past it waits
    for the next batch; a single longer request runs alone); ``max_wait_ms``: how long a
    batch waits, after its first request joined the queue, for more (requests already
    queued are taken at once, without waiting).
    """

    max_batch: int = 16
    max_batch_tokens: int = 65536
    max_wait_ms: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_batch_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"front.{name}={v!r}; allowed: int >= 1")
        w = self.max_wait_ms
        if isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0:
            raise ValueError(f"front.max_wait_ms={w!r}; allowed: a number >= 0 (milliseconds)")

    @classmethod
    def from_spec(cls, block: Mapping[str, Any] | None) -> FrontSettings:
        """Settings from the spec's ``"front"`` block (None or absent keys: the defaults)."""
        block = dict(block or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(block) - set(allowed))
        if unknown:
            raise ValueError(f"front settings {unknown} are unknown; allowed: {allowed}")
        return cls(**block)


@dataclass(frozen=True)
class BatchInfo:
    """What a request's batch was: ``size`` requests, ``tokens`` prompt tokens, ``queue_s``
    from the request joining the queue to the batch starting on the worker, ``batch_s`` the
    batch's time on the worker."""

    size: int
    tokens: int
    queue_s: float
    batch_s: float


@dataclass
class _Waiting(Generic[T, R]):
    item: T
    cost: int
    joined: float
    future: asyncio.Future[tuple[R, BatchInfo]]


class Batcher(Generic[T, R]):
    """Dynamic batching of concurrent requests onto one worker thread.

    ``run(items) -> results`` (one result per item, same order) is called on the worker
    thread with each batch, one batch at a time; :meth:`submit` waits for an item's result
    and its :class:`BatchInfo`. ``cost(item)`` is what ``max_batch_tokens`` counts. A batch
    is the queue's head in arrival order, as many requests as fit the limits (never
    skipping one that does not: it heads the next batch); it starts when it is full, or
    ``max_wait_ms`` after its first request joined the queue, whichever is first. While
    a batch runs, the next one gathers. An exception from ``run`` fails that batch's
    requests (each :meth:`submit` raises it); the batcher goes on. Must be used from one
    event loop; :meth:`close` stops it.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        settings: FrontSettings,
        cost: Callable[[T], int],
        executor: Executor | None = None,
    ) -> None:
        self.run, self.settings, self.cost = run, settings, cost
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="speculator")
        self._queue: collections.deque[_Waiting[T, R]] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Start the batching loop on the running event loop (:meth:`submit` does it too)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve(), name="front-batcher")

    async def close(self) -> None:
        """Stop: requests still waiting fail with RuntimeError; the worker thread is released."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail(list(self._queue), RuntimeError("the front is shutting down"))
        self._queue.clear()
        if self._own_executor:
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, item: T) -> tuple[R, BatchInfo]:
        """Queue ``item``; its result and its batch, once its batch has run."""
        if self._closed:
            raise RuntimeError("the front is shutting down")
        self.start()
        future: asyncio.Future[tuple[R, BatchInfo]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(item, int(self.cost(item)), time.perf_counter(), future))
        self._wakeup.set()
        return await future  # a cancelled request cancels its future: it is dropped from the queue

    def _fit(self) -> tuple[int, bool]:
        """How many of the queue's head make a batch, and whether that batch is full (the
        next request, or any, would not fit)."""
        s = self.settings
        n = tokens = 0
        for w in self._queue:
            if n == s.max_batch or (n and tokens + w.cost > s.max_batch_tokens):
                return n, True
            n, tokens = n + 1, tokens + w.cost
        return n, n == s.max_batch or tokens >= s.max_batch_tokens

    async def _next_batch(self) -> list[_Waiting[T, R]]:
        while True:
            live = [w for w in self._queue if not w.future.done()]  # drop cancelled requests
            if len(live) != len(self._queue):
                self._queue = collections.deque(live)
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            n, full = self._fit()
            left = self._queue[0].joined + self.settings.max_wait_ms / 1000 - time.perf_counter()
            if full or left <= 0:
                return [self._queue.popleft() for _ in range(n)]
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):  # the wait is over, or a request came: look again
                await asyncio.wait_for(self._wakeup.wait(), timeout=left)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            items = [w.item for w in batch]
            started: list[float] = []

            def work(items: list[T] = items, started: list[float] = started) -> Sequence[R]:
                started.append(time.perf_counter())
                return self.run(items)

            try:
                results = await loop.run_in_executor(self.executor, work)
                if len(results) != len(batch):
                    raise RuntimeError(f"the planner returned {len(results)} results for a batch of {len(batch)}")
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the front is shutting down"))
                raise
            except Exception as e:  # fails this batch's requests, not the batcher
                self._fail(batch, e)
                continue
            end = time.perf_counter()
            start = started[0] if started else end
            tokens = sum(w.cost for w in batch)
            for w, r in zip(batch, results, strict=True):
                if not w.future.done():
                    w.future.set_result((r, BatchInfo(len(batch), tokens, start - w.joined, end - start)))

    @staticmethod
    def _fail(batch: Sequence[_Waiting[T, R]], error: BaseException) -> None:
        for w in batch:
            if not w.future.done():
                w.future.set_exception(error)


class Planner:
    """Tokenizer, speculator backend and method; plans a batch of prompts per call (worker thread)."""

    def __init__(self, spec: dict[str, Any]) -> None:

        model = ModelConfig(**spec["model"])
        options = dict(spec["method"])
        name = str(options.pop("name"))
        self.method = build_method(name, options)
        if self.method.scope != "prompt":
            raise ValueError(
                f"method {name!r} (scope {self.method.scope!r}) cannot be served by the front: a request carries one "
                f"prompt text, no instruction/context/question split; allowed: methods with scope 'prompt' (specprefill)"
            )
        if self.method.acts_in_model:  # its applied() hook would reach the speculator here, never vLLM's base
            raise ValueError(
                f"method {name!r} acts inside the base model, which runs in vLLM's server, out of the front's reach; "
                f"allowed: methods that only choose tokens (specprefill)"
            )
        # The base runs in vLLM; here only the tokenizer and the speculator (an early-exit
        # speculator is the base's first layers, loaded for it).
        lm, backend = speculator_backend(model)  # chunked as placement planned (model.speculator_chunk)
        if backend is None:  # the front plans on the speculator's device, whatever the method
            raise ValueError(
                f"method {name!r}: the front plans on the model's speculator, but model {model.name!r} has "
                f"speculator: null"
            )
        self.tokenizer = lm.tokenizer
        self.backend = backend
        #: Token ids a request may carry: the speculator's embedding rows (else the tokenizer's size).
        self.vocab = int(getattr(getattr(lm.speculator, "config", None), "vocab_size", 0) or len(lm.tokenizer))

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        """The prompt's token ids (a text is tokenized as vLLM's completions endpoint does);
        an empty prompt or an id outside the vocabulary raises here, failing only its request."""
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt has no tokens")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab})")
        return ids

    def plan_batch(self, batch: Sequence[list[int]]) -> list[Planned]:
        """Plan B token-id prompts with one ``method.plan_batch`` call (SpecPrefill: one
        speculator forward). Per prompt: (kept token ids ``[K_i]``, vllm_xargs or None, log
        fields); ``plan_s`` is an equal share of the call, the method's timings its own."""

        t0 = time.perf_counter()
        with torch.inference_mode():
            prompts = [Prompt(torch.tensor(ids, dtype=torch.int64)) for ids in batch]
            plans = self.method.plan_batch(prompts, self.backend)
        share = (time.perf_counter() - t0) / len(batch)
        out: list[Planned] = []
        for ids, plan in zip(batch, plans, strict=True):
            log = {"prompt_tokens": len(ids), "kept_tokens": plan.k, "plan_s": share}
            log.update({k: float(v) for k, v in plan.timings.items()})
            out.append(([int(t) for t in plan.input_ids.tolist()], extra_args(plan), log))
        return out

    def plan(self, prompt: str | list[int], add_special_tokens: bool) -> Planned:
        """:meth:`plan_batch` of one prompt, tokenized here (``tokenize_s`` in its log)."""
        t0 = time.perf_counter()
        ids = self.tokenize(prompt, add_special_tokens)
        tokenize_s = time.perf_counter() - t0
        kept, xargs, log = self.plan_batch([ids])[0]
        return kept, xargs, {**log, "tokenize_s": tokenize_s}


#: How long the front keeps an idle connection to the engine for reuse: below vLLM's own
#: keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), so the front does not send a request down a
#: connection the server is closing (aiohttp's default, 15 s, did: a request arriving after a
#: gap of 5-15 s failed with ServerDisconnectedError, an Internal Server Error its client
#: counted against the method's rate, on the served path only the front has).
UPSTREAM_KEEPALIVE_S = 2.0


def make_app(planner: Planner, upstream: str, log_path: Path | None, settings: FrontSettings | None = None) -> Any:
    from aiohttp import ClientSession, ClientTimeout, ServerDisconnectedError, TCPConnector, web

    batcher: Batcher[list[int], Planned] = Batcher(planner.plan_batch, settings or FrontSettings(), len)
    state: dict[str, Any] = {}

    async def on_startup(app: web.Application) -> None:
        state["session"] = ClientSession(
            timeout=ClientTimeout(total=None), connector=TCPConnector(keepalive_timeout=UPSTREAM_KEEPALIVE_S)
        )
        batcher.start()

    async def on_cleanup(app: web.Application) -> None:
        await state["session"].close()
        await batcher.close()

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
            error = f"prompt must be a string or token ids, got {type(prompt).__name__}"
            return web.json_response({"error": error}, status=400)
        loop = asyncio.get_running_loop()
        add_special = bool(body.get("add_special_tokens", True))
        try:  # a bad prompt, or a batch whose planning raised, fails its request(s), not the server
            t0 = time.perf_counter()
            ids = await loop.run_in_executor(None, planner.tokenize, prompt, add_special)
            tokenize_s = time.perf_counter() - t0
            (kept, xargs, log), batch = await batcher.submit(ids)
        except Exception as e:
            write_log({"request_id": rid, "error": f"{type(e).__name__}: {e}", "arrived": arrived})
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=500)
        body["prompt"] = kept
        body.pop("add_special_tokens", None)
        if xargs:
            body["vllm_xargs"] = {**(body.get("vllm_xargs") or {}), **xargs}
        headers = {"Content-Type": "application/json"}
        if rid:
            headers["x-request-id"] = rid
        forwarded = time.perf_counter()
        up, retries = None, 0
        while up is None:
            try:
                up = await state["session"].post(f"{upstream}/v1/completions", json=body, headers=headers)
            except ServerDisconnectedError as e:
                # The engine closed the connection before answering (a kept-alive connection it
                # was closing as the request went out): nothing was served, so send it once more
                # on a new one. A server that stopped fails the retry to connect instead.
                retries += 1
                if retries > 1:
                    write_log({"request_id": rid, "error": f"{type(e).__name__}: {e}", "arrived": arrived, **log})
                    return web.json_response({"error": f"upstream: {type(e).__name__}: {e}"}, status=502)
        async with up:
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
        entry = {"request_id": rid, "status": up.status, **log, "tokenize_s": tokenize_s, "upstream_retries": retries}
        entry.update(batch_size=batch.size, batch_tokens=batch.tokens, batch_s=batch.batch_s, queue_s=batch.queue_s)
        entry.update(front_s=forwarded - arrived, upstream_first_byte_s=(first or forwarded) - forwarded)
        write_log({**entry, "arrived": arrived})
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
    ap.add_argument(
        "--spec", required=True, help="JSON file: {'model': {...}, 'method': {'name': ...}, 'front': {...}}"
    )
    ap.add_argument("--upstream", required=True, help="base URL of the vLLM OpenAI server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", type=Path, default=None, help="JSON lines, one per request")
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    settings = FrontSettings.from_spec(spec.get("front"))  # bad settings fail before the model loads
    planner = Planner(spec)
    # Warm the speculator once (first-call allocations are not any request's cost).
    planner.plan(list(range(1, 65)), False)
    print(f"front: batching {dataclasses.asdict(settings)}", flush=True)
    app = make_app(planner, args.upstream.rstrip("/"), args.log, settings)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
