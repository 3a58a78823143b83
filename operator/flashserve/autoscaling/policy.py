"""The autoscaling policy: a pure function from (metrics, replica counts, spec, remembered state) to a decision.

The operator calls `decide` every evaluation interval and the benchmark's simulator calls the very same
function in virtual time, so nothing here reads a clock, the network or the cluster.

In short (docs/autoscaling.md has the long form):

* demand = running + waiting requests (+ agentic sessions between turns when known), planned ahead by its
  rising trend over the start-up time (trend.py);
* capacity = concurrent users one replica serves at the SLA, learned online (capacity.py), and lowered when
  the KV cache rather than speed is the limit;
* up: when demand exceeds what the replicas already ordered (ready + starting) serve at the SLA, or the SLA
  is observed breached, order the whole shortfall in one go;
* up in deep overload (users far below the SLA, concurrency beyond the learned capacity): sized on the
  learned capacity, not on a line through the overloaded window (1/speed bends up past capacity), and not
  learned from (unless the fleet never met the SLA and the window lies on the learned line: slow at any load);
* down: one step at a time, only when the replicas left would run at <= 80% of capacity, and only after the
  surplus has lasted scaleDown.delaySeconds (the start-up time by default: a replica is not given up for
  less than it costs to get back - the ski-rental rule); then one step per settle time while it lasts;
  the first release after a scale-up takes the whole surplus at once (a scale-up in overload is sized on a
  backlog and can overshoot); an explicit scaleDown.step is honoured as is;
  never below what the highest demand of the last four start-up times needed (peak.py: a burst shorter than
  a start-up is only served by replicas that are already there);
* no fresh metrics, or no ready replica: hold (only min/max are enforced); pending pods: add nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from flashserve.autoscaling.capacity import (
    CapacityModel,
    CapacityPrior,
    capacity_from_line,
    capacity_through,
    clamp_capacity,
)
from flashserve.autoscaling.peak import PeakMemory
from flashserve.autoscaling.snapshot import MetricsSnapshot
from flashserve.autoscaling.trend import DemandTrend

if TYPE_CHECKING:
    from flashserve.api.v1alpha1 import AutoscalingSpec

ACTIVE, ADVISORY = "Active", "Advisory"

# Decision reasons (CamelCase, for status, Events and the operator's decisions-by-reason metric).
SLA_BREACH = "SLABreach"
TTFT_BREACH = "TTFTBreach"
SLA_AT_RISK = "SLAAtRisk"
SURPLUS_RELEASED = "SurplusReleased"
BELOW_MIN = "BelowMin"
ABOVE_MAX = "AboveMax"
AT_MAX = "AtMax"
HOLD_MISSING_METRICS = "HoldMissingMetrics"
HOLD_STALE_METRICS = "HoldStaleMetrics"
HOLD_NO_READY = "HoldNoReadyReplicas"
HOLD_PENDING = "HoldPendingPods"
HOLD_STARTING = "HoldStartingReplicas"
HOLD_STABILIZING = "HoldStabilizing"
HOLD_SLA_UNREACHABLE = "HoldSLAUnreachable"
HOLD_SURPLUS = "HoldSurplus"
STEADY = "Steady"

# Condition types and their reasons.
METRICS_AVAILABLE = "MetricsAvailable"
SCALING_LIMITED = "ScalingLimited"
METRICS_FRESH = "MetricsFresh"
METRICS_MISSING = "MetricsMissing"
METRICS_STALE = "MetricsStale"
PENDING_PODS = "PendingPods"
AT_MIN = "AtMin"
WITHIN_LIMITS = "WithinLimits"

# SLA states for status.slaState.
SLA_MET, SLA_AT_RISK_STATE, SLA_BREACHED, SLA_UNKNOWN = "Met", "AtRisk", "Breached", "Unknown"

# Below this KV usage the ratio running/usage extrapolates too far to say anything about a memory limit.
KV_SIGNIFICANT = 0.5
# A breach this deep is acted on at once; shallower ones must last PolicyConfig.breach_confirm_s.
SEVERE_BREACH = 0.9
# The breaching window's own capacity estimate replaces the learned one only below this share of it.
LOCAL_OVERRIDE = 0.85
# Speeds within this factor above the SLA report the SLA as AtRisk.
AT_RISK_MARGIN = 1.05


@dataclass(frozen=True)
class PolicyConfig:
    """The AutoscalingSpec, resolved, plus the few knobs the spec does not expose."""

    min_replicas: int = 1
    max_replicas: int = 4
    sla_tokens_per_s: float = 100.0
    percentile: float = 90.0
    ttft_seconds: float | None = None
    evaluation_interval_s: float = 15.0
    replica_startup_s: float = 900.0
    scale_up_stabilization_s: float = 0.0
    scale_down_delay_s: float | None = None
    """None: replica_startup_s."""
    scale_down_step: int | None = None
    """Groups released per step; None: one, except the first release after a scale-up, which takes the whole
    surplus (the replicas a backlog-sized order bought beyond what demand and the recent peak need)."""
    mode: str = ACTIVE
    prior_capacity: float = 200.0
    """Concurrent users per replica at the SLA before any is learned. The engine model of the default profile
    (agentic coding traffic, MTP) keeps p90 per-user speed >= 100 tok/s up to ~50 sequences per GPU, so 200
    for a 4-GPU GB200 replica; the operator should pass 50 x GPUs per replica (scaled for other SLAs)."""
    prior_low_load_tokens_per_s: float = 140.0
    """p90-side per-user speed of a nearly idle replica (same engine model: ~140 tok/s)."""
    metrics_window_s: float = 60.0
    """Rate window of the metric queries; windows that straddle a readiness change are not learned from."""
    max_metrics_age_s: float | None = None
    """Older engine samples count as stale; None: max(60 s, 4 evaluation intervals)."""
    scale_up_utilization: float = 1.0
    """Order replicas so that demand / (replicas x capacity) stays at or below this."""
    scale_down_utilization: float = 0.8
    """Release a replica only if the rest would run at or below this share of capacity (the hysteresis band
    between this and scale_up_utilization is what keeps steady noisy load from flapping)."""
    kv_usage_limit: float = 0.9
    """KV-cache usage a replica may be driven to before memory, not speed, caps its concurrency."""
    capacity_memory_s: float = 1200.0
    """Time constant of forgetting in the capacity learner: long enough for ~80 readings at 15 s, short
    enough to follow context lengths drifting over the day (an estimate too high would release replicas
    early)."""
    session_weight: float = 1.0
    """Weight of a session between turns in demand (it is expected back within seconds)."""
    overload_demand_at_sla: bool = False
    """Off by default. While users are below the SLA, count the running requests at the SLA speed (running x
    speed / SLA). By Little's law an overloaded fleet holds more requests than the same arrivals would at the
    SLA speed, and this part of a burst's backlog is gone once users are served at the SLA: sized as is, it buys
    replicas that arrive after the burst (docs/autoscaling-benchmark.md, cause 2). It is right for open-loop
    arrivals and agentic turns with tool calls in between (on the benchmark, seed 0: 17-18% fewer GPU-hours on
    the bursty scenarios at about the same attainment) and wrong for users who send the next request the
    moment the last ends (their number does not shrink): then each breach orders only speed/SLA of the
    shortfall, and the rest a start-up time later."""
    peak_memory_s: float | None = None
    """How long the highest recent demand keeps the replicas it needs (peak.py); None: 4 x replica_startup_s,
    0: release down to the demand of the moment."""
    trend_horizon_s: float | None = None
    """How far ahead a rising demand trend is projected when sizing the fleet; None: replica_startup_s (what
    is ordered now serves from then on), 0: no projection."""

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, **overrides: object) -> PolicyConfig:
        values: dict[str, object] = {
            "min_replicas": spec.min_replicas,
            "max_replicas": spec.max_replicas,
            "sla_tokens_per_s": spec.sla.per_user_tokens_per_second,
            "percentile": spec.sla.percentile,
            "ttft_seconds": spec.sla.ttft_seconds,
            "evaluation_interval_s": float(spec.evaluation_interval_seconds),
            "replica_startup_s": float(spec.replica_startup_seconds),
            "scale_up_stabilization_s": float(spec.scale_up.stabilization_seconds),
            "scale_down_delay_s": (
                float(spec.scale_down.delay_seconds) if spec.scale_down.delay_seconds is not None else None
            ),
            "scale_down_step": spec.scale_down.step,
            "peak_memory_s": (
                float(spec.scale_down.peak_window_seconds)
                if spec.scale_down.peak_window_seconds is not None
                else None
            ),
            "mode": spec.mode,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def down_delay_s(self) -> float:
        return self.replica_startup_s if self.scale_down_delay_s is None else self.scale_down_delay_s

    @property
    def stale_after_s(self) -> float:
        if self.max_metrics_age_s is not None:
            return self.max_metrics_age_s
        return max(60.0, 4.0 * self.evaluation_interval_s)

    @property
    def settle_s(self) -> float:
        """Time for the metric windows to show the effect of the last change."""
        return max(self.metrics_window_s + 2.0 * self.evaluation_interval_s, 3.0 * self.evaluation_interval_s)

    @property
    def breach_confirm_s(self) -> float:
        """How long a breach the model does not explain must last before it alone adds a replica."""
        return max(2.0 * self.evaluation_interval_s, 30.0)

    @property
    def peak_window_s(self) -> float:
        return 4.0 * self.replica_startup_s if self.peak_memory_s is None else self.peak_memory_s

    @property
    def horizon_s(self) -> float:
        return self.replica_startup_s if self.trend_horizon_s is None else self.trend_horizon_s

    def prior(self) -> CapacityPrior:
        return CapacityPrior(self.prior_capacity, self.prior_low_load_tokens_per_s, self.sla_tokens_per_s)


@dataclass(frozen=True)
class ReplicaCounts:
    """Replica groups with an index below spec.replicas (groups being removed are not counted)."""

    desired: int
    """spec.replicas now."""
    ready: int
    """Groups whose pods are all ready (serving)."""
    starting: int = 0
    """Groups created and scheduled but not ready yet (pulling, loading weights, capturing graphs)."""
    pending: int = 0
    """Groups with a pod that cannot be scheduled (Pending/Unschedulable): the pool is exhausted."""


@dataclass(frozen=True)
class PolicyInputs:
    now: float
    """Seconds on any clock that only moves forward; the same clock across evaluations."""
    metrics: MetricsSnapshot | None
    """None when Prometheus could not be read."""
    replicas: ReplicaCounts
    config: PolicyConfig
    metrics_error: str | None = None
    """Why `metrics` is None, for the condition's message."""


@dataclass(frozen=True)
class PolicyState:
    """What must survive between evaluations (and operator restarts, via `to_dict`)."""

    capacity: CapacityModel = field(default_factory=CapacityModel)
    demand: DemandTrend = field(default_factory=DemandTrend)
    peaks: PeakMemory = field(default_factory=PeakMemory)
    last_desired: int | None = None
    """The value this autoscaler last set, in Active mode; a different spec.replicas is an outside edit."""
    last_change_at: float | None = None
    last_direction: int = 0
    surplus_since: float | None = None
    releasing: bool = False
    """A release is under way: the next step waits only the settle time, not the whole delay."""
    breach_since: float | None = None
    at_risk_since: float | None = None
    at_risk_want: int | None = None
    """Smallest replica count wanted since at_risk_since: a predicted shortfall is sized on it."""
    ready: int | None = None
    ready_changed_at: float | None = None
    sla_met_at: float | None = None
    """Last evaluation whose users were at or above the SLA: a fleet that met it is not slow at any load."""

    def to_dict(self) -> dict:
        out: dict = {"capacity": self.capacity.to_dict(), "demand": self.demand.to_dict()}
        if self.peaks.buckets:
            out["peaks"] = self.peaks.to_dict()
        for key in ("last_desired", "last_change_at", "surplus_since", "breach_since", "at_risk_since",
                    "at_risk_want", "ready", "ready_changed_at", "sla_met_at"):  # fmt: skip
            value = getattr(self, key)
            if value is not None:
                out[_camel(key)] = value
        if self.last_direction:
            out["lastDirection"] = self.last_direction
        if self.releasing:
            out["releasing"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> PolicyState:
        """Tolerant: anything missing or malformed falls back to its default, so a hand-edited or older
        annotation never breaks the operator."""
        if not isinstance(data, dict):
            return cls()

        def num(key: str, kind: type = float) -> float | int | None:
            value = data.get(_camel(key))
            try:
                return kind(value) if value is not None and math.isfinite(float(value)) else None
            except (TypeError, ValueError, OverflowError):
                return None

        return cls(
            capacity=CapacityModel.from_dict(data.get("capacity")),
            demand=DemandTrend.from_dict(data.get("demand")),
            peaks=PeakMemory.from_dict(data.get("peaks")),
            last_desired=num("last_desired", int),
            last_change_at=num("last_change_at"),
            last_direction=int(num("last_direction", int) or 0),
            surplus_since=num("surplus_since"),
            releasing=data.get("releasing") is True,
            breach_since=num("breach_since"),
            at_risk_since=num("at_risk_since"),
            at_risk_want=num("at_risk_want", int),
            ready=num("ready", int),
            ready_changed_at=num("ready_changed_at"),
            sla_met_at=num("sla_met_at"),
        )


@dataclass(frozen=True)
class ConditionHint:
    type: str
    status: str
    """"True" or "False", as Kubernetes conditions spell them."""
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    desired: int
    """Replicas the policy wants."""
    current: int
    """spec.replicas it was given."""
    apply: bool
    """Write `desired` to spec.replicas: Active mode and a change. Advisory mode never applies."""
    reason: str
    message: str
    sla_state: str
    """Met, AtRisk, Breached or Unknown."""
    capacity: float
    """Concurrent users per replica at the SLA the decision used."""
    capacity_learned: bool
    """False while the capacity is still the prior."""
    readings: dict
    conditions: tuple[ConditionHint, ...]
    state: PolicyState
    """Pass this to the next call (and persist `state.to_dict()`)."""
    overrode_outside_change: bool = False
    """spec.replicas had been changed by someone else (e.g. kubectl scale); in Active mode it is overwritten."""

    @property
    def direction(self) -> int:
        return (self.desired > self.current) - (self.desired < self.current)

    def condition(self, type_: str) -> ConditionHint:
        return next(c for c in self.conditions if c.type == type_)


def decide(inputs: PolicyInputs, state: PolicyState) -> Decision:
    cfg, now, reps = inputs.config, inputs.now, inputs.replicas
    current = reps.desired
    active = cfg.mode == ACTIVE
    outside = active and state.last_desired is not None and current != state.last_desired
    base = state.last_desired if outside and state.last_desired is not None else current

    ready_changed_at = state.ready_changed_at
    if state.ready is None or ready_changed_at is None:
        # First sight (autoscaling just enabled, or state lost): assume the fleet has been as it is for a
        # while rather than freezing learning and breach handling for a settle time.
        ready_changed_at = now - cfg.settle_s
    elif state.ready != reps.ready:
        ready_changed_at = now

    metrics_ok, metrics_reason, metrics_msg, age = _metrics_status(inputs)
    readings: dict = {
        "current": current,
        "ready": reps.ready,
        "starting": reps.starting,
        "pending": reps.pending,
        "metricsAgeSeconds": _r(age),
    }
    nxt = replace(state, ready=reps.ready, ready_changed_at=ready_changed_at)
    m = inputs.metrics if metrics_ok else None
    if m is None or reps.ready <= 0:
        # Blind: the learned model stays as it was; timers restart so that no scale-down fires on the first
        # fresh reading after a gap.
        out = _Outcome(
            target=base,
            reason=HOLD_NO_READY if m is not None else _hold_reason(metrics_reason),
            message=metrics_msg if m is None else "no replica is ready yet: demand cannot be read from the engines",
            want=base,
            sla_state=SLA_UNKNOWN,
            capacity=state.capacity.capacity(cfg.prior()),
            state=replace(nxt, surplus_since=None, releasing=False, breach_since=None, at_risk_since=None,
                          at_risk_want=None),  # fmt: skip
        )
    else:
        out = _decide_on_metrics(cfg, now, reps, base, m, nxt, readings, now - ready_changed_at)

    target, reason, message = _bounds(cfg, base, out.target, out.reason, out.message)
    if outside:
        message += f" (spec.replicas {current} was set outside the autoscaler; it owns spec.replicas)"
    nxt = out.state
    if active:
        nxt = replace(nxt, last_desired=target)
        if target != base:
            nxt = replace(nxt, last_change_at=now, last_direction=(target > base) - (target < base))
    else:
        nxt = replace(nxt, last_desired=None)
    readings["desired"] = target
    direction = (target > current) - (target < current)
    return Decision(
        desired=target,
        current=current,
        apply=active and direction != 0,
        reason=reason,
        message=message,
        sla_state=out.sla_state,
        capacity=out.capacity,
        capacity_learned=nxt.capacity.n > 0,
        readings=readings,
        conditions=(
            ConditionHint(METRICS_AVAILABLE, "True" if metrics_ok else "False", metrics_reason, metrics_msg),
            _limited(cfg, reps, out.want),
        ),
        state=nxt,
        overrode_outside_change=outside and target != current,
    )


@dataclass(frozen=True)
class _Outcome:
    target: int
    reason: str
    message: str
    want: int
    sla_state: str
    capacity: float
    state: PolicyState


def _decide_on_metrics(
    cfg: PolicyConfig,
    now: float,
    reps: ReplicaCounts,
    base: int,
    m: MetricsSnapshot,
    state: PolicyState,
    readings: dict,
    ready_stable_s: float,
) -> _Outcome:
    prior = cfg.prior()
    sla = cfg.sla_tokens_per_s
    running = m.running or 0.0
    waiting = m.waiting or 0.0
    served = running
    if cfg.overload_demand_at_sla and m.speed_at_percentile is not None and 0 < m.speed_at_percentile < sla:
        served = running * m.speed_at_percentile / sla
    sessions = (m.sessions_between_turns or 0.0) * cfg.session_weight
    demand = served + waiting + sessions
    # Concurrency per replica over the window the speed was measured in; only ready replicas get traffic.
    conc = (m.running_avg if m.running_avg is not None else running) / reps.ready
    conc_now = running / reps.ready
    speed = m.speed_at_percentile
    window_clean = ready_stable_s >= cfg.metrics_window_s

    # ---- capacity: learned speed curve, then memory and admission limits
    model = state.capacity
    # Deep overload: a severe breach at a concurrency beyond the capacity learned so far, in a fleet that met
    # the SLA within the learning memory or well below what the learned line says of that concurrency. Past
    # capacity the engine queues and preempts and 1/speed bends up, so such a window says the fleet is short
    # but not by how much: a line through its point does not size the scale-up (cap_local below), and it is
    # not learned from either, queue or not: it would drag the fitted line's crossing of the SLA below where
    # it is (a burst's windows at 0.6x the SLA cut a fleet's learned capacity by a fifth to a third for the
    # next twenty minutes, and the fleet then held that many more replicas than the next burst needed). A
    # replica that is slow at any load never meets the SLA and stays on its line: it is learned from, and
    # the model finds out that the SLA is out of reach.
    a0, b0 = model.fit(prior)
    met_recently = state.sla_met_at is not None and now - state.sla_met_at <= cfg.capacity_memory_s
    deep_overload = (
        speed is not None
        and running > 0
        and speed < SEVERE_BREACH * sla
        and conc > model.capacity(prior)
        and (met_recently or speed * (a0 + b0 * conc) < SEVERE_BREACH)
    )
    sla_met_at = now if window_clean and speed is not None and speed >= sla and running > 0 else state.sla_met_at
    if window_clean and speed is not None and conc > 0 and not deep_overload:
        model = model.observe(now, conc, speed, cfg.capacity_memory_s)
    a, b = model.fit(prior)
    reachable = a < 1.0 / sla
    # An SLA the fitted curve puts beyond even an idle replica is not bought with more replicas: size the fleet
    # on the prior instead of sending it to maxReplicas, and say so.
    cap_speed = clamp_capacity(capacity_from_line(a, b, sla), prior) if reachable else prior.capacity
    cap = cap_speed
    cap_kv = None
    if m.kv_usage_avg is not None and m.kv_usage_avg >= KV_SIGNIFICANT and conc_now > 0:
        cap_kv = conc_now * cfg.kv_usage_limit / m.kv_usage_avg
        cap = min(cap, cap_kv)

    # ---- breaches
    speed_breach = speed is not None and speed < sla and running > 0
    ttft_breach = bool(
        cfg.ttft_seconds is not None
        and m.ttft_at_percentile_s is not None
        and m.ttft_at_percentile_s > cfg.ttft_seconds
        and waiting > 0
    )
    breached = speed_breach or ttft_breach
    breach_since = (state.breach_since if state.breach_since is not None else now) if breached else None
    confirmed = breach_since is not None and now - breach_since >= cfg.breach_confirm_s
    severe = speed_breach and speed is not None and speed < SEVERE_BREACH * sla
    cap_local = None
    # Not in deep overload: there 1/speed has bent up past the line, and a line through the window's point
    # would put the capacity too low and order for a fleet the burst never needed.
    if speed_breach and reachable and window_clean and (confirmed or severe) and not deep_overload:
        # The window's own verdict: if the learned line still claims room, trust what users see. Not on a
        # single marginal miss, though: near capacity, noise alone dips below the SLA now and then, and one
        # noisy point would size a whole scale-up.
        cap_local = capacity_through(a, conc, speed or 0.0, sla)
        # One window's point is noisy (5% on speed is ~15% on capacity far from the SLA): override the
        # learned value only when they clearly disagree; the learner has taken the point in anyway.
        if cap_local is not None and cap_local < LOCAL_OVERRIDE * cap:
            cap = max(cap_local, 1.0)
    if ttft_breach and conc_now > 0:
        # Requests queue long enough to miss the TTFT target: admission (KV blocks or max_num_seqs), not
        # speed, binds, at the concurrency running now.
        cap = min(cap, conc_now)

    # ---- demand to plan for: what a replica ordered now will meet when it is ready
    trend = state.demand.update(now, demand, cfg.stale_after_s)
    projected = trend.forecast(cfg.horizon_s) if trend.trend > 0 else None
    plan = max(demand, projected or 0.0)
    # Remembered for releases: the requests being served, counted at the SLA speed when users are below it,
    # plus the sessions between turns. Not the queue and not the trend: right after an overload both are the
    # fleet's own backlog, which drains in a minute or two, and would hold a fleet sized for it for the whole
    # window.
    served_at_sla = running * min(1.0, speed / sla) if speed is not None and speed > 0 else running
    peaks = state.peaks.update(now, served_at_sla + sessions, cfg.peak_window_s)
    recent_peak = peaks.peak(now, cfg.peak_window_s)

    want = math.ceil(plan / (cap * cfg.scale_up_utilization) - 1e-9) if plan > 0 else 0
    readings.update(
        demand=_r(demand),
        demandTrendPerMinute=_r(trend.trend * 60.0),
        demandPlanned=_r(plan),
        running=_r(running),
        waiting=_r(waiting),
        concurrencyPerReplica=_r(conc),
        speedAtPercentile=_r(speed),
        speedSource=m.speed_source,
        speedP50=_r(m.speed_p50),
        speedFromCounters=_r(m.speed_from_counters),
        tokensPerStep=_r(m.tokens_per_step),
        tokensPerSecond=_r(m.tokens_per_second),
        kvUsageAvg=_r(m.kv_usage_avg),
        kvUsageMax=_r(m.kv_usage_max),
        ttftAtPercentileSeconds=_r(m.ttft_at_percentile_s),
        capacitySpeed=_r(cap_speed),
        capacityKV=_r(cap_kv),
        capacityLocal=_r(cap_local),
        capacity=_r(cap),
        slaReachable=reachable,
        fitA=_r(a, 9),
        fitB=_r(b, 9),
        required=want,
    )
    speed_txt = f"p{cfg.percentile:g} per-user speed {_fmt(speed)} tok/s (SLA {sla:g})"
    rising = f" (rising to {plan:.0f} in {cfg.horizon_s:.0f}s)" if plan > demand + 0.5 else ""
    load_txt = f"demand {demand:.0f}{rising} at {cap:.0f} users/replica needs {want}"

    target, reason, message = base, STEADY, f"{speed_txt}; {load_txt}; have {base}"
    at_risk_since: float | None = None
    at_risk_want: int | None = None
    surplus_since, releasing = state.surplus_since, state.releasing
    if want > base:
        surplus_since, releasing = None, False
        at_risk_since = state.at_risk_since if state.at_risk_since is not None else now
        at_risk_want = want if state.at_risk_want is None else min(want, state.at_risk_want)
        # Users already below target: act now on the full shortfall. A shortfall only predicted (demand up,
        # speed still fine, or a marginal miss) must show at two evaluations in a row and is sized on the
        # smaller of them, so that one noisy reading does not buy a replica for a start-up time.
        urgent = ttft_breach or (speed_breach and (confirmed or severe))
        wait = cfg.scale_up_stabilization_s if urgent else max(cfg.scale_up_stabilization_s, cfg.evaluation_interval_s)
        size = want if urgent else at_risk_want
        up_reason = SLA_BREACH if speed_breach else TTFT_BREACH if ttft_breach else SLA_AT_RISK
        if now - at_risk_since < wait:
            reason = HOLD_STABILIZING
            message = f"{speed_txt}; {load_txt}; confirming for {wait:g}s before adding"
        elif reps.pending > 0:
            reason = HOLD_PENDING
            message = (
                f"{speed_txt}; {load_txt}; {reps.pending} replica group(s) cannot be scheduled, "
                "adding no more until they are placed"
            )
        elif base >= cfg.max_replicas:
            reason = AT_MAX
            message = f"{speed_txt}; {load_txt}; already at maxReplicas {cfg.max_replicas}"
        else:
            target, reason = max(size, base + 1), up_reason
            message = f"{speed_txt}; {load_txt}; {base} -> {min(target, cfg.max_replicas)}"
            # the next shortfall, if any, is measured against the new count
            at_risk_since, at_risk_want = None, None
    elif breached:
        surplus_since, releasing = None, False
        if not reachable:
            reason = HOLD_SLA_UNREACHABLE
            message = f"{speed_txt}; even an idle replica misses the SLA by the fitted curve; more replicas won't help"
        elif reps.starting > 0 or reps.ready < base:
            reason = HOLD_STARTING
            message = f"{speed_txt}; {load_txt}; {base - reps.ready} replica group(s) still starting"
        else:
            reason = HOLD_STABILIZING
            message = f"{speed_txt}; {load_txt}; confirming the breach before sizing it"
    else:
        release_need = math.ceil(plan / (cap * cfg.scale_down_utilization) - 1e-9) if plan > 0 else 0
        # The peak is held at what serving it needs (the scale-up line), not with the release hysteresis: it
        # is already the maximum of a long window, there is no noise left to band against.
        peak_need = math.ceil(recent_peak / (cap * cfg.scale_up_utilization) - 1e-9) if recent_peak > 0 else 0
        release_need = max(release_need, peak_need)
        readings["requiredForRelease"] = release_need
        readings["recentPeak"] = _r(recent_peak)
        candidate = max(base - (cfg.scale_down_step or 1), cfg.min_replicas, release_need)
        if cfg.scale_down_step is None and state.last_direction > 0 and not releasing:
            # The first release since the fleet last grew. A scale-up in overload is sized on running + waiting
            # requests, a stock that slow service swells (each request stays longer, and the queue holds what
            # the engines cannot admit), so it can buy twice what the same users need at the SLA. Once the
            # surplus has lasted the delay, with the peak memory still holding what the recent peak needed,
            # the replicas beyond that were never needed: they go in one step, not one per settle time.
            candidate = max(cfg.min_replicas, release_need)
        if candidate < base:
            surplus_since = surplus_since if surplus_since is not None else now
            wait = cfg.settle_s if releasing else cfg.down_delay_s
            lasted = now - surplus_since
            if lasted >= wait:
                target, reason = candidate, SURPLUS_RELEASED
                message = f"{speed_txt}; {load_txt}; surplus for {lasted:.0f}s, {base} -> {candidate}"
                surplus_since, releasing = now, True
            else:
                reason = HOLD_SURPLUS
                message = f"{speed_txt}; {load_txt}; surplus for {lasted:.0f}s of {wait:.0f}s before release"
        else:
            surplus_since, releasing = None, False

    if breached:
        sla_state = SLA_BREACHED
    elif want > base or (speed is not None and speed < AT_RISK_MARGIN * sla and running > 0):
        sla_state = SLA_AT_RISK_STATE
    elif speed is None and running > 0:
        sla_state = SLA_UNKNOWN
    else:
        sla_state = SLA_MET
    return _Outcome(
        target=target,
        reason=reason,
        message=message,
        want=want,
        sla_state=sla_state,
        capacity=cap,
        state=replace(
            state,
            capacity=model,
            demand=trend,
            peaks=peaks,
            sla_met_at=sla_met_at,
            surplus_since=surplus_since,
            releasing=releasing,
            breach_since=breach_since,
            at_risk_since=at_risk_since,
            at_risk_want=at_risk_want,
        ),
    )


def _metrics_status(inputs: PolicyInputs) -> tuple[bool, str, str, float | None]:
    m = inputs.metrics
    if m is None:
        return False, METRICS_MISSING, inputs.metrics_error or "no metrics for this serving", None
    age = m.sample_age_s + max(0.0, inputs.now - m.time)
    limit = inputs.config.stale_after_s
    if not math.isfinite(age) or age > limit:
        return False, METRICS_STALE, f"newest engine sample is {age:.0f}s old (limit {limit:.0f}s)", age
    if m.running is None:
        return False, METRICS_MISSING, "Prometheus has no vllm:num_requests_running for this serving", age
    return True, METRICS_FRESH, f"engine metrics {age:.0f}s old", age


def _hold_reason(metrics_reason: str) -> str:
    return HOLD_STALE_METRICS if metrics_reason == METRICS_STALE else HOLD_MISSING_METRICS


def _bounds(cfg: PolicyConfig, base: int, target: int, reason: str, message: str) -> tuple[int, str, str]:
    """min/max always win, with or without metrics: they are the user's explicit limits."""
    if target < cfg.min_replicas:
        return cfg.min_replicas, BELOW_MIN, f"{message}; raised to minReplicas {cfg.min_replicas}"
    if target > cfg.max_replicas:
        if base > cfg.max_replicas:
            return cfg.max_replicas, ABOVE_MAX, f"{message}; lowered to maxReplicas {cfg.max_replicas}"
        return cfg.max_replicas, reason, f"{message}; capped at maxReplicas {cfg.max_replicas}"
    return target, reason, message


def _limited(cfg: PolicyConfig, reps: ReplicaCounts, want: int) -> ConditionHint:
    if reps.pending > 0:
        return ConditionHint(
            SCALING_LIMITED, "True", PENDING_PODS,
            f"{reps.pending} replica group(s) Pending/Unschedulable (GPU pool exhausted?); not adding more",
        )  # fmt: skip
    if want > cfg.max_replicas:
        return ConditionHint(SCALING_LIMITED, "True", AT_MAX, f"wants {want}, capped at maxReplicas {cfg.max_replicas}")
    if want < cfg.min_replicas:
        return ConditionHint(SCALING_LIMITED, "True", AT_MIN, f"wants {want}, held at minReplicas {cfg.min_replicas}")
    return ConditionHint(SCALING_LIMITED, "False", WITHIN_LIMITS, "")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _r(v: float | None, digits: int = 4) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"
