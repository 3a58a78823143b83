"""run_load and replay_trace against an in-process mock engine running ten times faster than real time."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from flashserve_testbed.engine.args import parse
from flashserve_testbed.engine.profile import LogNormal
from flashserve_testbed.engine.replica import MockSettings
from flashserve_testbed.engine.server import serve
from flashserve_testbed.loadgen import Workload, replay_trace, run_load
from flashserve_testbed.loadgen.cli import main as load_main

pytestmark = pytest.mark.timeout(120)
SCALE = 10.0


async def with_engine(test, *extra: str):
    ports: asyncio.Queue = asyncio.Queue()
    args = parse(["deepseek-ai/DeepSeek-V4.1-Flash", "--served-model-name", "dsv4", "--port", "0",
                  "--data-parallel-size", "4", "--speculative-config", '{"method":"dspark","num_speculative_tokens":1}',
                  *extra])
    settings = MockSettings(startup_seconds=0, time_scale=SCALE, seed=1)
    server = asyncio.ensure_future(serve(args, settings, ready_file=ports.put_nowait))
    try:
        port = await asyncio.wait_for(ports.get(), 30)
        return await test(f"http://127.0.0.1:{port}/v1")
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


def small_workload() -> Workload:
    return replace(Workload.from_profile().scaled(0.1), gap_seconds=LogNormal(1.0, 0.3, 0.2, 3.0))


def test_sessions_follow_the_schedule_and_hit_the_prefix_cache():
    lines: list[str] = []

    async def test(base):
        return await run_load(base, schedule="ramp 0 4 4s; hold 4 16s", workload=small_workload(), sla=100,
                              time_scale=SCALE, seed=2, progress=lines.append, progress_interval=0.5)

    report = asyncio.run(with_engine(test))
    s = report.summary()
    assert s["ok"] == s["requests"] > 8 and not s["errors"]
    assert 4 <= s["sessions"] <= 8
    assert 19.5 <= s["engine_seconds"] < 40  # the schedule, then the drain of requests in flight
    turns = {}
    for r in report.records:
        turns[r.session] = max(turns.get(r.session, 0), r.turn)
    assert max(turns.values()) >= 2  # multi-turn
    assert s["cached_fraction"] > 0.5  # later turns resend the conversation
    p50 = s["per_user_tokens_per_s"]["p50"]
    assert 90 < p50 < 220, p50  # ~150 tok/s per user at low load, read in engine seconds
    assert s["sla_attainment"] > 0.8
    ts = report.timeseries()
    assert len(ts) >= 19 and max(b["active_sessions"] for b in ts) == 4
    assert sum(b["output_tokens_per_s"] for b in ts) == pytest.approx(s["output_tokens"], rel=0.01)
    assert lines and "sessions" in lines[-1]


def test_max_requests_bounds_a_run():
    async def test(base):
        return await run_load(base, schedule="hold 3 60s", workload=small_workload(), time_scale=SCALE,
                              max_requests=5)

    report = asyncio.run(with_engine(test))
    assert len(report.records) == 5 and report.wall_seconds < 10


def test_mooncake_replay_reuses_shared_blocks(tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": i * 200, "input_length": 1600 + 10 * i, "output_length": 20 + i,
             "hash_ids": [1, 2, 3, 100 + i]} for i in range(8)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))

    async def test(base):
        return await replay_trace(base, str(trace), time_scale=SCALE, speedup=1.0)

    report = asyncio.run(with_engine(test))
    s = report.summary()
    assert s["ok"] == 8
    assert [r.completion_tokens for r in sorted(report.records, key=lambda r: r.session)] == [20 + i for i in range(8)]
    later = [r for r in report.records if r.session > 0]
    assert all(r.cached_tokens >= 1024 for r in later)  # the three shared 512-token blocks, less the tail
    assert report.wall_seconds * SCALE == pytest.approx(1.4, abs=1.5)


def test_aiperf_sessions_replay_closed_loop_with_the_conversation_so_far(tmp_path):
    """Turn 2 waits its delay after answer 1 and resends the conversation (a prefix-cache hit on turn 1); turn 3
    would pass max_model_len: refused with HTTP 400 as vLLM does, and it ends its session (turn 4 never sent)."""
    rows = [
        {"session_id": "s", "timestamp": 0, "input_length": 1024, "output_length": 30, "hash_ids": [1, 2]},
        {"session_id": "s", "delay": 3000, "input_length": 512, "output_length": 20, "hash_ids": [3]},
        {"session_id": "s", "delay": 0, "input_length": 9000, "output_length": 5},
        {"session_id": "s", "delay": 0, "input_length": 10, "output_length": 5},
        {"session_id": "t", "timestamp": 100, "input_length": 600, "output_length": 8},
    ]
    trace = tmp_path / "aiperf.jsonl.gz"
    import gzip

    trace.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))

    async def test(base):
        return await replay_trace(base, str(trace), time_scale=SCALE)

    report = asyncio.run(with_engine(test, "--max-model-len", "8192"))
    s_turns = sorted((r for r in report.records if r.session == 0), key=lambda r: r.turn)
    assert [r.turn for r in s_turns] == [0, 1, 2]
    first, second, third = s_turns
    assert first.completion_tokens == 30 and second.completion_tokens == 20
    assert second.start - first.end >= 3.0 / SCALE * 0.9  # its delay after the previous answer
    assert second.cached_tokens >= 1024  # the conversation so far came back
    assert third.status == 400 and third.error
    assert report.summary()["errors"] == {"400": 1} and report.config["mode"] == "aiperf"


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"

    async def test(base):
        return await asyncio.to_thread(load_main, [
            "--base-url", base, "--schedule", "hold 2 5s", "--time-scale", str(SCALE), "--prompt-scale", "0.05",
            "--gap-seconds", "0.5", "--sla", "100", "--json", str(out), "-q"])

    assert asyncio.run(with_engine(test)) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["ok"] > 0 and doc["config"]["schedule"] == "hold 2 5s"
    assert len(doc["timeseries"]) >= 5
    assert "per-user tok/s" in capsys.readouterr().out
