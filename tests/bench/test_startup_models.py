"""The simulator's start-up models (bench/fleet.py STARTUP_MODELS) and the start-ups it shows the policy."""

from __future__ import annotations

import random
import statistics

import pytest
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS, Fleet
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.sim import Settings, Simulation, Workload
from flashserve_testbed.startup_model import COLD, REFERENCE, WARM, WEIGHTS_CACHED

pytestmark = pytest.mark.timeout(120)


def fleet(profile, model, median=420.0, nodes=4, seed=1):
    return Fleet(profile, 100.0, seed, median, engines=False, startup_model=model, nodes=nodes)


def order_and_ready(f, n, now=0.0):
    gs = [f.order(now) for _ in range(n)]
    for g in gs:
        f.make_ready(g, g.ready_at)
    return gs


def test_lognormal_is_the_published_stream(profile):
    # the default model draws the k-th start-up of the run's stream, exactly as the published tables did
    f = fleet(profile, "lognormal")
    got = [f.order(0.0).startup for _ in range(5)]
    rng = random.Random(1 * 31 + 7)
    st = profile.startup
    scale = 420.0 / st.median
    dist = type(st)(420.0, st.sigma, st.minimum * scale, st.maximum * scale)
    assert got == [dist.draw(rng) for _ in range(5)]
    assert {g.cache_state for g in f.all} == {COLD}


def test_cold_is_every_phase_around_the_median(profile):
    f = fleet(profile, "cold", nodes=40)
    gs = order_and_ready(f, 30)
    assert {g.cache_state for g in gs} == {COLD}
    assert statistics.median(g.startup for g in gs) == pytest.approx(420.0, rel=0.15)
    # caches filled by one start-up do not help the next: no cache is configured
    assert {g.cache_state for g in order_and_ready(f, 5)} == {COLD}


def test_cached_node_is_warm_on_the_pool_and_cold_on_a_new_node(profile):
    f = fleet(profile, "cached-node", nodes=3)
    f.order(0.0, ready=True)  # the initial fleet: its start-up left the kernels in the cache
    gs = [f.order(0.0) for _ in range(3)]
    assert [g.cache_state for g in gs] == [WARM, WARM, COLD]  # the third lands beyond the pool
    assert gs[2].node.startswith("x") and len({g.node for g in f.all}) == 4
    warm = REFERENCE.scaled(420.0 / REFERENCE.cold_total())
    assert gs[0].startup < 0.5 * 420.0
    assert gs[0].startup == pytest.approx(warm.pull + warm.load_node + warm.warmup, rel=0.6)


def test_cached_shared_loads_from_the_claim_after_the_first(profile):
    f = fleet(profile, "cached-shared", nodes=6)
    first = f.order(0.0)
    assert first.cache_state == COLD
    f.make_ready(first, first.ready_at)
    later = [f.order(0.0) for _ in range(3)]
    assert {g.cache_state for g in later} == {WARM}
    f2 = fleet(profile, "cached-shared")
    f2.caches.kernel_cache = False
    f2.make_ready(g := f2.order(0.0), g.ready_at)
    assert f2.order(0.0).cache_state == WEIGHTS_CACHED


@pytest.mark.parametrize("model", ["lognormal", "cached-node"])
def test_peeking_does_not_draw(profile, model):
    f = fleet(profile, model, nodes=3)
    f.order(0.0, ready=True)
    ahead = f.peek_startups(3)
    assert ahead == f.peek_startups(3)
    assert [f.order(0.0).startup for _ in range(3)] == ahead


def test_unknown_model_names_the_choices(profile):
    with pytest.raises(ValueError, match="startup_model: 'warmish'.*cached-node"):
        fleet(profile, "warmish")


def test_the_policy_learns_from_the_startups_that_complete(tiny, profile, calib):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    spec = 600.0  # the user's guess; the runs' start-ups are the scenario's 60 s
    on = Simulation(w, build(PolicySpec("flashserve"), calib, spec, 100.0), Settings(startup_model="cold")).run()
    assert on.startup_model == "cold" and on.cached_startups == 0.0
    assert on.learned_startup_s is not None and on.learned_startup_s < 0.5 * spec
    pol = build(PolicySpec("flashserve"), calib, spec, 100.0, learn_startup=False)
    off = Simulation(w, pol, Settings(startup_model="cold", learn_startup=False)).run()
    assert off.learned_startup_s == spec and off.startup_learning == "off"
