"""One reading of a serving's engine metrics: what the policy sees each evaluation.

Kept apart from metrics.py so that the policy and the benchmark's simulated metrics pipeline can build
snapshots without importing an HTTP client.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MetricsSnapshot:
    """Per-serving aggregates over the serving's engines. Every reading may be None: no data in the window
    (e.g. no decode tokens while idle) is different from an error, which is a missing snapshot."""

    time: float
    """Clock time (seconds) at which the queries were evaluated."""
    sample_age_s: float
    """Age of the freshest engine sample at `time` (scrape delay, or how long the targets have been gone)."""
    window_s: float
    """Rate window of the rate-based readings."""
    percentile: float
    """The SLA percentile the `*_at_percentile` readings refer to (e.g. 90)."""
    running: float | None = None
    """Requests being served now (prefill or decode), summed over engines."""
    waiting: float | None = None
    """Requests queued in the engines now."""
    running_avg: float | None = None
    """Running requests averaged over the window, matching the rate-based speed readings."""
    speed_p50: float | None = None
    """Median per-user decode speed (tokens/s), read like speed_at_percentile."""
    speed_at_percentile: float | None = None
    """Per-user speed that `percentile`% of the requests finished in the window met or beat (tokens/s):
    1 / TPOT quantile; the per-step ITL reading when no request finished (see `speed_source`)."""
    speed_source: str | None = None
    """What the speeds were read from: "requests" (vllm:request_time_per_output_token_seconds) or "steps"
    (tokens_per_step / vllm:inter_token_latency_seconds, the fallback); None without a reading."""
    speed_from_counters: float | None = None
    """Mean per-user speed: generation tokens/s over average running requests."""
    tokens_per_step: float | None = None
    """Tokens a decoding request gains per engine step (1 + accepted MTP drafts); the ITL readings are
    per step, so the fallback speeds are this over ITL."""
    tokens_per_second: float | None = None
    """Generation tokens/s of the whole serving."""
    kv_usage_avg: float | None = None
    """KV-cache usage (0..1), mean over engines."""
    kv_usage_max: float | None = None
    """KV-cache usage (0..1) of the fullest engine."""
    ttft_at_percentile_s: float | None = None
    """Time to first token that `percentile`% of requests met."""
    replicas_reporting: int | None = None
    """Replica groups with at least one engine scraped."""
    sessions_between_turns: float | None = None
    """Agentic sessions waiting on a tool call (a router metric; vLLM has none). A leading indicator."""
    arrival_rate: float | None = None
    """Requests per second arriving at the serving's routers over the window (vllm_router_requests_total;
    an agentic session's turns each count). None without a router or when its pods are not scraped."""
    mean_output_tokens: float | None = None
    """Output tokens per request finished in the window (vllm:request_generation_tokens sum over count)."""

    def to_dict(self) -> dict:
        return {k: _round(v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict) -> MetricsSnapshot:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _round(v: object) -> object:
    if isinstance(v, float) and math.isfinite(v):
        return round(v, 6)
    return v
