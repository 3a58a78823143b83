"""A Prometheus for the simulator: scrapes every engine pod at a fixed interval and answers the few PromQL
functions the autoscalers use, with Prometheus's own semantics (rate extrapolation, le-bucket quantiles,
staleness of vanished targets).

Every policy reads the fleet only through this: readings are as old as the last scrape and rates are averages
over their window, as they are for a real autoscaler.

Each engine (data-parallel rank) is one series, labelled with its pod. By default the benchmark simulates one
representative rank per replica (docs/autoscaling-benchmark.md) whose series carries a `weight` of the rank
count: a pod's counters and gauges are the sum over its ranks, i.e. weight x the representative's. Quantiles
and averages of ratios are unaffected.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

LOOKBACK_S = 300.0  # Prometheus's default lookback for instant vectors
RETENTION_S = 900.0


@dataclass(slots=True)
class Sample:
    t: float
    running: float
    waiting: float
    kv: float
    gen_tokens: float
    itl_count: float
    itl_sum: float
    itl_buckets: tuple[float, ...]  # cumulative counts per finite bound (the +Inf bucket is itl_count)
    ttft_count: float
    ttft_sum: float
    ttft_buckets: tuple[float, ...]
    prompt_tokens: float
    prompt_count: float
    output_tokens_done: float
    output_count: float
    prefix_queries: float
    prefix_hits: float
    tpot_count: float = 0.0
    """vllm:request_time_per_output_token_seconds: one observation per finished request, on the ITL bounds."""
    tpot_buckets: tuple[float, ...] = ()
    one_token_requests: float = 0.0
    """vllm:request_generation_tokens_bucket{le="1.0"}: finished requests with at most one output token, whose
    TPOT observation is 0 (promql.Queries.one_token_requests_rate)."""


class Series:
    __slots__ = ("key", "pod", "group", "weight", "samples", "ended")

    def __init__(self, key: str, pod: str, group: int, weight: float) -> None:
        self.key = key
        self.pod = pod
        self.group = group
        self.weight = weight
        self.samples: deque[Sample] = deque()
        self.ended: float | None = None

    def window(self, now: float, window_s: float) -> list[Sample]:
        lo = now - window_s
        return [s for s in self.samples if lo < s.t <= now]

    def latest(self, now: float) -> Sample | None:
        if self.ended is not None and self.ended <= now:
            return None
        for s in reversed(self.samples):
            if s.t <= now:
                return s if now - s.t <= LOOKBACK_S else None
        return None


class Prometheus:
    def __init__(self, itl_bounds: tuple[float, ...], ttft_bounds: tuple[float, ...]) -> None:
        self.itl_bounds = tuple(itl_bounds)
        self.ttft_bounds = tuple(ttft_bounds)
        self.series: dict[str, Series] = {}
        # bucket rates of the current state, by query: a policy asks for several quantiles of one histogram
        self._rates: dict[tuple, list[float] | None] = {}
        # the router's vllm_router_requests_total, (scrape time, value): one target that lives as long as the
        # serving, apart from the engines' series
        self.router: deque[tuple[float, float]] = deque()

    # ------------------------------------------------------------------ ingest
    def ingest(self, key: str, pod: str, group: int, weight: float, sample: Sample) -> None:
        self._rates.clear()
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(key, pod, group, weight)
        s.samples.append(sample)
        while s.samples and s.samples[0].t < sample.t - RETENTION_S:
            s.samples.popleft()

    def ingest_router(self, t: float, requests_total: float) -> None:
        """A scrape of the router pod: its arrival counter (requests received, before any is routed)."""
        self.router.append((t, requests_total))
        while self.router and self.router[0][0] < t - RETENTION_S:
            self.router.popleft()

    def router_rate(self, now: float, window_s: float) -> float | None:
        """sum(rate(vllm_router_requests_total[w])); None without a router target (a plain Service)."""
        pts = [(t, v) for t, v in self.router if now - window_s < t <= now]
        if len(pts) < 2:
            return None
        return extrapolated_rate(pts, now - window_s, now)

    def target_gone(self, pod: str, now: float) -> None:
        """A scrape target (pod) disappeared: Prometheus writes staleness markers, its series end now."""
        self._rates.clear()
        for s in self.series.values():
            if s.pod == pod and s.ended is None:
                s.ended = now

    def forget_old(self, now: float) -> None:
        self._rates.clear()
        for key in [k for k, s in self.series.items() if s.ended is not None and s.ended < now - RETENTION_S]:
            del self.series[key]

    def live(self, now: float) -> list[Series]:
        return [s for s in self.series.values() if s.latest(now) is not None]

    # ------------------------------------------------------------------ instant vectors
    def sample_age(self, now: float) -> float | None:
        """time() - max(timestamp(vllm:num_requests_running{...})); None without any series."""
        newest = None
        for s in self.series.values():
            last = s.latest(now)
            if last is not None and (newest is None or last.t > newest):
                newest = last.t
        return None if newest is None else now - newest

    def gauge_by_pod(self, now: float, field: str) -> dict[str, float]:
        """sum by (pod) (gauge): a pod's total over its engines."""
        out: dict[str, float] = {}
        for s in self.series.values():
            last = s.latest(now)
            if last is not None:
                out[s.pod] = out.get(s.pod, 0.0) + getattr(last, field) * s.weight
        return out

    def gauge_by_series(self, now: float, field: str) -> dict[str, float]:
        """The gauge per engine series (for ratios such as KV usage, averaged or maxed over engines)."""
        out = {}
        for s in self.series.values():
            last = s.latest(now)
            if last is not None:
                out[s.key] = getattr(last, field)
        return out

    def gauge_sum(self, now: float, field: str) -> float | None:
        values = self.gauge_by_pod(now, field)
        return sum(values.values()) if values else None

    def over_time_by_pod(self, now: float, window_s: float, field: str, how: str = "avg",
                         combine: str = "sum") -> dict[str, float]:  # fmt: skip
        """avg_over_time / max_over_time of a gauge per engine series, then combined per pod: `sum` (a pod's
        total: the weight counts the ranks a representative stands for) or `max` (its worst engine)."""
        out: dict[str, float] = {}
        for s in self.series.values():
            if s.ended is not None and s.ended <= now - window_s:
                continue
            pts = [getattr(x, field) for x in s.window(now, window_s)]
            if not pts:
                continue
            v = sum(pts) / len(pts) if how == "avg" else max(pts)
            if combine == "sum":
                out[s.pod] = out.get(s.pod, 0.0) + v * s.weight
            else:
                out[s.pod] = max(out.get(s.pod, v), v)
        return out

    # ------------------------------------------------------------------ range functions
    def rate_by_pod(self, now: float, window_s: float, field: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.series.values():
            pts = s.window(now, window_s)
            if len(pts) >= 2:
                r = s.weight * extrapolated_rate([(p.t, getattr(p, field)) for p in pts], now - window_s, now)
                out[s.pod] = out.get(s.pod, 0.0) + r
        return out

    def rate_sum(self, now: float, window_s: float, field: str) -> float | None:
        values = self.rate_by_pod(now, window_s, field)
        return sum(values.values()) if values else None

    def bucket_rates(self, now: float, window_s: float, field: str, count_field: str) -> list[float] | None:
        """sum by (le) (rate(x_bucket[w])): cumulative rates per bound, +Inf last (do not modify the list)."""
        key = (now, window_s, field, count_field)
        if key not in self._rates:
            self._rates[key] = self._bucket_rates(now, window_s, field, count_field)
        return self._rates[key]

    def _bucket_rates(self, now: float, window_s: float, field: str, count_field: str) -> list[float] | None:
        total: list[float] | None = None
        lo = now - window_s
        for s in self.series.values():
            pts = s.window(now, window_s)
            if len(pts) < 2:
                continue
            times = [p.t for p in pts]
            # one column per bucket (transposed in C), the count last: no (t, v) pairs built per bucket
            columns = list(zip(*(getattr(p, field) for p in pts)))
            columns.append(tuple(getattr(p, count_field) for p in pts))
            rates = [_extrapolated_rate(times, col, lo, now) * s.weight for col in columns]
            total = rates if total is None else [a + b for a, b in zip(total, rates)]
        return total

    def histogram_quantile(
        self, q: float, now: float, window_s: float, which: str = "itl", minus: str | None = None
    ) -> float | None:
        """histogram_quantile(q, sum by (le) (rate(x_bucket[w]))), less `- on() group_left() sum(rate(minus[w]))`
        in every bucket when `minus` names a counter field (the zeros of one-token requests in TPOT)."""
        bounds = self.ttft_bounds if which == "ttft" else self.itl_bounds  # TPOT shares the ITL buckets
        rates = self.bucket_rates(now, window_s, f"{which}_buckets", f"{which}_count")
        if rates is None:
            return None
        if minus is not None:
            less = self.rate_sum(now, window_s, minus)
            if less is None:
                return None
            rates = [r - less for r in rates]
        return bucket_quantile(q, bounds, rates)


def extrapolated_rate(points: list[tuple[float, float]], range_start: float, range_end: float) -> float:
    """Prometheus's extrapolatedRate for a counter (promql/functions.go), per second."""
    if len(points) < 2:
        return math.nan
    return _extrapolated_rate([t for t, _ in points], [v for _, v in points], range_start, range_end)


def _extrapolated_rate(times, values, range_start: float, range_end: float) -> float:
    first_t, first_v = times[0], values[0]
    last_t = times[-1]
    result = 0.0
    prev = first_v
    for v in values[1:]:
        if v < prev:  # counter reset
            result += prev
        prev = v
    result += values[-1] - first_v
    sampled = last_t - first_t
    if sampled <= 0:
        return math.nan
    avg_step = sampled / (len(times) - 1)
    to_start = first_t - range_start
    to_end = range_end - last_t
    threshold = avg_step * 1.1
    if to_start >= threshold:
        to_start = avg_step / 2
    if result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        if to_zero < to_start:
            to_start = to_zero
    if to_end >= threshold:
        to_end = avg_step / 2
    factor = (sampled + to_start + to_end) / sampled
    return result * factor / (range_end - range_start)


def bucket_quantile(q: float, bounds: tuple[float, ...], cumulative: list[float]) -> float | None:
    """histogram_quantile over cumulative bucket values (`bounds` finite, the last value is +Inf), with
    Prometheus's linear interpolation inside the bucket."""
    if not cumulative:
        return None
    total = cumulative[-1]
    if not (total > 0) or math.isnan(total):
        return None
    if q <= 0:
        return -math.inf
    if q >= 1:
        return math.inf
    # enforce monotonicity as Prometheus does for floating-point noise
    cum = list(cumulative)
    for i in range(1, len(cum)):
        if cum[i] < cum[i - 1]:
            cum[i] = cum[i - 1]
    rank = q * total
    i = bisect.bisect_left(cum, rank)
    if i >= len(bounds):
        return bounds[-1]  # falls in +Inf: the highest finite bound
    upper = bounds[i]
    lower = bounds[i - 1] if i > 0 else 0.0
    below = cum[i - 1] if i > 0 else 0.0
    in_bucket = cum[i] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket
