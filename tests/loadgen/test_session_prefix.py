"""Session keys: `session_prefix` names every request's session in X-Session-ID and `user`, so two runs can
send disjoint keys (a router hashes keys onto engines; runs with the same keys reuse one placement)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from flashserve_testbed.engine.profile import LogNormal
from flashserve_testbed.loadgen import Workload, run_load
from flashserve_testbed.loadgen import runner as runner_mod


def _sent_keys(monkeypatch, **kwargs) -> set[tuple[str, str]]:
    sent: set[tuple[str, str]] = set()

    async def fake_stream(http, url, body, record, t0, headers=None, timeout=600.0):
        sent.add((headers["X-Session-ID"], body["user"]))
        record.status, record.prompt_tokens, record.completion_tokens = 200, 10, body["max_tokens"]
        record.first = record.end = 0.0
        return "abc " * body["max_tokens"]

    monkeypatch.setattr(runner_mod, "stream_chat", fake_stream)
    wl = replace(Workload.from_profile().scaled(0.05), gap_seconds=LogNormal(0.05, 0.1, 0.01, 0.1))
    asyncio.run(run_load("http://127.0.0.1:9/v1", "m", "hold 2 0.3s", workload=wl, seed=3, **kwargs))
    return sent


def test_keys_default_to_s_and_take_the_prefix(monkeypatch):
    assert {k for k, _ in _sent_keys(monkeypatch)} >= {"s0", "s1"}
    keyed = _sent_keys(monkeypatch, session_prefix="w40r2-s")
    assert {k for k, _ in keyed} >= {"w40r2-s0", "w40r2-s1"}
    assert all(k.startswith("w40r2-s") and k == user for k, user in keyed)
