"""Start the mock engine as a subprocess on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from flashserve_testbed.localcluster.procs import end

ROOT = Path(__file__).resolve().parents[2]
PORT_LINE = re.compile(r"on http://127\.0\.0\.1:(\d+) ")


class MockServer:
    def __init__(self, proc: subprocess.Popen, port: int, log: list[str]) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.get("/health")[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError("mock engine never became healthy")

    def stop(self) -> None:
        end(self.proc)


def mock_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSERVE_MOCK_")}
    env.setdefault("PYTHONPATH", str(ROOT / "operator"))
    env.update(extra)
    return env


def start_mock(args: list[str], **env: str) -> MockServer:
    cmd = [sys.executable, "-m", "flashserve_testbed.engine.cli", "serve", *args, "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=mock_env(**env))
    log: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"mock engine exited {proc.returncode}: {''.join(log)}")
            continue
        log.append(line)
        m = PORT_LINE.search(line)
        if m:
            return MockServer(proc, int(m.group(1)), log)
    proc.kill()
    raise AssertionError(f"mock engine did not report its port: {''.join(log)}")


@pytest.fixture
def mock_server():
    servers: list[MockServer] = []

    def start(args: list[str], **env: str) -> MockServer:
        s = start_mock(args, **env)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
