"""PromQL: every query selects the serving by label, and the speed percentile reads the slow side."""

from __future__ import annotations

import random
import re

import pytest
from flashserve.autoscaling.metrics import assemble
from flashserve.autoscaling.promql import Queries, selector

Q = Queries("team-a", "flash", window_s=60, percentile=90)


def test_every_query_selects_the_serving_by_label():
    for name, query in Q.all().items():
        metrics = re.findall(r"vllm:[a-z_:]+|vllm_router_[a-z_]+", query)
        assert metrics, name
        for metric in metrics:
            # each vLLM (and vllm-router) series reference carries the namespace and serving matchers
            assert re.search(re.escape(metric) + r'\{namespace="team-a",serving="flash"[,}]', query), (name, query)


def test_arrival_rate_reads_the_routers_request_counter_over_the_window():
    # vllm-router 0.1.17 counts each inference request it receives as vllm_router_requests_total{route=...}
    assert Q.arrival_rate == 'sum(rate(vllm_router_requests_total{namespace="team-a",serving="flash"}[60s]))'
    assert "[90s]" in Queries("n", "s", window_s=90.0).arrival_rate


def test_mean_output_tokens_is_the_finished_requests_histogram_sum_over_count():
    sel = 'namespace="team-a",serving="flash"'
    assert Q.mean_output_tokens == (f"sum(rate(vllm:request_generation_tokens_sum{{{sel}}}[60s])) / "
                                    f"sum(rate(vllm:request_generation_tokens_count{{{sel}}}[60s]))")


def test_assemble_passes_the_arrival_readings_through_and_drops_meaningless_ones():
    base = {"sample_age": 1.0, "running": 10.0}
    s = assemble({**base, "arrival_rate": 12.5, "mean_output_tokens": 480.0}, 0.0, 60.0, 90.0)
    assert (s.arrival_rate, s.mean_output_tokens) == (12.5, 480.0)
    # no router series (routing off, or not scraped): no reading, and the policy sizes as before
    s = assemble(base, 0.0, 60.0, 90.0)
    assert (s.arrival_rate, s.mean_output_tokens) == (None, None)
    # extrapolation noise below zero is no arrivals; a zero mean output is no finished request
    s = assemble({**base, "arrival_rate": -0.01, "mean_output_tokens": 0.0}, 0.0, 60.0, 90.0)
    assert (s.arrival_rate, s.mean_output_tokens) == (0.0, None)


def test_label_values_are_escaped():
    assert selector('we"ird', "a\\b") == 'namespace="we\\"ird",serving="a\\\\b"'


def test_rate_windows_use_the_window():
    assert "[60s]" in Q.generation_tokens_rate and "[60s]" in Q.itl_at_percentile
    assert "[90s]" in Queries("n", "s", window_s=90.0).running_avg


@pytest.mark.parametrize("percentile, q", [(90, "0.9"), (99, "0.99"), (95.5, "0.955"), (50, "0.5")])
def test_speed_percentile_uses_the_slow_side_of_the_itl(percentile, q):
    queries = Queries("n", "s", percentile=percentile)
    assert queries.itl_at_percentile.startswith(f"histogram_quantile({q}, ")
    assert "vllm:inter_token_latency_seconds_bucket" in queries.itl_at_percentile
    assert "sum by (le)" in queries.itl_at_percentile
    assert queries.ttft_at_percentile.startswith(f"histogram_quantile({q}, ")
    assert Q.itl_p50.startswith("histogram_quantile(0.5, ")


def test_the_slow_side_is_the_right_side():
    # "p90 per-user speed >= X" means 90% of tokens come at X or faster: X = 1 / ITL quantile 0.9.
    rng = random.Random(3)
    speeds = sorted(rng.uniform(60.0, 160.0) for _ in range(10_000))
    itls = sorted(1.0 / s for s in speeds)
    x = 1.0 / itls[int(0.9 * len(itls)) - 1]
    share_at_or_above = sum(s >= x for s in speeds) / len(speeds)
    assert share_at_or_above == pytest.approx(0.9, abs=0.002)
    wrong = 1.0 / itls[int(0.1 * len(itls)) - 1]
    assert sum(s >= wrong for s in speeds) / len(speeds) == pytest.approx(0.1, abs=0.002)


@pytest.mark.parametrize("percentile, q", [(90, "0.9"), (99, "0.99")])
def test_sla_speed_reads_the_per_request_time_per_output_token(percentile, q):
    queries = Queries("team-a", "flash", percentile=percentile)
    tpot = 'vllm:request_time_per_output_token_seconds_bucket{namespace="team-a",serving="flash"}[60s]'
    # vLLM's zeros for requests with at most one output token, taken out of every bucket (promql docstring)
    ones = 'sum(rate(vllm:request_generation_tokens_bucket{namespace="team-a",serving="flash",le="1.0"}[60s]))'
    assert queries.one_token_requests_rate == ones
    buckets = f"sum by (le) (rate({tpot})) - on() group_left() {ones}"
    assert queries.tpot_at_percentile == f"histogram_quantile({q}, {buckets})"
    assert queries.tpot_p50 == f"histogram_quantile(0.5, {buckets})"
    count = 'vllm:request_time_per_output_token_seconds_count{namespace="team-a",serving="flash"}[60s]'
    assert queries.tpot_requests_rate == f"sum(rate({count})) - {ones}"
    assert {"tpot_at_percentile", "tpot_p50", "tpot_requests_rate"} <= set(queries.all())


def test_freshness_and_group_count_queries():
    assert Q.sample_age.startswith("time() - max(timestamp(vllm:num_requests_running{")
    assert Q.replicas_reporting.startswith("count(count by (group) (")


RAW = {
    "sample_age": 3.0, "running": 64.0, "waiting": 0.0, "running_avg": 64.0,
    "generation_tokens_rate": 6400.0, "first_tokens_rate": 100.0, "itl_steps_rate": 3500.0,
    "itl_at_percentile": 0.018, "itl_p50": 0.015, "kv_usage_avg": 0.4, "kv_usage_max": 0.5,
    "ttft_at_percentile": 0.8, "replicas_reporting": 1.0,
}  # fmt: skip


def test_speed_is_one_over_the_per_request_tpot_quantile():
    # 100 requests finished per second; 90% of them at <= 9.5 ms per output token: p90 speed 105 tok/s. The
    # per-step reading (1.8 / 18 ms = 100) is not used, nor is tokens per step (TPOT is per token already).
    raw = RAW | {"tpot_requests_rate": 100.0, "tpot_at_percentile": 0.0095, "tpot_p50": 0.008}
    snap = assemble(raw, stamp=1000.0, window_s=60.0, percentile=90.0)
    assert snap.speed_source == "requests"
    assert snap.speed_at_percentile == pytest.approx(1 / 0.0095)
    assert snap.speed_p50 == pytest.approx(125.0)
    assert snap.tokens_per_step == pytest.approx(1.8)  # still measured, for the fallback and the status


@pytest.mark.parametrize(
    "tpot",
    [
        {},  # an engine without the histogram
        {"tpot_requests_rate": 0.0, "tpot_at_percentile": None, "tpot_p50": None},  # nothing finished
        {"tpot_requests_rate": 0.25, "tpot_at_percentile": 0.02, "tpot_p50": 0.01},  # 15 finished: too few
    ],
)
def test_per_step_reading_stands_in_when_too_few_requests_finished(tpot):
    snap = assemble(RAW | tpot, stamp=1000.0, window_s=60.0, percentile=90.0)
    assert snap.speed_source == "steps"
    assert snap.speed_at_percentile == pytest.approx(100.0)  # 1.8 / 0.018
    assert snap.speed_p50 == pytest.approx(120.0)


def test_per_step_itl_is_scaled_by_tokens_per_step():
    # MTP: 1.8 tokens per step. 6400 tok/s, 100 new requests/s, (6400-100)/1.8 = 3500 steps/s.
    snap = assemble(RAW, stamp=1000.0, window_s=60.0, percentile=90.0)  # no TPOT histogram: the fallback
    assert snap.tokens_per_step == pytest.approx(1.8) and snap.speed_source == "steps"
    assert snap.speed_at_percentile == pytest.approx(100.0)  # 1.8 / 0.018, not 1 / 0.018 = 55
    assert snap.speed_p50 == pytest.approx(120.0)
    assert snap.speed_from_counters == pytest.approx(100.0)
    assert snap.replicas_reporting == 1 and snap.sample_age_s == 3.0


def test_idle_serving_has_no_speed_but_has_demand():
    raw = {"sample_age": 3.0, "running": 0.0, "waiting": 0.0, "running_avg": 0.0, "generation_tokens_rate": 0.0,
           "first_tokens_rate": 0.0, "itl_steps_rate": 0.0, "itl_at_percentile": None}  # fmt: skip
    snap = assemble(raw, stamp=0.0, window_s=60.0, percentile=90.0)
    assert snap.running == 0.0 and snap.speed_at_percentile is None and snap.speed_from_counters is None
    assert snap.speed_source is None
