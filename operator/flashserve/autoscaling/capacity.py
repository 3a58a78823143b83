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

# The reference point of the capacity prior, for DeepSeek-V4.1-Flash with MTP on Blackwell (docs/autoscaling.md,
# "The capacity prior"): users per GPU whose p90 per-user speed is REFERENCE_SLA, and the speed of an idle one.
REFERENCE_SLA_TOKENS_PER_S = 100.0
USERS_PER_GPU_AT_REFERENCE = 50.0
LOW_LOAD_TOKENS_PER_S = 140.0
# An SLA the prior puts at or above the idle speed would leave no capacity at all: the prior's idle speed is
# taken at least this factor above the SLA, so that the prior stays feasible and the data say otherwise.
FEASIBLE_IDLE_MARGIN = 1.1


def prior_intercept(low_load_tokens_per_s: float, sla_tokens_per_s: float) -> float:
    """1/speed of an idle replica, as the prior line assumes it."""
    return 1.0 / max(low_load_tokens_per_s, FEASIBLE_IDLE_MARGIN * sla_tokens_per_s)


def prior_users_per_replica(
    gpus_per_replica: int, sla_tokens_per_s: float, low_load_tokens_per_s: float = LOW_LOAD_TOKENS_PER_S
) -> float:
    """Concurrent users one replica serves at the SLA before anything is learned: the operator's and the
    benchmark's prior (spec.autoscaling.initialCapacity overrides it).

    Per-user speed falls as concurrency rises: an engine step costs about fixed + k x batch and every request
    gains the same tokens per step, so 1/speed is close to linear in the concurrency per GPU (the line the
    learner fits). The reference point fixes that line's slope, a property of the hardware and the model, not
    of the SLA; the users that fit at SLA S are where it crosses 1/S:

        C(S) = C_ref x gpus x (1/S - 1/v0) / (1/S_ref - 1/v0)

    So a stricter SLA admits fewer users, and faster than 1/S (at 120 tok/s 0.42 x C_ref, not 0.83), and a
    laxer one more (at 50 tok/s 4.5 x C_ref). Near and past the idle speed v0 there is no crossing; v0 is
    then taken FEASIBLE_IDLE_MARGIN above the SLA, as CapacityPrior does, so the prior line keeps the
    reference slope and its capacity stays positive. At S_ref the ratio is exactly 1."""
    if gpus_per_replica < 1:
        raise ValueError(f"gpus_per_replica: {gpus_per_replica} must be at least 1")
    if not sla_tokens_per_s > 0:
        raise ValueError(f"sla_tokens_per_s: {sla_tokens_per_s} must be positive")
    if not low_load_tokens_per_s > REFERENCE_SLA_TOKENS_PER_S:
        raise ValueError(
            f"low_load_tokens_per_s: {low_load_tokens_per_s} must exceed the reference SLA "
            f"{REFERENCE_SLA_TOKENS_PER_S:g} tok/s, or the reference point has no slope"
        )
    at_sla = 1.0 / sla_tokens_per_s - prior_intercept(low_load_tokens_per_s, sla_tokens_per_s)
    at_reference = 1.0 / REFERENCE_SLA_TOKENS_PER_S - 1.0 / low_load_tokens_per_s
    return USERS_PER_GPU_AT_REFERENCE * gpus_per_replica * (at_sla / at_reference)


@dataclass(frozen=True)
class CapacityPrior:
    capacity: float
    """Concurrent users per replica at the SLA before anything is learned."""
    low_load_tokens_per_s: float
    """Per-user speed of a nearly idle replica."""
    sla_tokens_per_s: float

    @property
    def intercept(self) -> float:
        return prior_intercept(self.low_load_tokens_per_s, self.sla_tokens_per_s)

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
