"""The online capacity learner converges to the true capacity at the SLA from (concurrency, speed) pairs; the
prior it starts from follows the speed-versus-concurrency line across SLAs and replica shapes."""

from __future__ import annotations

import math
import random

import pytest
from flashserve.autoscaling import PolicyConfig
from flashserve.autoscaling.capacity import (
    LOW_LOAD_TOKENS_PER_S,
    REFERENCE_SLA_TOKENS_PER_S,
    USERS_PER_GPU_AT_REFERENCE,
    CapacityModel,
    CapacityPrior,
    capacity_through,
    prior_users_per_replica,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .toy import curve

SLA = 100.0
PRIOR = CapacityPrior(capacity=256.0, low_load_tokens_per_s=150.0, sla_tokens_per_s=SLA)


def learn(model, speed, concurrencies, t0=0.0, dt=15.0, noise=0.03, seed=0, memory_s=None):
    memory_s = memory_s or PolicyConfig().capacity_memory_s
    rng = random.Random(seed)
    t = t0
    for c in concurrencies:
        s = speed(c) * math.exp(rng.gauss(0.0, noise))
        model = model.observe(t, c, s, memory_s)
        t += dt
    return model, t


def test_no_data_is_the_prior():
    assert CapacityModel().capacity(PRIOR) == pytest.approx(256.0)


@given(
    true_capacity=st.floats(40.0, 2000.0),
    low_load=st.floats(120.0, 400.0),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=40, deadline=None)
def test_converges_from_varied_load(true_capacity, low_load, seed):
    # A prior off by up to 6x in capacity and in idle speed; an hour of load wandering over the range.
    speed = curve(true_capacity, SLA, low_load)
    rng = random.Random(seed)
    cs = [true_capacity * rng.uniform(0.1, 1.5) for _ in range(240)]
    model, _ = learn(CapacityModel(), speed, cs, seed=seed)
    # 3% noise on every reading: the estimate is within 0.5% at the median and 4% at worst over 1,500 random
    # draws, but an idle speed close to the SLA (a flat curve) amplifies the noise at the edges of the domain.
    assert model.capacity(PRIOR) == pytest.approx(true_capacity, rel=0.08)


def test_converges_at_a_single_operating_point_with_the_idle_speed_known():
    # Steady traffic gives one concurrency only; the low-load anchor supplies the slope.
    speed = curve(180.0, SLA, 150.0)
    model, _ = learn(CapacityModel(), speed, [120.0] * 240, noise=0.02)
    assert model.capacity(PRIOR) == pytest.approx(180.0, rel=0.05)


def test_thin_data_stays_near_the_prior_and_moves_towards_the_truth():
    speed = curve(128.0, SLA, 150.0)
    model, _ = learn(CapacityModel(), speed, [100.0], noise=0.0)
    est = model.capacity(PRIOR)
    assert 128.0 < est < 256.0
    assert model.n == 1


def test_forgets_an_old_curve():
    # Context lengths grew: the capacity fell from 256 to 128. Within an hour the estimate follows.
    rng = random.Random(1)
    model, t = learn(CapacityModel(), curve(256.0), [rng.uniform(50, 350) for _ in range(240)])
    assert model.capacity(PRIOR) == pytest.approx(256.0, rel=0.05)
    model, _ = learn(model, curve(128.0), [rng.uniform(30, 180) for _ in range(240)], t0=t)
    assert model.capacity(PRIOR) == pytest.approx(128.0, rel=0.1)


def test_ignores_invalid_observations():
    m = CapacityModel()
    for c, s in ((0.0, 100.0), (10.0, 0.0), (math.nan, 100.0), (10.0, math.inf), (-5.0, 100.0)):
        assert m.observe(0.0, c, s, 3600.0) == m


def test_round_trips_through_a_dict():
    model, _ = learn(CapacityModel(), curve(200.0), [50.0, 100.0, 150.0, 300.0] * 10)
    again = CapacityModel.from_dict(model.to_dict())
    assert again.capacity(PRIOR) == pytest.approx(model.capacity(PRIOR), rel=1e-6)
    assert CapacityModel.from_dict({"w": "x"}) == CapacityModel()
    assert CapacityModel.from_dict({"w": -1}) == CapacityModel()


def test_capacity_through_a_point_on_the_curve_is_exact():
    speed = curve(200.0, SLA, 150.0)
    assert capacity_through(1 / 150.0, 320.0, speed(320.0), SLA) == pytest.approx(200.0)
    assert capacity_through(1 / 150.0, 0.0, 90.0, SLA) is None
    assert capacity_through(1 / 150.0, 10.0, 200.0, SLA) is None  # faster than idle: no slope to read


# ---- the capacity prior


def test_prior_at_the_reference_sla_is_the_reference_users_per_gpu_exactly():
    for gpus in (1, 4, 8, 16):
        assert prior_users_per_replica(gpus, REFERENCE_SLA_TOKENS_PER_S) == USERS_PER_GPU_AT_REFERENCE * gpus


def test_prior_falls_as_the_sla_rises_and_stays_positive_past_the_idle_speed():
    slas = [40.0, 60.0, 80.0, 100.0, 120.0, 127.0, 140.0, 200.0, 400.0]
    priors = [prior_users_per_replica(4, s) for s in slas]
    assert all(a > b > 0 for a, b in zip(priors, priors[1:])), priors


def test_prior_keeps_the_reference_slope_at_every_sla():
    """The per-GPU slope of 1/speed over concurrency is the hardware's, whatever the SLA: the prior line the
    learner starts from (CapacityPrior) has the same slope at every SLA, only the crossing moves."""
    for gpus in (4, 8):
        reference = CapacityPrior(prior_users_per_replica(gpus, 100.0), LOW_LOAD_TOKENS_PER_S, 100.0).slope
        for sla in (50.0, 80.0, 120.0, 150.0, 250.0):
            line = CapacityPrior(prior_users_per_replica(gpus, sla), LOW_LOAD_TOKENS_PER_S, sla)
            assert line.slope == pytest.approx(reference, rel=1e-12), (gpus, sla)
            # and the line meets the SLA at the prior capacity
            assert 1.0 / (line.intercept + line.slope * line.capacity) == pytest.approx(sla, rel=1e-12)


def test_prior_follows_the_speed_curve_not_the_inverse_of_the_sla():
    """At 120 tok/s the line puts 0.42 of the reference users on a replica; 100/SLA would say 0.83, which at
    0.83 x 50 users per GPU is ~42 per GPU, where the p90 speed is ~104 tok/s, well short of 120."""
    ratio = prior_users_per_replica(4, 120.0) / prior_users_per_replica(4, 100.0)
    expected = (1 / 120 - 1 / LOW_LOAD_TOKENS_PER_S) / (1 / 100 - 1 / LOW_LOAD_TOKENS_PER_S)
    assert ratio == pytest.approx(expected) and ratio < 0.5


@pytest.mark.parametrize(
    "kwargs, field",
    [({"gpus_per_replica": 0}, "gpus_per_replica"), ({"sla_tokens_per_s": 0.0}, "sla_tokens_per_s"),
     ({"low_load_tokens_per_s": 90.0}, "low_load_tokens_per_s")],
)  # fmt: skip
def test_prior_refuses_nonsense_naming_the_argument(kwargs, field):
    args = {"gpus_per_replica": 4, "sla_tokens_per_s": 100.0} | kwargs
    with pytest.raises(ValueError, match=field):
        prior_users_per_replica(**args)
