"""The steps of a decision on a fresh reading with replicas serving, each a pure function from frozen values to
a frozen value:

    read_load -> demand_from_arrivals -> estimate_capacity -> find_breaches -> capacity_under_breach -> plan_demand
              -> breach_outlasts_plan -> act (scale_up, within overload_wave_limit | hold_on_breach | scale_down)
              -> sla_state

`decide_on_metrics` runs them in that order; policy.decide wraps it with the blind path, min/max and the
conditions. docs/autoscaling.md explains each rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from flashserve.autoscaling.capacity import (
    CapacityModel,
    capacity_from_line,
    capacity_through,
    clamp_capacity,
)
from flashserve.autoscaling.peak import PeakMemory, Recurrence
from flashserve.autoscaling.reasons import (
    AT_MAX,
    HOLD_PENDING,
    HOLD_SLA_UNREACHABLE,
    HOLD_STABILIZING,
    HOLD_STARTING,
    HOLD_SURPLUS,
    SLA_AT_RISK,
    SLA_AT_RISK_STATE,
    SLA_BREACH,
    SLA_BREACHED,
    SLA_MET,
    SLA_UNKNOWN,
    STEADY,
    SURPLUS_RELEASED,
    TTFT_BREACH,
)
from flashserve.autoscaling.replicas import ReplicaCounts
from flashserve.autoscaling.snapshot import MetricsSnapshot
from flashserve.autoscaling.trend import DemandTrend

if TYPE_CHECKING:
    from flashserve.autoscaling.policy import PolicyConfig, PolicyState

# Below this KV usage the ratio running/usage extrapolates too far to say anything about a memory limit.
KV_SIGNIFICANT = 0.5
# A breach this deep is acted on at once; shallower ones must last PolicyConfig.breach_confirm_s. Also the
# deep-overload line and where the arrival cap applies. PolicyConfig.severe_breach's default.
SEVERE_BREACH = 0.9
# The breaching window's own capacity estimate replaces the learned one only below this share of it.
LOCAL_OVERRIDE = 0.85
# Speeds within this factor above the SLA report the SLA as AtRisk.
AT_RISK_MARGIN = 1.05
# The first-token part of a request's time in the arrival-based demand, at most: the SLA's TTFT target where it
# sets one, else this. The measured TTFT stands in when lower; it is never taken above this, since in
# overload it is queueing, the very backlog the arrival-based demand leaves out.
ARRIVAL_TTFT_S = 0.5
# The median user of a fleet held at the SLA decodes faster than the SLA percentile's: the window's ratio of
# the two speeds sizes a request's mean duration, within these bounds (a wild ratio from a handful of requests
# must not shrink the duration much).
ARRIVAL_SPEED_RATIO = (1.0, 1.5)

Readings = tuple[tuple[str, object], ...]
"""Decision readings as (key, value) pairs, in the order status shows them."""


@dataclass(frozen=True)
class Load:
    """What the engines report, per ready replica where it says so."""

    running: float
    waiting: float
    sessions: float
    """Agentic sessions between turns, weighted (PolicyConfig.session_weight)."""
    demand: float
    """Requests to serve now: running (at the SLA speed, with overload_demand_at_sla) + waiting + sessions."""
    concurrency: float
    """Running requests per ready replica over the rate window: where the speed was read."""
    concurrency_now: float
    """Running requests per ready replica now."""
    speed: float | None
    """Per-user speed at the SLA percentile."""
    kv_usage: float | None
    ttft_s: float | None
    window_clean: bool
    """The rate window did not straddle a readiness change: the reading may be learned from."""
    arrival_demand: float | None = None
    """Requests the router's arrivals keep running at the SLA speed (Little's law), where known."""
    stock: float = 0.0
    """Running + waiting requests + sessions as the engines hold them: `demand` before any estimate of what
    they would be at the SLA speed."""


@dataclass(frozen=True)
class CapacityEstimate:
    """Concurrent users one replica serves at the SLA, and where that figure comes from."""

    model: CapacityModel
    """The learner, with this window taken in (or not)."""
    a: float
    b: float
    """The fitted line 1/speed = a + b x concurrency."""
    reachable: bool
    """An idle replica meets the SLA by the fitted line."""
    speed_limit: float
    kv_limit: float | None
    local: float | None
    """The breaching window's own estimate, where it was computed."""
    value: float
    """What the decision sizes on: the tightest of the limits that apply."""
    deep_overload: bool
    sla_met_at: float | None


@dataclass(frozen=True)
class Breaches:
    speed: bool
    """Users below the SLA speed."""
    ttft: bool
    """Time to first token above its target, with requests queued."""
    since: float | None
    confirmed: bool
    """The breach has lasted PolicyConfig.breach_confirm_s."""
    severe: bool
    """Users below PolicyConfig.severe_breach x the SLA."""

    @property
    def any(self) -> bool:
        return self.speed or self.ttft

    @property
    def urgent(self) -> bool:
        """Users already below target: the whole shortfall is acted on at once."""
        return self.ttft or (self.speed and (self.confirmed or self.severe))


@dataclass(frozen=True)
class Demand:
    """The demand to plan for: what a replica ordered now will meet when it is ready."""

    trend: DemandTrend
    planned: float
    """The demand, or its level projected over the horizon while it rises."""
    peaks: PeakMemory
    recurrence: Recurrence
    peak_window_s: float
    """The peak memory this evaluation: start-up-based, longer to outlast bursts that keep coming back, or one
    start-up time where demand did not rise within the window (peak_needs_rise)."""
    recent_peak: float
    required: int
    """Replicas the planned demand needs at the scale-up utilization."""


@dataclass(frozen=True)
class Wording:
    speed: str
    load: str

    def say(self, tail: str) -> str:
        return f"{self.speed}; {self.load}; {tail}"


@dataclass(frozen=True)
class Action:
    """Where the replica count goes, and the timers that carry over to the next evaluation."""

    target: int
    reason: str
    message: str
    surplus_since: float | None = None
    releasing: bool = False
    at_risk_since: float | None = None
    at_risk_want: int | None = None
    readings: Readings = ()


@dataclass(frozen=True)
class Outcome:
    """A decision before min/max are applied."""

    target: int
    reason: str
    message: str
    want: int
    sla_state: str
    capacity: float
    state: PolicyState
    readings: Readings = ()


def decide_on_metrics(
    cfg: PolicyConfig, now: float, reps: ReplicaCounts, base: int, m: MetricsSnapshot, state: PolicyState,
    ready_stable_s: float,
) -> Outcome:  # fmt: skip
    breach_age = now - state.breach_since if state.breach_since is not None else None
    load = demand_from_arrivals(cfg, m, read_load(cfg, m, reps.ready, ready_stable_s), breach_age)
    est = estimate_capacity(cfg, now, load, state)
    br = find_breaches(cfg, now, load, state)
    est = capacity_under_breach(cfg, load, est, br)
    demand = plan_demand(cfg, now, load, est.value, state, remembers_peak(cfg, load, est))
    wording = describe(cfg, load, est.value, demand)
    if demand.required <= base and breach_outlasts_plan(cfg, now, reps, base, br, est, ready_stable_s):
        demand, wording = size_on_stock(cfg, base, load, est.value, demand, wording)
    if demand.required > base:
        action = scale_up(cfg, now, reps, base, br, demand.required, state, wording,
                          overload_wave_limit(cfg, reps, est.deep_overload))  # fmt: skip
    elif br.any:
        action = hold_on_breach(reps, base, est, wording, cfg.settle_s)
    else:
        action = scale_down(cfg, now, base, est.value, demand, state, wording)
    return Outcome(
        target=action.target,
        reason=action.reason,
        message=action.message,
        want=demand.required,
        sla_state=sla_state(cfg, load, br, demand.required, base),
        capacity=est.value,
        state=replace(
            state,
            capacity=est.model,
            demand=demand.trend,
            peaks=demand.peaks,
            recurrence=demand.recurrence,
            sla_met_at=est.sla_met_at,
            surplus_since=action.surplus_since,
            releasing=action.releasing,
            breach_since=br.since,
            at_risk_since=action.at_risk_since,
            at_risk_want=action.at_risk_want,
        ),
        readings=readings(m, load, est, demand) + action.readings,
    )


def read_load(cfg: PolicyConfig, m: MetricsSnapshot, ready: int, ready_stable_s: float) -> Load:
    sla = cfg.sla_tokens_per_s
    running = m.running or 0.0
    waiting = m.waiting or 0.0
    served = running
    if cfg.overload_demand_at_sla and m.speed_at_percentile is not None and 0 < m.speed_at_percentile < sla:
        served = running * m.speed_at_percentile / sla
    sessions = (m.sessions_between_turns or 0.0) * cfg.session_weight
    return Load(
        running=running,
        waiting=waiting,
        sessions=sessions,
        demand=served + waiting + sessions,
        stock=running + waiting + sessions,
        # Only ready replicas get traffic.
        concurrency=(m.running_avg if m.running_avg is not None else running) / ready,
        concurrency_now=running / ready,
        speed=m.speed_at_percentile,
        kv_usage=m.kv_usage_avg,
        ttft_s=m.ttft_at_percentile_s,
        window_clean=ready_stable_s >= cfg.metrics_window_s,
    )


def demand_from_arrivals(cfg: PolicyConfig, m: MetricsSnapshot, load: Load, breach_age_s: float | None) -> Load:
    """Cap the running part of the demand at what the arrivals need, where the router reports them.

    Running requests are a stock, and slow service swells it: in overload each request stays longer than at
    the SLA speed, the stock grows every evaluation while the arrivals do not, its rise reads as a trend, and
    sizing on it orders up to maxReplicas for users who need half that (docs/autoscaling.md, "Demand from
    arrivals"). By Little's law the same arrivals served at the SLA keep arrival_rate x W requests running,
    W = mean output tokens / the median user's speed at the SLA (SLA x the window's p50/percentile speed
    ratio) + a first-token allowance. Only while users are below severe_breach x the SLA (the overload that
    swells the stock), and never below the requests running now counted at the SLA speed (the peak memory's
    figure): a window shorter than a long request undercounts its arrivals. And only once users have been below
    the SLA for a metrics window (`breach_age_s`, None: not before this evaluation): until then the window's
    arrivals lag the rise that caused the breach, and slow service has had no time to swell the stock, so a
    step would be cut to what the arrivals were before it (measured: a closed-loop step to 3.5 replicas'
    worth ordered 1 -> 2 a minute late, e2e/test_autoscaling.py).

    The queue is counted as it is, not from arrivals: a queued turn of an agentic session holds back that
    session's next turns until it is served, so in overload the router sees fewer arrivals than the users
    behind the queue will send (measured: sizing the queue from arrivals too cost a 15.7x step 40 points of
    attainment). Sessions between turns are added as before. Only ever lowers the demand, and only with both
    readings: without a router (or with its pods unscraped) nothing changes."""
    rate, out = m.arrival_rate, m.mean_output_tokens
    if rate is None or out is None:
        return load
    sla, speed = cfg.sla_tokens_per_s, load.speed
    ratio = 1.0
    if m.speed_p50 is not None and speed is not None and speed > 0:
        ratio = min(max(m.speed_p50 / speed, ARRIVAL_SPEED_RATIO[0]), ARRIVAL_SPEED_RATIO[1])
    allowance = cfg.ttft_seconds if cfg.ttft_seconds is not None else ARRIVAL_TTFT_S
    ttft = min(m.ttft_at_percentile_s, allowance) if m.ttft_at_percentile_s is not None else allowance
    at_sla = rate * (out / (sla * ratio) + ttft)
    young = breach_age_s is None or breach_age_s < cfg.metrics_window_s
    if speed is None or speed >= cfg.severe_breach * sla or young:
        # Users near the SLA, or below it for less than a window: slow service has not swollen the stock, and
        # the estimate's own error (the window lags a rise, long requests weigh more in the stock than in the
        # mean) would trim real demand.
        return replace(load, arrival_demand=at_sla)
    served_at_sla = load.running * speed / sla
    running = min(load.demand - load.waiting - load.sessions, max(at_sla, served_at_sla))
    return replace(load, demand=running + load.waiting + load.sessions, arrival_demand=at_sla)


def estimate_capacity(cfg: PolicyConfig, now: float, load: Load, state: PolicyState) -> CapacityEstimate:
    """The learned speed curve (taking this window in unless it is deep overload), then the memory limit."""
    prior, sla, speed, conc = cfg.prior(), cfg.sla_tokens_per_s, load.speed, load.concurrency
    model = state.capacity
    # Deep overload: a severe breach at a concurrency beyond the capacity learned so far, in a fleet that met
    # the SLA within the learning memory or well below what the learned line says of that concurrency. Past
    # capacity the engine queues and preempts and 1/speed bends up, so such a window says the fleet is short
    # but not by how much: a line through its point does not size the scale-up (capacity_under_breach), and
    # it is not learned from either, queue or not: it would drag the fitted line's crossing of the SLA below
    # where it is, and the fleet would hold more replicas than the next burst needs for as long as the
    # learner remembers. A replica that is slow at any load never meets the SLA and stays on its line: it is
    # learned from, and the model finds out that the SLA is out of reach.
    a0, b0 = model.fit(prior)
    met_recently = state.sla_met_at is not None and now - state.sla_met_at <= cfg.capacity_memory_s
    deep_overload = (
        speed is not None
        and load.running > 0
        and speed < cfg.severe_breach * sla
        and conc > model.capacity(prior)
        and (met_recently or speed * (a0 + b0 * conc) < cfg.severe_breach)
    )
    met_now = load.window_clean and speed is not None and speed >= sla and load.running > 0
    if load.window_clean and speed is not None and conc > 0 and not deep_overload:
        model = model.observe(now, conc, speed, cfg.capacity_memory_s)
    a, b = model.fit(prior)
    reachable = a < 1.0 / sla
    # An SLA the fitted curve puts beyond even an idle replica is not bought with more replicas: size the fleet
    # on the prior instead of sending it to maxReplicas, and say so.
    cap_speed = clamp_capacity(capacity_from_line(a, b, sla), prior) if reachable else prior.capacity
    cap, cap_kv = cap_speed, None
    if load.kv_usage is not None and load.kv_usage >= KV_SIGNIFICANT and load.concurrency_now > 0:
        cap_kv = load.concurrency_now * cfg.kv_usage_limit / load.kv_usage
        cap = min(cap, cap_kv)
    return CapacityEstimate(
        model=model, a=a, b=b, reachable=reachable, speed_limit=cap_speed, kv_limit=cap_kv, local=None,
        value=cap, deep_overload=deep_overload, sla_met_at=now if met_now else state.sla_met_at,
    )  # fmt: skip


def find_breaches(cfg: PolicyConfig, now: float, load: Load, state: PolicyState) -> Breaches:
    sla, speed = cfg.sla_tokens_per_s, load.speed
    speed_breach = speed is not None and speed < sla and load.running > 0
    ttft_breach = bool(
        cfg.ttft_seconds is not None and load.ttft_s is not None and load.ttft_s > cfg.ttft_seconds
        and load.waiting > 0
    )  # fmt: skip
    since = (state.breach_since if state.breach_since is not None else now) if speed_breach or ttft_breach else None
    return Breaches(
        speed=speed_breach,
        ttft=ttft_breach,
        since=since,
        confirmed=since is not None and now - since >= cfg.breach_confirm_s,
        severe=speed_breach and speed is not None and speed < cfg.severe_breach * sla,
    )


def capacity_under_breach(cfg: PolicyConfig, load: Load, est: CapacityEstimate, br: Breaches) -> CapacityEstimate:
    """What users see overrides what the learned line claims, where the two clearly disagree."""
    cap, cap_local = est.value, None
    # Not in deep overload: there 1/speed has bent up past the line, and a line through the window's point
    # would put the capacity too low and order for a fleet the burst never needed. Not on a single marginal
    # miss either: near capacity, noise alone dips below the SLA now and then, and one noisy point would size
    # a whole scale-up.
    if br.speed and est.reachable and load.window_clean and (br.confirmed or br.severe) and not est.deep_overload:
        cap_local = capacity_through(est.a, load.concurrency, load.speed or 0.0, cfg.sla_tokens_per_s)
        # One window's point is noisy (5% on speed is ~15% on capacity far from the SLA): override the
        # learned value only when they clearly disagree; the learner has taken the point in anyway.
        if cap_local is not None and cap_local < LOCAL_OVERRIDE * cap:
            cap = max(cap_local, 1.0)
    if br.ttft and load.concurrency_now > 0:
        # Requests queue long enough to miss the TTFT target: admission (KV blocks or max_num_seqs), not
        # speed, binds, at the concurrency running now.
        cap = min(cap, load.concurrency_now)
    return replace(est, local=cap_local, value=cap)


def remembers_peak(cfg: PolicyConfig, load: Load, est: CapacityEstimate) -> bool:
    """Whether this window goes into the peak memory: not a deep overload (unless peak_from_overload), where
    the engines hold what the fleet can run (a backlog's drain included), and not a queue above
    peak_queue_max_ratio; both say the fleet is short, not how many users need serving."""
    if est.deep_overload and not cfg.peak_from_overload:
        return False
    return cfg.peak_queue_max_ratio is None or load.waiting < cfg.peak_queue_max_ratio * load.running + 0.5


def plan_demand(
    cfg: PolicyConfig, now: float, load: Load, capacity: float, state: PolicyState, remember: bool = True
) -> Demand:  # fmt: skip
    trend = state.demand.update(now, load.demand, cfg.stale_after_s)
    projected = trend.forecast(cfg.horizon_s) if trend.trend > 0 else None
    planned = max(load.demand, projected or 0.0)
    # Remembered for releases: the requests being served, counted at the SLA speed when users are below it,
    # plus the sessions between turns. Not the queue and not the trend: right after an overload both are the
    # fleet's own backlog, which drains in a minute or two, and would hold a fleet sized for it for the whole
    # window.
    speed, running = load.speed, load.running
    served_at_sla = running * min(1.0, speed / cfg.sla_tokens_per_s) if speed is not None and speed > 0 else running
    held = served_at_sla + load.sessions
    recurrence, gap = state.recurrence, 0.0
    if cfg.peak_recurrence_s is not None:
        if remember:
            recurrence = recurrence.update(now, held, cfg.peak_recurrence_s, cfg.peak_window_s)
        gap = recurrence.gap(now, cfg.peak_recurrence_s)
    window = cfg.peak_window_for(gap)
    if cfg.peak_skip_fall is not None and trend.trend * cfg.replica_startup_s < -cfg.peak_skip_fall * held:
        remember = False
    peaks = state.peaks.update(now, held, window) if remember else state.peaks
    memory = window
    if cfg.peak_needs_rise and cfg.peak_memory_s is None and not peaks.rose(now, window):
        memory = min(window, cfg.replica_startup_s)
    return Demand(
        trend=trend,
        planned=planned,
        peaks=peaks,
        recurrence=recurrence,
        peak_window_s=memory,
        recent_peak=peaks.peak(now, memory, cfg.peak_full_s),
        required=replicas_for(planned, capacity, cfg.scale_up_utilization),
    )


def breach_outlasts_plan(
    cfg: PolicyConfig, now: float, reps: ReplicaCounts, base: int, br: Breaches, est: CapacityEstimate,
    ready_stable_s: float,
) -> bool:  # fmt: skip
    """Users far below the SLA for a settle time, at a fleet that has served as it is for a settle time, while
    the plan says that fleet is enough: the plan is refuted. Each guard against buying on an overload's swollen
    stock (the arrival cap, deep overload not learned from and not sized on a line through its point) is right
    alone, but together they can hold a fleet short for good: an optimistic capacity prior makes every window
    past it a "deep overload", and the arrivals of closed-loop users slowed by that overload say the fleet is
    enough. Nothing may be starting or pending: their effect is not in the readings yet."""
    return (
        br.severe
        and br.since is not None
        and now - br.since >= cfg.settle_s
        and est.reachable
        and reps.ready >= base
        and reps.starting == 0
        and reps.pending == 0
        and ready_stable_s >= cfg.settle_s
    )


def size_on_stock(
    cfg: PolicyConfig, base: int, load: Load, capacity: float, demand: Demand, wording: Wording
) -> tuple[Demand, Wording]:  # fmt: skip
    """A refuted plan: size on the requests the engines hold (not what the arrivals or the SLA speed say they
    would be) at the learned capacity, and at least one replica more: what users see wins over the model."""
    required = max(base + 1, replicas_for(load.stock, capacity, cfg.scale_up_utilization))
    note = (f"; users below {cfg.severe_breach * cfg.sla_tokens_per_s:g} tok/s for over {cfg.settle_s:.0f}s at "
            f"{base} replicas the plan said were enough: sized on the {load.stock:.0f} requests in the engines")  # fmt: skip
    return replace(demand, required=required), replace(wording, load=wording.load + note)


def replicas_for(demand: float, capacity: float, utilization: float) -> int:
    return math.ceil(demand / (capacity * utilization) - 1e-9) if demand > 0 else 0


def describe(cfg: PolicyConfig, load: Load, capacity: float, demand: Demand) -> Wording:
    speed = f"p{cfg.percentile:g} per-user speed {_fmt(load.speed)} tok/s (SLA {cfg.sla_tokens_per_s:g})"
    rising = f" (rising to {demand.planned:.0f} in {cfg.horizon_s:.0f}s)" if demand.planned > load.demand + 0.5 else ""
    return Wording(speed, f"demand {load.demand:.0f}{rising} at {capacity:.0f} users/replica needs {demand.required}")


def overload_wave_limit(cfg: PolicyConfig, reps: ReplicaCounts, deep_overload: bool) -> int | None:
    """The most a scale-up may reach now: PolicyConfig.overload_wave x the ready replicas in deep overload,
    None (no limit) otherwise. The ready count grows only when a wave is ready, so this orders at most one
    wave per start-up time, each sized by a fleet that serves the crowd faster than the last. Never below one
    more than the ready replicas: a wave of 1x or less would hold a fleet in overload for good."""
    if cfg.overload_wave is None or not deep_overload:
        return None
    return max(reps.ready + 1, math.ceil(cfg.overload_wave * max(reps.ready, 1) - 1e-9))


def scale_up(
    cfg: PolicyConfig, now: float, reps: ReplicaCounts, base: int, br: Breaches, want: int, state: PolicyState,
    wording: Wording, wave_limit: int | None = None,
) -> Action:  # fmt: skip
    """More is needed. Users already below target: act now on the full shortfall. A shortfall only predicted
    (demand up, speed still fine, or a marginal miss) must show at two evaluations in a row and is sized on
    the smaller of them, so that one noisy reading does not buy a replica for a start-up time."""
    at_risk_since = state.at_risk_since if state.at_risk_since is not None else now
    at_risk_want = want if state.at_risk_want is None else min(want, state.at_risk_want)
    held = Action(base, HOLD_STABILIZING, "", at_risk_since=at_risk_since, at_risk_want=at_risk_want)
    wait = cfg.scale_up_stabilization_s if br.urgent else max(cfg.scale_up_stabilization_s, cfg.evaluation_interval_s)
    if now - at_risk_since < wait:
        return replace(held, message=wording.say(f"confirming for {wait:g}s before adding"))
    if reps.pending > 0:
        tail = f"{reps.pending} replica group(s) cannot be scheduled, adding no more until they are placed"
        return replace(held, reason=HOLD_PENDING, message=wording.say(tail))
    if base >= cfg.max_replicas:
        return replace(held, reason=AT_MAX, message=wording.say(f"already at maxReplicas {cfg.max_replicas}"))
    target = max(want if br.urgent else at_risk_want, base + 1)
    if wave_limit is not None and target > wave_limit:
        if wave_limit <= base:
            tail = f"deep overload: this wave of {base} ({reps.ready} ready) is sized again once it is ready"
            return replace(held, reason=HOLD_STARTING, message=wording.say(tail))
        target = wave_limit
    reason = SLA_BREACH if br.speed else TTFT_BREACH if br.ttft else SLA_AT_RISK
    # The next shortfall, if any, is measured against the new count: the at-risk timers start over.
    return Action(target, reason, wording.say(f"{base} -> {min(target, cfg.max_replicas)}"))


def hold_on_breach(reps: ReplicaCounts, base: int, est: CapacityEstimate, wording: Wording, settle_s: float) -> Action:
    """A breach with enough replicas ordered: nothing to add, and no surplus either."""
    if not est.reachable:
        return Action(base, HOLD_SLA_UNREACHABLE,
                      f"{wording.speed}; even an idle replica misses the SLA by the fitted curve; more replicas won't help")  # fmt: skip
    if reps.starting > 0 or reps.ready < base:
        return Action(base, HOLD_STARTING, wording.say(f"{base - reps.ready} replica group(s) still starting"))
    return Action(base, HOLD_STABILIZING, wording.say(
        f"the plan says {base} suffice: holding unless users stay far below the SLA for {settle_s:.0f}s"))


def scale_down(
    cfg: PolicyConfig, now: float, base: int, capacity: float, demand: Demand, state: PolicyState,
    wording: Wording,
) -> Action:  # fmt: skip
    """No breach and nothing more needed: release a step once the surplus has lasted the delay (the settle
    time mid-release), never below the demand with the release hysteresis nor below the recent peak."""
    need = replicas_for(demand.planned, capacity, cfg.scale_down_utilization)
    # The peak is held at what serving it needs (the scale-up line), not with the release hysteresis: it is
    # already the maximum of a long window, there is no noise left to band against.
    need = max(need, replicas_for(demand.recent_peak, capacity, cfg.scale_up_utilization))
    extra: Readings = (("requiredForRelease", need), ("recentPeak", rounded(demand.recent_peak)),
                       ("peakMemorySeconds", rounded(demand.peak_window_s)))  # fmt: skip
    step, surplus = cfg.scale_down_step or 1, base - max(need, cfg.min_replicas)
    if cfg.scale_down_step is None and cfg.release_share is not None and surplus > 0:
        step = max(1, math.ceil(cfg.release_share * surplus))
    falling = cfg.scale_down_step is None and cfg.release_on_fall and falling_fast(cfg, demand.trend, capacity)
    if falling:
        # One group per settle time hedges a surplus that is a peak memory run out while demand is flat
        # (bursts that recur come back to a fleet still partly there); a decline this fast is no such hedge,
        # and one group at a time only pays for the replicas minutes longer. The need still holds the peak.
        step = max(step, surplus)
    candidate = max(base - step, cfg.min_replicas, need)
    if cfg.scale_down_step is None and state.last_direction > 0 and not state.releasing:
        # The first release since the fleet last grew. A scale-up in overload is sized on running + waiting
        # requests, a stock that slow service swells (each request stays longer, and the queue holds what
        # the engines cannot admit), so it can buy well beyond what the same users need at the SLA. Once the
        # surplus has lasted the delay, with the peak memory still holding what the recent peak needed, the
        # replicas beyond that were never needed: they go in one step, not one per settle time.
        candidate = max(cfg.min_replicas, need)
    if candidate >= base:
        return Action(base, STEADY, wording.say(f"have {base}"), readings=extra)
    since = state.surplus_since if state.surplus_since is not None else now
    wait = cfg.settle_s if state.releasing else cfg.down_delay_s
    lasted = now - since
    if lasted >= wait:
        why = ", demand falling: down to the need" if falling and base - candidate > 1 else ""
        tail = f"surplus for {lasted:.0f}s, {base} -> {candidate}{why}"
        return Action(candidate, SURPLUS_RELEASED, wording.say(tail), surplus_since=now, releasing=True, readings=extra)
    return Action(base, HOLD_SURPLUS, wording.say(f"surplus for {lasted:.0f}s of {wait:.0f}s before release"),
                  surplus_since=since, releasing=state.releasing, readings=extra)  # fmt: skip


def falling_fast(cfg: PolicyConfig, trend: DemandTrend, capacity: float) -> bool:
    """Demand falls by at least one replica's worth (at the release line) per settle time."""
    return -trend.trend * cfg.settle_s >= capacity * cfg.scale_down_utilization


def sla_state(cfg: PolicyConfig, load: Load, br: Breaches, want: int, base: int) -> str:
    speed, sla = load.speed, cfg.sla_tokens_per_s
    if br.any:
        return SLA_BREACHED
    if want > base or (speed is not None and speed < AT_RISK_MARGIN * sla and load.running > 0):
        return SLA_AT_RISK_STATE
    if speed is None and load.running > 0:
        return SLA_UNKNOWN
    return SLA_MET


def readings(m: MetricsSnapshot, load: Load, est: CapacityEstimate, demand: Demand) -> Readings:
    return (
        ("demand", rounded(load.demand)),
        ("arrivalRate", rounded(m.arrival_rate)),
        ("meanOutputTokens", rounded(m.mean_output_tokens)),
        ("arrivalDemand", rounded(load.arrival_demand)),
        ("demandTrendPerMinute", rounded(demand.trend.trend * 60.0)),
        ("demandPlanned", rounded(demand.planned)),
        ("running", rounded(load.running)),
        ("waiting", rounded(load.waiting)),
        ("concurrencyPerReplica", rounded(load.concurrency)),
        ("speedAtPercentile", rounded(load.speed)),
        ("speedSource", m.speed_source),
        ("speedP50", rounded(m.speed_p50)),
        ("speedFromCounters", rounded(m.speed_from_counters)),
        ("tokensPerStep", rounded(m.tokens_per_step)),
        ("tokensPerSecond", rounded(m.tokens_per_second)),
        ("kvUsageAvg", rounded(m.kv_usage_avg)),
        ("kvUsageMax", rounded(m.kv_usage_max)),
        ("ttftAtPercentileSeconds", rounded(m.ttft_at_percentile_s)),
        ("capacitySpeed", rounded(est.speed_limit)),
        ("capacityKV", rounded(est.kv_limit)),
        ("capacityLocal", rounded(est.local)),
        ("capacity", rounded(est.value)),
        ("slaReachable", est.reachable),
        ("fitA", rounded(est.a, 9)),
        ("fitB", rounded(est.b, 9)),
        ("required", demand.required),
    )


def rounded(v: float | None, digits: int = 4) -> float | None:
    """A reading as status shows it: `digits` significant digits, None for no value or a non-finite one."""
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"
