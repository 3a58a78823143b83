"""The simulator's model of vllm-router's consistent_hash (bench/routing.py) against the real binary: with the
same worker URLs, every session key goes to the engine the model predicts, also after a worker leaves the set.
The workers are stubs that answer with their own port (the router's choice is all that is measured)."""

from __future__ import annotations

import json
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest
from flashserve_testbed.bench.routing import HashRing, session_key
from flashserve_testbed.router.vllm_router import RouterOptions, VllmRouter, free_port

pytestmark = pytest.mark.timeout(120)


class _Stub(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # /health, /v1/models
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        port = str(self.server.server_address[1])
        self._send({"id": "c", "object": "chat.completion", "created": 0, "model": port,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": port}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})  # fmt: skip


@pytest.fixture
def stubs(serve_http):
    return [serve_http(_Stub)[0] for _ in range(4)]


def _served_by(base: str, sid: str) -> str:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json", "X-Session-ID": sid})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["model"]


@pytest.mark.parametrize("workers", [4, 3])
def test_the_ring_model_predicts_every_choice_of_the_binary(stubs, workers, tmp_path, vllm_router_bin):
    urls = tuple(stubs[:workers])
    ring = HashRing(list(urls))
    opts = RouterOptions(worker_urls=urls, port=free_port(), prometheus_port=free_port(), policy="consistent_hash")
    with VllmRouter(opts, tmp_path / "router.log") as router:
        got = {f"s{i}": _served_by(router.base, f"s{i}") for i in range(120)}
    want = {sid: ring.lookup(session_key(sid)).rsplit(":", 1)[1] for sid in got}
    assert got == want
    assert len(set(got.values())) == workers
