"""Overhead of the mock engine per streamed token: CPU the server process spends per token it streams.

Starts `flashserve mock-engine serve` on 127.0.0.1 (DP 4, MTP, real time by default), streams chat completions from
concurrent clients, and reads the server's CPU time from /proc. The idle cost of the driver over the same wall
time is measured first and subtracted. Prints one line per run and the median.

    python -m flashserve_testbed.engine.bench_overhead [--runs 5] [--streams 32] [--tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time

import aiohttp

from flashserve_testbed.localcluster.procs import end

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(scale: float) -> tuple[subprocess.Popen, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSERVE_MOCK_")}
    env.update(FLASHSERVE_MOCK_STARTUP_SECONDS="0", FLASHSERVE_MOCK_TIME_SCALE=str(scale), FLASHSERVE_MOCK_SEED="1")
    cmd = [sys.executable, "-m", "flashserve_testbed.engine.cli", "serve", MODEL, "--port", "0", "-dp", "4",
           "--speculative-config", '{"method":"dspark","num_speculative_tokens":1}']
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    for line in proc.stderr:
        m = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
        if m:
            return proc, int(m.group(1))
    raise RuntimeError("mock engine did not start")


async def one_stream(session: aiohttp.ClientSession, url: str, i: int, tokens: int) -> tuple[int, int]:
    body = {
        "model": MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"session {i}: " + "context " * 300}],
    }
    chunks = streamed = 0
    async with session.post(url, json=body) as resp:
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                streamed = doc["usage"]["completion_tokens"]
            elif doc["choices"] and doc["choices"][0]["delta"].get("content"):
                chunks += 1
    return streamed, chunks


async def load(port: int, streams: int, tokens: int) -> tuple[int, int]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*(one_stream(session, url, i, tokens) for i in range(streams)))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    proc, port = start_server(args.scale)
    try:
        time.sleep(0.5)
        c0, w0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(2.0)
        idle_rate = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - w0)
        print(f"idle driver: {idle_rate * 100:.2f}% of one core")
        per_token, per_chunk = [], []
        for run in range(args.runs):
            c0, w0 = cpu_seconds(proc.pid), time.monotonic()
            tokens, chunks = asyncio.run(load(port, args.streams, args.tokens))
            wall = time.monotonic() - w0
            cpu = cpu_seconds(proc.pid) - c0 - idle_rate * wall
            per_token.append(cpu / tokens * 1e6)
            per_chunk.append(cpu / chunks * 1e6)
            print(f"run {run + 1}: {args.streams} streams x {args.tokens} tokens = {tokens} tokens in {chunks} "
                  f"SSE chunks, {wall:.2f} s wall, server CPU {cpu:.3f} s -> {per_token[-1]:.1f} us/token, "
                  f"{per_chunk[-1]:.1f} us/chunk")
        print(f"median over {args.runs} runs: {statistics.median(per_token):.1f} us of server CPU per streamed "
              f"token ({statistics.median(per_chunk):.1f} us per SSE chunk); one core streams about "
              f"{1e6 / statistics.median(per_token):,.0f} tokens/s")
    finally:
        end(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
