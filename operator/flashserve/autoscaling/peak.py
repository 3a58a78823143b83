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
from dataclasses import dataclass, replace

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

    def peak(self, now: float, window_s: float, full_s: float | None = None) -> float:
        """The highest demand of the window. With `full_s` (shorter than the window), a bucket's high counts in
        full until it is `full_s` old and then less and less, to nothing at the window's end: the replicas
        above the demand of the moment go one by one instead of all at once, so holding them costs about half
        as much while a burst that comes back soon still finds most of them."""
        full = full_s if full_s is not None and full_s < window_s else None
        best = 0.0
        for t, v in self.buckets:
            if now - window_s < t <= now:
                if full is not None:
                    # Aged from the bucket's end (or now): its high may have come at any time inside it.
                    age = now - min(t + window_s / BUCKETS, now)
                    v *= min(1.0, max(0.0, (window_s - age) / (window_s - full)))
                best = max(best, v)
        return best

    def rose(self, now: float, window_s: float) -> bool:
        """Whether demand rose within the window: a bucket's high above the lowest high before it by more than
        the noise band of a crowd (1 / FALL). A window that only fell or stayed level holds no burst to wait for."""
        low = math.inf
        for t, v in self.buckets:
            if now - window_s < t <= now:
                if v * FALL > low:
                    return True
                low = min(low, v)
        return False

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


# A burst is over once demand falls below FALL of its high, and the next has come once demand is back at
# RETURN of it: a crowd's own noise moves between the two without counting as either.
FALL, RETURN = 0.75, 0.9
TROUGHS = 3


@dataclass(frozen=True)
class Recurrence:
    """How long demand stays away from its high before it comes back: the peak memory must outlast that gap,
    or it releases the replicas the next burst needs a start-up before they are back.

    The gap runs from the last reading near the high (RETURN of it or more) to the first one near it again
    after a fall below FALL of it. A high older than `horizon_s` is forgotten (the level moved), and so are
    gaps whose return is older than that: once traffic stops coming back the memory returns to its
    start-up-based length.
    """

    high: float = 0.0
    high_at: float | None = None
    """The last reading at or above RETURN x high."""
    fallen: bool = False
    """Demand fell below FALL x high since high_at."""
    returned_at: float | None = None
    troughs: tuple[float, ...] = ()
    """Seconds from high_at to the return, of the last few returns, oldest first."""

    def update(self, now: float, demand: float, horizon_s: float, shortest_s: float = 0.0) -> Recurrence:
        """`shortest_s`: gaps shorter than this are not recorded (a memory that long covers them already)."""
        if not math.isfinite(demand) or demand < 0 or horizon_s <= 0:
            return self
        if self.high_at is None or now - self.high_at > horizon_s:
            # A first reading, or a high too old to say anything about the next burst: start again from here.
            return Recurrence(demand, now, False, self.returned_at, self.troughs)
        if demand >= RETURN * self.high:
            troughs, returned_at = self.troughs, self.returned_at
            if self.fallen and now - self.high_at >= shortest_s:
                troughs, returned_at = (*self.troughs, now - self.high_at)[-TROUGHS:], now
            return Recurrence(max(self.high, demand), now, False, returned_at, troughs)
        if demand < FALL * self.high and not self.fallen:
            return replace(self, fallen=True)
        return self

    def gap(self, now: float, horizon_s: float) -> float:
        """The longest recent gap, 0 when demand has not come back within the horizon. The longest, not a
        middle one: gaps between bursts vary, and a memory shorter than the next one is no memory."""
        if not self.troughs or self.returned_at is None or now - self.returned_at > horizon_s:
            return 0.0
        return max(self.troughs)

    def to_dict(self) -> dict:
        out: dict = {"high": _sig(self.high, 6), "troughs": [_sig(t, 6) for t in self.troughs]}
        for key, value in (("highAt", self.high_at), ("returnedAt", self.returned_at)):
            if value is not None:
                out[key] = _sig(value, 12)
        if self.fallen:
            out["fallen"] = True
        return out

    @classmethod
    def from_dict(cls, data: object) -> Recurrence:
        if not isinstance(data, dict):
            return cls()
        try:
            high = float(data.get("high", 0.0))
            troughs = tuple(float(t) for t in data.get("troughs", ()))[-TROUGHS:]
            high_at, returned_at = (None if data.get(k) is None else float(data[k]) for k in ("highAt", "returnedAt"))
        except (TypeError, ValueError, OverflowError):
            return cls()
        values = [high, *troughs, *(v for v in (high_at, returned_at) if v is not None)]
        if not all(math.isfinite(v) for v in values) or min((high, *troughs)) < 0:
            return cls()
        return cls(high, high_at, data.get("fallen") is True, returned_at, troughs)
