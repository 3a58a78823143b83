"""What a plain Kubernetes Service in front of the engines gives, as a process: every request to an engine drawn
at random, streamed back unchanged. A baseline for bench_vllm_router.py.

    python -m flashserve_testbed.router.randomproxy PORT ENGINE_URL [ENGINE_URL ...]
"""

from __future__ import annotations

import random
import sys

import aiohttp
from aiohttp import web

from flashserve_testbed.router.vllm_router import HOST, loopback_url

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def app(engines: list[str], seed: int = 0) -> web.Application:
    rng = random.Random(seed)
    state: dict[str, aiohttp.ClientSession] = {}

    async def start(_app) -> None:
        state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=1800))

    async def stop(_app) -> None:
        await state["http"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with state["http"].request(request.method, rng.choice(engines) + request.path_qs, data=body,
                                         headers=headers) as up:
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in _HOP})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    a = web.Application(client_max_size=256 * 1024 * 1024)
    a.on_startup.append(start)
    a.on_cleanup.append(stop)
    a.router.add_route("*", "/{tail:.*}", forward)
    return a


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    engines = [loopback_url(u, f"ENGINE_URL {i}") for i, u in enumerate(args[1:])]
    web.run_app(app(engines), host=HOST, port=int(args[0]), access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
