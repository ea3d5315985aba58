"""The serving front's dynamic batcher (harness/serving/front.py), with a fake planner: no
model, no network. Plus the front's planner on a tiny random Llama: a batch of unequal
prompts plans what each prompt alone plans."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from harness.serving.front import Batcher, BatchInfo, FrontSettings, Planner

Item = tuple[str, int]  # (name, prompt tokens)


def _tokens(item: Item) -> int:
    return item[1]


class FakePlanner:
    """Plans a batch of items on the worker thread: records the batch's names, its thread
    and time span, sleeps ``delay`` seconds, and raises if an item is named ``fail_on``."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None) -> None:
        self.delay, self.fail_on = delay, fail_on
        self.batches: list[list[str]] = []
        self.spans: list[tuple[float, float]] = []
        self.threads: set[str] = set()

    def __call__(self, items: list[Item]) -> list[str]:
        t0 = time.perf_counter()
        self.threads.add(threading.current_thread().name)
        self.batches.append([name for name, _ in items])
        time.sleep(self.delay)
        self.spans.append((t0, time.perf_counter()))
        for name, _ in items:
            if name == self.fail_on:
                raise ValueError(f"cannot plan {name}")
        return [name.upper() for name, _ in items]


def _serve(planner: FakePlanner, settings: FrontSettings, *schedule: tuple[float, Item], cancel: dict | None = None):
    """Submit each item at its time (seconds from the start) concurrently; per item, its
    (result, BatchInfo) or the exception it raised. ``cancel``: {item name: time} cancels
    that request while it waits."""

    async def main() -> list:
        b: Batcher[Item, str] = Batcher(planner, settings, _tokens)

        async def client(delay: float, item: Item) -> tuple[str, BatchInfo]:
            await asyncio.sleep(delay)
            return await b.submit(item)

        try:
            tasks = {item[0]: asyncio.ensure_future(client(d, item)) for d, item in schedule}
            for name, at in (cancel or {}).items():
                asyncio.get_running_loop().call_later(at, tasks[name].cancel)
            # a batcher that stops serving fails the test instead of hanging it
            return await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), timeout=30)
        finally:
            await b.close()

    return asyncio.run(main())


def test_concurrent_requests_are_batched_up_to_max_batch():
    planner = FakePlanner()
    out = _serve(planner, FrontSettings(max_batch=4, max_wait_ms=50), *((0.0, (f"r{i}", 10)) for i in range(10)))
    assert planner.batches == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"], ["r8", "r9"]]
    assert [r for r, _ in out] == [f"R{i}" for i in range(10)]  # each request gets its own result
    assert [i.size for _, i in out] == [4] * 8 + [2] * 2 and [i.tokens for _, i in out] == [40] * 8 + [20] * 2


def test_token_budget_holds_a_request_that_does_not_fit_for_the_next_batch():
    """FIFO: a request that would take the batch past max_batch_tokens heads the next batch
    (no overtaking by smaller ones); one request over the budget runs alone."""
    costs = [60, 30, 20, 150, 10, 90, 20]
    planner = FakePlanner()
    settings = FrontSettings(max_batch=16, max_batch_tokens=100, max_wait_ms=50)
    out = _serve(planner, settings, *((0.0, (f"r{i}", c)) for i, c in enumerate(costs)))
    assert planner.batches == [["r0", "r1"], ["r2"], ["r3"], ["r4", "r5"], ["r6"]]
    assert [i.tokens for _, i in out] == [90, 90, 20, 150, 100, 100, 20]


def test_max_wait_bounds_how_long_a_batch_waits_for_more():
    """A batch waits max_wait_ms from its first request for company, then goes: a request
    50 ms later joins it, one 1 s later gets its own batch after the same bounded wait."""
    planner = FakePlanner()
    settings = FrontSettings(max_batch=8, max_wait_ms=200)
    (_, a), (_, b), (_, c) = _serve(planner, settings, (0.0, ("a", 1)), (0.05, ("b", 1)), (1.0, ("c", 1)))
    assert planner.batches == [["a", "b"], ["c"]]
    assert 0.19 <= a.queue_s < 0.8 and b.queue_s < a.queue_s
    assert 0.19 <= c.queue_s < 0.8


def test_requests_queued_while_a_batch_runs_go_together_without_a_new_wait():
    """Requests that arrive while the worker is busy are all taken as the next batch as soon
    as it is free: the wait is counted from their first one's arrival, long passed by then."""
    planner = FakePlanner(delay=0.5)
    settings = FrontSettings(max_batch=8, max_batch_tokens=100, max_wait_ms=400)
    schedule = [(0.0, ("a", 100)), (0.05, ("b", 1)), (0.06, ("c", 1)), (0.07, ("d", 1))]
    out = _serve(planner, settings, *schedule)
    assert planner.batches == [["a"], ["b", "c", "d"]]  # a fills the token budget: no wait
    (_, a), (_, b), (_, d) = out[0], out[1], out[3]
    assert a.queue_s < 0.2 and b.size == d.size == 3
    # b waited for a's batch (0.5 s from the start), not another 0.4 s after it
    assert 0.4 <= b.queue_s < 0.7 and d.queue_s < b.queue_s


def test_max_batch_1_is_the_serial_front():
    """max_batch=1: one request per batch in arrival order, one after another on one worker
    thread (not the event loop's), and no waiting for company however long max_wait is."""
    planner = FakePlanner(delay=0.02)
    t0 = time.perf_counter()
    out = _serve(planner, FrontSettings(max_batch=1, max_wait_ms=10_000), *((0.0, (f"r{i}", 5)) for i in range(5)))
    assert time.perf_counter() - t0 < 5
    assert planner.batches == [[f"r{i}"] for i in range(5)] and [i.size for _, i in out] == [1] * 5
    assert all(end <= nxt for (_, end), (nxt, _) in zip(planner.spans, planner.spans[1:], strict=False))
    (thread,) = planner.threads
    assert thread.startswith("speculator") and thread != threading.current_thread().name
    assert out[0][1].queue_s < 1


def test_an_exception_fails_only_its_batchs_requests():
    planner = FakePlanner(fail_on="bad")
    settings = FrontSettings(max_batch=2, max_wait_ms=50)
    items = [(0.0, ("a", 1)), (0.0, ("bad", 1)), (0.0, ("c", 1)), (0.0, ("d", 1)), (0.5, ("e", 1))]
    out = _serve(planner, settings, *items)
    assert planner.batches == [["a", "bad"], ["c", "d"], ["e"]]
    assert all(isinstance(e, ValueError) and str(e) == "cannot plan bad" for e in out[:2])
    assert [r for r, _ in out[2:]] == ["C", "D", "E"]  # the batcher went on


def test_a_cancelled_request_leaves_the_queue():
    planner = FakePlanner(delay=0.3)
    settings = FrontSettings(max_batch=8, max_wait_ms=5)
    out = _serve(
        planner, settings, (0.0, ("a", 1)), (0.05, ("x", 1)), (0.05, ("y", 1)), (0.05, ("z", 1)), cancel={"y": 0.1}
    )
    assert planner.batches == [["a"], ["x", "z"]]
    assert isinstance(out[2], asyncio.CancelledError) and out[3][1].size == 2


def test_front_settings_from_the_spec():
    assert FrontSettings.from_spec(None) == FrontSettings(max_batch=16, max_batch_tokens=65536, max_wait_ms=5)
    assert FrontSettings.from_spec({"max_batch": 1}) == FrontSettings(max_batch=1)
    with pytest.raises(ValueError, match=r"\['max_batch_token'\] are unknown"):
        FrontSettings.from_spec({"max_batch_token": 100})
    for bad in ({"max_batch": 0}, {"max_batch_tokens": 1.5}, {"max_wait_ms": -1}, {"max_batch": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FrontSettings.from_spec(bad)


def test_planner_batch_of_unequal_prompts_plans_each_as_alone(tiny_llama):
    """The front's planner: one batch of prompts of 50, 80 and 64 tokens gives each the kept
    tokens and positions it gets alone; plan_s shares sum to the call."""
    from specprefill import SpecPrefill
    from specprefill.backends.transformers import TransformersBackend
    from tests.conftest import CharTokenizer

    planner = object.__new__(Planner)  # no model loading: the tiny Llama is the speculator
    planner.method = SpecPrefill(keep_rate=0.3, lookahead=2, chunk_size=8, pool_kernel=3)
    planner.backend = TransformersBackend(tiny_llama, CharTokenizer(), tiny_llama)
    planner.vocab = 97
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (50, 80, 64)]
    t0 = time.perf_counter()
    batch = planner.plan_batch(prompts)
    wall = time.perf_counter() - t0
    for ids, (kept, xargs, log) in zip(prompts, batch, strict=True):
        alone_kept, alone_xargs, _ = planner.plan_batch([ids])[0]
        assert kept == alone_kept and xargs == alone_xargs
        assert log["prompt_tokens"] == len(ids) and log["kept_tokens"] == len(kept) < len(ids)
        assert xargs is not None and xargs["specprefill_next"] == len(ids)
    assert sum(log["plan_s"] for _, _, log in batch) == pytest.approx(wall, rel=0.2, abs=0.02)
    with pytest.raises(ValueError, match=r"token ids \[97\] are outside the vocabulary \[0, 97\)"):
        planner.tokenize([1, 97], False)
    with pytest.raises(ValueError, match="no tokens"):
        planner.tokenize([], False)


def test_the_fronts_speculator_is_chunked_as_placement_planned():
    """The front builds its speculator where the vLLM backend does (harness.models.factory), so it
    prefills model.speculator_chunk tokens at a time: the memory placement planned for it."""
    import dataclasses

    from harness.models.catalog import model_config

    for chunk in (64, None):
        model = model_config("tiny-random", speculator_chunk=chunk)
        planner = Planner({"model": dataclasses.asdict(model), "method": {"name": "specprefill", "keep_rate": 0.3}})
        assert planner.backend.prefill_chunk == chunk
        assert planner.backend.speculator is not None


class _EchoPlanner:
    """Keeps every token: a planner with no model (the app's forwarding is what is tested)."""

    def tokenize(self, prompt, add_special_tokens):
        return list(prompt) if isinstance(prompt, list) else [ord(c) for c in prompt]

    def plan_batch(self, batch):
        return [(ids, {}, {"kept_tokens": len(ids)}) for ids in batch]


def test_a_connection_the_engine_closes_before_answering_is_retried_once(tmp_path):
    """The engine (vLLM's server, keep-alive 5 s) may close a kept-alive connection just as
    the front sends a request down it: nothing was served, so the front sends it once more
    instead of failing the request (an Internal Server Error its client counted against the
    method's rate). A second disconnect fails the request with 502, logged."""
    from aiohttp import ClientSession, web

    from harness.serving.front import UPSTREAM_KEEPALIVE_S, make_app

    assert UPSTREAM_KEEPALIVE_S < 5  # below vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE

    async def main(drops: int) -> tuple[int, str, list[dict]]:
        seen = {"n": 0}

        async def upstream_completions(request: web.Request) -> web.StreamResponse:
            await request.read()
            seen["n"] += 1
            if seen["n"] <= drops:  # hang up without a response, as a closing keep-alive connection does
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            return web.json_response({"choices": [{"text": "ok"}]})

        engine = web.Application()
        engine.router.add_post("/v1/completions", upstream_completions)
        runners = []
        try:
            urls = []
            for app in (engine, None):
                if app is None:
                    log = tmp_path / f"front-{drops}.jsonl"
                    app = make_app(_EchoPlanner(), urls[0], log)  # type: ignore[arg-type]
                runner = web.AppRunner(app)
                await runner.setup()
                runners.append(runner)
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                urls.append(f"http://127.0.0.1:{port}")
            async with ClientSession() as s, s.post(f"{urls[1]}/v1/completions", json={"prompt": "hi"}) as r:
                text = await r.text()
                status = r.status
        finally:
            for runner in reversed(runners):
                await runner.cleanup()
        import json

        return status, text, [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    status, text, entries = asyncio.run(main(drops=1))
    assert status == 200 and "ok" in text and entries[-1]["upstream_retries"] == 1
    status, text, entries = asyncio.run(main(drops=2))
    assert status == 502 and "ServerDisconnectedError" in entries[-1]["error"]
    status, _, entries = asyncio.run(main(drops=0))
    assert status == 200 and entries[-1]["upstream_retries"] == 0
