"""A few mock engines (`flashserve mock-engine serve`) as local processes on 127.0.0.1, for putting vllm-router in
front of them (tests/router, bench_vllm_router.py), and reading their vLLM counters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flashserve_testbed.engine.replica import ENV_ROUTING
from flashserve_testbed.localcluster.procs import end

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"
SERVED = "dsv4"
_PORT_LINE = re.compile(r"on http://127\.0\.0\.1:(\d+) ")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


@dataclass
class MockEngine:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        end(self.proc)


def _env(profile: str | None, seed: int, time_scale: float, dp_routing: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSERVE_MOCK_")}
    env.update(FLASHSERVE_MOCK_STARTUP_SECONDS="0", FLASHSERVE_MOCK_SEED=str(seed),
               FLASHSERVE_MOCK_TIME_SCALE=f"{time_scale:g}")
    if profile:
        env["FLASHSERVE_MOCK_PROFILE"] = profile
    if dp_routing:
        env[ENV_ROUTING] = dp_routing
    return env


def start_engines(count: int, log_dir: Path, *, profile: str | None = None, flags: tuple[str, ...] = (),
                  seed: int = 1, time_scale: float = 1.0, timeout: float = 60.0,
                  dp_routing: str | None = None) -> list[MockEngine]:
    """`count` mock engines, each on its own ephemeral port, ready (start-up delay 0). `flags` are `vllm serve`
    flags, e.g. ("--enable-scale-out",) for the render routes vllm-router's cache_aware policy asks for.
    `dp_routing` chooses the mock's balancer between its data-parallel ranks (`load`: vLLM 0.33's, by load
    only; `prefix`: the mock's default, which also prefers a rank holding the prompt's prefix)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    engines: list[MockEngine] = []
    try:
        for i in range(count):
            log_path = log_dir / f"engine-{i}.log"
            log = open(log_path, "wb")
            cmd = [sys.executable, "-m", "flashserve_testbed.engine.cli", "serve", MODEL, "--served-model-name",
                   SERVED, "--port", "0", *flags]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                                    env=_env(profile, seed * 100 + i, time_scale, dp_routing))
            log.close()
            engines.append(MockEngine(proc, 0, log_path))
        deadline = time.monotonic() + timeout
        for e in engines:
            while not e.port:
                m = _PORT_LINE.search(e.log_path.read_text(errors="replace"))
                if m:
                    e.port = int(m.group(1))
                elif e.proc.poll() is not None:
                    raise RuntimeError(f"mock engine exited {e.proc.returncode}: {e.log_path.read_text()[-2000:]}")
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"mock engine did not report its port: {e.log_path.read_text()[-2000:]}")
                else:
                    time.sleep(0.05)
    except BaseException:
        stop_all(engines)
        raise
    return engines


def stop_all(engines: list[MockEngine]) -> None:
    for e in engines:
        e.stop()


def counter(text: str, name: str) -> float:
    """The sum of a metric's samples over all label sets (e.g. every DP engine of a mock)."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(3))
    return total


def samples(text: str, name: str) -> dict[str, float]:
    """label string -> value, for one metric."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out[m.group(2) or ""] = float(m.group(3))
    return out
