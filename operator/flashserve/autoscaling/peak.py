"""The highest demand of the recent past, which the fleet is not released below.

A replica takes minutes to start, so a burst shorter than that can only be served by replicas that are
already there when it starts: replicas ordered for it arrive after it. What predicts the next burst is the
last ones. Releasing down to the demand between bursts and ordering again at each burst (what a purely
reactive policy does) pays a start-up for every burst and serves none of them; keeping what the recent peak
needed serves them all at the cost of the gap between peak and mean. The memory forgets: a peak older than
the window no longer holds replicas, so a fleet still follows a day's decline or the end of a flash crowd,
only later.

Kept as a few buckets (the maximum per eighth of the window), so that it fits in the state annotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUCKETS = 8


@dataclass(frozen=True)
class PeakMemory:
    buckets: tuple[tuple[float, float], ...] = ()
    """(start of the bucket, highest demand seen in it), oldest first."""

    def update(self, now: float, demand: float, window_s: float) -> PeakMemory:
        if window_s <= 0 or not math.isfinite(demand) or demand < 0:
            return self
        width = window_s / BUCKETS
        start = math.floor(now / width) * width
        kept = [(t, v) for t, v in self.buckets if t > now - window_s and t <= now]
        if kept and kept[-1][0] == start:
            kept[-1] = (start, max(kept[-1][1], demand))
        else:
            kept.append((start, demand))
        return PeakMemory(tuple(kept))

    def peak(self, now: float, window_s: float) -> float:
        return max((v for t, v in self.buckets if t > now - window_s and t <= now), default=0.0)

    def to_dict(self) -> list[list[float]]:
        return [[_sig(t, 12), _sig(v, 6)] for t, v in self.buckets]

    @classmethod
    def from_dict(cls, data: object) -> PeakMemory:
        if not isinstance(data, list):
            return cls()
        out = []
        for item in data[-BUCKETS - 1 :]:
            try:
                t, v = float(item[0]), float(item[1])
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                return cls()
            if not (math.isfinite(t) and math.isfinite(v)) or v < 0:
                return cls()
            out.append((t, v))
        return cls(tuple(sorted(out)))


def _sig(v: float, digits: int) -> float:
    return float(f"{v:.{digits}g}")
