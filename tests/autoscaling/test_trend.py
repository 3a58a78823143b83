"""Demand trend: follows ramps, ignores steps and noise, so replicas are ordered for the demand they will meet."""

from __future__ import annotations

import math
import random

import pytest
from flashserve.autoscaling import PolicyConfig
from flashserve.autoscaling.trend import DemandTrend

from .toy import Fleet


def feed(series, dt=15.0, trend=None, t0=0.0):
    trend = trend or DemandTrend()
    for i, x in enumerate(series):
        trend = trend.update(t0 + i * dt, x, max_gap_s=60.0)
    return trend


def test_follows_a_ramp():
    rng = random.Random(1)
    ramp = [500 + 0.5 * 15 * i + rng.gauss(0, 15) for i in range(120)]  # +0.5 users/s for 30 min
    tr = feed(ramp)
    assert tr.trend == pytest.approx(0.5, rel=0.25)
    assert tr.forecast(600) == pytest.approx(ramp[-1] + 300, rel=0.08)


def test_a_step_is_a_level_shift_not_a_trend():
    tr = feed([240.0] * 40 + [900.0] * 40)
    assert tr.level == pytest.approx(900.0, rel=0.01)
    assert abs(tr.trend) < 0.05
    assert tr.forecast(600) < 950


def test_noise_alone_gives_little_trend():
    rng = random.Random(2)
    worst = 0.0
    tr = DemandTrend()
    for i in range(240):
        tr = tr.update(i * 15.0, 500 * (1 + 0.08 * rng.gauss(0, 1)), 60.0)
        if i > 20:
            worst = max(worst, abs(tr.trend * 300))
    assert worst < 0.25 * 500  # never projects more than a quarter of the demand over 5 minutes
    assert tr.noise == pytest.approx(40, rel=0.35)


def test_a_gap_starts_over():
    tr = feed([100.0, 200.0, 300.0])
    later = tr.update(tr.t + 600.0, 1000.0, max_gap_s=60.0)
    assert (later.level, later.trend) == (1000.0, 0.0)


def test_round_trip_and_junk():
    tr = feed([100.0, 110.0, 125.0, 130.0])
    again = DemandTrend.from_dict(tr.to_dict())
    assert again.forecast(300) == pytest.approx(tr.forecast(300), rel=1e-5)
    assert DemandTrend.from_dict({"level": "x"}) == DemandTrend()
    assert DemandTrend.from_dict(None) == DemandTrend()
    assert DemandTrend().to_dict() == {}


def test_projecting_the_trend_keeps_users_above_target_on_a_ramp():
    # Demand climbs from 300 to 1800 over 3 hours; a replica takes 10 minutes to start. Reacting to the
    # demand of the moment leaves users short for much of the climb; ordering for the demand at ready time
    # does not, for about the same GPU time.
    def attainment(horizon):
        cfg = PolicyConfig(max_replicas=30, replica_startup_s=600.0, trend_horizon_s=horizon)
        fleet = Fleet.steady(cfg, capacity=180.0, replicas=2)
        rng = random.Random(5)
        fleet.run(0.0, 10800.0, lambda t: 300 + 1500 * math.sin(math.pi * t / 21600) * (1 + 0.05 * rng.gauss(0, 1)))
        return fleet.attainment(), fleet.direction_changes()

    reactive, _ = attainment(0.0)
    ahead, changes = attainment(None)
    assert ahead >= reactive + 0.05
    assert ahead >= 0.93
    assert changes == 0
