"""Online estimate of how many concurrent users one replica serves at the per-user speed SLA.

An engine step costs about `fixed + k * batch` seconds (weights and expert all-to-all, plus per-sequence
attention and MLP work), and every running request gains the same tokens per step, so the time per token a
user sees is close to linear in the concurrency per replica:

    1 / speed = a + b * concurrency        capacity at SLA S:  C = (1/S - a) / b

We fit (a, b) by weighted least squares over exponentially forgotten observations, with two constant
pseudo-observations standing in for prior knowledge: the low-load speed at concurrency 0 (a hardware and
model property, trusted moderately) and the SLA at the prior capacity (trusted little). With no data the fit
is the prior line; with data at a single operating point, which is what steady traffic gives, the line goes
through the data and takes its slope from the low-load anchor; once the load has moved around, data alone
decide. Context length shifts the curve; forgetting lets the estimate follow it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Relative weights of the prior pseudo-observations; each real observation weighs 1 (before forgetting).
INTERCEPT_PRIOR_WEIGHT = 1.0
SLOPE_PRIOR_WEIGHT = 0.05
# Learned capacity stays within this factor of the prior: a wild fit from a few odd windows must not send
# the fleet to max or to min on its own.
CAPACITY_CLAMP = 16.0


@dataclass(frozen=True)
class CapacityPrior:
    capacity: float
    """Concurrent users per replica at the SLA before anything is learned."""
    low_load_tokens_per_s: float
    """Per-user speed of a nearly idle replica."""
    sla_tokens_per_s: float

    @property
    def intercept(self) -> float:
        # A prior that puts the SLA at or above the idle speed would make the prior capacity zero; keep the
        # prior feasible and let the data say otherwise.
        return 1.0 / max(self.low_load_tokens_per_s, 1.1 * self.sla_tokens_per_s)

    @property
    def slope(self) -> float:
        return (1.0 / self.sla_tokens_per_s - self.intercept) / self.capacity


@dataclass(frozen=True)
class CapacityModel:
    """Forgotten sufficient statistics of y = 1/speed on x = concurrency per replica."""

    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    n: int = 0
    """Observations ever taken (not forgotten): tells a prior-only estimate from a learned one."""
    t: float | None = None
    """Time of the last observation, for forgetting by elapsed time rather than by call count."""

    def observe(self, now: float, concurrency: float, speed: float, memory_s: float) -> CapacityModel:
        if not (_finite_positive(concurrency) and _finite_positive(speed)):
            return self
        keep = 1.0 if self.t is None else math.exp(-max(0.0, now - self.t) / memory_s)
        x, y = concurrency, 1.0 / speed
        return CapacityModel(
            w=self.w * keep + 1.0,
            sx=self.sx * keep + x,
            sy=self.sy * keep + y,
            sxx=self.sxx * keep + x * x,
            sxy=self.sxy * keep + x * y,
            n=self.n + 1,
            t=now,
        )

    def fit(self, prior: CapacityPrior) -> tuple[float, float]:
        """(a, b) of 1/speed = a + b * concurrency."""
        wa, wb = INTERCEPT_PRIOR_WEIGHT, SLOPE_PRIOR_WEIGHT
        c0, y0, ys = prior.capacity, prior.intercept, 1.0 / prior.sla_tokens_per_s
        w = self.w + wa + wb
        sx = self.sx + wb * c0
        sy = self.sy + wa * y0 + wb * ys
        sxx = self.sxx + wb * c0 * c0
        sxy = self.sxy + wb * c0 * ys
        det = w * sxx - sx * sx
        if det <= 1e-12 * max(1.0, w * sxx):
            return prior.intercept, prior.slope
        b = (w * sxy - sx * sy) / det
        a = (sy - b * sx) / w
        return a, b

    def capacity(self, prior: CapacityPrior) -> float:
        a, b = self.fit(prior)
        return clamp_capacity(capacity_from_line(a, b, prior.sla_tokens_per_s), prior)

    def to_dict(self) -> dict:
        out = {k: _sig(getattr(self, k)) for k in ("w", "sx", "sy", "sxx", "sxy")}
        out["n"] = self.n
        if self.t is not None:
            out["t"] = _sig(self.t, 12)
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> CapacityModel:
        if not isinstance(data, dict):
            return cls()
        try:
            values = {k: float(data.get(k, 0.0)) for k in ("w", "sx", "sy", "sxx", "sxy")}
            n = int(data.get("n", 0))
            t = data.get("t")
            t = float(t) if t is not None else None
        except (TypeError, ValueError, OverflowError):
            return cls()
        if not all(math.isfinite(v) for v in values.values()) or values["w"] < 0:
            return cls()
        return cls(n=max(0, n), t=t, **values)


def capacity_from_line(a: float, b: float, sla_tokens_per_s: float) -> float:
    target = 1.0 / sla_tokens_per_s
    if a >= target:
        return 0.0  # the SLA is out of reach even unloaded
    if b <= 0:
        return math.inf  # no slowdown with load seen: unbounded as far as the data know
    return (target - a) / b


def capacity_through(a: float, concurrency: float, speed: float, sla_tokens_per_s: float) -> float | None:
    """Capacity implied by one observed point on a line with intercept `a`: the current window's own verdict,
    used when the SLA is breached and the learned model still claims there is room."""
    if not (_finite_positive(concurrency) and _finite_positive(speed)):
        return None
    b = (1.0 / speed - a) / concurrency
    if b <= 0:
        return None
    return capacity_from_line(a, b, sla_tokens_per_s)


def clamp_capacity(value: float, prior: CapacityPrior) -> float:
    lo = max(1.0, prior.capacity / CAPACITY_CLAMP)
    hi = prior.capacity * CAPACITY_CLAMP
    if math.isnan(value):
        return prior.capacity
    return min(hi, max(lo, value))


def _finite_positive(v: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _sig(v: float, digits: int = 9) -> float:
    return float(f"{v:.{digits}g}")
