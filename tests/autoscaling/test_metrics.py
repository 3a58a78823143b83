"""metrics.py against a tiny fake Prometheus on 127.0.0.1: canned answers, errors, a dead and a hung server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from flashserve.autoscaling import metrics

from tests.fakes import CANNED, QUERIES, FakePrometheus
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


class _Trickle(FakePrometheus):
    """Answers 200 with a body sent a byte at a time, each within the socket timeout."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for byte in body:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.05)


class _Huge(FakePrometheus):
    """Answers 200 with a body of MAX_ANSWER_BYTES and more, chunked, as fast as it can."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(metrics.MAX_ANSWER_BYTES // 65536 + 4):
                self.wfile.write(b" " * 65536)
        except OSError:
            pass  # the client stopped reading, as it should


def test_a_trickling_answer_ends_at_the_deadline_not_per_read():
    # each byte comes within the 0.2 s socket timeout, so only a wall-clock bound ends it: 3.5 s of body
    with serving(_Trickle) as (url, _):
        t0 = time.monotonic()
        res = fetch(url, timeout_s=0.2)
        elapsed = time.monotonic() - t0
    assert res.snapshot is None and "Unreachable (no answers within 0.4s)" in res.error
    assert elapsed < 1.5


def test_an_answer_over_the_cap_is_refused_unread():
    with serving(_Huge) as (url, _):
        res = fetch(url)
    assert res.snapshot is None and "BadResponse (an answer over 1 MiB)" in res.error


def test_an_absurd_reading_is_missing_not_a_number_the_policy_overflows_on():
    handler = type("Handler", (FakePrometheus,), {"values": dict(CANNED, running=1e200), "seen": []})
    with serving(handler) as (url, _):
        res = fetch(url)
    assert res.snapshot is not None and res.snapshot.running is None


def test_fetches_run_on_their_own_pool_so_a_slow_prometheus_keeps_the_default_pool_free():
    async def main(url: str) -> float:
        fetches = [asyncio.create_task(metrics.fetch_async(url, "team-a", "flash", 60, 90, timeout_s=0.5))
                   for _ in range(12)]  # fmt: skip
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await asyncio.to_thread(lambda: None)  # what the operator's writes use
        waited = time.monotonic() - t0
        await asyncio.gather(*fetches)
        return waited

    with prometheus("hang") as url:
        assert asyncio.run(main(url)) < 0.3
