"""Report arithmetic: per-user speed, TTFT, percentiles, token-weighted SLA attainment, time series."""

from __future__ import annotations

import json

import pytest
from flashserve_testbed.loadgen.report import (
    LoadReport,
    RequestRecord,
    percentile,
    percentiles,
    sla_attainment,
)


def rec(start, first, end, tokens, session=0, error=None, prompt=1000, cached=800) -> RequestRecord:
    return RequestRecord(session=session, turn=0, start=start, first=first, end=end, completion_tokens=tokens,
                         prompt_tokens=prompt, cached_tokens=cached, error=error, status=200 if not error else 500)


def test_speed_is_tokens_after_the_first_over_decode_time():
    r = rec(0.0, 0.5, 1.5, 101)
    assert r.speed() == pytest.approx(100.0)
    assert r.speed(time_scale=10) == pytest.approx(10.0)  # wall speeds of a 10x engine are 10x too fast
    assert r.ttft() == pytest.approx(0.5) and r.ttft(10) == pytest.approx(5.0)
    assert rec(0, 0.5, 0.5, 1).speed() is None  # one token: no decode time
    assert rec(0, 0.5, 1.5, 50, error="x").speed() is None


def test_percentiles_are_nearest_rank_values_a_request_saw():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.0 and percentile(values, 0) == 1 and percentile(values, 100) == 4
    assert percentile(values, 10) == 1.0 and percentile(values, 51) == 3.0
    assert percentile([], 50) is None
    p = percentiles([5.0])
    assert p["p1"] == p["p99"] == p["mean"] == 5.0


def test_sla_attainment_weighs_by_output_tokens():
    fast = rec(0, 0.1, 1.1, 201)  # 200 tok/s, 201 tokens
    slow = rec(0, 0.1, 10.1, 501)  # 50 tok/s, 501 tokens
    assert sla_attainment([fast, slow], 100) == pytest.approx(201 / 702)
    assert sla_attainment([fast, slow], 40) == 1.0
    assert sla_attainment([], 100) is None


def test_summary_and_timeseries():
    records = [rec(0.0, 0.2, 1.2, 101, session=0), rec(1.0, 1.1, 3.1, 101, session=1),
               rec(2.0, None, 2.5, 0, session=1, error="HTTP 500")]
    samples = [{"t": 0.0, "target": 2, "active": 1, "inflight": 1}, {"t": 1.5, "target": 2, "active": 2, "inflight": 2}]
    report = LoadReport(records, wall_seconds=4.0, sla=60, samples=samples)
    s = report.summary()
    assert (s["requests"], s["ok"], s["sessions"], s["errors"]) == (3, 2, 2, {"500": 1})
    assert s["output_tokens"] == 202 and s["output_tokens_per_s"] == pytest.approx(50.5)
    assert s["cached_fraction"] == pytest.approx(0.8)
    assert s["per_user_tokens_per_s"]["p50"] == pytest.approx(50.0)  # 100 and 50 tok/s: the lower, by nearest rank
    assert s["sla_attainment"] == pytest.approx(0.5)
    ts = report.timeseries(1.0)
    assert [b["t"] for b in ts] == [0, 1, 2, 3]
    assert sum(b["output_tokens_per_s"] for b in ts) == pytest.approx(202)  # every token lands in one bin
    assert ts[0]["output_tokens_per_s"] == pytest.approx(80.8)  # 0.8 s of the first request's 1 s of decode
    assert ts[1]["requests_finished"] == 1 and ts[1]["per_user_p50"] == pytest.approx(100)
    assert (ts[0]["active_sessions"], ts[1]["active_sessions"], ts[3]["inflight"]) == (1, 2, 2)
    doc = json.loads(json.dumps(report.to_dict(requests=True)))
    assert len(doc["requests"]) == 3 and doc["summary"]["ok"] == 2
    assert "per-user tok/s" in report.format() and "SLA 60 tok/s: 50.0%" in report.format()


def test_timeseries_in_engine_seconds_with_a_time_scale():
    report = LoadReport([rec(0.0, 0.1, 0.2, 11)], wall_seconds=0.5, time_scale=10)
    ts = report.timeseries(1.0)
    assert len(ts) == 5  # 0.5 wall s = 5 engine s
    assert sum(b["output_tokens_per_s"] for b in ts) == pytest.approx(11)
    assert report.summary()["per_user_tokens_per_s"]["p50"] == pytest.approx(10.0)


def test_errors_without_an_http_status_are_counted_by_what_failed():
    down = RequestRecord(session=0, turn=0, start=0.0, end=0.1, error="ClientConnectorError: Cannot connect to host")
    cut = RequestRecord(session=1, turn=0, start=0.0, end=0.1, error="stream cut: ended after 3 chunks without [DONE]")
    s = LoadReport([down, cut], wall_seconds=1.0).summary()
    assert s["errors"] == {"ClientConnectorError": 1, "stream cut": 1}
