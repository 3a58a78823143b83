"""Demand level and trend (Holt's linear smoothing in continuous time), to order replicas for the demand
they will meet when they are ready rather than the demand of the moment they are ordered.

A replica ordered now serves from `replicaStartupSeconds` on; on a steady ramp a purely reactive policy is
always one start-up time of growth behind. Only rising trends are projected (see policy.py): a falling one
must never release capacity ahead of the demand actually falling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL_TAU_S = 60.0
"""Smoothing of the level: about one rate window, so one noisy reading moves it by a fraction."""
TREND_TAU_S = 300.0
"""Smoothing of the trend: long enough that reading noise averages out, short enough to catch a ramp
within a few minutes."""


NOISE_TAU_S = 600.0
"""Smoothing of the reading noise estimate."""
SHIFT_SIGMAS = 4.0
SHIFT_MIN_FRACTION = 0.1
"""A reading this many noise deviations (and this share of the level) off the forecast is a step: a burst,
a flash crowd, a drop. The level jumps to it and the trend is left alone: a step read as a trend would
project the whole jump again over the horizon and order replicas for demand that never comes."""


@dataclass(frozen=True)
class DemandTrend:
    level: float | None = None
    trend: float = 0.0
    """Demand change per second."""
    noise: float = 0.0
    """Standard deviation of readings around the forecast."""
    t: float | None = None

    def update(self, now: float, demand: float, max_gap_s: float) -> DemandTrend:
        if self.level is None or self.t is None or not (0.0 < now - self.t <= max_gap_s):
            if self.t is not None and now == self.t:
                return self
            # first reading, or after a gap (blind period, clock jump): start over rather than read a trend
            # into the jump between two distant readings; assume 10% noise until it is measured
            return DemandTrend(level=demand, trend=0.0, noise=0.1 * demand + 1.0, t=now)
        dt = now - self.t
        predicted = self.level + self.trend * dt
        residual = demand - predicted
        if abs(residual) > SHIFT_SIGMAS * self.noise and abs(residual) > SHIFT_MIN_FRACTION * max(predicted, 1.0):
            return DemandTrend(level=demand, trend=self.trend, noise=self.noise, t=now)
        alpha = 1.0 - math.exp(-dt / LEVEL_TAU_S)
        beta = 1.0 - math.exp(-dt / TREND_TAU_S)
        gamma = 1.0 - math.exp(-dt / NOISE_TAU_S)
        level = predicted + alpha * residual
        trend = beta * (level - self.level) / dt + (1.0 - beta) * self.trend
        noise = math.sqrt((1.0 - gamma) * self.noise**2 + gamma * residual**2)
        return DemandTrend(level=level, trend=trend, noise=noise, t=now)

    def forecast(self, horizon_s: float) -> float | None:
        if self.level is None:
            return None
        return self.level + self.trend * horizon_s

    def to_dict(self) -> dict:
        if self.level is None or self.t is None:
            return {}
        return {
            "level": _sig(self.level),
            "trend": _sig(self.trend),
            "noise": _sig(self.noise),
            "t": _sig(self.t, 12),
        }

    @classmethod
    def from_dict(cls, data: object) -> DemandTrend:
        if not isinstance(data, dict) or not data:
            return cls()
        try:
            values = [float(data[k]) for k in ("level", "trend", "noise", "t")]
        except (KeyError, TypeError, ValueError, OverflowError):
            return cls()
        if not all(math.isfinite(v) for v in values) or values[2] < 0:
            return cls()
        return cls(*values)


def _sig(v: float, digits: int = 6) -> float:
    return float(f"{v:.{digits}g}")
