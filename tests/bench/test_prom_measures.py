"""The simulated Prometheus's PromQL arithmetic and the run measures."""

from __future__ import annotations

import math

import pytest
from flashserve_testbed.bench.measures import (
    Recorder,
    need_at,
    oracle_gpu_hours,
    summarize,
    weighted_quantile,
)
from flashserve_testbed.bench.prom import (
    Prometheus,
    Sample,
    bucket_quantile,
    extrapolated_rate,
)


def test_rate_of_a_steady_counter_is_its_slope():
    # scraped every 15 s, 10 per second; a 60 s window holds 4 samples 45 s apart and extrapolates to 60 s
    pts = [(t, 10.0 * t + 1000.0) for t in (105.0, 120.0, 135.0, 150.0)]
    assert extrapolated_rate(pts, 90.0, 150.0) == pytest.approx(10.0)


def test_rate_extrapolation_stops_at_zero_for_a_new_counter():
    # a counter born at t=100 (first sample 20 at t=102): Prometheus does not extrapolate below zero
    pts = [(102.0, 20.0), (117.0, 170.0), (132.0, 320.0), (147.0, 470.0)]
    r = extrapolated_rate(pts, 90.0, 150.0)
    assert r == pytest.approx((450.0 * (45.0 + 2.0 + 3.0) / 45.0) / 60.0)


def test_rate_handles_counter_resets():
    # +150, reset (the new counter counted 50), +150: 350 over 45 s, extrapolated back towards zero only as
    # far as the first value allows (100/350 of the sampled span), not past the window
    pts = [(0.0, 100.0), (15.0, 250.0), (30.0, 50.0), (45.0, 200.0)]
    assert extrapolated_rate(pts, -15.0, 45.0) == pytest.approx(350.0 * (45.0 + 45.0 * 100 / 350) / 45.0 / 60.0)


def test_histogram_quantile_interpolates_inside_the_bucket():
    bounds = (0.01, 0.02, 0.05)
    # cumulative: 50 under 10 ms, 90 under 20 ms, 100 under 50 ms, 100 total
    assert bucket_quantile(0.5, bounds, [50.0, 90.0, 100.0, 100.0]) == pytest.approx(0.01)
    assert bucket_quantile(0.7, bounds, [50.0, 90.0, 100.0, 100.0]) == pytest.approx(0.015)
    assert bucket_quantile(0.25, bounds, [50.0, 90.0, 100.0, 100.0]) == pytest.approx(0.005)
    # in the +Inf bucket: the highest finite bound
    assert bucket_quantile(0.99, bounds, [10.0, 20.0, 30.0, 100.0]) == 0.05
    assert bucket_quantile(0.9, bounds, [0.0, 0.0, 0.0, 0.0]) is None


def _sample(t: float, tpot: tuple[float, ...], count: float, one_token: float) -> Sample:
    zeros = (0.0,) * 3
    return Sample(t=t, running=0, waiting=0, kv=0, gen_tokens=0, itl_count=0, itl_sum=0, itl_buckets=zeros,
                  ttft_count=0, ttft_sum=0, ttft_buckets=zeros, prompt_tokens=0, prompt_count=0,
                  output_tokens_done=0, output_count=0, prefix_queries=0, prefix_hits=0, tpot_count=count,
                  tpot_buckets=tpot, one_token_requests=one_token)  # fmt: skip


def test_tpot_quantile_leaves_out_the_zeros_of_one_token_requests():
    # per 15 s scrape: 30 one-token requests (TPOT 0, lowest bucket) and 70 that decoded: 35 in (5, 10] ms,
    # 35 in (10, 20] ms. The median of those 70 is 10 ms; read with the zeros it is 7.1 ms.
    prom = Prometheus(itl_bounds=(0.005, 0.01, 0.02), ttft_bounds=(1.0, 2.0, 3.0))
    for k in range(5):
        prom.ingest("e0", "pod", 0, 1.0, _sample(15.0 * k, (30.0 * k, 65.0 * k, 100.0 * k), 100.0 * k, 30.0 * k))
    assert prom.histogram_quantile(0.5, 60.0, 60.0, "tpot") == pytest.approx(0.005 + 0.005 * 20 / 35)
    assert prom.histogram_quantile(0.5, 60.0, 60.0, "tpot", "one_token_requests") == pytest.approx(0.01)
    assert prom.histogram_quantile(0.9, 60.0, 60.0, "tpot", "one_token_requests") == pytest.approx(
        0.01 + 0.01 * (63 - 35) / 35)


def test_attainment_is_token_weighted_and_counts_unfinished_as_missed():
    rec = Recorder()
    rec.add(1000, 900, 120.0, 0.05)  # 900 tokens fast
    rec.add(1000, 100, 80.0, 0.05)  # 100 tokens slow
    s = summarize(rec, 100.0, gpu_hours=1.0, price=2.0)
    assert s["attainment"] == pytest.approx(0.9)
    assert s["speed_p90"] == 80.0  # 10% of tokens are at 80 tok/s: the slow side
    assert s["tokens_per_dollar"] == pytest.approx((2000 + 1000) / 2.0)
    rec.unfinished(1000, 1000)
    assert summarize(rec, 100.0, 1.0, 2.0)["attainment"] == pytest.approx(0.45)


def test_weighted_quantile():
    assert weighted_quantile([(1.0, 1), (2.0, 1), (3.0, 8)], 0.1) == 1.0
    assert weighted_quantile([(1.0, 1), (2.0, 1), (3.0, 8)], 0.5) == 3.0


def test_oracle_integral_of_ceil_demand_over_capacity():
    # capacity 2 per replica, 4 GPUs each: 3 requests overlap in [10, 20) -> 2 replicas, else 1 (the floor)
    starts, ends = [0.0, 10.0, 10.0], [30.0, 20.0, 20.0]
    gpu_h, steps = oracle_gpu_hours(starts, ends, 2.0, 4, 0.0, 40.0, window_s=0.0)
    assert gpu_h == pytest.approx((40.0 * 1 + 10.0 * 1) * 4 / 3600.0)
    assert need_at(steps, 15.0) == 2 and need_at(steps, 25.0) == 1 and need_at(steps, 35.0) == 1
    assert math.isclose(oracle_gpu_hours([], [], 2.0, 4, 0.0, 3600.0)[0], 4.0)


def test_oracle_on_minute_averages_ignores_blips():
    # 8 requests for 300 s plus a 5 s blip of 4 more: capacity 10 -> 1 replica on minute averages
    starts = [0.0] * 8 + [100.0] * 4
    ends = [300.0] * 8 + [105.0] * 4
    gpu_h, steps = oracle_gpu_hours(starts, ends, 10.0, 4, 0.0, 300.0)
    assert gpu_h == pytest.approx(300.0 * 4 / 3600.0)
    # a lasting rise is followed
    gpu_h, _ = oracle_gpu_hours(starts[:8] + [100.0] * 4, [400.0] * 12, 10.0, 4, 0.0, 300.0)
    assert gpu_h == pytest.approx((100.0 + 2 * 200.0) * 4 / 3600.0, rel=0.05)


def test_policy_snapshot_reads_the_speed_of_the_requests_that_decoded():
    from flashserve_testbed.bench.policies import snapshot

    prom = Prometheus(itl_bounds=(0.005, 0.01, 0.02), ttft_bounds=(1.0, 2.0, 3.0))
    for k in range(5):
        prom.ingest("e0", "pod", 0, 1.0, _sample(15.0 * k, (30.0 * k, 65.0 * k, 100.0 * k), 100.0 * k, 30.0 * k))
    snap, error = snapshot(prom, 60.0, 60.0, 90.0)
    assert error is None and snap.speed_source == "requests"
    assert snap.speed_p50 == pytest.approx(100.0)  # 1 / 10 ms, not 1 / 7.1 ms
    assert snap.speed_at_percentile == pytest.approx(1.0 / (0.01 + 0.01 * 28 / 35))


def test_router_rate_is_none_without_a_router_and_the_counters_rate_with_one():
    prom = Prometheus((0.01, 0.1), (0.1, 1.0))
    assert prom.router_rate(100.0, 60.0) is None  # a plain Service: no vllm-router target
    for t in range(0, 121, 15):
        prom.ingest_router(float(t), 7.0 * t)
    assert prom.router_rate(120.0, 60.0) == pytest.approx(7.0)
