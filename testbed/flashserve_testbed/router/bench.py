"""What the router adds: `python -m flashserve_testbed.router.bench [--streams 32] [--tokens 300] [--rounds 3]`.

Starts a mock engine (DP 4, real time) and a router in front of it, each its own process, then runs the same
concurrent streamed chat completions straight to the engine and through the router. Reports time to first
token and end-to-end time for both, and the router's CPU time per request and per streamed token (read from
/proc, so it counts only the router's own work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

import aiohttp

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _serve_router(engine_port: int, port: int) -> None:
    from flashserve_testbed.router import Router

    router = Router()
    router.set_endpoint("bench", "flash", "engine-0", "127.0.0.1", engine_port, "0", True)
    await router.start("127.0.0.1", port)
    await asyncio.Event().wait()


async def _wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


async def _round(base: str, streams: int, tokens: int) -> tuple[list[float], list[float]]:
    async def one(http: aiohttp.ClientSession, i: int) -> tuple[float, float]:
        body = {"model": "dsv4", "stream": True, "max_tokens": tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"request {i} " + "x" * 4000}]}
        t0 = time.monotonic()
        first = None
        async with http.post(f"{base}/chat/completions", json=body) as r:
            async for line in r.content:
                content = line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line
                if first is None and content:
                    first = time.monotonic() - t0
        return first or 0.0, time.monotonic() - t0

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results = await asyncio.gather(*(one(http, i) for i in range(streams)))
    return [r[0] for r in results], [r[1] for r in results]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashserve_testbed.router.bench")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve-router", nargs=2, type=int, metavar=("ENGINE_PORT", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_router:
        asyncio.run(_serve_router(*args.serve_router))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSERVE_MOCK_")}
    env.update(FLASHSERVE_MOCK_STARTUP_SECONDS="0", FLASHSERVE_MOCK_SEED="1")
    eport, rport = _free_port(), _free_port()
    engine = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.engine.cli", "serve", MODEL, "--served-model-name",
                               "dsv4", "--port", str(eport), "--data-parallel-size", "4", "--speculative-config",
                               '{"method":"dspark","num_speculative_tokens":1}'], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    router = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.router.bench", "--serve-router", str(eport),
                               str(rport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        asyncio.run(_wait_http(f"http://127.0.0.1:{eport}/health"))
        asyncio.run(_wait_http(f"http://127.0.0.1:{rport}/metrics"))
        direct = f"http://127.0.0.1:{eport}/v1"
        routed = f"http://127.0.0.1:{rport}/bench/flash/v1"
        asyncio.run(_round(routed, 4, 20))  # warm both paths
        rows = []
        for _ in range(args.rounds):
            for name, base in (("direct", direct), ("router", routed)):
                cpu0 = _cpu_seconds(router.pid)
                ttft, e2e = asyncio.run(_round(base, args.streams, args.tokens))
                cpu = _cpu_seconds(router.pid) - cpu0
                rows.append((name, statistics.median(ttft), statistics.median(e2e), cpu))
        for name in ("direct", "router"):
            mine = [r for r in rows if r[0] == name]
            ttft = statistics.median(r[1] for r in mine) * 1e3
            e2e = statistics.median(r[2] for r in mine)
            line = f"{name:6}  TTFT p50 {ttft:6.1f} ms   end-to-end p50 {e2e:5.2f} s"
            if name == "router":
                cpu = statistics.median(r[3] for r in mine)
                line += (f"   router CPU {cpu * 1e3 / args.streams:5.2f} ms/request, "
                         f"{cpu * 1e6 / (args.streams * args.tokens):5.1f} us/token")
            print(line)
    finally:
        for proc in (router, engine):
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
