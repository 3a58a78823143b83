"""What an autoscaler sees at an evaluation: the replica counts the cluster reports and a Prometheus to query.
Nothing else of the simulation is reachable from a policy."""

from __future__ import annotations

from dataclasses import dataclass

from flashserve_testbed.bench.calibrate import Calibration
from flashserve_testbed.bench.fleet import READY, FleetCounts, Group
from flashserve_testbed.bench.prom import Prometheus


@dataclass
class Context:
    now: float
    counts: FleetCounts
    groups: list[Group]
    """Groups below spec.replicas, index order (their pod names and readiness, as the API server shows)."""
    prom: Prometheus
    calib: Calibration
    sla_tokens_per_s: float
    min_replicas: int
    max_replicas: int
    scrape_interval_s: float
    startups: tuple = ()
    """The last few completed group start-ups (flashserve.autoscaling.startup.StartupSample), oldest first:
    what the operator records in status.startup.recent."""

    @property
    def current(self) -> int:
        return self.counts.desired

    def ready_pods(self) -> list[str]:
        return [g.pod for g in self.groups if g.state == READY]

    def starting_pods(self, phase: str | None = None) -> list[str]:
        return [g.pod for g in self.groups if g.state != READY and (phase is None or g.phase(self.now) == phase)]


class Policy:
    """An autoscaler: evaluated every `interval_s` (first at `offset_s`), returns the replicas it wants or
    None for no opinion. The simulator clamps to [min, max] and applies it."""

    name = "policy"
    interval_s = 15.0
    offset_s = 5.0
    knob = ""
    """Name of the main knob (swept to draw GPU-hours versus attainment)."""
    knob_value: float | None = None

    def decide(self, ctx: Context) -> int | None:
        raise NotImplementedError
