"""AIBrix's APA strategy (vllm-project/aibrix pkg/controller/podautoscaler), controller defaults:

* every 10 s (resync), on a per-pod metric averaged over the APA window, here `vllm:num_requests_running`;
* if metric/target > 1 + 0.1 (up fluctuation tolerance): ceil(n x ratio), at most 2n (max scale-up rate 2);
  if < 1 - 0.1 (down tolerance): ceil(n x ratio), at least floor(n / 2) (max scale-down rate 2); else hold;
* n is the current replica count; with replicas still pending, the pending-replica guard treats them as
  missing metrics (0 on the way up, the target on the way down), as the HPA does;
* a scale-down cooldown of 300 s after the last change; no cooldown up.
"""

from __future__ import annotations

import math

from flashserve_testbed.bench.context import Context, Policy


def apa_replicas(current: int, per_pod: float, target: float, up_tol: float = 0.1, down_tol: float = 0.1,
                 max_up_rate: float = 2.0, max_down_rate: float = 2.0) -> int:  # fmt: skip
    """computeTargetReplicas (algorithm/apa.go)."""
    ratio = per_pod / target
    if ratio > 1.0 + up_tol:
        return min(math.ceil(current * ratio), math.ceil(max_up_rate * current))
    if ratio < 1.0 - down_tol:
        return max(math.ceil(current * ratio), math.floor(current / max_down_rate))
    return current


def pending_guard(current: int, ready: int, desired: int, per_pod: float, target: float) -> int:
    """applyPendingReplicaGuard for APA (autoscaler.go)."""
    pending = current - min(max(ready, 0), current)
    if pending <= 0 or desired == current or current <= 0:
        return desired
    if desired > current:
        adjusted = per_pod * ready / current
        return max(current, min(desired, math.ceil(current * adjusted / target)))
    adjusted = (per_pod * ready + target * pending) / current
    return min(current, max(desired, math.ceil(current * adjusted / target)))


class APA(Policy):
    name = "aibrix-apa"
    interval_s = 10.0
    offset_s = 5.0
    knob = "target_running_per_pod"

    def __init__(self, target: float, window_s: float = 60.0, up_tol: float = 0.1, down_tol: float = 0.1,
                 down_cooldown_s: float = 300.0, name: str = "aibrix-apa") -> None:  # fmt: skip
        self.target = target
        self.window_s = window_s
        self.up_tol = up_tol
        self.down_tol = down_tol
        self.down_cooldown_s = down_cooldown_s
        self.last_change: float | None = None
        self.name = name
        self.knob_value = target

    def decide(self, ctx: Context) -> int | None:
        avg = ctx.prom.over_time_by_pod(ctx.now, self.window_s, "running")
        ready = ctx.ready_pods()
        values = [avg[p] for p in ready if p in avg]
        if not values:
            return None
        per_pod = sum(values) / len(values)
        current = ctx.current
        desired = apa_replicas(current, per_pod, self.target, self.up_tol, self.down_tol)
        desired = pending_guard(current, ctx.counts.ready, desired, per_pod, self.target)
        if desired < current and self.last_change is not None and ctx.now - self.last_change < self.down_cooldown_s:
            return current
        desired = min(max(desired, ctx.min_replicas), ctx.max_replicas)
        if desired != current:
            self.last_change = ctx.now
        return desired


def default(capacity_per_replica: float) -> APA:
    return APA(capacity_per_replica)


def tuned(capacity_per_replica: float, startup_s: float) -> APA:
    """Target 70% of the SLA concurrency (the best of the target sweep on flash-crowd seed 0)."""
    return APA(0.7 * capacity_per_replica, name="aibrix-apa-tuned")


SWEEP = (0.55, 0.85, 1.15)
"""Target as a share of the SLA concurrency per replica."""
