"""The start-up learner (autoscaling/startup.py) and the policy's horizons following what it learned."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from flashserve.autoscaling import PolicyConfig, PolicyInputs, PolicyState, ReplicaCounts, decide
from flashserve.autoscaling import reasons as R
from flashserve.autoscaling.startup import (
    RECENT,
    SEEN_KEYS,
    WINDOW,
    StartupLearner,
    StartupSample,
    weighted_median,
)

from .toy import curve, snapshot

SPEC = 900.0
CFG = PolicyConfig(min_replicas=1, max_replicas=10, replica_startup_s=SPEC, evaluation_interval_s=15.0)
SPEED = curve(CFG.prior_capacity)


def samples(values, state="cold", prefix="g"):
    return [StartupSample(f"{prefix}{i}", v, state) for i, v in enumerate(values)]


def test_no_startup_seen_is_the_spec_value():
    assert StartupLearner().predict(SPEC) == SPEC


def test_one_observation_outweighs_the_spec_prior():
    lr = StartupLearner().observe(samples([200.0]))
    assert lr.predict(SPEC) == 200.0


def test_converges_on_noisy_startups():
    rng = random.Random(4)
    lr = StartupLearner().observe(samples([300.0 * rng.lognormvariate(0, 0.2) for _ in range(40)]))
    assert lr.predict(SPEC) == pytest.approx(300.0, rel=0.15)
    assert lr.n == WINDOW  # bounded window


def test_outliers_do_not_move_the_estimate_by_their_size():
    base = [300.0, 310.0, 290.0, 305.0, 295.0]
    lr = StartupLearner().observe(samples(base + [5000.0, 4000.0]))
    assert 290.0 <= lr.predict(SPEC) <= 310.0
    lr = StartupLearner().observe(samples(base + [1.0]))
    assert 290.0 <= lr.predict(SPEC) <= 310.0


def test_keys_already_learned_from_are_ignored():
    lr = StartupLearner().observe(samples([100.0, 120.0]))
    again = lr.observe(samples([100.0, 120.0]))  # the operator repeats status.startup.recent
    assert again is lr
    # a repeated key with another value is still the same start-up
    assert lr.observe([StartupSample("g0", 9000.0, "cold")]) is lr
    many = StartupLearner().observe(samples(range(1, 3 * SEEN_KEYS)))
    assert len(many.seen) == SEEN_KEYS


def test_unusable_samples_are_skipped():
    bad = [StartupSample("a", float("nan"), "cold"), StartupSample("b", -3.0, "warm"),
           StartupSample("c", 0.0, "cold")]  # fmt: skip
    assert StartupLearner().observe(bad).n == 0


def test_two_populations_the_recent_one_predicts():
    cold = samples([1100.0, 1050.0, 1150.0], "cold", "c")
    warm = samples([160.0, 170.0, 150.0], "warm", "w")
    lr = StartupLearner().observe(cold + warm)
    assert lr.estimates(SPEC) == {"cold": 1100.0, "warm": 160.0}
    assert lr.population() == "warm" and lr.predict(SPEC) == 160.0
    # one cold start-up (a node new to the pool) among warm ones does not switch the horizons
    lr = lr.observe([StartupSample("c-new", 1200.0, "cold")])
    assert lr.population() == "warm" and lr.predict(SPEC) == 160.0
    # cold start-ups are the recent majority again (a new image): cold predicts
    lr = lr.observe(samples([1100.0] * RECENT, "cold", "img2-"))
    assert lr.population() == "cold" and lr.predict(SPEC) == pytest.approx(1100.0, rel=0.05)
    # the warm population is kept for when the caches are warm again
    assert lr.estimate("warm", SPEC) == 160.0


def test_a_tie_goes_to_the_newest():
    lr = StartupLearner().observe(samples([1000.0, 1000.0], "cold", "c") + samples([100.0, 100.0], "warm", "w"))
    assert lr.population() == "warm"


def test_unknown_cache_state_counts_as_cold():
    lr = StartupLearner().observe([StartupSample("x", 700.0, "")])
    assert lr.estimates(SPEC) == {"cold": 700.0}


def test_weighted_median():
    assert weighted_median([(1.0, 1.0), (5.0, 1.0), (3.0, 1.0)]) == 3.0
    assert weighted_median([(1.0, 1.0), (3.0, 1.0)]) == 2.0
    assert weighted_median([(900.0, 0.5), (100.0, 1.0)]) == 100.0


def test_persistence_round_trip_through_the_state_annotation():
    lr = StartupLearner().observe(samples([1000.0, 1100.0], "cold", "c") + samples([150.0], "weights-cached", "w"))
    st = replace(PolicyState(), startup=lr)
    back = PolicyState.from_dict(json.loads(json.dumps(st.to_dict())))
    assert back.startup == lr
    assert back.startup.predict(SPEC) == lr.predict(SPEC)
    # nothing learned: nothing written (older annotations stay byte for byte)
    assert "startup" not in PolicyState().to_dict()


@pytest.mark.parametrize("garbage", [None, 3, "x", {"samples": "no"}, {"samples": {"cold": [1, "a", -2, None]},
                                     "recent": ["cold", 7, "hot"], "seen": [1, "k"]}])  # fmt: skip
def test_from_dict_is_tolerant(garbage):
    lr = StartupLearner.from_dict(garbage)
    assert all(v > 0 for _, vals in lr.samples for v in vals)
    assert set(lr.recent) <= {"cold", "weights-cached", "warm"}
    if isinstance(garbage, dict) and garbage.get("seen"):
        assert lr.samples == (("cold", (1.0,)),) and lr.recent == ("cold",) and lr.seen == ("k",)
    state = PolicyState.from_dict({"startup": garbage})
    assert isinstance(state.startup, StartupLearner)


# ------------------------------------------------------------------------------------------ in decide()


def quiet(now, counts, state, cfg=CFG, startups=()):
    snap = snapshot(now, 100.0, counts.ready, SPEED)
    return decide(PolicyInputs(now, snap, counts, cfg, startups=tuple(startups)), state)


def first_release(cfg, startups):
    counts = ReplicaCounts(desired=4, ready=4)
    state, t = PolicyState(), 0.0
    while t < 3 * SPEC:
        d = quiet(t, counts, state, cfg, startups)
        state = d.state
        if d.apply:
            return t, d
        t += cfg.evaluation_interval_s
    raise AssertionError("never released")


def test_the_scale_down_delay_follows_the_learned_startup():
    t_spec, _ = first_release(CFG, ())
    assert t_spec >= SPEC
    t_learned, d = first_release(CFG, samples([120.0, 130.0, 125.0]))
    assert 125.0 <= t_learned < 2 * 125.0 + CFG.settle_s
    assert d.startup_s == 125.0 and d.startup_learned
    assert d.readings["startupSeconds"] == 125.0
    assert d.startup_by_cache_state == {"cold": 125.0}
    # learning off: the spec value, whatever was observed
    t_off, d = first_release(replace(CFG, learn_startup=False), samples([120.0, 130.0, 125.0]))
    assert t_off >= SPEC and d.startup_s == SPEC and not d.startup_learned


def test_an_explicit_delay_is_kept():
    cfg = replace(CFG, scale_down_delay_s=600.0)
    t, _ = first_release(cfg, samples([120.0]))
    assert t >= 600.0


def test_horizons_follow_and_the_state_carries_the_learner():
    counts = ReplicaCounts(desired=2, ready=2)
    d = quiet(0.0, counts, PolicyState(), startups=samples([200.0, 205.0, 210.0]))
    assert d.startup_s == 205.0
    eff = replace(CFG, replica_startup_s=d.startup_s)
    assert (eff.horizon_s, eff.down_delay_s, eff.peak_window_s) == (205.0, 205.0, 820.0)
    # the next evaluation, with no new start-up, remembers it (the operator passes the state back)
    d2 = quiet(15.0, counts, d.state)
    assert d2.startup_s == 205.0 and d2.state.startup is d.state.startup


def test_the_windows_in_start_up_times_scale_with_the_start_up_and_explicit_seconds_win():
    cfg = replace(CFG, replica_startup_s=200.0, peak_window_startups=2.0, trend_horizon_startups=0.5)
    assert (cfg.peak_window_s, cfg.horizon_s) == (400.0, 100.0)
    assert replace(cfg, replica_startup_s=300.0).peak_window_s == 600.0  # follows the learned start-up
    fixed = replace(cfg, peak_memory_s=90.0, trend_horizon_s=0.0)
    assert (fixed.peak_window_s, fixed.horizon_s) == (90.0, 0.0)
    # the lead adds to a horizon in start-up times, not to one given in seconds
    assert replace(cfg, trend_lead_s=60.0).horizon_s == 160.0
    assert replace(fixed, trend_lead_s=60.0).horizon_s == 0.0
