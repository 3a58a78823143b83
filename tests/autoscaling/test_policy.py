"""The policy's required behaviours, each as a decision (or a short closed loop) that would fail without it."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import replace

import pytest
from flashserve.api.v1alpha1 import AutoscalingSpec
from flashserve.autoscaling import (
    MetricsSnapshot,
    PolicyConfig,
    PolicyInputs,
    PolicyState,
    ReplicaCounts,
    decide,
)
from flashserve.autoscaling import policy as P
from flashserve.autoscaling import reasons as R
from flashserve.autoscaling import steps as S
from flashserve.autoscaling.capacity import capacity_through, prior_users_per_replica
from flashserve.autoscaling.peak import PeakMemory
from flashserve.autoscaling.trend import DemandTrend

from .toy import Fleet, curve, snapshot

CAP = PolicyConfig().prior_capacity  # the truth where a test is not about learning
CFG = PolicyConfig(min_replicas=1, max_replicas=10, replica_startup_s=900.0, evaluation_interval_s=15.0)
SPEED = curve(CAP)


def run(now, running, counts, cfg=CFG, state=None, waiting=0.0, speed=SPEED, **extra):
    snap = snapshot(now, running, counts.ready, speed, waiting=waiting, **extra) if counts.ready else None
    return decide(PolicyInputs(now, snap, counts, cfg), state or PolicyState())


# ------------------------------------------------------------------------------------------ scale up


def test_adds_the_whole_shortfall_at_once():
    # 2 ready replicas, demand for 5: one decision goes straight to 5, not +1.
    d = run(0.0, 5 * CAP - 10, ReplicaCounts(desired=2, ready=2))
    assert d.desired == 5 and d.apply
    assert d.reason == R.SLA_BREACH
    assert d.sla_state == R.SLA_BREACHED


def test_starting_replicas_count_as_capacity():
    # 2 ready + 2 starting; demand for 5: add 1 (not 3, not 5 on top).
    d = run(0.0, 5 * CAP - 10, ReplicaCounts(desired=4, ready=2, starting=2))
    assert d.desired == 5
    # demand for 4: the starting replicas cover it, though users are below target meanwhile.
    d = run(0.0, 4 * CAP - 10, ReplicaCounts(desired=4, ready=2, starting=2))
    assert d.desired == 4 and not d.apply
    assert d.reason == R.HOLD_STARTING and d.sla_state == R.SLA_BREACHED


def test_overload_demand_at_sla_counts_the_backlog_at_the_sla_speed():
    # 2 ready replicas, 2.5 x CAP running per replica: users far below target. By default the whole shortfall
    # (5 replicas and the queue: 6) is ordered; with overload_demand_at_sla the running requests count at speed / SLA (Little's
    # law: at the SLA speed the same arrivals keep fewer requests in the engines), the queue as it is.
    counts = ReplicaCounts(desired=2, ready=2)
    running, waiting = 5 * CAP - 10, 30.0
    d = run(0.0, running, counts, waiting=waiting)
    speed = d.readings["speedAtPercentile"]
    assert speed < 0.9 * CFG.sla_tokens_per_s and d.desired == 6
    cfg = replace(CFG, overload_demand_at_sla=True)
    d = run(0.0, running, counts, cfg=cfg, waiting=waiting)
    assert d.readings["demand"] == pytest.approx(running * speed / cfg.sla_tokens_per_s + waiting, rel=1e-3)
    assert d.desired == math.ceil(d.readings["demand"] / d.capacity) < 5 and d.reason == R.SLA_BREACH
    # users at or above target: nothing changes
    d = run(0.0, 1.5 * CAP, counts, cfg=cfg)
    assert d.readings["demand"] == pytest.approx(1.5 * CAP)



def test_deep_overload_is_sized_on_the_learned_capacity():
    # Past capacity 1/speed bends up (queueing, preemption): a line through a deeply overloaded window's point
    # would put the capacity far below where the SLA is crossed and order for a fleet the burst never needs.
    # When the learned line explains the breach (the concurrency is beyond its capacity), the scale-up is
    # sized on the learned capacity.
    state = _trained(capacity=CAP, until=2400.0)
    counts = ReplicaCounts(desired=2, ready=2)
    bent = lambda c: 30.0  # noqa: E731  (far slower than the line says at 2.5 x capacity)
    d = run(2400.0, 5 * CAP, counts, state=state, speed=bent)
    assert d.readings["capacityLocal"] is None and d.capacity == pytest.approx(d.readings["capacitySpeed"], rel=1e-3)
    assert d.desired == math.ceil(d.readings["demand"] / d.capacity - 1e-6) and d.reason == R.SLA_BREACH
    # a line through the window's point would have ordered many more
    a, _ = d.state.capacity.fit(CFG.prior())
    local = capacity_through(a, 2.5 * CAP, 30.0, 100.0)
    assert local < S.LOCAL_OVERRIDE * d.capacity and math.ceil(d.readings["demand"] / local) > d.desired


def test_deep_overload_is_not_learned_from():
    # Past the knee of the curve (far below the SLA at a concurrency beyond the learned capacity), queue or
    # not, a window would pull the learned capacity far down for the next twenty minutes.
    state = _trained(capacity=CAP, until=2400.0)
    counts = ReplicaCounts(desired=2, ready=2)
    bent = lambda c: 30.0  # noqa: E731
    queued = run(2400.0, 5 * CAP, counts, state=state, speed=bent, waiting=20.0)
    assert queued.state.capacity == state.capacity
    unqueued = run(2400.0, 5 * CAP, counts, state=state, speed=bent)
    assert unqueued.state.capacity == state.capacity
    assert unqueued.reason == R.SLA_BREACH  # not learned from, still acted on
    # The same slowness within the learned capacity is learned from: a replica slow at any load still teaches
    # the model that the SLA is out of reach once the fleet has grown.
    within = run(2400.0, CAP, counts, state=state, speed=bent)
    assert within.state.capacity.n == state.capacity.n + 1
    assert within.state.capacity.capacity(CFG.prior()) < state.capacity.capacity(CFG.prior())


def test_overload_on_the_learned_line_is_learned_only_by_a_fleet_that_never_met_the_sla():
    # Beyond capacity the truth bends up only gradually at first: windows still near the line, but past the
    # knee, pull the fitted slope up and the capacity down. A fleet that met the SLA within the learning memory
    # does not learn from them; one that never met it (slow at any load) must, or a first unlucky point
    # could freeze the model below every concurrency it will ever see.
    state = _trained(capacity=CAP, until=2400.0)
    assert state.sla_met_at is not None and 2400.0 - state.sla_met_at <= CFG.capacity_memory_s
    counts = ReplicaCounts(desired=2, ready=2)
    a, b = state.capacity.fit(CFG.prior())
    conc = 2.0 * CAP
    on_line = 1.0 / (a + b * conc) * 0.98  # within 10% of the line, far below the SLA
    assert on_line < S.SEVERE_BREACH * CFG.sla_tokens_per_s
    d = run(2400.0, 2 * conc, counts, state=state, speed=lambda c: on_line)
    assert d.state.capacity == state.capacity
    never = replace(state, sla_met_at=None)
    d = run(2400.0, 2 * conc, counts, state=never, speed=lambda c: on_line)
    assert d.state.capacity.n == state.capacity.n + 1
    # the memory of meeting it fades with the learning memory
    stale = replace(state, sla_met_at=2400.0 - CFG.capacity_memory_s - 15.0)
    d = run(2400.0, 2 * conc, counts, state=stale, speed=lambda c: on_line)
    assert d.state.capacity.n == state.capacity.n + 1


def test_predicted_risk_scales_up_before_a_breach_once_confirmed():
    # Demand has just jumped (the running gauge shows it) but the speed window was taken at the old load:
    # users are still fine, yet 2 replicas cannot serve what is running now. A prediction must hold for two
    # evaluations in a row (one noisy reading must not buy a replica), and is sized on the smaller reading.
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 4 * CAP, counts, running_avg=2 * CAP * 0.8)
    assert d.readings["speedAtPercentile"] > 100
    assert d.desired == 2 and d.reason == R.HOLD_STABILIZING and d.sla_state == R.SLA_AT_RISK_STATE
    d = run(15.0, 3 * CAP, counts, state=d.state, running_avg=2 * CAP * 0.8)
    assert d.desired == 3 and d.reason == R.SLA_AT_RISK
    # demand keeps rising: each new shortfall is confirmed and sized against the new count
    d = run(30.0, 4 * CAP, ReplicaCounts(desired=3, ready=2, starting=1), state=d.state, running_avg=2 * CAP)
    assert d.desired == 3 and d.reason == R.HOLD_STABILIZING
    d = run(45.0, 4.5 * CAP, ReplicaCounts(desired=3, ready=2, starting=1), state=d.state, running_avg=2 * CAP)
    assert d.desired == 4 and d.reason == R.SLA_AT_RISK


def test_a_one_off_spike_is_forgotten():
    counts = ReplicaCounts(desired=3, ready=3)
    d = run(15.0, 2.5 * CAP, counts, running_avg=2.5 * CAP)
    assert d.desired == 3 and d.reason == R.STEADY
    d = run(30.0, 4 * CAP, counts, state=d.state, running_avg=2 * CAP)
    assert d.desired == 3 and d.reason == R.HOLD_STABILIZING
    d = run(45.0, 2 * CAP, counts, state=d.state, running_avg=2 * CAP)
    assert d.desired == 3 and d.reason == R.STEADY
    d = run(60.0, 4 * CAP, counts, state=d.state, running_avg=2 * CAP)
    assert d.desired == 3 and d.reason == R.HOLD_STABILIZING


def test_breach_the_model_does_not_explain_uses_the_observed_point():
    # The true capacity is 100, far below the prior 200: at 190 users/replica users get 76 tok/s. The
    # shortfall is sized from the observed point at once, not +1 per evaluation.
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 380, counts, speed=curve(100.0))
    assert d.desired == 4, d.message
    assert d.reason == R.SLA_BREACH


def _trained(capacity=CAP, until=600.0):
    """State after some time at varied load on the true curve."""
    state, speed, counts = PolicyState(), curve(capacity), ReplicaCounts(desired=3, ready=3)
    for i, t in enumerate(range(0, int(until), 15)):
        state = run(float(t), capacity * (1.0 + 0.5 * (i % 4)), counts, state=state, speed=speed).state
    # open loop: forget what it asked for, so the next test's replica counts are not an outside edit
    return replace(state, last_desired=None, ready=None, ready_changed_at=None)


def test_a_marginal_breach_must_last_before_it_sizes_a_scale_up():
    # 2% below the SLA while the learned curve says 2 replicas have room for 400: confirm, then size the
    # shortfall from the observed point.
    counts = ReplicaCounts(desired=2, ready=2)
    slow = lambda c: 98.0  # noqa: E731
    d = run(1000.0, 400, counts, state=_trained(), speed=slow)
    assert d.desired == 2 and d.reason == R.HOLD_STABILIZING and d.sla_state == R.SLA_BREACHED
    d = run(1000.0 + CFG.breach_confirm_s, 400, counts, state=d.state, speed=slow)
    assert d.desired == 3 and d.reason == R.SLA_BREACH


def test_unreachable_sla_does_not_send_the_fleet_to_max():
    # Users get 80 tok/s at any load (e.g. huge contexts): no replica count meets 100 tok/s.
    # (Open loop, so in Advisory mode: the first readings, before the curve is learned, do ask for more.)
    cfg = replace(CFG, mode=P.ADVISORY)
    counts = ReplicaCounts(desired=2, ready=2)
    state = PolicyState()
    for i, t in enumerate(range(0, 900, 15)):
        d = run(float(t), 100.0 * (1 + i % 3), counts, cfg=cfg, state=state, speed=lambda c: 80.0)
        state = d.state
    assert d.readings["slaReachable"] is False
    assert d.desired == 2 and d.reason == R.HOLD_SLA_UNREACHABLE and d.sla_state == R.SLA_BREACHED


def test_ttft_breach_sizes_the_shortfall_from_admission():
    cfg = PolicyConfig(max_replicas=10, ttft_seconds=2.0)
    # Users decode fast but 300 requests queue (KV blocks or max_num_seqs bind at 230 per replica) and TTFT
    # misses its target: 760 requests at 230 per replica need 4.
    d = run(0.0, 460, ReplicaCounts(desired=2, ready=2), cfg=cfg, waiting=300,
            speed=lambda c: 120.0, ttft_at_percentile_s=5.0)  # fmt: skip
    assert d.desired == 4 and d.reason == R.TTFT_BREACH
    # a queue with TTFT within target is not a breach
    d = run(0.0, 460, ReplicaCounts(desired=2, ready=2), cfg=cfg, waiting=300,
            speed=lambda c: 120.0, ttft_at_percentile_s=1.0)  # fmt: skip
    assert d.reason != R.TTFT_BREACH


def test_scale_up_stabilization():
    cfg = PolicyConfig(max_replicas=10, scale_up_stabilization_s=60.0)
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 4 * CAP, counts, cfg=cfg)
    assert d.desired == 2 and d.reason == R.HOLD_STABILIZING
    d = run(45.0, 4 * CAP, counts, cfg=cfg, state=d.state)
    assert d.desired == 2
    d = run(60.0, 4 * CAP, counts, cfg=cfg, state=d.state)
    assert d.desired == 4


def test_kv_cache_limit_lowers_capacity():
    # 150 users/replica already fill 90% of the KV cache: memory caps a replica at 150, not 200.
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 300, counts, waiting=150, kv_usage_avg=0.9, kv_usage_max=0.95)
    assert d.readings["capacityKV"] == pytest.approx(150)
    d = run(15.0, 300, counts, state=d.state, waiting=150, kv_usage_avg=0.9, kv_usage_max=0.95)
    assert d.desired == 3


# ---------------------------------------------------------------------------------------- scale down


def _quiet(state, now, counts, running=100.0, cfg=CFG):
    return run(now, running, counts, cfg=cfg, state=state)


def test_scale_down_waits_for_the_delay_then_steps_one_at_a_time():
    cfg = CFG
    counts = ReplicaCounts(desired=4, ready=4)
    state, t, history = PolicyState(), 0.0, []
    while t <= cfg.down_delay_s + 20 * cfg.settle_s:
        d = _quiet(state, t, counts)
        state = d.state
        if d.apply:
            history.append((t, d.current, d.desired))
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    assert history[0][0] >= cfg.down_delay_s  # not before the surplus lasted the delay (= start-up time)
    assert all(frm - to == 1 for _, frm, to in history)  # one group per step
    assert [to for _, _, to in history] == [3, 2, 1]
    gaps = [b[0] - a[0] for a, b in zip(history, history[1:])]
    assert all(g >= cfg.settle_s for g in gaps)
    assert counts.desired == 1  # min


def _releases(cfg, counts):
    state, t, out = PolicyState(), 0.0, []
    while t <= cfg.down_delay_s + 20 * cfg.settle_s:
        d = _quiet(state, t, counts, cfg=cfg)
        state = d.state
        if d.apply:
            out.append(d.desired)
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    return out


def test_release_share_takes_a_share_of_the_surplus_per_step():
    # 8 replicas, demand for 1: by default one group per settle time; with release_share each step takes that
    # share of what is left above the need (at least one group), so the fleet comes down geometrically.
    counts = ReplicaCounts(desired=8, ready=8)
    assert _releases(CFG, counts) == [7, 6, 5, 4, 3, 2, 1]
    assert _releases(replace(CFG, release_share=0.5), counts) == [4, 2, 1]
    assert _releases(replace(CFG, release_share=1.0), counts) == [1]
    # an explicit scaleDown.step is what the user asked for: the share does not apply
    assert _releases(replace(CFG, release_share=0.5, scale_down_step=2), counts) == [6, 4, 2, 1]


def _release_path(cfg, load_at, counts, until_s):
    state, t, out = PolicyState(), 0.0, []
    while t <= until_s:
        d = _quiet(state, t, counts, running=load_at(t), cfg=cfg)
        state = d.state
        if d.apply:
            out.append((t, d.desired))
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    return out


def test_release_on_fall_follows_a_fast_decline_and_not_an_expired_peak():
    assert CFG.release_on_fall  # the default
    cfg = replace(CFG, peak_memory_s=0.0, scale_down_delay_s=60.0, release_on_fall=False)
    counts = ReplicaCounts(desired=10, ready=10)

    # demand for 8 replicas' worth falls to 1 over 5 minutes (about two replicas' worth per settle time)
    def falling(t):
        return CAP * max(1.0, 8.0 - 7.0 * max(0.0, t - 300.0) / 300.0)

    slow = _release_path(cfg, falling, counts, 1200.0)
    fast = _release_path(replace(cfg, release_on_fall=True), falling, counts, 1200.0)
    # one group per settle time lags the decline by minutes; following it, the fleet is at what demand needs
    # (2 at the release line) a settle time after the decline ends, where one at a time is still at 7
    assert [n for _, n in slow] == [9, 8, 7, 6, 5, 4, 3, 2]
    assert fast[-1] == (585.0, 2) and [n for t, n in slow if t <= 585.0][-1] == 7
    # never below what demand needs: the release is bounded by the need, as before
    assert all(n >= math.ceil(falling(t) / (CAP * cfg.scale_down_utilization) - 1e-9) for t, n in fast)

    # flat demand (the surplus is not a decline): one group per settle time, as without the knob
    flat = ReplicaCounts(desired=8, ready=8)
    assert _releases(replace(cfg, release_on_fall=True), flat) == _releases(cfg, flat) == [7, 6, 5, 4, 3, 2, 1]


def test_policy_config_refuses_knobs_out_of_range_by_name():
    with pytest.raises(ValueError, match=r"scale_up_utilization=0\.0: give a number > 0"):
        PolicyConfig(scale_up_utilization=0.0)
    with pytest.raises(ValueError, match=r"peak_window_startups=-3\.0: give a number >= 0"):
        PolicyConfig(peak_window_startups=-3.0)
    with pytest.raises(ValueError, match=r"kv_usage_limit=nan"):
        PolicyConfig(kv_usage_limit=float("nan"))
    with pytest.raises(ValueError, match="scale_down_utilization=0.95 is above scale_up_utilization=0.9"):
        PolicyConfig(scale_up_utilization=0.9, scale_down_utilization=0.95)
    assert PolicyConfig(release_share=None, peak_window_startups=0.0).peak_window_startups == 0.0


def test_scale_down_step_and_explicit_delay():
    cfg = PolicyConfig(max_replicas=10, scale_down_delay_s=120.0, scale_down_step=2, replica_startup_s=900)
    counts = ReplicaCounts(desired=6, ready=6)
    d = _quiet(PolicyState(), 0.0, counts, running=10.0, cfg=cfg)
    assert d.reason == R.HOLD_SURPLUS and d.desired == 6
    d = _quiet(d.state, 119.0, counts, running=10.0, cfg=cfg)
    assert d.desired == 6
    d = _quiet(d.state, 120.0, counts, running=10.0, cfg=cfg)
    assert d.desired == 4 and d.reason == R.SURPLUS_RELEASED


def test_release_keeps_what_the_recent_peak_needed():
    # A burst needing 5 replicas, then 4 minutes later back to 1.5 replicas' worth. A burst shorter than a
    # start-up is only served by replicas that are there when it starts, so the fleet keeps what the peak
    # needed for peak_window_s (4 x start-up), then releases as before.
    cfg = replace(CFG, replica_startup_s=300.0)
    counts = ReplicaCounts(desired=5, ready=5)
    state, t, history = PolicyState(), 0.0, []
    while t < 3600.0:
        d = run(t, 4.5 * CAP if t < 240.0 else 1.5 * CAP, counts, cfg=cfg, state=state)
        state = d.state
        if d.apply:
            history.append((t, d.desired))
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    assert cfg.peak_window_s == 1200.0
    # the peak's bucket (0-150 s) leaves the window at 1350 s; one delay later the first release
    assert history and history[0][0] >= 1200.0 + cfg.down_delay_s - cfg.peak_window_s / 8
    assert history[-1][1] == 2  # down to what 1.5 replicas' worth needs (hysteresis: 2)
    # without the memory the first release comes one delay after the burst
    state, counts, first = PolicyState(), ReplicaCounts(desired=5, ready=5), None
    off = replace(cfg, peak_memory_s=0.0)
    for t in range(0, 1200, 15):
        d = run(float(t), 4.5 * CAP if t < 240 else 1.5 * CAP, counts, cfg=off, state=state)
        state = d.state
        if d.apply and first is None:
            first = t
    assert first is not None and first <= 240 + off.down_delay_s + 2 * off.evaluation_interval_s


def _first_release_after(cfg, load, after: float, until: float = 4800.0):
    """The time of the first release at or after `after` s, the fleet following each decision at once."""
    counts, state, t = ReplicaCounts(desired=5, ready=5), PolicyState(), 0.0
    while t < until:
        d = run(t, load(t), counts, cfg=cfg, state=state)
        state = d.state
        if d.apply:
            if d.desired < d.current and t >= after:
                return t
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    return None


def test_peak_needs_rise_lets_a_crowd_that_outlasted_the_window_go_after_one_start_up():
    # 5-minute start-ups, so a 20-minute peak memory. A crowd of 4.5 replicas' worth for 30 minutes, then 1.5:
    # the window after the drop holds no rise, only the crowd's level and its end.
    cfg = replace(CFG, replica_startup_s=300.0)
    crowd = lambda t: 4.5 * CAP if t < 1800.0 else 1.5 * CAP  # noqa: E731
    held = _first_release_after(cfg, crowd, 1800.0)
    assert held is not None and held >= 1800.0 + cfg.peak_window_s - cfg.peak_window_s / 8
    early = _first_release_after(replace(cfg, peak_needs_rise=True), crowd, 1800.0)
    slack = 2 * cfg.evaluation_interval_s
    assert early is not None and early <= 1800.0 + cfg.replica_startup_s + cfg.down_delay_s + slack
    # a burst that began inside the window is a rise: held for the whole window, as without the knob
    burst = lambda t: 4.5 * CAP if 600.0 <= t < 840.0 else 1.5 * CAP  # noqa: E731
    kept = _first_release_after(replace(cfg, peak_needs_rise=True), burst, 840.0)
    assert kept is not None and kept >= 600.0 + cfg.peak_window_s - cfg.peak_window_s / 8


def test_peak_full_startups_tapers_the_hold_after_one_start_up():
    # The crowd of the test above: held in full, the first release comes at the window's end; tapered after
    # one start-up, the remembered high counts less each minute after that and a first replica goes well before.
    cfg = replace(CFG, replica_startup_s=300.0)
    crowd = lambda t: 4.5 * CAP if t < 1800.0 else 1.5 * CAP  # noqa: E731
    held = _first_release_after(cfg, crowd, 1800.0)
    tapered = _first_release_after(replace(cfg, peak_full_startups=1.0), crowd, 1800.0)
    assert held is not None and tapered is not None
    assert 1800.0 + cfg.replica_startup_s <= tapered < held - cfg.replica_startup_s


def test_peak_skip_fall_keeps_a_steep_fall_out_of_the_peak_memory():
    # A demand trend falling 2 requests a second (a backlog draining at the SLA speed) meets a reading of 600
    # requests: over a 5-minute start-up the trend projects a fall of 600, all of it, so with the knob the
    # reading is not remembered, and the memory keeps the level it had; a slow fall is remembered as before.
    cfg = replace(CFG, replica_startup_s=300.0)
    load = S.Load(running=600.0, waiting=0.0, sessions=0.0, demand=600.0, concurrency=100.0, concurrency_now=100.0,
                  speed=cfg.sla_tokens_per_s, kv_usage=None, ttft_s=None, window_clean=True)  # fmt: skip
    before = PeakMemory().update(0.0, 200.0, cfg.peak_window_s)

    def remembered(c, trend_per_s):
        state = PolicyState(peaks=before, demand=DemandTrend(level=640.0, trend=trend_per_s, noise=50.0, t=45.0))
        return S.plan_demand(c, 60.0, load, CAP, state).recent_peak

    assert remembered(cfg, -2.0) == 600.0
    assert remembered(replace(cfg, peak_skip_fall=0.5), -2.0) == 200.0
    assert remembered(replace(cfg, peak_skip_fall=0.5), -0.5) == 600.0  # a fall of 150 in a start-up: kept


def _bursty(cfg, until=6000.0, period=1200.0):
    """Bursts of 4.5 replicas' worth for 3 minutes every `period` s over 1.5 replicas' worth; the fleet
    follows the decisions at once. Returns the releases (time, replicas), the last decision and the
    longest peak memory a decision reported."""
    counts, state, t, releases, d, memory = ReplicaCounts(desired=5, ready=5), PolicyState(), 0.0, [], None, 0.0
    while t < until:
        d = run(t, 4.5 * CAP if t % period < 180.0 else 1.5 * CAP, counts, cfg=cfg, state=state)
        state = d.state
        memory = max(memory, d.readings.get("peakMemorySeconds") or 0.0)
        if d.apply:
            if d.desired < d.current:
                releases.append((t, d.desired))
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
        t += cfg.evaluation_interval_s
    return releases, d, memory


def test_peak_memory_outlasts_bursts_that_keep_coming_back():
    # A 2-minute start-up: four of them (8 min) end before the next burst, 20 minutes on. Without the
    # recurrence the fleet is released between every two bursts; with it, once two bursts have shown the
    # gap, it is held across the gaps that follow.
    base = replace(CFG, replica_startup_s=120.0, peak_window_startups=4.0)
    releases, _, memory = _bursty(base)
    between = lambda rs, after: [r for r in rs if r[0] > after and (r[0] % 1200.0) > 180.0]  # noqa: E731
    assert len(between(releases, 2400.0)) >= 2 and memory == 480.0
    on = replace(base, peak_recurrence_s=3600.0)
    releases, d, memory = _bursty(on)
    assert between(releases, 2400.0) == []
    gap = 1200.0 - 165.0  # the last reading of a burst is 165 s into it
    assert d.state.recurrence.gap(5985.0, 3600.0) == pytest.approx(gap, abs=15.0)
    # the memory used, in the readings: the margin over the gap (give or take a reading), not the horizon
    assert P.RECURRENCE_MARGIN * (gap - 15.0) <= memory <= P.RECURRENCE_MARGIN * (gap + 15.0)
    # the state survives a restart (the annotation) with the gap in it
    again = PolicyState.from_dict(copy.deepcopy(d.state.to_dict()))
    assert again.recurrence == d.state.recurrence


def test_the_recurrence_never_lengthens_an_explicit_peak_window_and_is_capped():
    cfg = replace(CFG, replica_startup_s=120.0, peak_recurrence_s=900.0)
    assert cfg.peak_window_for(0.0) == cfg.peak_window_s == 480.0
    assert cfg.peak_window_for(600.0) == P.RECURRENCE_MARGIN * 600.0
    assert cfg.peak_window_for(5000.0) == 900.0  # at most peak_recurrence_s
    assert replace(cfg, peak_memory_s=60.0).peak_window_for(600.0) == 60.0
    assert replace(cfg, peak_recurrence_s=None).peak_window_for(600.0) == 480.0


def _crowd_then_recovery(cfg):
    """2 replicas meet a crowd: 4 x CAP running and 5 x CAP queued (a stock that slow service swells) order
    far more than the 3.5 x CAP users need once served at the SLA. Returns the scale-up and every release."""
    state = _trained(capacity=CAP, until=600.0)
    counts, t, ups, downs = ReplicaCounts(desired=2, ready=2), 600.0, [], []
    while t < 600.0 + 3 * cfg.replica_startup_s:
        ready = counts.desired if t >= 600.0 + cfg.replica_startup_s else 2
        overload = ready == 2
        d = run(t, 4 * CAP if overload else 3.5 * CAP, replace(counts, ready=ready, starting=counts.desired - ready),
                cfg=cfg, state=state, waiting=5 * CAP if overload else 0.0)
        state = d.state
        if d.apply:
            (ups if d.desired > d.current else downs).append((t, d.current, d.desired, d.readings))
            counts = ReplicaCounts(desired=d.desired, ready=min(ready, d.desired))
        t += cfg.evaluation_interval_s
    return ups, downs


def test_the_first_release_after_a_scale_up_takes_the_whole_surplus():
    ups, downs = _crowd_then_recovery(CFG)
    ordered = ups[-1][2]
    assert ordered >= 9  # sized on running + waiting
    # After the delay, the replicas the users never needed go in one step, down to what demand and the recent
    # peak (the crowd, counted at the SLA speed) need; nothing more is released while that peak is remembered.
    t, frm, to, readings = downs[0]
    assert frm == ordered and to == readings["requiredForRelease"] == math.ceil(3.5 * CAP / (0.8 * CAP))
    assert t >= 600.0 + CFG.replica_startup_s + CFG.down_delay_s
    assert len(downs) == 1
    # with scaleDown.step set, one group per settle time, as the user asked
    ups1, downs1 = _crowd_then_recovery(replace(CFG, scale_down_step=1))
    assert ups1[-1][2] == ordered
    assert [(frm, to) for _, frm, to, _ in downs1[:3]] == [(ordered, ordered - 1), (ordered - 1, ordered - 2),
                                                           (ordered - 2, ordered - 3)]  # fmt: skip
    assert downs1[0][0] == t


def test_surplus_timer_restarts_when_the_surplus_goes_away():
    cfg = replace(CFG, peak_memory_s=0.0)  # the load coming back would otherwise hold the fleet (test above)
    counts = ReplicaCounts(desired=4, ready=4)
    d = _quiet(PolicyState(), 0.0, counts, cfg=cfg)
    d = _quiet(d.state, 800.0, counts, cfg=cfg)
    d = run(815.0, 3.5 * CAP, counts, state=d.state, cfg=cfg)  # load back: no surplus
    assert d.desired == 4
    d = _quiet(d.state, 830.0, counts, cfg=cfg)
    d = _quiet(d.state, 1000.0, counts, cfg=cfg)
    assert d.desired == 4  # 170 s of surplus, not 1000
    d = _quiet(d.state, 830.0 + CFG.down_delay_s, counts, cfg=cfg)
    assert d.desired == 3


def test_never_below_min():
    cfg = PolicyConfig(min_replicas=3, max_replicas=10, scale_down_delay_s=0)
    counts = ReplicaCounts(desired=4, ready=4)
    state = PolicyState()
    for t in range(0, 3600, 15):
        d = run(float(t), 0.0, counts, cfg=cfg, state=state)
        state = d.state
        if d.apply:
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
    assert counts.desired == 3
    assert d.condition(R.SCALING_LIMITED).reason == R.AT_MIN


def test_never_below_demand_and_hysteresis():
    # 2.35 replicas' worth of users: 3 replicas run at 78%, 2 would run at 117%. It steps 5 -> 4 -> 3 and stops.
    cfg = PolicyConfig(max_replicas=10, scale_down_delay_s=60)
    counts = ReplicaCounts(desired=5, ready=5)
    state = PolicyState()
    for t in range(0, 7200, 15):
        d = run(float(t), 2.35 * CAP, counts, cfg=cfg, state=state)
        state = d.state
        if d.apply:
            counts = ReplicaCounts(desired=d.desired, ready=d.desired)
    assert counts.desired == 3
    # 2.6 replicas' worth: 3 at 87% are within the band: no release to 2 (which would run at 130%), no add.
    d = run(7200.0, 2.6 * CAP, counts, cfg=cfg, state=state)
    assert d.desired == 3 and d.reason == R.STEADY


def test_below_min_is_raised_even_without_metrics():
    cfg = PolicyConfig(min_replicas=2, max_replicas=4)
    d = decide(PolicyInputs(0.0, None, ReplicaCounts(desired=1, ready=1), cfg), PolicyState())
    assert d.desired == 2 and d.reason == R.BELOW_MIN and d.apply


def test_above_max_is_lowered():
    cfg = PolicyConfig(min_replicas=1, max_replicas=3)
    d = run(0.0, 100.0, ReplicaCounts(desired=5, ready=5), cfg=cfg)
    assert d.desired == 3 and d.reason == R.ABOVE_MAX


# -------------------------------------------------------------------------------- missing metrics


def test_missing_metrics_hold_and_never_scale_down_blind():
    counts = ReplicaCounts(desired=4, ready=4)
    d = _quiet(PolicyState(), 0.0, counts)
    almost = CFG.down_delay_s - 15.0
    d = _quiet(d.state, almost, counts)
    assert d.desired == 4
    d = decide(PolicyInputs(CFG.down_delay_s, None, counts, CFG, "connection refused"), d.state)
    assert d.desired == 4 and not d.apply
    assert d.reason == R.HOLD_MISSING_METRICS
    cond = d.condition(R.METRICS_AVAILABLE)
    assert (cond.status, cond.reason) == ("False", R.METRICS_MISSING)
    assert "connection refused" in cond.message
    assert d.sla_state == R.SLA_UNKNOWN
    # Fresh metrics again: the surplus clock starts over, no release on the first reading after the gap.
    d = _quiet(d.state, CFG.down_delay_s + 15.0, counts)
    assert d.desired == 4 and d.reason == R.HOLD_SURPLUS
    assert d.condition(R.METRICS_AVAILABLE).status == "True"


def test_missing_metrics_do_not_scale_up_either():
    counts = ReplicaCounts(desired=2, ready=2)
    d = decide(PolicyInputs(0.0, None, counts, CFG), PolicyState())
    assert d.desired == 2 and d.reason == R.HOLD_MISSING_METRICS


def test_stale_metrics_hold():
    counts = ReplicaCounts(desired=4, ready=4)
    old = MetricsSnapshot(time=0.0, sample_age_s=400.0, window_s=60, percentile=90, running=0.0, waiting=0.0)
    state = PolicyState(surplus_since=-10_000.0, ready=4, ready_changed_at=-10_000.0, last_desired=4)
    d = decide(PolicyInputs(0.0, old, counts, CFG), state)
    assert d.desired == 4 and d.reason == R.HOLD_STALE_METRICS
    assert d.condition(R.METRICS_AVAILABLE).reason == R.METRICS_STALE
    # A snapshot fetched long ago is stale too, however fresh it was then.
    fetched = MetricsSnapshot(time=0.0, sample_age_s=5.0, window_s=60, percentile=90, running=0.0, waiting=0.0)
    d = decide(PolicyInputs(600.0, fetched, counts, CFG), state)
    assert d.reason == R.HOLD_STALE_METRICS


def test_no_ready_replica_holds():
    counts = ReplicaCounts(desired=3, ready=0, starting=3)
    snap = MetricsSnapshot(time=0.0, sample_age_s=5.0, window_s=60, percentile=90, running=0.0, waiting=0.0)
    state = PolicyState(surplus_since=-10_000.0)
    d = decide(PolicyInputs(0.0, snap, counts, CFG), state)
    assert d.desired == 3 and d.reason == R.HOLD_NO_READY


# ----------------------------------------------------------------------------------------- limits


def test_pending_pods_limit_and_no_further_adds():
    counts = ReplicaCounts(desired=4, ready=3, pending=1)
    d = run(0.0, 8 * CAP, counts)
    assert d.desired == 4 and not d.apply
    assert d.reason == R.HOLD_PENDING
    cond = d.condition(R.SCALING_LIMITED)
    assert (cond.status, cond.reason) == ("True", R.PENDING_PODS)
    # still holding an evaluation later
    d = run(15.0, 8 * CAP, counts, state=d.state)
    assert d.desired == 4


def test_at_max():
    cfg = PolicyConfig(max_replicas=4)
    d = run(0.0, 10 * CAP, ReplicaCounts(desired=4, ready=4), cfg=cfg)
    assert d.desired == 4 and d.reason == R.AT_MAX
    cond = d.condition(R.SCALING_LIMITED)
    assert (cond.status, cond.reason) == ("True", R.AT_MAX)
    # from below: goes to max in one step, and says it was capped
    d = run(0.0, 10 * CAP, ReplicaCounts(desired=2, ready=2), cfg=cfg)
    assert d.desired == 4 and d.reason == R.SLA_BREACH
    assert d.condition(R.SCALING_LIMITED).reason == R.AT_MAX


def test_within_limits():
    d = run(0.0, 2.5 * CAP, ReplicaCounts(desired=3, ready=3))
    assert d.condition(R.SCALING_LIMITED).status == "False"


# --------------------------------------------------------------------------------- mode, ownership


def test_advisory_computes_but_does_not_apply():
    cfg = PolicyConfig(max_replicas=10, mode=P.ADVISORY)
    d = run(0.0, 5 * CAP - 10, ReplicaCounts(desired=2, ready=2), cfg=cfg)
    assert d.desired == 5 and not d.apply
    assert d.reason == R.SLA_BREACH
    assert d.state.last_desired is None  # a human may set spec.replicas in advisory mode


def test_outside_change_is_overwritten_in_active_mode():
    counts = ReplicaCounts(desired=3, ready=3)
    d = run(0.0, 2.5 * CAP, counts)
    assert d.desired == 3 and d.state.last_desired == 3
    # someone runs `kubectl scale --replicas=6`
    d = run(15.0, 2.5 * CAP, ReplicaCounts(desired=6, ready=3, starting=3), state=d.state)
    assert d.desired == 3 and d.apply and d.overrode_outside_change
    assert "outside the autoscaler" in d.message


def test_from_spec_resolves_the_delay():
    spec = AutoscalingSpec(minReplicas=2, maxReplicas=8, replicaStartupSeconds=600, mode="Advisory")
    cfg = PolicyConfig.from_spec(spec, prior_capacity=512.0)
    assert (cfg.min_replicas, cfg.max_replicas, cfg.mode, cfg.prior_capacity) == (2, 8, "Advisory", 512.0)
    assert cfg.down_delay_s == 600
    spec = AutoscalingSpec(scaleDown={"delaySeconds": 30})
    assert PolicyConfig.from_spec(spec).down_delay_s == 30


def test_state_round_trips_through_a_small_dict():
    counts = ReplicaCounts(desired=2, ready=2)
    state = PolicyState()
    for t in range(0, 600, 15):
        d = run(float(t), 5 * CAP, counts, state=state)
        state = d.state
    data = state.to_dict()
    assert len(repr(data)) < 600
    import json

    again = PolicyState.from_dict(json.loads(json.dumps(data)))
    assert again == PolicyState.from_dict(data)
    assert again.capacity.capacity(CFG.prior()) == pytest.approx(state.capacity.capacity(CFG.prior()), rel=1e-6)
    assert again.last_desired == state.last_desired and again.breach_since == state.breach_since
    met = run(600.0, CAP, counts, state=state).state
    assert met.sla_met_at == 600.0 and PolicyState.from_dict(json.loads(json.dumps(met.to_dict()))).sla_met_at == 600.0


@pytest.mark.parametrize("junk", [None, "x", {"capacity": "?", "lastDesired": "many", "surplusSince": "nan"}])
def test_state_from_junk_is_the_default(junk):
    s = PolicyState.from_dict(junk)
    assert s.last_desired is None and s.surplus_since is None and s.capacity.n == 0


# ------------------------------------------------------------------------------------ closed loop


@pytest.mark.parametrize("capacity, users, seed", [(160.0, 400.0, 1), (250.0, 1100.0, 2), (120.0, 200.0, 3)])
def test_no_flapping_under_steady_noisy_load_for_an_hour(capacity, users, seed):
    # The true capacity differs from the prior (200), so the policy has to learn it; users +- 8% every
    # evaluation, per-user speed +- 3%. At most one change of direction in the hour (the first scale-up
    # and nothing after is typical), and the fleet ends where the demand's noise peaks need it.
    cfg = PolicyConfig(max_replicas=20, replica_startup_s=300.0)
    fleet = Fleet.steady(cfg, capacity=capacity, replicas=2)
    rng = random.Random(seed)
    fleet.run(0.0, 3600.0, lambda t: users * (1 + 0.08 * rng.gauss(0, 1)), seed=seed, noise=0.03)
    assert fleet.direction_changes() <= 1, fleet.changes()
    assert len(fleet.changes()) <= 4, fleet.changes()
    assert math.ceil(users / capacity) <= len(fleet.ready_at) <= math.ceil(1.25 * users / capacity)
    assert fleet.attainment(start=1800.0) >= 0.95


def test_closed_loop_step_up_then_down():
    cfg = PolicyConfig(max_replicas=10, replica_startup_s=300.0, scale_down_delay_s=300.0)
    fleet = Fleet.steady(cfg, capacity=160.0, replicas=2)

    def demand(t):
        return 240.0 if t < 1200 or t >= 3000 else 900.0

    fleet.run(0.0, 5400.0, demand, seed=2)
    changes = fleet.changes()
    ups = [c for c in changes if c[2] > c[1]]
    downs = [c for c in changes if c[2] < c[1]]
    # The step is seen at the first evaluation after it (no metric lag in the toy) and answered at once,
    # with the whole shortfall.
    assert ups[0][0] <= 1200 + 2 * cfg.evaluation_interval_s
    assert ups[0][2] >= math.ceil(900 / 160) - 1
    assert max(to for _, _, to in ups) in (math.ceil(900 / 160), math.ceil(900 / 160) + 1)
    # The SLA recovers once the new replicas are ready (start-up 300 s).
    assert fleet.attainment(1200.0, 1500.0) < 0.1
    assert fleet.attainment(1500.0, 3000.0) == 1.0
    # Down: only after the delay (and the peak memory), back to what 240 users need. The first release after
    # a scale-up takes the whole surplus in one step.
    assert downs and downs[0][0] >= 3000 + cfg.down_delay_s
    assert [(frm, to) for _, frm, to in downs] == [(6, 2)]
    assert len(fleet.ready_at) == 2
    assert fleet.direction_changes() == 1
    assert fleet.attainment(3000.0, 5400.0) == 1.0
    # An explicit scaleDown.step is honoured as is: one group per settle time.
    stepwise = Fleet.steady(replace(cfg, scale_down_step=1), capacity=160.0, replicas=2)
    stepwise.run(0.0, 5400.0, demand, seed=2)
    downs1 = [c for c in stepwise.changes() if c[2] < c[1]]
    assert [(frm, to) for _, frm, to in downs1] == [(6, 5), (5, 4), (4, 3), (3, 2)]
    assert downs1[0][0] == downs[0][0]
    assert all(b[0] - a[0] >= cfg.settle_s for a, b in zip(downs1, downs1[1:]))


def test_recurring_bursts_shorter_than_a_start_up_are_served_from_the_peak_memory():
    # 240 users, and every 15 minutes a 2-minute burst to 700; replicas take 5 minutes to start. Replicas
    # ordered for a burst arrive after it. Released after each burst, the fleet meets every burst short;
    # kept for the peak window (4 x start-up = 20 minutes > the 15 between bursts), it serves them from the
    # third on. (The first is seen in deep overload, where the memory counts running requests at the SLA
    # speed; this toy's users do not thin out when served faster, so that undercounts it and the second burst
    # still finds one replica short. Served, the second is remembered as it is.)
    def demand(t):
        return 700.0 if t % 900.0 < 120.0 else 240.0

    def fleet(peak_memory_s):
        cfg = PolicyConfig(max_replicas=10, replica_startup_s=300.0, peak_memory_s=peak_memory_s)
        f = Fleet.steady(cfg, capacity=160.0, replicas=2)
        f.run(0.0, 7200.0, demand, seed=4)
        bursts = [(t, ok) for t, ok in f.attained if t >= 1800.0 and t % 900.0 < 120.0]
        return sum(ok for _, ok in bursts) / len(bursts), len(f.ready_at), f

    served_off, _, off = fleet(0.0)
    served_on, held, on = fleet(None)
    assert served_off < 0.5  # released between bursts: later bursts meet a fleet sized for 240
    assert served_on > 0.9  # kept: later bursts are served
    assert held == math.ceil(700.0 / 160.0)  # what the burst needs, kept; no more ordered for it
    assert on.direction_changes() <= 2  # no order-release cycle per burst
    assert off.direction_changes() >= 6


def test_from_spec_sizes_the_prior_for_the_replica_and_the_sla():
    for gpus, sla in ((4, 100.0), (8, 100.0), (4, 150.0), (8, 60.0)):
        spec = AutoscalingSpec(sla={"perUserTokensPerSecond": sla}, metricsWindowSeconds=120)
        cfg = PolicyConfig.from_spec(spec, gpus_per_replica=gpus)
        assert cfg.prior_capacity == prior_users_per_replica(gpus, sla)
        assert cfg.metrics_window_s == 120.0
    # initialCapacity is the user's own prior; an explicit override beats both
    spec = AutoscalingSpec(initialCapacity=77.0, sla={"perUserTokensPerSecond": 150.0})
    assert PolicyConfig.from_spec(spec, gpus_per_replica=8).prior_capacity == 77.0
    assert PolicyConfig.from_spec(spec, gpus_per_replica=8, prior_capacity=5.0).prior_capacity == 5.0
    # the prior line follows an overridden idle speed
    cfg = PolicyConfig.from_spec(AutoscalingSpec(), gpus_per_replica=4, prior_low_load_tokens_per_s=200.0)
    assert cfg.prior_capacity == prior_users_per_replica(4, 100.0, 200.0)


def test_decide_changes_neither_its_inputs_nor_its_state_and_repeats_itself():
    """Over a seeded run through every branch (breaches, TTFT, KV, surplus, releases, blind, pending): the
    inputs and the state passed in compare equal to copies taken before the call, and the same call again
    gives the same decision."""
    rng = random.Random(17)
    cfg = PolicyConfig(max_replicas=8, ttft_seconds=2.0, replica_startup_s=120.0, scale_down_delay_s=60.0,
                       peak_memory_s=240.0)  # fmt: skip
    state, desired, reasons = PolicyState(), 2, set()
    for i in range(400):
        now = 15.0 * i
        ready = max(0, desired - rng.choice([0, 0, 0, 1]))
        counts = ReplicaCounts(desired=desired, ready=ready, starting=desired - ready, pending=rng.random() < 0.05)
        users = CAP * (4.0 if (i // 80) % 2 == 0 else 0.5) * rng.choice([0.8, 1.0, 1.2, 2.0])
        snap = None if rng.random() < 0.05 or not ready else snapshot(
            now, users, ready, SPEED, waiting=rng.choice([0.0, 40.0]), noise=0.05, rng=rng,
            kv_usage_avg=rng.choice([None, 0.3, 0.8]), ttft_at_percentile_s=rng.choice([None, 0.5, 3.0]),
            sessions_between_turns=rng.choice([None, 10.0]),
        )  # fmt: skip
        inputs = PolicyInputs(now, snap, counts, cfg, None if snap else "down")
        before = (copy.deepcopy(inputs), copy.deepcopy(state))
        d = decide(inputs, state)
        assert (inputs, state) == before, i
        assert decide(inputs, state) == d, i
        reasons.add(d.reason)
        state, desired = d.state, d.desired if d.apply else desired
    expected = {R.SLA_BREACH, R.TTFT_BREACH, R.SURPLUS_RELEASED, R.HOLD_SURPLUS, R.HOLD_MISSING_METRICS, R.STEADY}
    assert expected <= reasons, reasons


# ------------------------------------------------------------------------------------ demand from arrivals


def _arrivals_for(users: float, out: float = 500.0, cfg: PolicyConfig = CFG) -> float:
    """The arrival rate whose requests, served at the SLA, keep `users` in the engines (the toy snapshot's
    p50 speed is 1.1 x the percentile's; no TTFT reading: the allowance stands)."""
    return users / (out / (cfg.sla_tokens_per_s * 1.1) + S.ARRIVAL_TTFT_S)


OVERLOADED = PolicyState(breach_since=-CFG.metrics_window_s)
"""Users below the SLA for a metrics window by t=0: the arrival cap applies."""


def test_a_fresh_breach_is_sized_on_the_engines_and_capped_only_once_it_lasted_a_window():
    # A step: the rate window's arrivals still describe the load before it, and slow service has had no
    # time to swell the stock, so the first orders are sized on the requests in the engines. Once users have
    # been below the SLA for a window, the arrivals cap the running part.
    counts = ReplicaCounts(desired=2, ready=2)
    arrivals = {"arrival_rate": _arrivals_for(2 * CAP), "mean_output_tokens": 500.0}
    fresh = run(0.0, 5 * CAP, counts, **arrivals)
    assert fresh.readings["speedAtPercentile"] < S.SEVERE_BREACH * CFG.sla_tokens_per_s
    assert fresh.readings["demand"] == 5 * CAP and fresh.desired == 5
    assert fresh.readings["arrivalDemand"] == pytest.approx(2 * CAP, rel=1e-3)  # read, not applied
    young = run(CFG.metrics_window_s - 15.0, 5 * CAP, counts, state=fresh.state, **arrivals)
    assert young.readings["demand"] == 5 * CAP
    late = run(CFG.metrics_window_s, 5 * CAP, counts, state=fresh.state, **arrivals)
    assert late.readings["demand"] < 5 * CAP


def test_a_crowd_swelling_the_engines_orders_what_the_arrivals_need_not_max_replicas():
    # 2 ready replicas hold 5 x CAP running requests at a fraction of the SLA speed: slow service keeps each
    # request longer. The router says the arrivals are what 5.5 x CAP users need at the SLA. Without the
    # arrival reading the policy orders for the swollen stock (maxReplicas here); with it, for the arrivals.
    counts = ReplicaCounts(desired=2, ready=2)
    running = 12 * CAP
    d = run(0.0, running, counts)
    assert d.readings["speedAtPercentile"] < 0.5 * CFG.sla_tokens_per_s
    assert d.desired == CFG.max_replicas
    d = run(0.0, running, counts, state=OVERLOADED, arrival_rate=_arrivals_for(5.5 * CAP), mean_output_tokens=500.0)
    assert d.readings["arrivalDemand"] == pytest.approx(5.5 * CAP, rel=1e-3)
    assert d.readings["demand"] == pytest.approx(5.5 * CAP, rel=1e-3)
    assert d.desired == 6 and d.reason == R.SLA_BREACH


def test_flat_arrivals_hold_the_order_while_the_backlog_keeps_swelling():
    # A closed loop over a minute of evaluations: the running stock grows every evaluation (service slows as
    # it grows), the arrivals stay flat. The order stays at what the arrivals need; the trend of the stock is
    # not projected into more.
    counts = ReplicaCounts(desired=2, ready=2)
    state, rate = OVERLOADED, _arrivals_for(5.5 * CAP)
    for i in range(5):
        d = run(15.0 * i, (6 + 2 * i) * CAP, counts, state=state, arrival_rate=rate, mean_output_tokens=500.0)
        state = d.state
        assert d.desired == 6, i
        counts = ReplicaCounts(desired=d.desired, ready=2, starting=d.desired - 2)


def test_arrivals_never_raise_the_demand():
    counts = ReplicaCounts(desired=2, ready=2)
    plain = run(0.0, 1.5 * CAP, counts)
    d = run(0.0, 1.5 * CAP, counts, arrival_rate=_arrivals_for(20 * CAP), mean_output_tokens=500.0)
    assert d.readings["demand"] == plain.readings["demand"] and d.desired == plain.desired


def test_users_near_the_sla_keep_their_demand_whatever_the_arrivals_say():
    # No swelling without overload: an arrival estimate below the running requests is its own error there
    # (the window lags a rise), and trimming on it would skip a replica the load needs.
    counts = ReplicaCounts(desired=2, ready=2)
    plain = run(0.0, 2.2 * CAP, counts)
    assert plain.readings["speedAtPercentile"] > S.SEVERE_BREACH * CFG.sla_tokens_per_s
    d = run(0.0, 2.2 * CAP, counts, arrival_rate=_arrivals_for(1.5 * CAP), mean_output_tokens=500.0)
    assert d.readings["arrivalDemand"] == pytest.approx(1.5 * CAP, rel=1e-3)
    assert (d.readings["demand"], d.readings["required"]) == (plain.readings["demand"], plain.readings["required"])
    assert d.readings["required"] == 3


def test_queued_requests_count_as_they_are():
    # A queued request of a closed-loop session sends no next turn until it is served: the arrivals undercount
    # the users behind a queue, so only the running part is sized from them.
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 12 * CAP, counts, state=OVERLOADED, waiting=2 * CAP, arrival_rate=_arrivals_for(5.5 * CAP),
            mean_output_tokens=500.0)  # fmt: skip
    assert d.readings["demand"] == pytest.approx(7.5 * CAP, rel=1e-3) and d.desired == 8


def test_running_at_the_sla_speed_is_the_floor_of_the_arrival_demand():
    # a window shorter than the requests undercounts their arrivals: the requests running now, counted at the
    # SLA speed, stay in the demand
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 12 * CAP, counts, state=OVERLOADED, arrival_rate=0.0, mean_output_tokens=500.0)
    speed = d.readings["speedAtPercentile"]
    assert d.readings["demand"] == pytest.approx(12 * CAP * speed / CFG.sla_tokens_per_s, rel=1e-3)


@pytest.mark.parametrize("extra", [{}, {"arrival_rate": 5.0}, {"mean_output_tokens": 500.0}])
def test_without_both_arrival_readings_the_decision_is_unchanged(extra):
    counts = ReplicaCounts(desired=2, ready=2)
    plain = run(0.0, 12 * CAP, counts)
    d = run(0.0, 12 * CAP, counts, **extra)
    assert (d.desired, d.reason, d.readings["demand"]) == (plain.desired, plain.reason, plain.readings["demand"])
    assert d.readings.get("arrivalDemand") is None


def test_severe_breach_sets_where_the_arrivals_start_to_cap_the_demand():
    # The same window as above: users just above the default deep-overload line keep their demand; a line
    # set above their speed counts them as overloaded, and the arrivals cap the running part.
    counts = ReplicaCounts(desired=2, ready=2)
    plain = run(0.0, 2.2 * CAP, counts)
    speed = plain.readings["speedAtPercentile"]
    assert S.SEVERE_BREACH * CFG.sla_tokens_per_s < speed < CFG.sla_tokens_per_s
    cfg = replace(CFG, severe_breach=speed / CFG.sla_tokens_per_s + 0.01)
    kw = {"arrival_rate": _arrivals_for(1.5 * CAP), "mean_output_tokens": 500.0}
    assert run(0.0, 2.2 * CAP, counts, state=OVERLOADED, **kw).readings["demand"] == plain.readings["demand"]
    capped = run(0.0, 2.2 * CAP, counts, cfg=cfg, state=OVERLOADED, **kw)
    assert capped.readings["demand"] < plain.readings["demand"]


# ------------------------------------------------------------------------------------ ordering in waves


def test_overload_wave_orders_a_deep_overload_in_waves_of_the_ready_fleet():
    # A deep overload at 2 ready replicas: by default the whole (swollen) shortfall is ordered at once; with
    # overload_wave=2 the order reaches 2 x the ready replicas, and while that wave starts nothing more is
    # added, however much the stock swells; once it is ready, the next wave is sized on the bigger fleet.
    state = _trained(capacity=CAP, until=2400.0)
    bent = lambda c: 30.0  # noqa: E731  (past the knee: deep overload)
    counts = ReplicaCounts(desired=2, ready=2)
    plain = run(2400.0, 5 * CAP, counts, state=state, speed=bent)
    assert plain.desired > 4 and plain.reason == R.SLA_BREACH
    cfg = replace(CFG, overload_wave=2.0)
    d = run(2400.0, 5 * CAP, counts, cfg=cfg, state=state, speed=bent)
    assert d.desired == 4 and d.reason == R.SLA_BREACH
    held = run(2415.0, 8 * CAP, ReplicaCounts(desired=4, ready=2, starting=2), cfg=cfg, state=d.state, speed=bent)
    assert held.desired == 4 and not held.apply and held.reason == R.HOLD_STARTING
    assert held.readings["required"] > 4  # what it wants is still shown
    ready = run(3300.0, 8 * CAP, ReplicaCounts(desired=4, ready=4), cfg=cfg, state=held.state, speed=bent)
    assert ready.desired == 8


def test_overload_wave_leaves_a_scale_up_outside_deep_overload_alone():
    # users below the SLA but within the learned capacity: the whole shortfall at once, wave or not
    cfg = replace(CFG, overload_wave=1.5)
    counts = ReplicaCounts(desired=2, ready=2)
    d = run(0.0, 5 * CAP - 10, counts, cfg=cfg)
    assert d.desired == run(0.0, 5 * CAP - 10, counts).desired == 5


def test_peak_from_overload_false_does_not_remember_a_deep_overload_window_as_a_peak():
    # After a crowd the backlog's drain fills the engines: a deep-overload window counts what the fleet can
    # hold, not what the users need. By default it is remembered (and holds the replicas for the peak
    # memory); with peak_from_overload=False it is not, while a window within capacity still is.
    state = _trained(capacity=CAP, until=2400.0)
    bent = lambda c: 30.0  # noqa: E731
    counts = ReplicaCounts(desired=8, ready=8)
    kept = run(2400.0, 20 * CAP, counts, state=state, speed=bent)
    assert kept.state.peaks.peak(2400.0, CFG.peak_window_s) > state.peaks.peak(2400.0, CFG.peak_window_s)
    cfg = replace(CFG, peak_from_overload=False)
    skipped = run(2400.0, 20 * CAP, counts, cfg=cfg, state=state, speed=bent)
    assert skipped.readings["speedAtPercentile"] < S.SEVERE_BREACH * CFG.sla_tokens_per_s
    assert skipped.state.peaks == state.peaks
    within = run(2400.0, 6 * CAP, counts, cfg=cfg, state=state)
    assert within.state.peaks.peak(2400.0, CFG.peak_window_s) == pytest.approx(6 * CAP, rel=1e-3)


def test_peak_queue_max_ratio_remembers_only_windows_whose_queue_is_small():
    # A queue large against the running requests says the fleet is short (or draining a backlog): with the
    # option such a window is not remembered, one below the ratio is; by default both are. 0: no queue at all.
    state = _trained(capacity=CAP, until=2400.0)
    counts = ReplicaCounts(desired=8, ready=8)
    running = 7 * CAP
    queued = run(2400.0, running, counts, state=state, waiting=0.2 * running)
    assert queued.state.peaks.peak(2400.0, CFG.peak_window_s) > state.peaks.peak(2400.0, CFG.peak_window_s)
    for ratio, waiting, kept in ((0.1, 0.2 * running, False), (0.1, 0.05 * running, True), (0.0, 1.0, False),
                                 (0.0, 0.0, True)):
        d = run(2400.0, running, counts, cfg=replace(CFG, peak_queue_max_ratio=ratio), state=state, waiting=waiting)
        if kept:
            assert d.state.peaks.peak(2400.0, CFG.peak_window_s) == pytest.approx(running, rel=1e-3), (ratio, waiting)
        else:
            assert d.state.peaks == state.peaks, (ratio, waiting)


def test_peak_window_max_s_caps_the_peak_memory_in_start_up_times_only():
    # four 20-minute start-ups outlast a crowd and the run; the cap shortens that memory, and an explicit
    # peak_memory_s (scaleDown.peakWindowSeconds) still wins
    long = PolicyConfig(replica_startup_s=1200.0)
    assert long.peak_window_s == 4800.0
    assert replace(long, peak_window_max_s=1800.0).peak_window_s == 1800.0
    assert replace(long, peak_window_max_s=1800.0, replica_startup_s=300.0).peak_window_s == 1200.0
    assert replace(long, peak_window_max_s=1800.0, peak_memory_s=3000.0).peak_window_s == 3000.0


def test_down_delay_max_s_caps_the_scale_down_delay_of_one_start_up_only():
    long = PolicyConfig(replica_startup_s=1200.0)
    assert long.down_delay_s == 1200.0
    assert replace(long, down_delay_max_s=600.0).down_delay_s == 600.0
    assert replace(long, down_delay_max_s=600.0, replica_startup_s=300.0).down_delay_s == 300.0
    assert replace(long, down_delay_max_s=600.0, scale_down_delay_s=900.0).down_delay_s == 900.0


# ------------------------------------------------------------------------- a breach that refutes the plan


def _held_short(steps: int, counts=None, cfg=CFG, speed_at=None, **extra):
    """A fleet of 2 whose prior is 3x too optimistic: each replica holds 1.25 x the prior's users (past the
    prior's capacity, so the windows read as deep overload and are not learned from) at a fraction of the
    SLA, and the router's arrivals (closed-loop users slowed by the overload) say 2 replicas are enough.
    Evaluated every 15 s from when users have been below the SLA for a metrics window (the arrivals cap the
    demand from then on); returns the decisions."""
    counts = counts or ReplicaCounts(desired=2, ready=2)
    true = speed_at or curve(CAP / 3)
    # it met the SLA at low load before the crowd
    state = replace(OVERLOADED, sla_met_at=-100.0)
    out = []
    for i in range(steps):
        d = run(15.0 * i, 2.5 * CAP, counts, cfg=cfg, state=state, speed=true,
                arrival_rate=_arrivals_for(1.6 * CAP), mean_output_tokens=500.0, **extra)  # fmt: skip
        out.append(d)
        state = replace(d.state, last_desired=None)
    return out


def test_a_severe_breach_outlasting_a_settle_time_refutes_a_plan_that_says_enough():
    ds = _held_short(8)
    first = ds[0]
    assert first.readings["speedAtPercentile"] < S.SEVERE_BREACH * CFG.sla_tokens_per_s
    assert first.readings["required"] == 2 and first.reason == R.HOLD_STABILIZING and first.desired == 2
    settle = int((CFG.settle_s - CFG.metrics_window_s) // 15.0)  # the breach began a window before ds[0]
    assert all(d.desired == 2 for d in ds[:settle]), [d.reason for d in ds]
    d = ds[settle]
    # sized on the requests in the engines at the learned (prior) capacity, at least one more
    assert d.reason == R.SLA_BREACH and d.desired == max(3, math.ceil(2.5 - 1e-9)) and d.apply
    assert "the plan said were enough" in d.message


def test_a_refuted_plan_waits_for_what_is_starting():
    # a replica on its way: its effect is not in the readings yet, so the plan is not refuted
    ds = _held_short(12, counts=ReplicaCounts(desired=3, ready=2, starting=1))
    assert all(d.desired == 3 and not d.apply for d in ds), [(d.reason, d.desired) for d in ds]


def test_a_marginal_breach_never_refutes_the_plan():
    # users just below the SLA (above the severe line), with the learned line claiming room: no order on the
    # stock, however long it lasts (a marginal miss is sized on the window's own point, not the stock)
    marginal = lambda c: 0.95 * CFG.sla_tokens_per_s  # noqa: E731
    ds = _held_short(20, speed_at=marginal)
    assert not any("the plan said were enough" in d.message for d in ds)
