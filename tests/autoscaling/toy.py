"""A closed-loop toy fleet for the policy tests: per-user speed follows a known curve of concurrency per ready
replica, new replicas become ready after a fixed start-up time, and the policy's decisions are applied."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from flashserve.autoscaling import (
    Decision,
    MetricsSnapshot,
    PolicyConfig,
    PolicyInputs,
    PolicyState,
    ReplicaCounts,
    decide,
)

LOW_LOAD = PolicyConfig().prior_low_load_tokens_per_s  # tok/s per user, idle replica


def curve(capacity: float, sla: float = 100.0, low_load: float = LOW_LOAD) -> Callable[[float], float]:
    """Per-user speed at concurrency c per replica, with speed(capacity) == sla exactly."""
    a = 1.0 / low_load
    b = (1.0 / sla - a) / capacity
    return lambda c: 1.0 / (a + b * c)


def snapshot(now: float, running: float, ready: int, speed: Callable[[float], float], waiting: float = 0.0,
             noise: float = 0.0, rng: random.Random | None = None, running_avg: float | None = None,
             **extra: float) -> MetricsSnapshot:  # fmt: skip
    """`running_avg` (the window's concurrency, which the speed is taken at) defaults to `running` (now)."""
    running_avg = running if running_avg is None else running_avg
    c = running_avg / ready if ready else 0.0
    s = speed(c) if running_avg > 0 else None
    if s is not None and noise and rng is not None:
        s *= math.exp(rng.gauss(0.0, noise))
    return MetricsSnapshot(
        time=now, sample_age_s=5.0, window_s=60.0, percentile=90.0, running=running, waiting=waiting,
        running_avg=running_avg, speed_at_percentile=s, speed_p50=s * 1.1 if s else None, **extra,
    )  # fmt: skip


@dataclass
class Fleet:
    config: PolicyConfig
    capacity: float  # true users per replica at the SLA
    ready_at: list[float] = field(default_factory=list)  # one entry per replica group, ordered by index
    state: PolicyState = field(default_factory=PolicyState)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    attained: list[tuple[float, bool]] = field(default_factory=list)
    """(time, true per-user speed at the SLA percentile >= target) at each evaluation with users."""

    @classmethod
    def steady(cls, config: PolicyConfig, capacity: float, replicas: int, **kw) -> Fleet:
        return cls(config, capacity, ready_at=[-1e9] * replicas, **kw)

    def counts(self, now: float) -> ReplicaCounts:
        ready = sum(1 for t in self.ready_at if t <= now)
        return ReplicaCounts(desired=len(self.ready_at), ready=ready, starting=len(self.ready_at) - ready)

    def step(self, now: float, demand: float, rng: random.Random, noise: float = 0.02) -> Decision:
        counts = self.counts(now)
        speed = curve(self.capacity, self.config.sla_tokens_per_s)
        snap = snapshot(now, demand, counts.ready, speed, noise=noise, rng=rng) if counts.ready else None
        if snap is not None and snap.speed_at_percentile is not None:
            self.attained.append((now, speed(demand / counts.ready) >= self.config.sla_tokens_per_s))
        d = decide(PolicyInputs(now, snap, counts, self.config), self.state)
        self.state = d.state
        self.decisions.append((now, d))
        if d.apply:
            if d.desired > len(self.ready_at):
                self.ready_at += [now + self.config.replica_startup_s] * (d.desired - len(self.ready_at))
            else:
                del self.ready_at[d.desired :]
        return d

    def run(self, start: float, end: float, demand: Callable[[float], float], seed: int = 0,
            noise: float = 0.02) -> None:  # fmt: skip
        rng = random.Random(seed)
        t = start
        while t < end:
            self.step(t, demand(t), rng, noise)
            t += self.config.evaluation_interval_s

    def attainment(self, start: float = 0.0, end: float = math.inf) -> float:
        hits = [ok for t, ok in self.attained if start <= t < end]
        return sum(hits) / len(hits) if hits else 1.0

    def changes(self) -> list[tuple[float, int, int]]:
        return [(t, d.current, d.desired) for t, d in self.decisions if d.apply]

    def direction_changes(self) -> int:
        dirs = [1 if to > frm else -1 for _, frm, to in self.changes()]
        return sum(1 for x, y in zip(dirs, dirs[1:]) if x != y)
