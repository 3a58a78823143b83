"""Static provisioning for the peak: a fixed fleet sized for the highest demand of the run (as the oracle
counts it), ready from the start. What teams do when start-up takes too long to autoscale."""

from __future__ import annotations

import math

from flashserve_testbed.bench.context import Context, Policy


class StaticPeak(Policy):
    name = "static"
    interval_s = 3600.0
    knob = "peak_share"

    def __init__(self, share: float = 1.0, name: str = "static") -> None:
        self.share = share
        self.name = name
        self.knob_value = share

    def fixed_replicas(self, workload) -> int:
        return max(1, math.ceil(self.share * workload.peak_need() - 1e-9))

    def decide(self, ctx: Context) -> int | None:
        return None


def default() -> StaticPeak:
    return StaticPeak(1.0)


class StaticBelowPeak(StaticPeak):
    knob = "replicas_under_peak"

    def fixed_replicas(self, workload) -> int:
        return max(1, workload.peak_need() - 1)


def tuned() -> StaticPeak:
    """One replica under the peak: the peak lasts minutes, a replica less saves GPU time for the whole run."""
    return StaticBelowPeak(name="static-tuned")


SWEEP = (0.7, 0.85, 1.15)
"""Replicas as a share of the run's peak need."""
