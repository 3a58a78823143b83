"""Scoring a run: what users got (speed, time to first token) and what it cost (GPU-hours, scaling actions).

Per-user speed of a request is how benchmarks report it: (output tokens - 1) / (last token - first token).
Attainment is token-weighted: the share of all output tokens that belong to requests at or above the target
speed, so a long answer at a slow speed weighs by its length. Requests that never finish count as missed.
The p90 per-user speed is read on the slow side, like the SLA: the speed that 90% of output tokens were
delivered at or above.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from flashserve_testbed.quantiles import nearest_rank

# Total cost of ownership per GPU-hour implied by the public DeepSeek-V4.1-Flash figures: 830K tokens/s per GPU
# (cached + new input + output) at the 100 tok/s SLA and 1.3B tokens per dollar: 830e3 * 3600 / 1.3e9.
GPU_HOUR_PRICE_USD = 2.30


class Recorder:
    """Per-request outcomes of requests that arrived inside the measured window."""

    __slots__ = ("speeds", "tokens", "ttfts", "prompt_tokens", "missed_tokens", "missed", "refused")

    def __init__(self) -> None:
        self.speeds: list[float] = []
        self.tokens: list[int] = []
        self.ttfts: list[float] = []
        self.prompt_tokens = 0
        self.missed_tokens = 0
        self.missed = 0
        self.refused = 0  # refused as vLLM refuses them (prompt + output over max_model_len): not served, not missed

    def add(self, prompt: int, tokens: int, speed: float | None, ttft: float | None) -> None:
        self.prompt_tokens += prompt
        self.tokens.append(tokens)
        # a 1-token answer has no decode speed; it is not slowed by anything the autoscaler controls
        self.speeds.append(math.inf if speed is None else speed)
        self.ttfts.append(math.inf if ttft is None else ttft)

    def unfinished(self, prompt: int, tokens: int) -> None:
        self.prompt_tokens += prompt
        self.missed_tokens += tokens
        self.missed += 1

    def refuse(self) -> None:
        self.refused += 1


@dataclass
class Result:
    policy: str
    scenario: str
    seed: int
    attainment: float
    speed_p90: float
    speed_p50: float
    ttft_p90_s: float
    gpu_hours: float
    tokens_per_dollar: float
    output_tokens_per_dollar: float
    scale_actions: int
    replicas_mean: float
    replicas_max: int
    requests: int
    """Simulated requests (with one representative rank per replica, a quarter of the fleet's)."""
    unfinished: int
    output_tokens: int
    sim_seconds: float
    cpu_seconds: float
    knob: str = ""
    knob_value: float | None = None
    variant: str = "default"
    startup_median_s: float | None = None
    oracle_gpu_hours: float = 0.0
    refused: int = 0
    """Requests refused as vLLM refuses them (prompt + output over max_model_len, HTTP 400): not in `requests`."""
    kind: str = "table"
    """table, sweep or startup: which part of the benchmark the run belongs to."""
    step_attainment: float | None = None
    """Share of decode steps (per request) whose inter-token latency met tokens-per-step / SLA: the
    token-level view the policy's ITL quantile reads, stricter than per-request speed."""
    routing: str = "affinity"
    """The simulator's routing model (service, affinity, router: bench/routing.py)."""
    prefix_hit_rate: float | None = None
    """Prefix-cache hit rate over the measured window: cached prompt tokens / prompt tokens, every engine."""
    startup_model: str = "lognormal"
    """Where the run's start-ups came from (bench/fleet.py STARTUP_MODELS)."""
    startup_learning: str = "on"
    """on: FlashServe's policy was shown the start-ups that completed and learned its start-up time from them;
    off: it used the spec value throughout."""
    cached_startups: float | None = None
    """Share of the run's completed start-ups that found the weights cached (weights-cached or warm)."""
    spec_startup_s: float | None = None
    """The replicaStartupSeconds the policy was given (FlashServe's prior; the tuned baselines' start-up)."""
    learned_startup_s: float | None = None
    """FlashServe's start-up time at the end of the run (the spec value when nothing was learned)."""
    timeline: dict | None = field(default=None, repr=False)
    decisions: list | None = field(default=None, repr=False)
    """FlashServe's decisions with their readings, when asked for (--decision-log)."""

    def row(self) -> dict:
        d = asdict(self)
        d.pop("timeline", None)
        d.pop("decisions", None)
        return d


def summarize(rec: Recorder, sla: float, gpu_hours: float, price: float, weight: float = 1.0) -> dict:
    """`weight`: real requests each simulated one stands for (the ranks a representative rank stands for);
    it scales the tokens counted against the whole fleet's cost."""
    tokens = rec.tokens
    total = sum(tokens) + rec.missed_tokens
    good = sum(n for v, n in zip(rec.speeds, tokens) if v >= sla)
    pairs = sorted(zip(rec.speeds, tokens))
    if rec.missed_tokens:
        pairs = [(0.0, rec.missed_tokens)] + pairs
    cost = gpu_hours * price
    return {
        "attainment": good / total if total else 1.0,
        "speed_p90": weighted_quantile(pairs, 0.10),
        "speed_p50": weighted_quantile(pairs, 0.50),
        "ttft_p90_s": quantile(rec.ttfts, 0.90),
        "tokens_per_dollar": weight * (rec.prompt_tokens + total) / cost if cost > 0 else 0.0,
        "output_tokens_per_dollar": weight * total / cost if cost > 0 else 0.0,
        "requests": len(tokens) + rec.missed,
        "unfinished": rec.missed,
        "output_tokens": total,
        "refused": rec.refused,
    }


def weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float:
    """Value below which a share q of the weight lies; pairs sorted by value."""
    if not pairs:
        return 0.0
    total = sum(n for _, n in pairs)
    acc = 0.0
    for v, n in pairs:
        acc += n
        if acc >= q * total:
            return v if math.isfinite(v) else 0.0
    v = pairs[-1][0]
    return v if math.isfinite(v) else 0.0


def quantile(values: list[float], q: float) -> float:
    """quantiles.nearest_rank, 0 for no values and inf for a value that never came (a request never answered)."""
    v = nearest_rank(values, q)
    if v is None:
        return 0.0
    return v if math.isfinite(v) else float("inf")


def median(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


ORACLE_WINDOW_S = 60.0
"""The oracle sizes on concurrency averaged over a minute centred on each instant: a replica serves a brief
overshoot of its capacity within the SLA (a request's speed is an average over its seconds of decoding), and
no fleet changes faster than the autoscalers' evaluations anyway. Sizing on the instantaneous count would
charge the bound for every momentary blip and let a steady policy undercut it."""


def oracle_gpu_hours(starts: list[float], ends: list[float], capacity: float, gpus: int, t0: float,
                     t1: float, floor: int = 1, window_s: float = ORACLE_WINDOW_S,
                     step_s: float = 5.0) -> tuple[float, list[tuple[float, int]]]:  # fmt: skip
    """Integral over [t0, t1] of ceil(concurrent requests / capacity) replicas (at least `floor`, the
    minReplicas every policy has), times GPUs per replica, for requests occupying [start, end); concurrency is
    averaged over `window_s` centred on each instant (0: instantaneous, exact). Also returns the replica need
    as a step function of (time, replicas) changes."""
    events: list[tuple[float, int]] = [(s, 1) for s in starts] + [(e, -1) for e in ends]
    events.sort()
    if window_s <= 0:
        return _exact_oracle(events, capacity, gpus, t0, t1, floor)
    # cumulative area under the concurrency step function, sampled on a grid
    half = window_s / 2.0
    lo, hi = t0 - half, t1 + half
    n = int(math.ceil((hi - lo) / step_s)) + 1
    grid = [lo + i * step_s for i in range(n)]
    area = [0.0] * n
    d = 0
    j = 0
    acc = 0.0
    last = lo
    for i, g in enumerate(grid):
        while j < len(events) and events[j][0] <= g:
            t, delta = events[j]
            if t > last:
                acc += d * (t - last)
                last = t
            d += delta
            j += 1
        acc += d * (g - last)
        last = g
        area[i] = acc
    return oracle_from_area(grid, area, capacity, gpus, t0, t1, floor, window_s, step_s)


def oracle_from_area(grid: list[float], area: list[float], capacity: float, gpus: int, t0: float, t1: float,
                     floor: int = 1, window_s: float = ORACLE_WINDOW_S,
                     step_s: float = 5.0) -> tuple[float, list[tuple[float, int]]]:  # fmt: skip
    """The oracle's integral and step function from the cumulative area under concurrency, sampled every
    `step_s` on `grid` from t0 - window_s / 2 to t1 + window_s / 2 (see `oracle_gpu_hours`)."""
    half = window_s / 2.0
    n = len(grid)
    k = int(round(window_s / step_s))
    steps: list[tuple[float, int]] = [(-math.inf, floor)]
    total = 0.0
    need = floor
    for i in range(n - k):
        centre = grid[i] + half
        if centre > t1:
            break
        avg = (area[i + k] - area[i]) / (grid[i + k] - grid[i])
        m = max(floor, math.ceil(avg / capacity - 1e-9))
        if m != need:
            need = m
            steps.append((centre, m))
        a, b = max(centre, t0), min(centre + step_s, t1)
        if b > a:
            total += need * (b - a)
    return total * gpus / 3600.0, steps


def _exact_oracle(events, capacity, gpus, t0, t1, floor):
    d = 0
    need = floor
    steps: list[tuple[float, int]] = [(-math.inf, floor)]
    area = 0.0
    last = t0
    for t, delta in events:
        if t > t0:
            lo, hi = max(last, t0), min(t, t1)
            if hi > lo:
                area += need * (hi - lo)
            last = max(last, min(t, t1))
        d += delta
        n = max(floor, math.ceil(d / capacity - 1e-9))
        if n != need:
            need = n
            steps.append((t, n))
        if t >= t1:
            break
    if last < t1:
        area += need * (t1 - last)
    return area * gpus / 3600.0, steps


def need_at(steps: list[tuple[float, int]], t: float) -> int:
    """Value of a step function given as sorted (time, value) changes."""
    lo, hi = 0, len(steps)
    while lo < hi:
        mid = (lo + hi) // 2
        if steps[mid][0] <= t:
            lo = mid + 1
        else:
            hi = mid
    return steps[lo - 1][1] if lo else 0
