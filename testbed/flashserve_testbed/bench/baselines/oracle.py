"""The lower bound: perfect knowledge of demand and no start-up time. Its GPU-hours are the integral of
ceil(concurrent requests / per-replica capacity at the SLA) over the run, with each request occupying a
replica for its nominal service time at the SLA operating point (calibrate.py) and at least one replica.

The simulator also runs this fleet (instant start-up, sized a minute ahead from the same ideal demand) to
show what attainment that capacity buys on the real engine model with cold caches on new replicas."""

from __future__ import annotations

from flashserve_testbed.bench.context import Context, Policy


class Oracle(Policy):
    name = "oracle"
    interval_s = 15.0
    offset_s = 0.0

    def decide(self, ctx: Context) -> int | None:  # the simulator sizes it from the ideal demand
        return None
