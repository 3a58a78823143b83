"""Knative Pod Autoscaler (pkg/autoscaler/scaling/autoscaler.go), defaults from config-autoscaler:

* decides every 2 s on the observed concurrency (requests in flight at the pods, queued ones included);
* stable window 60 s, panic window 10% of it (6 s), panic threshold 200%;
* desired = ceil(observed / (target x 0.7 target utilization));
* panic starts when the panic-window desire is >= 2x the ready pods, and while panicking the scale never
  goes down; it ends after a whole stable window below the threshold;
* at most x1000 up and /2 down per decision.

Knative's queue-proxy reports every second; here every autoscaler reads the same Prometheus scraped every
15 s, so the panic window holds the latest scrape (documented in docs/autoscaling-benchmark.md).
"""

from __future__ import annotations

import math

from flashserve_testbed.bench.context import Context, Policy


class KPA(Policy):
    name = "kpa"
    interval_s = 2.0
    offset_s = 5.0
    knob = "target_concurrency_per_pod"

    def __init__(self, target: float, utilization: float = 0.7, stable_window_s: float = 60.0,
                 panic_window_pct: float = 10.0, panic_threshold: float = 2.0, max_up_rate: float = 1000.0,
                 max_down_rate: float = 2.0, scale_down_delay_s: float = 0.0, name: str = "kpa") -> None:  # fmt: skip
        self.target = target
        self.utilization = utilization
        self.stable_window_s = stable_window_s
        self.panic_window_s = stable_window_s * panic_window_pct / 100.0
        self.panic_threshold = panic_threshold
        self.max_up_rate = max_up_rate
        self.max_down_rate = max_down_rate
        self.scale_down_delay_s = scale_down_delay_s
        self.history: list[tuple[float, int]] = []
        self.panic_time: float | None = None
        self.max_panic_pods = 0
        self.name = name
        self.knob_value = target

    def observed(self, ctx: Context, window_s: float) -> float | None:
        w = max(window_s, ctx.scrape_interval_s)
        run = ctx.prom.over_time_by_pod(ctx.now, w, "running")
        wait = ctx.prom.over_time_by_pod(ctx.now, w, "waiting")
        if not run:
            return None
        return sum(run.values()) + sum(wait.values())

    def decide(self, ctx: Context) -> int | None:
        stable = self.observed(ctx, self.stable_window_s)
        panic = self.observed(ctx, self.panic_window_s)
        if stable is None or panic is None:
            return None  # "no data": Knative skips the decision
        want = self.scale(ctx.now, max(1, ctx.counts.ready), stable, panic)
        return self.delay_scale_down(ctx.now, want)

    def delay_scale_down(self, now: float, want: int) -> int:
        """scale-down-delay: the highest decision of the delay window (Knative's max-over-window)."""
        if self.scale_down_delay_s <= 0:
            return want
        self.history = [(t, w) for t, w in self.history if t > now - self.scale_down_delay_s] + [(now, want)]
        return max(w for _, w in self.history)

    def scale(self, now: float, ready: int, stable: float, panic: float) -> int:
        """The decider's arithmetic (Autoscaler.Scale), separate so the tests can pin it."""
        target_value = self.target * self.utilization
        max_up = math.ceil(self.max_up_rate * ready)
        max_down = math.floor(ready / self.max_down_rate)
        dspc = math.ceil(stable / target_value)
        dppc = math.ceil(panic / target_value)
        desired_stable = min(max(dspc, max_down), max_up)
        desired_panic = min(max(dppc, max_down), max_up)
        over = dppc / ready >= self.panic_threshold
        if over:
            self.panic_time = now
        elif self.panic_time is not None and now >= self.panic_time + self.stable_window_s:
            self.panic_time = None
            self.max_panic_pods = 0
        desired = desired_stable
        if self.panic_time is not None:
            if desired_panic > self.max_panic_pods:
                self.max_panic_pods = desired_panic
            desired = self.max_panic_pods
        return desired


def default(capacity_per_replica: float) -> KPA:
    return KPA(capacity_per_replica)


def tuned(capacity_per_replica: float, startup_s: float) -> KPA:
    """Knative's own knob for slow-starting revisions: scale-down-delay of one start-up time, so that a
    replica is not released between two bursts only to be ordered again."""
    return KPA(capacity_per_replica, scale_down_delay_s=startup_s, name="kpa-tuned")


SWEEP = (0.55, 0.85, 1.0, 1.15)
"""target x utilization as a share of the SLA concurrency per replica."""
