"""Every PromQL query the autoscaler runs, in one place.

All queries select one serving's engines by the labels its scrape targets carry (`namespace` and `serving`,
set by the pod relabelling of kubernetes_sd or by the local cluster's file_sd), and aggregate over every
engine (`engine` label) of every pod and replica group, so a serving is read as a whole. The arrival rate is
read the same way from the serving's router pods (job `vllm-router`, the same two labels: the chart's
router PodMonitor and the local cluster's scrape config set them as for the engines).

Direction of the speed percentile: an SLA "p90 per-user speed >= 100 tok/s" means 90% of the users (here:
requests) get at least that speed, so it is limited by the SLOW tail, i.e. the LONG times per token. The
speed that p% of requests meet or beat is therefore 1 / TPOT quantile(p/100), where TPOT is
`vllm:request_time_per_output_token_seconds`: one observation per finished request, its decode time over its
output tokens - 1, i.e. the inverse of that user's speed, MTP included. TPOT q0.9 gives the p90 speed in this
sense (equivalently the 10th percentile of the speed distribution). Using q0.1 would report the speed of the
fastest 10% and hide every breach. Each request counts once whatever its length (the histogram cannot weight
by tokens). TPOT shares the ITL buckets (vLLM's `inter_token_latency` bucket family), so the renderer's bounds
must resolve 1/SLA as well as the step latency (vllm_args.itl_buckets).

One-token requests. vLLM observes a TPOT of 0 for every finished request with at most one output token (no
decode step: `mean_time_per_output_token` is 0 when `num_generation_tokens - 1 <= 0`, v1/metrics/stats.py),
and those zeros land in the lowest TPOT bucket. Read naively, they pull every quantile down, i.e. the speed
up: with 31% one-token requests the q0.9 is really the q0.855 of the requests that decoded, and the q0.5 their
q0.275. Those requests have no per-user speed, so the reading leaves them out, exactly: the same finished
requests are observed, in the same `record` call, by `vllm:request_generation_tokens`, whose lowest bound is 1
(the `request_tokens` family, a 1-2-5 series), so its `le="1.0"` bucket counts precisely the requests that
produced the zeros. That rate is subtracted from every cumulative TPOT bucket (the zeros sit in all of them,
+Inf included) before histogram_quantile, which then ranks only the requests with two or more output tokens;
the request count behind the reading is corrected the same way. The alternative, a speed from
`vllm:request_generation_tokens` over `vllm:request_decode_time_seconds`, is not a quantile over requests:
those are two separate histograms, and the quantile of a per-request ratio cannot be recovered from their
marginals (only the ratio of their sums, a token-weighted mean, which the counter reading already gives). The
subtraction leaves the TPOT buckets' own resolution as the only error. Right after an engine starts,
Prometheus's rate extrapolation can differ slightly between the two series; histogram_quantile's monotonicity
fix absorbs it.

The per-step ITL reading below is the fallback when no request finished in the window (metrics.assemble).
It is not the users' speed: vLLM observes `vllm:inter_token_latency_seconds` once per engine step per
decoding request, however many tokens the step produced, and on agentic traffic the steps that carry a new
turn's prefill chunk make up its slow tail while a user's speed averages over all of its steps, so near
capacity tokens_per_step / ITL q0.9 reads well below the p90 per-request speed (docs/autoscaling.md, "Why not
the ITL", has the figures). With MTP speculative
decoding a step yields ~1.8 tokens, hence the tokens_per_step factor; it is measured from counters:
generation tokens minus first tokens (one per request, counted by the TTFT histogram) over ITL observations,
a mean over requests.
"""

from __future__ import annotations

from dataclasses import dataclass

ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
TTFT = "vllm:time_to_first_token_seconds"
GENERATION_TOKENS_PER_REQUEST = "vllm:request_generation_tokens"
# The lowest bound of vLLM's `request_tokens` bucket family as prometheus_client writes it (and Prometheus 3
# normalises `le` to): the bucket of the finished requests with at most one output token.
ONE_TOKEN_LE = "1.0"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
# vllm-router's arrival counter: one per request it receives on an inference route, counted on receipt (before
# it picks a worker, whether or not one is ready), labelled by `route` only. Health and model-list calls are
# not counted (checked against 0.1.17).
ROUTER_REQUESTS = "vllm_router_requests_total"

NAMESPACE_LABEL = "namespace"
SERVING_LABEL = "serving"
GROUP_LABEL = "group"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(namespace: str, serving: str) -> str:
    """Label matchers (without braces) for one serving's engine series."""
    return f'{NAMESPACE_LABEL}="{_escape(namespace)}",{SERVING_LABEL}="{_escape(serving)}"'


def duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class Queries:
    """The queries for one serving. Each attribute is one instant query returning a single sample (or none)."""

    namespace: str
    serving: str
    window_s: float = 60.0
    percentile: float = 90.0

    @property
    def sel(self) -> str:
        return selector(self.namespace, self.serving)

    @property
    def w(self) -> str:
        return duration(self.window_s)

    def _quantile(self, metric: str, q: float) -> str:
        return f"histogram_quantile({q:g}, sum by (le) (rate({metric}_bucket{{{self.sel}}}[{self.w}])))"

    @property
    def one_token_requests_rate(self) -> str:
        """Requests finished per second with at most one output token: each left a TPOT observation of 0."""
        return (
            f'sum(rate({GENERATION_TOKENS_PER_REQUEST}_bucket{{{self.sel},le="{ONE_TOKEN_LE}"}}[{self.w}]))'
        )

    def _tpot_quantile(self, q: float) -> str:
        # `on() group_left()`: the one-sample right side is subtracted from every le bucket of the left side.
        buckets = f"sum by (le) (rate({TPOT}_bucket{{{self.sel}}}[{self.w}]))"
        return f"histogram_quantile({q:g}, {buckets} - on() group_left() {self.one_token_requests_rate})"

    @property
    def tpot_at_percentile(self) -> str:
        """Time per output token (seconds, one observation per finished request) that `percentile`% of the
        requests finished in the window with two or more output tokens stayed within: per-user speed at the
        SLA percentile = 1 / this. The zeros vLLM records for one-token requests are taken out (module
        docstring). No result (NaN) when no such request finished in the window."""
        return self._tpot_quantile(self.percentile / 100.0)

    @property
    def tpot_requests_rate(self) -> str:
        """Requests finished per second with at least two output tokens (TPOT observations less the one-token
        requests' zeros); times the window, how many the TPOT quantiles rest on."""
        return f"sum(rate({TPOT}_count{{{self.sel}}}[{self.w}])) - {self.one_token_requests_rate}"

    @property
    def tpot_p50(self) -> str:
        """Median time per output token over the requests finished in the window with two or more output
        tokens; median speed = 1 / this."""
        return self._tpot_quantile(0.5)

    @property
    def itl_at_percentile(self) -> str:
        """ITL (seconds per step) that `percentile`% of decode steps stay within; the fallback speed reading
        is tokens_per_step / this. Needs ITL buckets around tokens_per_step/SLA (the renderer adds them)."""
        return self._quantile(ITL, self.percentile / 100.0)

    @property
    def itl_p50(self) -> str:
        """Median ITL; the fallback median speed reading = tokens_per_step / this."""
        return self._quantile(ITL, 0.5)

    @property
    def itl_steps_rate(self) -> str:
        """ITL observations per second: decode steps summed over requests (the denominator of tokens per step)."""
        return f"sum(rate({ITL}_count{{{self.sel}}}[{self.w}]))"

    @property
    def first_tokens_rate(self) -> str:
        """First tokens per second (one TTFT observation each); they are not decode steps."""
        return f"sum(rate({TTFT}_count{{{self.sel}}}[{self.w}]))"

    @property
    def generation_tokens_rate(self) -> str:
        """Output tokens per second of the serving (`vllm:generation_tokens_total`)."""
        return f"sum(rate({GENERATION_TOKENS}{{{self.sel}}}[{self.w}]))"

    @property
    def mean_output_tokens(self) -> str:
        """Output tokens per request finished in the window: the sum over the count of
        `vllm:request_generation_tokens` (one observation per finished request). With the SLA speed it gives a
        request's duration at the SLA, the W of Little's law for the arrival-based ceiling (steps.py)."""
        return (
            f"sum(rate({GENERATION_TOKENS_PER_REQUEST}_sum{{{self.sel}}}[{self.w}])) / "
            f"sum(rate({GENERATION_TOKENS_PER_REQUEST}_count{{{self.sel}}}[{self.w}]))"
        )

    @property
    def arrival_rate(self) -> str:
        """Requests per second arriving at the serving's routers (vllm-router's own counter, summed over its
        pods and routes): what users send, whatever the engines' backlog. vLLM exports no arrival counter; its
        finished and running counts follow the service, not the demand. No sample without a router (routing
        disabled) or when its pods are not scraped: the policy then sizes on the engines alone."""
        return f"sum(rate({ROUTER_REQUESTS}{{{self.sel}}}[{self.w}]))"

    @property
    def running(self) -> str:
        """Requests in the engines' running set now (prefill or decode): the served part of demand."""
        return f"sum({RUNNING}{{{self.sel}}})"

    @property
    def running_avg(self) -> str:
        """Running requests averaged over the rate window: the concurrency the speed readings were taken at,
        and the denominator of the counter-based mean per-user speed."""
        return f"sum(avg_over_time({RUNNING}{{{self.sel}}}[{self.w}]))"

    @property
    def waiting(self) -> str:
        """Requests queued in the engines now: unserved demand."""
        return f"sum({WAITING}{{{self.sel}}})"

    @property
    def kv_usage_avg(self) -> str:
        """Mean KV-cache usage over engines (0..1): memory pressure that caps concurrency before speed does."""
        return f"avg({KV_USAGE}{{{self.sel}}})"

    @property
    def kv_usage_max(self) -> str:
        """KV-cache usage of the fullest engine."""
        return f"max({KV_USAGE}{{{self.sel}}})"

    @property
    def ttft_at_percentile(self) -> str:
        """Time to first token `percentile`% of requests met (slow side, same direction as the ITL)."""
        return self._quantile(TTFT, self.percentile / 100.0)

    @property
    def sample_age(self) -> str:
        """Seconds since the freshest engine sample, on Prometheus's own clock (no skew with the operator).
        A scrape failure ends a series at once (staleness marker), so dead targets read as no data."""
        return f"time() - max(timestamp({RUNNING}{{{self.sel}}}))"

    @property
    def replicas_reporting(self) -> str:
        """Replica groups with at least one engine scraped."""
        return f"count(count by ({GROUP_LABEL}) ({RUNNING}{{{self.sel}}}))"

    def all(self) -> dict[str, str]:
        """Name -> query, in the order metrics.py runs them (freshness first: it decides whether the rest matter)."""
        names = (
            "sample_age", "running", "waiting", "running_avg", "generation_tokens_rate", "itl_steps_rate",
            "first_tokens_rate", "tpot_requests_rate", "tpot_at_percentile", "tpot_p50", "itl_at_percentile", "itl_p50",
            "kv_usage_avg", "kv_usage_max", "ttft_at_percentile", "replicas_reporting", "mean_output_tokens",
            "arrival_rate",
        )  # fmt: skip
        return {n: getattr(self, n) for n in names}
