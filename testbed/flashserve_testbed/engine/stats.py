"""Counters and histograms one engine keeps, in the shape vLLM 0.33 exports them.

Histograms take bulk observations: a run of k identical decode steps for B sequences is one call, not k*B,
which is what lets the model advance many steps at once.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from flashserve.facts.vllm_flags import (
    DEFAULT_ITL_BUCKETS,
    DEFAULT_TTFT_BUCKETS,
    HISTOGRAM_FAMILIES,
)

# vLLM 0.33 v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)
KV_CACHE_RESIDENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800,
)


def one_two_five(max_value: int) -> tuple[float, ...]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, ... capped at max_value (token-count histograms)."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(v)
        exponent += 1


def default_buckets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    return {
        "request_latency": REQUEST_LATENCY_BUCKETS,
        "time_to_first_token": DEFAULT_TTFT_BUCKETS,
        "inter_token_latency": DEFAULT_ITL_BUCKETS,
        "iteration_tokens": ITERATION_TOKENS_BUCKETS,
        "request_params_n": REQUEST_PARAMS_N_BUCKETS,
        "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
        "request_tokens": one_two_five(max_model_len),
        "kv_cache_residency": KV_CACHE_RESIDENCY_BUCKETS,
    }


def validate_custom_buckets(raw: object) -> dict[str, tuple[float, ...]]:
    """Check a `--custom-histogram-buckets` map the way vLLM does; raises ValueError with the reason."""
    if not isinstance(raw, dict):
        raise ValueError("--custom-histogram-buckets must be a JSON object mapping a bucket family to bounds")
    out: dict[str, tuple[float, ...]] = {}
    for family, bounds in raw.items():
        if family not in HISTOGRAM_FAMILIES:
            raise ValueError(
                f"--custom-histogram-buckets: unknown bucket family {family!r}; "
                f"valid families: {', '.join(HISTOGRAM_FAMILIES)}"
            )
        if not isinstance(bounds, list) or not bounds:
            raise ValueError(f"--custom-histogram-buckets: {family} must be a non-empty list of numbers")
        values: list[float] = []
        for b in bounds:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
                raise ValueError(f"--custom-histogram-buckets: {family} bounds must be positive finite numbers")
            values.append(float(b))
        if any(y <= x for x, y in zip(values, values[1:])):
            raise ValueError(f"--custom-histogram-buckets: {family} bounds must be strictly increasing")
        out[family] = tuple(values)
    return out


@dataclass
class Histogram:
    bounds: Sequence[float]
    counts: list[float] = field(init=False)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    n: float = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times

    def observe_progression(self, first: float, step: float, k: int, times: int) -> None:
        """Observe first, first+step, ..., first+(k-1)*step (step >= 0), each `times` times."""
        if k <= 0 or times <= 0:
            return
        if step <= 0 or k == 1:
            self.observe(first, k * times)
            return
        placed = 0
        last = first + step * (k - 1)
        lo = bisect.bisect_left(self.bounds, first)
        for i in range(lo, len(self.bounds)):
            ub = self.bounds[i]
            # values <= ub fall at or below bucket i (Prometheus buckets are le)
            upto = min(k, int(math.floor((ub - first) / step + 1e-9)) + 1)
            if upto > placed:
                self.counts[i] += (upto - placed) * times
                placed = upto
            if ub >= last:
                break
        if placed < k:
            self.counts[-1] += (k - placed) * times
        self.total += (k * first + step * k * (k - 1) / 2) * times
        self.n += k * times

    def cumulative(self) -> list[float]:
        out, run = [], 0
        for c in self.counts:
            run += c
            out.append(run)
        return out


class EngineStats:
    """Everything /metrics shows for one engine, besides the live gauges the engine computes on demand."""

    # vLLM 0.33's FinishReason values, in its order: the logger creates a request_success child for each.
    FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

    def __init__(self, buckets: dict[str, tuple[float, ...]]) -> None:
        b = buckets
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generation_tokens_done = 0  # the engine adds tokens of still-decoding requests on read
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {r: 0 for r in self.FINISH_REASONS}
        self.spec_drafts_done = 0
        self.ttft = Histogram(b["time_to_first_token"])
        self.itl = Histogram(b["inter_token_latency"])
        self.tpot = Histogram(b["inter_token_latency"])
        self.e2e = Histogram(b["request_latency"])
        self.queue = Histogram(b["request_latency"])
        self.inference = Histogram(b["request_latency"])
        self.prefill = Histogram(b["request_latency"])
        self.decode = Histogram(b["request_latency"])
        self.req_prompt_tokens = Histogram(b["request_tokens"])
        self.req_generation_tokens = Histogram(b["request_tokens"])
        self.req_max_tokens = Histogram(b["request_tokens"])
        self.req_max_generation_tokens = Histogram(b["request_tokens"])
        self.req_n = Histogram(b["request_params_n"])
        self.req_preemptions = Histogram(b["request_num_preemptions"])
        self.req_prefill_computed = Histogram(b["request_tokens"])
        self.iteration_tokens = Histogram(b["iteration_tokens"])
