"""metrics.py against a tiny fake Prometheus on 127.0.0.1: canned answers, errors, a dead and a hung server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from flashserve.autoscaling import metrics

from tests.fakes import QUERIES, FakePrometheus
from tests.http_stub import serving


@contextmanager
def prometheus(mode: str = "ok") -> Iterator[str]:
    handler = type("Handler", (FakePrometheus,), {"mode": mode, "seen": []})
    with serving(handler) as (url, _):
        yield url
    prometheus.seen = handler.seen  # type: ignore[attr-defined]


def fetch(url: str, **kw) -> metrics.FetchResult:
    return metrics.fetch(url, "team-a", "flash", window_s=60, percentile=90, now=1000.0, **kw)


def test_reads_a_snapshot():
    with prometheus() as url:
        res = fetch(url)
    assert res.error is None
    s = res.snapshot
    assert s is not None
    assert (s.time, s.sample_age_s, s.running, s.waiting, s.running_avg) == (1000.0, 4.0, 500.0, 20.0, 480.0)
    assert s.tokens_per_step == pytest.approx(1.6)  # (48100 - 100) / 30000
    assert s.speed_source == "requests"
    assert s.speed_at_percentile == pytest.approx(1 / 0.0095)  # per request, not 1.6 / 0.016 per step
    assert s.speed_p50 == pytest.approx(1 / 0.008)
    assert s.speed_from_counters == pytest.approx(48_100 / 480)
    assert (s.kv_usage_avg, s.kv_usage_max, s.ttft_at_percentile_s, s.replicas_reporting) == (0.55, 0.7, 1.5, 2)
    # every query was sent, each selecting the serving
    assert set(prometheus.seen) == set(QUERIES.all().values())


def test_sync_wrapper_returns_the_snapshot_or_none():
    with prometheus() as url:
        assert metrics.fetch_snapshot(url, "team-a", "flash", 60, 90) is not None
    with prometheus("error") as url:
        assert metrics.fetch_snapshot(url, "team-a", "flash", 60, 90) is None


def test_no_series_is_missing_metrics():
    with prometheus("empty") as url:
        res = fetch(url)
    assert res.snapshot is None and "no vLLM engine series" in res.error
    assert len(prometheus.seen) == 1  # stops after the freshness query


def test_nan_quantile_reads_as_none():
    with prometheus("nan") as url:
        res = fetch(url)
    assert res.snapshot is not None and res.snapshot.speed_at_percentile is None


def test_http_error_is_none_with_the_reason(caplog):
    with prometheus("error") as url:
        res = fetch(url)
    assert res.snapshot is None and "unavailable" in res.error and "HTTPError 500" in res.error
    assert "boom" not in res.error, "nothing the endpoint answered is quoted"
    assert len(prometheus.seen) == 1  # no retry storm: the next evaluation is the retry
    assert any("unavailable" in r.message for r in caplog.records)


def test_down_server_is_none_quickly():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    t0 = time.monotonic()
    res = fetch(f"http://127.0.0.1:{port}")
    assert res.snapshot is None and "Unreachable" in res.error
    assert time.monotonic() - t0 < 2.0


def test_hung_server_times_out():
    with prometheus("hang") as url:
        t0 = time.monotonic()
        res = fetch(url, timeout_s=0.3)
        elapsed = time.monotonic() - t0
    assert res.snapshot is None and "Unreachable (no answer within 0.3s)" in res.error
    assert elapsed < 2.0


def test_async_wrapper_keeps_the_event_loop_free():
    async def main(url: str) -> tuple[metrics.FetchResult, int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.02)

        task = asyncio.create_task(ticker())
        res = await metrics.fetch_async(url, "team-a", "flash", 60, 90, timeout_s=0.4)
        done.set()
        await task
        return res, ticks

    with prometheus("hang") as url:
        res, ticks = asyncio.run(main(url))
    assert res.snapshot is None
    assert ticks >= 8  # the loop kept running during the ~0.4 s the worker thread waited

    async def ok(url: str):
        return await metrics.fetch_snapshot_async(url, "team-a", "flash", 60, 90)

    with prometheus() as url:
        assert asyncio.run(ok(url)).running == 500.0
