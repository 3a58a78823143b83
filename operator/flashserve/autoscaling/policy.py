"""The autoscaling policy: a pure function from (metrics, replica counts, spec, remembered state) to a decision.

The operator calls `decide` every evaluation interval and the benchmark's simulator calls the very same
function in virtual time, so nothing here reads a clock, the network or the cluster.

In short (docs/autoscaling.md has the long form):

* demand = running + waiting requests (+ agentic sessions between turns when known), planned ahead by its
  rising trend over the start-up time (trend.py); with the router's arrival rate, once users have been well
  below the SLA for a metrics window, the running part is capped at what the arrivals keep running at the
  SLA (Little's law: steps.demand_from_arrivals);
* capacity = concurrent users one replica serves at the SLA, learned online (capacity.py), and lowered when
  the KV cache rather than speed is the limit;
* up: when demand exceeds what the replicas already ordered (ready + starting) serve at the SLA, or the SLA
  is observed breached, order the whole shortfall in one go;
* up in deep overload (users far below the SLA, concurrency beyond the learned capacity): sized on the
  learned capacity, not on a line through the overloaded window (1/speed bends up past capacity), and not
  learned from (unless the fleet never met the SLA and the window lies on the learned line: slow at any load);
* down: one step at a time, only when the replicas left would run at <= 80% of capacity, and only after the
  surplus has lasted scaleDown.delaySeconds (the start-up time by default: a replica is not given up for
  less than it costs to get back - the ski-rental rule); then one step per settle time while it lasts, or
  straight to what is needed while demand falls fast;
  the first release after a scale-up takes the whole surplus at once (a scale-up in overload is sized on a
  backlog and can overshoot); an explicit scaleDown.step is honoured as is;
  never below what the highest demand of the last four start-up times needed (peak.py: a burst shorter than
  a start-up is only served by replicas that are already there);
* no fresh metrics, or no ready replica: hold (only min/max are enforced); pending pods: add nothing more.
* the start-up time of every horizon above is learned from the serving's completed start-ups, per cache
  state (startup.py); the spec's replicaStartupSeconds is its prior and the value until one is seen.

This module holds the interface (config, inputs, state, decision), the blind path and the limits; steps.py
the steps of a decision on a fresh reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from flashserve.autoscaling.capacity import (
    LOW_LOAD_TOKENS_PER_S,
    CapacityModel,
    CapacityPrior,
    prior_users_per_replica,
)
from flashserve.autoscaling.peak import PeakMemory, Recurrence
from flashserve.autoscaling.reasons import (
    ABOVE_MAX,
    AT_MAX,
    AT_MIN,
    BELOW_MIN,
    HOLD_MISSING_METRICS,
    HOLD_NO_READY,
    HOLD_STALE_METRICS,
    METRICS_AVAILABLE,
    METRICS_FRESH,
    METRICS_MISSING,
    METRICS_STALE,
    PENDING_PODS,
    SCALING_LIMITED,
    SLA_UNKNOWN,
    WITHIN_LIMITS,
)
from flashserve.autoscaling.replicas import ReplicaCounts
from flashserve.autoscaling.snapshot import MetricsSnapshot
from flashserve.autoscaling.startup import StartupLearner, StartupSample
from flashserve.autoscaling.steps import SEVERE_BREACH, Outcome, decide_on_metrics, rounded
from flashserve.autoscaling.trend import DemandTrend

if TYPE_CHECKING:
    from flashserve.api.v1alpha1 import AutoscalingSpec

ACTIVE, ADVISORY = "Active", "Advisory"
# The replica shape PolicyConfig's default prior is for.
DEFAULT_GPUS_PER_REPLICA = 4
# The peak memory outlasts a recurring gap by this much: the last high lies up to a bucket (1/8 of the
# window) before the memory's newest bucket starts, and a burst's rise takes a metrics window to read.
RECURRENCE_MARGIN = 1.25


_KNOB_RANGES: dict[str, tuple[float, bool, float | None]] = {
    # field: (lowest, lowest excluded, highest or None)
    "percentile": (0.0, True, 100.0),
    "prior_capacity": (0.0, True, None),
    "prior_low_load_tokens_per_s": (0.0, True, None),
    "max_metrics_age_s": (0.0, True, None),
    "scale_up_utilization": (0.0, True, None),
    "scale_down_utilization": (0.0, True, None),
    "kv_usage_limit": (0.0, True, 1.0),
    "capacity_memory_s": (0.0, True, None),
    "session_weight": (0.0, False, None),
    "severe_breach": (0.0, True, 1.0),
    "overload_wave": (0.0, True, None),
    "release_share": (0.0, True, 1.0),
    "peak_window_max_s": (0.0, False, None),
    "down_delay_max_s": (0.0, False, None),
    "peak_queue_max_ratio": (0.0, False, None),
    "peak_window_startups": (0.0, False, None),
    "peak_recurrence_s": (0.0, False, None),
    "peak_full_startups": (0.0, False, None),
    "peak_skip_fall": (0.0, False, None),
    "trend_horizon_s": (0.0, False, None),
    "trend_horizon_startups": (0.0, False, None),
    "trend_lead_s": (0.0, False, None),
}
"""The values each PolicyConfig knob may take: those the AutoscalingSpec does not expose, and the SLA percentile
again, which the benchmark's --flashserve-set can set past the API server's bounds."""


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
    release_share: float | None = None
    """Off (None) by default: mid-release, one group per settle time. A share in (0, 1]: each release after
    the first takes that share of the surplus (at least one group), so a fleet far above what demand and the
    recent peak need comes down geometrically rather than one group per settle time. Measured on the train set,
    not shipped: docs/autoscaling-benchmark.md, "The release, measured"."""
    release_on_fall: bool = True
    """On by default. Mid-release, while the demand trend falls by at least one replica's worth per settle
    time, each release goes down to the need in one step (the peak memory still bounds it): one group per
    settle time falls behind a decline that fast. With demand flat (the surplus is a peak memory that
    expired) releases stay one group per settle time. Off: one group per settle time always. Chosen on the
    train set: docs/autoscaling-benchmark.md, "The release, measured"."""
    mode: str = ACTIVE
    prior_capacity: float = prior_users_per_replica(DEFAULT_GPUS_PER_REPLICA, 100.0)
    """Concurrent users per replica at the SLA before any is learned. `from_spec` derives it from the replica's
    GPUs and the SLA (capacity.prior_users_per_replica) unless initialCapacity sets it; the default is that
    of a 4-GPU replica at 100 tok/s."""
    prior_low_load_tokens_per_s: float = LOW_LOAD_TOKENS_PER_S
    """p90-side per-user speed of a nearly idle replica: where the prior line meets zero concurrency."""
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
    severe_breach: float = SEVERE_BREACH
    """Users below this share of the SLA are a severe breach (acted on at once, without breach_confirm_s) and,
    with concurrency past the learned capacity, deep overload (sized on the learned capacity, not learned
    from); the router's arrivals cap the running demand only below it."""
    overload_wave: float | None = None
    """Off (None) by default. In deep overload, order at most this many times the ready replicas: the rest
    is sized when that wave is ready and the bigger fleet measures the crowd at a higher service rate. A
    closed-loop crowd queued in the engines is a stock that slow service swells, so an order sized on it in
    one go can buy maxReplicas for users who need half that. Measured on the train set, not shipped:
    docs/autoscaling-benchmark.md, "The overshoot on large steps, on a bigger train set"."""
    peak_window_max_s: float | None = None
    """None (no cap) by default. The most the peak memory in start-up times (peak_window_startups) may be:
    with a long start-up four of them outlast a crowd and the run, and hold what its tail needed. Measured on
    the train set, not shipped: docs/autoscaling-benchmark.md, "The overshoot on large steps, on a bigger
    train set"."""
    down_delay_max_s: float | None = None
    """None (no cap) by default. The most the scale-down delay may be while scale_down_delay_s is unset (it
    is then one start-up time, which after a crowd on a long start-up holds the whole order for as long).
    Measured on the train set, not shipped: docs/autoscaling-benchmark.md, "The overshoot on large steps, on
    a bigger train set"."""
    peak_from_overload: bool = True
    """On by default. False: deep-overload windows are not remembered as peaks. In deep overload the engines
    run what the fleet can hold, and after a crowd the backlog's drain fills them, so the window says the
    fleet is short, not what the users need; remembered, it holds the replicas a drain took for the whole
    peak memory. Measured on the train set, not shipped: docs/autoscaling-benchmark.md, "The overshoot on
    large steps, on a bigger train set"."""
    peak_queue_max_ratio: float | None = None
    """Off (None) by default. Only windows with at most this many requests waiting per running request (and
    half a request more) are remembered as peaks: a queue that large says the fleet is short or draining a
    backlog, so the window measures the fleet, not the users. 0 remembers only windows with no queue.
    Measured on the train set, not shipped: docs/autoscaling-benchmark.md, "The overshoot on large steps, on
    a bigger train set"."""
    overload_demand_at_sla: bool = False
    """Off by default. While users are below the SLA, count the running requests at the SLA speed (running x
    speed / SLA). By Little's law an overloaded fleet holds more requests than the same arrivals would at the
    SLA speed, and this part of a burst's backlog is gone once users are served at the SLA: sized as is, it buys
    replicas that arrive after the burst. It suits open-loop arrivals and agentic turns with tool calls in
    between, and not users who send the next request the moment the last ends (their number does not
    shrink): then each breach orders only speed/SLA of the shortfall, and the rest a start-up time later.
    docs/autoscaling.md, Knobs, has what it was measured to save."""
    peak_memory_s: float | None = None
    """How long the highest recent demand keeps the replicas it needs (peak.py); None: peak_window_startups x
    replica_startup_s, 0: release down to the demand of the moment."""
    peak_window_startups: float = 4.0
    """The peak memory, in start-up times, while peak_memory_s is None (it follows the learned start-up)."""
    peak_full_startups: float | None = None
    """None (the default): a remembered high holds its replicas for the whole peak memory. A value: it holds
    them in full for this many start-up times, then less and less, to none at the memory's end
    (peak.PeakMemory.peak)."""
    peak_recurrence_s: float | None = None
    """None: off. While peak_memory_s is None, the peak memory also outlasts the gap between bursts that keep
    coming back (peak.Recurrence): at least RECURRENCE_MARGIN x the longest recent gap, at most this long.
    With short start-ups four of them end before the next burst, and what is released then is a start-up
    and a metrics window late for it."""
    peak_skip_fall: float | None = None
    """Off (None) by default. The peak memory skips a reading while the demand trend projects a fall of more
    than this share of the reading within one start-up time: after an overload the fleet drains the
    backlog at the SLA speed, and remembered, that drain holds replicas users do not need; a falling reading
    is never the level a next burst needs. Measured on the train set, not shipped:
    docs/autoscaling-benchmark.md, "Against the frontier on the train set"."""
    peak_needs_rise: bool = False
    """Off by default. While peak_memory_s is None, a peak memory window in which demand did not rise
    (peak.PeakMemory.rose: it only fell or stayed level, as through a day's decline or after a crowd that
    outlasted the window) keeps its peak for one start-up time only; a window holding a rise (a burst, a crowd
    that began inside it) keeps it for the whole window. Measured on the train set, not shipped:
    docs/autoscaling-benchmark.md, "Against the frontier on the train set"."""
    trend_horizon_s: float | None = None
    """How far ahead a rising demand trend is projected when sizing the fleet; None: trend_horizon_startups x
    replica_startup_s (what is ordered now serves from then on), 0: no projection."""
    trend_horizon_startups: float = 1.0
    """The trend horizon, in start-up times, while trend_horizon_s is None."""
    trend_lead_s: float = 0.0
    """Added to the trend horizon while trend_horizon_s is None: the time from a rise in demand to the order
    for it (scrapes, the two evaluations an at-risk order is confirmed over), which a short start-up does not
    cover. Measured on the train set: docs/autoscaling-benchmark.md, "Which constants were chosen on which set"."""
    learn_startup: bool = True
    """Replace replica_startup_s, in every horizon that defaults to it, by the start-up time learned from the
    start-ups the serving has had (startup.py); replica_startup_s is then the prior. False: the spec value
    always."""

    def __post_init__(self) -> None:
        # The spec's fields come through the API server's bounds; the knobs it does not expose are checked
        # here, so that a bad value (the benchmark's --flashserve-set) is refused by name, not met as a
        # division by zero mid-run or a rule silently turned off.
        for name, (lo, lo_open, hi) in _KNOB_RANGES.items():
            v = getattr(self, name)
            if v is None:
                continue
            if not math.isfinite(v) or v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
                want = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
                raise ValueError(f"{name}={v!r}: give a number {want}")
        if self.scale_down_utilization > self.scale_up_utilization:
            raise ValueError(f"scale_down_utilization={self.scale_down_utilization:g} is above scale_up_utilization="
                             f"{self.scale_up_utilization:g}: give one at or below it (the band between them is what "
                             "keeps steady load from flapping)")  # fmt: skip

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, gpus_per_replica: int | None = None, **overrides: object) -> PolicyConfig:
        """The spec, resolved. `gpus_per_replica` sizes the capacity prior for the replica's shape and the SLA
        (the operator and the benchmark both pass it); spec.initialCapacity, when set, is the prior instead.
        `overrides` replace any field."""
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
            "metrics_window_s": float(spec.metrics_window_seconds),
        }
        if spec.initial_capacity is not None:
            values["prior_capacity"] = float(spec.initial_capacity)
        elif gpus_per_replica is not None:
            low_load = overrides.get("prior_low_load_tokens_per_s", LOW_LOAD_TOKENS_PER_S)
            values["prior_capacity"] = prior_users_per_replica(
                gpus_per_replica, spec.sla.per_user_tokens_per_second, float(low_load)  # type: ignore[arg-type]
            )
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def down_delay_s(self) -> float:
        if self.scale_down_delay_s is not None:
            return self.scale_down_delay_s
        cap = self.down_delay_max_s
        return self.replica_startup_s if cap is None else min(self.replica_startup_s, cap)

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
        if self.peak_memory_s is not None:
            return self.peak_memory_s
        window = self.peak_window_startups * self.replica_startup_s
        return window if self.peak_window_max_s is None else min(window, self.peak_window_max_s)

    @property
    def peak_full_s(self) -> float | None:
        """How long a remembered high holds in full before it tapers; None: for the whole peak memory."""
        return None if self.peak_full_startups is None else self.peak_full_startups * self.replica_startup_s

    def peak_window_for(self, recurrence_gap_s: float) -> float:
        """The peak memory, given the gap after which bursts have been coming back (0: none seen)."""
        window = self.peak_window_s
        if self.peak_memory_s is not None or self.peak_recurrence_s is None or recurrence_gap_s <= 0:
            return window
        return max(window, min(self.peak_recurrence_s, RECURRENCE_MARGIN * recurrence_gap_s))

    @property
    def horizon_s(self) -> float:
        if self.trend_horizon_s is None:
            return self.trend_horizon_startups * self.replica_startup_s + self.trend_lead_s
        return self.trend_horizon_s

    def prior(self) -> CapacityPrior:
        return CapacityPrior(self.prior_capacity, self.prior_low_load_tokens_per_s, self.sla_tokens_per_s)


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
    startups: tuple[StartupSample, ...] = ()
    """Completed group start-ups seen (may repeat earlier ones: those already learned from are skipped)."""


@dataclass(frozen=True)
class PolicyState:
    """What must survive between evaluations (and operator restarts, via `to_dict`)."""

    capacity: CapacityModel = field(default_factory=CapacityModel)
    demand: DemandTrend = field(default_factory=DemandTrend)
    peaks: PeakMemory = field(default_factory=PeakMemory)
    recurrence: Recurrence = field(default_factory=Recurrence)
    startup: StartupLearner = field(default_factory=StartupLearner)
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
        if self.recurrence.high_at is not None:
            out["recurrence"] = self.recurrence.to_dict()
        if self.startup.n:
            out["startup"] = self.startup.to_dict()
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
            recurrence=Recurrence.from_dict(data.get("recurrence")),
            startup=StartupLearner.from_dict(data.get("startup")),
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
    startup_s: float | None = None
    """The start-up time the decision's horizons used: learned, or the spec value while none is learned."""
    startup_learned: bool = False
    """startup_s comes from observed start-ups (config.learn_startup and at least one seen)."""
    startup_by_cache_state: dict | None = None
    """Learned start-up seconds per cache state that has start-ups (cold, weights-cached, warm)."""

    @property
    def direction(self) -> int:
        return (self.desired > self.current) - (self.desired < self.current)

    def condition(self, type_: str) -> ConditionHint:
        return next(c for c in self.conditions if c.type == type_)


def decide(inputs: PolicyInputs, state: PolicyState) -> Decision:
    """The decision of one evaluation. Pure: reads neither a clock nor the cluster, changes neither argument;
    the state to remember is in the Decision."""
    learner = state.startup.observe(inputs.startups)
    if learner is not state.startup:
        state = replace(state, startup=learner)
    cfg, now, reps = _effective(inputs.config, learner), inputs.now, inputs.replicas
    current = reps.desired
    active = cfg.mode == ACTIVE
    outside = active and state.last_desired is not None and current != state.last_desired
    base = state.last_desired if outside and state.last_desired is not None else current

    ready_changed_at = _ready_changed_at(cfg, now, reps, state)
    metrics_ok, metrics_reason, metrics_msg, age = _metrics_status(inputs)
    nxt = replace(state, ready=reps.ready, ready_changed_at=ready_changed_at)
    m = inputs.metrics if metrics_ok else None
    if m is None or reps.ready <= 0:
        # Blind, an outside change is undone only upward: lowering a fleet nothing can be read from is no hold.
        out = _blind(cfg, max(base, current), nxt, HOLD_NO_READY if m is not None else _hold_reason(metrics_reason),
                     metrics_msg if m is None else "no replica is ready yet: demand cannot be read from the engines")  # fmt: skip
    else:
        out = decide_on_metrics(cfg, now, reps, base, m, nxt, now - ready_changed_at)

    target, reason, message = _bounds(cfg, base, out.target, out.reason, out.message)
    if outside and target != current:
        message += f" (spec.replicas {current} was set outside the autoscaler; it owns spec.replicas)"
    nxt = out.state
    if active:
        nxt = replace(nxt, last_desired=target)
        if target != base:
            nxt = replace(nxt, last_change_at=now, last_direction=(target > base) - (target < base))
    else:
        nxt = replace(nxt, last_desired=None)
    learned = cfg.learn_startup and learner.n > 0
    readings = {"current": current, "ready": reps.ready, "starting": reps.starting, "pending": reps.pending,
                "metricsAgeSeconds": rounded(age), **dict(out.readings), "desired": target,
                "startupSeconds": rounded(cfg.replica_startup_s)}  # fmt: skip
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
        startup_s=cfg.replica_startup_s,
        startup_learned=learned,
        startup_by_cache_state=(
            {k: rounded(v) for k, v in learner.estimates(inputs.config.replica_startup_s).items()} if learned else None
        ),
    )


def _effective(cfg: PolicyConfig, learner: StartupLearner) -> PolicyConfig:
    """The config the decision runs on: replica_startup_s is the learned start-up time (the spec value is its
    prior), so every horizon left to default follows it; explicit delays and windows stay as set."""
    if not cfg.learn_startup or learner.n == 0:
        return cfg
    return replace(cfg, replica_startup_s=learner.predict(cfg.replica_startup_s))


def _ready_changed_at(cfg: PolicyConfig, now: float, reps: ReplicaCounts, state: PolicyState) -> float:
    if state.ready is None or state.ready_changed_at is None:
        # First sight (autoscaling just enabled, or state lost): assume the fleet has been as it is for a
        # while rather than freezing learning and breach handling for a settle time.
        return now - cfg.settle_s
    return now if state.ready != reps.ready else state.ready_changed_at


def _blind(cfg: PolicyConfig, base: int, state: PolicyState, reason: str, message: str) -> Outcome:
    """No fresh reading, or no replica to read: hold. The learned model stays as it was; timers restart so
    that no scale-down fires on the first fresh reading after a gap."""
    return Outcome(
        target=base,
        reason=reason,
        message=message,
        want=base,
        sla_state=SLA_UNKNOWN,
        capacity=state.capacity.capacity(cfg.prior()),
        state=replace(state, surplus_since=None, releasing=False, breach_since=None, at_risk_since=None,
                      at_risk_want=None),  # fmt: skip
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
