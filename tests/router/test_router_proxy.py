"""The router over HTTP against stand-in engines: unbuffered SSE, affinity, queueing, failover, metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from flashserve_testbed.router import Policy, Router
from flashserve_testbed.router.server import ENDPOINT_HEADER

pytestmark = pytest.mark.timeout(60)
GAP = 0.3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def fake_engine(name: str) -> tuple[web.AppRunner, int]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"engine": name, "choices": []})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f"data: {json.dumps({'engine': name, 'i': i})}\n\n".encode())
            await asyncio.sleep(GAP)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}], "engine": name})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def with_router(test, policy: Policy | None = None, queue_timeout: float = 2.0):
    router = Router(policy or Policy(), queue_timeout=queue_timeout)
    url = await router.start("127.0.0.1", 0)
    engines = {}
    try:
        for name in ("a", "b"):
            engines[name] = await fake_engine(name)
        async with aiohttp.ClientSession() as http:
            await test(router, url, engines, http)
    finally:
        await router.stop()
        for runner, _ in engines.values():
            await runner.cleanup()


def test_sse_passes_through_unbuffered_with_the_chosen_endpoint():
    async def test(router, url, engines, http):
        router.set_endpoint("ns", "flash", "a", "127.0.0.1", engines["a"][1], "0", True)
        t0 = time.monotonic()
        arrivals = []
        async with http.post(f"{url}/ns/flash/v1/chat/completions", json={"stream": True, "messages": []}) as r:
            assert r.status == 200 and r.headers[ENDPOINT_HEADER] == "a"
            assert r.headers["Content-Type"].startswith("text/event-stream")
            async for line in r.content:
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic() - t0)
        assert len(arrivals) == 3
        # each event arrives as the engine sends it, GAP apart, not all at once when the response ends
        assert arrivals[1] - arrivals[0] > GAP * 0.6 and arrivals[2] - arrivals[1] > GAP * 0.6

    asyncio.run(with_router(test))


def test_sessions_stick_and_new_sessions_spread():
    async def test(router, url, engines, http):
        for name in ("a", "b"):
            router.set_endpoint("ns", "flash", name, "127.0.0.1", engines[name][1], name, True)
        seen = {}
        for sid in ("s1", "s2", "s1", "s2", "s1"):
            async with http.post(f"{url}/ns/flash/v1/chat/completions", json={"messages": [], "user": sid}) as r:
                seen.setdefault(sid, set()).add((await r.json())["engine"])
        assert all(len(v) == 1 for v in seen.values())
        assert seen["s1"] != seen["s2"]

    asyncio.run(with_router(test))


def test_requests_queue_until_an_engine_is_ready_then_time_out():
    async def test(router, url, engines, http):
        router.set_endpoint("ns", "flash", "a", "127.0.0.1", engines["a"][1], "0", False)

        async def later():
            await asyncio.sleep(0.5)
            router.set_endpoint("ns", "flash", "a", "127.0.0.1", engines["a"][1], "0", True)

        t0 = time.monotonic()
        pending = asyncio.ensure_future(http.get(f"{url}/ns/flash/v1/models"))
        await asyncio.sleep(0.2)
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'flashserve_router_requests_queued{namespace="ns",serving="flash"} 1.0' in metrics
        await later()
        r = await pending
        assert r.status == 200 and 0.4 < time.monotonic() - t0 < 1.5
        router.set_endpoint("ns", "flash", "a", "127.0.0.1", engines["a"][1], "0", False)
        r = await http.get(f"{url}/ns/flash/v1/models")
        assert r.status == 503  # after queue_timeout
        r = await http.get(f"{url}/other/flash/v1/models")
        assert r.status == 404

    asyncio.run(with_router(test, queue_timeout=1.0))


def test_a_refused_connection_fails_over_to_another_engine():
    async def test(router, url, engines, http):
        router.set_endpoint("ns", "flash", "dead", "127.0.0.1", free_port(), "0", True)
        router.set_endpoint("ns", "flash", "b", "127.0.0.1", engines["b"][1], "1", True)
        for _ in range(3):
            r = await http.get(f"{url}/ns/flash/v1/models")
            assert r.status == 200 and r.headers[ENDPOINT_HEADER] == "b"
        state = await (await http.get(f"{url}/-/endpoints")).json()
        pods = {e["pod"] for e in state["servings"][0]["endpoints"]}
        assert pods == {"dead", "b"}
        router.remove_endpoint("ns", "flash", "dead")
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'flashserve_router_ready_endpoints{namespace="ns",serving="flash"} 1.0' in metrics
        assert 'flashserve_router_requests_total{code="200",namespace="ns",serving="flash"} 3.0' in metrics

    asyncio.run(with_router(test))


def test_max_inflight_queues_in_the_router():
    async def test(router, url, engines, http):
        router.set_endpoint("ns", "flash", "a", "127.0.0.1", engines["a"][1], "0", True)

        async def one():
            async with http.post(f"{url}/ns/flash/v1/chat/completions", json={"stream": True}) as r:
                await r.read()
            return time.monotonic()

        t0 = time.monotonic()
        ends = sorted(await asyncio.gather(one(), one()))
        # one engine slot: the second stream starts only after the first (3 x GAP) ended
        assert ends[1] - t0 > 5 * GAP

    asyncio.run(with_router(test, Policy(max_inflight=1), queue_timeout=10))
