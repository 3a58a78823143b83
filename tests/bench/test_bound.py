"""The start-up-aware bound: its pure sizing rule, and its runs in the simulator."""

from __future__ import annotations

import math
import random

import pytest
from flashserve_testbed.bench.baselines.bound import StartupAwareBound, target
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS
from flashserve_testbed.bench.measures import need_at
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.sim import Settings, Simulation, Workload, run_oracle

DT = 5.0


def _need(seed: int, end: float, calm: float) -> list[tuple[float, int]]:
    """A random step function of replicas: 2 until `calm`, then jumps up and down every few minutes."""
    rng = random.Random(seed)
    steps, t = [(-math.inf, 2)], calm
    while t < end:
        steps.append((t, rng.randint(1, 9)))
        t += rng.uniform(30.0, 600.0)
    return steps


def _schedule(steps, startups, end, lo=1, hi=40):
    """Drive `target` as the simulator does, every DT: returns (held per tick, ready per tick)."""
    ready_at = [0.0] * need_at(steps, 0.0)
    k = 0
    held, ready = [], []
    t = 0.0
    while t < end:
        want = target(t, ready_at, startups[k:], steps, DT, lo, hi)
        while len(ready_at) < want:
            ready_at.append(t + startups[k])
            k += 1
        del ready_at[want:]  # the last groups go first, as the operator removes them
        held.append(len(ready_at))
        ready.append(sum(1 for r in ready_at if r <= t))
        t += DT
    return held, ready


@pytest.mark.parametrize("seed", range(8))
def test_replicas_are_ready_when_needed_and_never_fewer_than_the_need(seed):
    rng = random.Random(100 + seed)
    startups = [rng.uniform(30.0, 900.0) for _ in range(400)] if seed % 2 else [rng.uniform(30.0, 900.0)] * 400
    calm = 900.0 + DT  # no order can be ready before the longest start-up: the need holds until then
    steps = _need(seed, 4 * 3600.0, calm)
    held, ready = _schedule(steps, startups, 4 * 3600.0)
    for i, (h, r) in enumerate(zip(held, ready)):
        assert r >= need_at(steps, i * DT), (i * DT, r, need_at(steps, i * DT))
    # so it holds at least the oracle's GPU time (the integral of the need), and pays for start-ups on top
    oracle = sum(need_at(steps, i * DT) for i in range(len(held)))
    assert sum(held) > oracle


def test_without_start_up_it_is_the_oracle():
    steps = _need(7, 3600.0, 0.0)
    held, ready = _schedule(steps, [0.0] * 1000, 3600.0)
    for i, h in enumerate(held):
        t = i * DT
        best = max([need_at(steps, t)] + [n for s, n in steps if t < s <= t + DT])
        assert h == ready[i] == best, t


def test_it_orders_one_start_up_ahead_and_releases_what_no_start_up_needs():
    steps = [(-math.inf, 1), (1000.0, 3), (2000.0, 1)]
    # a 300-s start-up: the two replicas for t=1000 are ordered within one evaluation of t=700
    assert target(690.0, [0.0], [300.0, 300.0], steps, DT, 1, 10) == 1
    assert target(700.0, [0.0], [300.0, 300.0], steps, DT, 1, 10) == 3
    # the second order takes longer: both are placed when it is due (orders take the start-ups in turn)
    assert target(595.0, [0.0], [300.0, 400.0], steps, DT, 1, 10) == 1
    assert target(600.0, [0.0], [300.0, 400.0], steps, DT, 1, 10) == 3
    # after the crowd: released once nothing within the next start-up needs them
    ready = [0.0, 600.0, 600.0]
    assert target(1500.0, ready, [300.0], steps, DT, 1, 10) == 3
    assert target(1995.0, ready, [300.0], steps, DT, 1, 10) == 3
    assert target(2000.0, ready, [300.0], steps, DT, 1, 10) == 1
    # a dip shorter than a start-up is held through
    dip = [(-math.inf, 3), (1000.0, 2), (1100.0, 3)]
    assert target(1000.0, [0.0, 0.0, 0.0], [300.0], dip, DT, 1, 10) == 3
    assert target(1000.0, [0.0, 0.0, 0.0], [50.0], dip, DT, 1, 10) == 2


def test_bound_in_the_simulator_pays_the_fleets_start_ups(tiny, profile, calib):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    pol = StartupAwareBound(w.oracle_steps, tiny.warmup_s)
    sim = Simulation(w, pol, Settings())
    pol.attach(sim.fleet)
    upcoming = pol.upcoming(3)
    assert upcoming == pol.upcoming(3)  # reading the stream does not consume it
    res = sim.run()
    ordered = [g.startup for g in sim.fleet.all if g.startup > 0]
    assert ordered and ordered[: len(upcoming)] == upcoming[: len(ordered)]  # it knew each order's start-up
    oracle = run_oracle(w, Settings())
    assert res.gpu_hours >= oracle.gpu_hours  # the oracle starts replicas instantly
    # it holds a replica only around when the need does: no more than the oracle plus the start-ups it paid
    assert res.gpu_hours <= oracle.gpu_hours + len(ordered) * (max(ordered) + 60.0) * profile.gpus_per_replica / 3600
    hpa = Simulation(w, build(PolicySpec("hpa"), calib, tiny.startup_median_s, 100.0), Settings()).run()
    # against a policy that does not know the future, on the same start-ups: at least as good on one axis
    assert res.attainment >= hpa.attainment or res.gpu_hours <= hpa.gpu_hours


def test_a_clairvoyant_at_a_lower_utilization_holds_more_for_more_attainment(tiny, profile, calib):
    """`--frontier`: the same arrivals, the oracle's need at 0.5 of the SLA capacity per replica."""
    from flashserve_testbed.bench import runner

    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    seen = w.at_utilization(0.5)
    assert seen.starts is w.starts and w.oracle_at(1.0) == (w.oracle_gpu_hours, w.oracle_steps)
    assert seen.peak_need() > w.peak_need() >= 2 and seen.oracle_gpu_hours > w.oracle_gpu_hours
    assert all(seen.oracle_need(t) >= w.oracle_need(t) for t in range(0, int(tiny.duration_s), 30))
    runner._init(profile, calib)
    task = runner.Task(tiny, 3, PolicySpec("bound", "sweep", 0.5), Settings())
    at_05, at_1 = runner.run_task(task), runner.run_task(runner.Task(tiny, 3, runner.BOUND_SPEC, Settings()))
    assert at_05.policy == "bound@0.5" and (at_05.knob, at_05.knob_value) == ("utilization", 0.5)
    assert at_05.oracle_gpu_hours == at_1.oracle_gpu_hours == w.oracle_gpu_hours  # scored against the same oracle
    assert at_05.gpu_hours > at_1.gpu_hours and at_05.attainment >= at_1.attainment
    oracle_05 = runner.run_task(runner.Task(tiny, 3, PolicySpec("oracle", "sweep", 0.5), Settings()))
    assert oracle_05.policy == "oracle@0.5" and oracle_05.gpu_hours == pytest.approx(seen.oracle_gpu_hours)
