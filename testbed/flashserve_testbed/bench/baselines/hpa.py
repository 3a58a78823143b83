"""Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on a Pods metric: running requests per pod.

Follows pkg/controller/podautoscaler: replica_calculator.go (GetMetricReplicas / calcPlainMetricReplicas,
groupPods) and horizontal.go (stabilizeRecommendationWithBehaviors, convertDesiredReplicasWithBehaviorRate)
with the default behavior:

* desired = ceil(ready pods x metric / target); no change while |1 - metric/target| <= 0.1;
* pods that are Running but have no metric yet (weights loading) are "missing": counted at 100% of target
  when scaling down and at 0 when scaling up, and the result may not reverse the direction; Pending pods
  (not yet scheduled or pulling the image) are ignored;
* every 15 s; scale-up stabilization 0 s (the lowest recommendation of the window), scale-down 300 s (the
  highest); at most max(4 pods, +100%) per 15 s up, -100% per 15 s down.

The metric is the instant `sum by (pod) (vllm:num_requests_running)` through prometheus-adapter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flashserve_testbed.bench.context import Context, Policy

TOLERANCE = 0.1


def plain_metric_replicas(current: int, ready_values: list[float], missing: int, target: float,
                          tolerance: float = TOLERANCE) -> int:  # fmt: skip
    """calcPlainMetricReplicas for a Pods metric with an AverageValue target."""
    if not ready_values:
        return current  # no metrics at all: the HPA reports an error and leaves the scale alone
    ratio = sum(ready_values) / len(ready_values) / target
    if missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * len(ready_values))
    fill = target if ratio < 1.0 else 0.0
    values = ready_values + [fill] * missing
    new_ratio = sum(values) / len(values) / target
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


def external_average_replicas(current: int, total: float, target: float, tolerance: float = TOLERANCE) -> int:
    """GetExternalPerPodMetricReplicas: an External metric with an AverageValue target."""
    if current <= 0:
        return math.ceil(total / target)
    ratio = total / (target * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(total / target)


@dataclass
class Behavior:
    """autoscaling/v2 HPAScalingRules, defaults as in the API (SetDefaults_HorizontalPodAutoscalerBehavior)."""

    up_window_s: float = 0.0
    down_window_s: float = 300.0
    up_pods: int = 4
    up_percent: float = 100.0
    up_period_s: float = 15.0
    down_percent: float = 100.0
    down_period_s: float = 15.0


@dataclass
class Stabilizer:
    """The HPA controller's per-autoscaler memory: recommendations and scale events."""

    behavior: Behavior = field(default_factory=Behavior)
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def normalize(self, now: float, current: int, desired: int, min_replicas: int, max_replicas: int) -> int:
        b = self.behavior
        up_rec = down_rec = desired
        for t, rec in self.recommendations:
            if t > now - b.up_window_s:
                up_rec = min(up_rec, rec)
            if t > now - b.down_window_s:
                down_rec = max(down_rec, rec)
        recommendation = current
        if recommendation < up_rec:
            recommendation = up_rec
        if recommendation > down_rec:
            recommendation = down_rec
        keep = max(b.up_window_s, b.down_window_s)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - keep] + [(now, desired)]
        if recommendation > current:
            added = sum(c for t, c in self.up_events if t > now - b.up_period_s)
            start = current - added
            limit = max(start + b.up_pods, math.ceil(start * (1.0 + b.up_percent / 100.0)))
            recommendation = min(recommendation, limit, max_replicas)
        elif recommendation < current:
            removed = sum(c for t, c in self.down_events if t > now - b.down_period_s)
            start = current + removed
            limit = math.ceil(start * (1.0 - b.down_percent / 100.0))
            recommendation = max(recommendation, limit, min_replicas)
        recommendation = min(max(recommendation, min_replicas), max_replicas)
        if recommendation > current:
            self.up_events.append((now, recommendation - current))
        elif recommendation < current:
            self.down_events.append((now, current - recommendation))
        horizon = max(b.up_period_s, b.down_period_s)
        self.up_events = [e for e in self.up_events if e[0] > now - horizon]
        self.down_events = [e for e in self.down_events if e[0] > now - horizon]
        return recommendation


class HPA(Policy):
    name = "hpa"
    interval_s = 15.0
    offset_s = 5.0
    knob = "target_running_per_pod"

    def __init__(self, target: float, behavior: Behavior | None = None, tolerance: float = TOLERANCE,
                 name: str = "hpa") -> None:  # fmt: skip
        self.target = target
        self.tolerance = tolerance
        self.stab = Stabilizer(behavior or Behavior())
        self.name = name
        self.knob_value = target

    def decide(self, ctx: Context) -> int | None:
        running = ctx.prom.gauge_by_pod(ctx.now, "running")
        ready = ctx.ready_pods()
        values = [running[p] for p in ready if p in running]
        # no metric yet: ready but not scraped since, or Running and still loading; Pending pods are ignored
        missing = (len(ready) - len(values)) + len(ctx.starting_pods("running"))
        desired = plain_metric_replicas(ctx.current, values, missing, self.target, self.tolerance)
        return self.stab.normalize(ctx.now, ctx.current, desired, ctx.min_replicas, ctx.max_replicas)


def default(capacity_per_replica: float) -> HPA:
    """Target: the load test's concurrency per replica at the SLA."""
    return HPA(capacity_per_replica)


def tuned(capacity_per_replica: float, startup_s: float) -> HPA:
    """Target 70% of the SLA concurrency: headroom for the growth that arrives while a replica starts (the
    best attainment per GPU-hour of the target sweep on flash-crowd seed 0, which no reported run uses)."""
    return HPA(0.7 * capacity_per_replica, name="hpa-tuned")


SWEEP = (0.55, 0.85, 1.15)
"""Target as a share of the SLA concurrency per replica."""
