"""Shared fixtures: a calibration typed in from the engine model's load test (calibrate.py measures the
same numbers in ~8 s; the unit tests should not), and tiny scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest
from flashserve_testbed.bench.calibrate import Calibration, Point
from flashserve_testbed.bench.workloads import Nominal, Scenario
from flashserve_testbed.engine import profile as profiles

DATA = Path(__file__).with_name("data")
SAMPLE_TRACE = DATA / "agentic-sample.jsonl"

# concurrency, attainment, speed p50, speed p90, ITL-quantile speed, ITL per token, output tok/s, TTFT, KV
_POINTS = (
    (8, 1.0, 141.8, 134.5, 144.0, 0.00707, 1118.5, 0.033, 0.050),
    (24, 0.9996, 126.9, 120.1, 111.5, 0.00790, 3001.1, 0.037, 0.130),
    (32, 0.9992, 120.4, 114.3, 98.8, 0.00833, 3797.2, 0.038, 0.182),
    (40, 0.9910, 113.9, 107.0, 87.9, 0.00881, 4480.0, 0.040, 0.228),
    (48, 0.9691, 109.6, 103.3, 82.1, 0.00915, 5180.5, 0.041, 0.268),
    (64, 0.4728, 99.7, 94.2, 71.9, 0.01005, 6294.2, 0.044, 0.365),
)


@pytest.fixture(scope="session")
def profile():
    return profiles.load()


@pytest.fixture(scope="session")
def calib(profile) -> Calibration:
    pts = tuple(
        Point(c, a, s50, s90, itl, ipt, out, ttft, kv, 0.5) for c, a, s50, s90, itl, ipt, out, ttft, kv in _POINTS
    )
    return Calibration(
        profile=profile.name, sla_tokens_per_s=100.0, target_attainment=0.99, points=pts, capacity_per_rank=41.0,
        engines_per_replica=profile.engines_per_replica, gpus_per_replica=profile.gpus_per_replica,
        prefill_tokens_per_s_per_gpu=1.0 / profile.step.per_prefill_token_s, mean_prompt_tokens=15700.0,
        mean_output_tokens=275.0, nominal=Nominal(0.04, 113.5),
    )


@pytest.fixture(scope="session")
def tiny() -> Scenario:
    """Five minutes (plus one of warm-up) at 0.6 replicas, doubling at minute two, 1-minute start-up."""
    return Scenario(
        name="tiny", description="unit-test scenario", duration_s=300.0, base_replicas=0.6,
        knots=((0.0, 1.0), (110.0, 1.0), (120.0, 2.0)), warmup_s=60.0, startup_median_s=60.0,
    )
