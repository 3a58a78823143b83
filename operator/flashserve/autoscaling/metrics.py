"""Read a serving's MetricsSnapshot from Prometheus (prometheus-api-client).

The client is synchronous (requests), so the operator calls the `*_async` wrappers, which run it in a worker
thread and keep kopf's event loop free. Nothing here raises: any failure becomes a None snapshot plus the
reason, which the policy turns into a hold with MetricsAvailable=False.

The reason is a class (Unreachable, HTTPError <code>, BadResponse), never the endpoint's response body or
exception text: the URL may be a serving's own, and what an arbitrary endpoint answers must not be read back
through the serving's status. Redirects are not followed, for the same reason (allowlist.py checks the URL
the serving gives, not where a redirect would lead).

Every answer is read within the evaluation's wall-clock deadline and up to MAX_ANSWER_BYTES: requests'
timeout bounds each socket read, not the whole answer, so an endpoint that sends a byte a second, or
gigabytes, would otherwise hold a worker thread as long as it likes or exhaust the operator's memory, and
the endpoint may be a serving's own. The fetches run on a pool of their own (FETCH_THREADS), so a slow
Prometheus never delays the operator's writes, which use asyncio's default pool.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from flashserve.autoscaling.promql import Queries
from flashserve.autoscaling.snapshot import MetricsSnapshot

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
# A step yields at least one token; more than this many per step means the counters disagree (e.g. a
# restarted engine mid-window), and no correction is better than a wild one.
MAX_TOKENS_PER_STEP = 9.0
# Fewer requests finished in the window than this, and the per-request quantile is not trusted (the q0.9 of
# a handful of observations is their slowest one): the per-step reading, which has ~100 observations per
# request, stands in.
MIN_FINISHED_REQUESTS = 20.0
# An instant query of one aggregated sample answers in well under a kilobyte.
MAX_ANSWER_BYTES = 1 << 20
# A reading this large is no count, rate or latency an engine reports: treated as missing, so that one
# absurd series cannot overflow the policy's arithmetic.
MAX_READING = 1e12
FETCH_THREADS = 16
_pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="prometheus-fetch")


class AnswerTooSlow(requests.Timeout):
    """The answers did not all arrive within the evaluation's deadline."""


class AnswerTooLarge(requests.RequestException):
    """An answer longer than MAX_ANSWER_BYTES."""


class _BoundedSession(requests.Session):
    """A session whose every answer is read whole before `deadline` (time.monotonic()) and up to `max_bytes`."""

    def __init__(self, deadline: float, max_bytes: int = MAX_ANSWER_BYTES):
        super().__init__()
        self.deadline, self.max_bytes = deadline, max_bytes
        self.max_redirects = 0
        self.trust_env = False  # no proxy from the environment: the request goes where the allow-list said

    def request(self, method, url, *args, **kwargs):  # type: ignore[override]
        kwargs["stream"] = True
        response = super().request(method, url, *args, **kwargs)
        try:
            response._content = read_bounded(response.raw, self.deadline, self.max_bytes)
        finally:
            response.close()
        return response


def read_bounded(raw, deadline: float, max_bytes: int) -> bytes:
    """The body of a streamed urllib3 response, or AnswerTooSlow / AnswerTooLarge. read1 returns whatever has
    arrived (at most one socket timeout's wait), so the deadline is checked between trickles too."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise AnswerTooSlow()
        chunk = raw.read1(64 * 1024, decode_content=True)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge()
        chunks.append(chunk)


@dataclass(frozen=True)
class FetchResult:
    snapshot: MetricsSnapshot | None
    error: str | None = None


def fetch(
    url: str,
    namespace: str,
    serving: str,
    window_s: float = 60.0,
    percentile: float = 90.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    now: float | None = None,
) -> FetchResult:
    """Run the queries of promql.Queries and assemble the snapshot. `now` stamps it (default: time.time(),
    which is the clock the operator must then pass to the policy)."""
    stamp = time.time() if now is None else now
    queries = Queries(namespace, serving, window_s, percentile)
    # One attempt per query: the next evaluation is the retry, and a hung Prometheus must not hold the
    # evaluation for minutes.
    deadline = time.monotonic() + 2 * timeout_s
    prom = PrometheusConnect(url=url.rstrip("/"), retry=Retry(total=0, raise_on_status=False), timeout=timeout_s,
                             session=_BoundedSession(deadline))  # fmt: skip
    values: dict[str, float | None] = {}
    try:
        for name, query in queries.all().items():
            if time.monotonic() > deadline:
                return _fail(serving, f"Prometheus unavailable: Unreachable (no answers within {2 * timeout_s:g}s)")
            values[name] = _scalar(prom.custom_query(query, timeout=timeout_s))
            if name == "sample_age" and values[name] is None:
                return _fail(serving, f"no vLLM engine series for serving {namespace}/{serving} in Prometheus")
    except Exception as exc:  # noqa: BLE001 - any failure is a missing reading, never an operator crash
        log.debug("autoscaling metrics for %s: %r", serving, exc)
        return _fail(serving, f"Prometheus unavailable: {classify(exc, timeout_s)}")
    finally:
        prom.close()
    return FetchResult(assemble(values, stamp, window_s, percentile))


def assemble(values: dict[str, float | None], stamp: float, window_s: float, percentile: float) -> MetricsSnapshot:
    """Derived readings from the raw query results (pure, so the benchmark can reuse it)."""
    v = values.get
    tokens_per_step = None
    steps, gen = v("itl_steps_rate"), v("generation_tokens_rate")
    if steps and steps > 0 and gen is not None:
        tokens_per_step = min(MAX_TOKENS_PER_STEP, max(1.0, (gen - (v("first_tokens_rate") or 0.0)) / steps))

    def step_speed(itl: float | None) -> float | None:
        if tokens_per_step is None or itl is None or itl <= 0:
            return None
        return tokens_per_step / itl

    # The SLA reading is per request: 1 / TPOT quantile, one observation per finished request. With fewer than
    # MIN_FINISHED_REQUESTS finished in the window (none: the quantile is NaN, None here) the per-step ITL
    # reading stands in. That happens on an idle serving (then there are no decode steps either, and no speed,
    # as before), in the first window after traffic starts, or when the few requests in flight decode for
    # longer than the window: all at low concurrency, where both readings are well above the SLA (the step
    # reading is the higher of the two at low load, the lower near capacity), so the fallback neither declares
    # a breach nor hides one; the capacity learner takes such points near concurrency zero, where its
    # idle-speed anchor weighs most anyway.
    tpot, tpot_p50 = v("tpot_at_percentile"), v("tpot_p50")
    finished = (v("tpot_requests_rate") or 0.0) * window_s
    if tpot is not None and tpot > 0 and finished >= MIN_FINISHED_REQUESTS:
        source = "requests"
        speed_at, speed_p50 = 1.0 / tpot, (1.0 / tpot_p50 if tpot_p50 and tpot_p50 > 0 else None)
    else:
        speed_at, speed_p50 = step_speed(v("itl_at_percentile")), step_speed(v("itl_p50"))
        source = "steps" if speed_at is not None else None

    running_avg = v("running_avg")
    counters = gen / running_avg if gen is not None and running_avg and running_avg > 0 else None
    reporting = v("replicas_reporting")
    return MetricsSnapshot(
        time=stamp,
        sample_age_s=max(0.0, v("sample_age") or 0.0),
        window_s=window_s,
        percentile=percentile,
        running=v("running"),
        waiting=v("waiting"),
        running_avg=running_avg,
        speed_p50=speed_p50,
        speed_at_percentile=speed_at,
        speed_source=source,
        speed_from_counters=counters,
        tokens_per_step=tokens_per_step,
        tokens_per_second=gen,
        kv_usage_avg=v("kv_usage_avg"),
        kv_usage_max=v("kv_usage_max"),
        ttft_at_percentile_s=v("ttft_at_percentile"),
        replicas_reporting=int(reporting) if reporting is not None else None,
        arrival_rate=_non_negative(v("arrival_rate")),
        mean_output_tokens=_positive(v("mean_output_tokens")),
    )


def _non_negative(x: float | None) -> float | None:
    return max(0.0, x) if x is not None else None


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 else None


def fetch_snapshot(
    url: str, namespace: str, serving: str, window_s: float = 60.0, percentile: float = 90.0, **kw: float
) -> MetricsSnapshot | None:
    return fetch(url, namespace, serving, window_s, percentile, **kw).snapshot


async def fetch_async(
    url: str, namespace: str, serving: str, window_s: float = 60.0, percentile: float = 90.0, **kw: float
) -> FetchResult:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, lambda: fetch(url, namespace, serving, window_s, percentile, **kw))


async def fetch_snapshot_async(
    url: str, namespace: str, serving: str, window_s: float = 60.0, percentile: float = 90.0, **kw: float
) -> MetricsSnapshot | None:
    return (await fetch_async(url, namespace, serving, window_s, percentile, **kw)).snapshot


def _scalar(result: object) -> float | None:
    """The value of a one-sample instant vector; None for no sample, NaN/Inf (e.g. a quantile of an
    empty histogram, or a division by zero) or beyond MAX_READING."""
    if not isinstance(result, list) or not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and abs(value) <= MAX_READING else None


def _fail(serving: str, reason: str) -> FetchResult:
    log.warning("autoscaling metrics for %s: %s", serving, reason)
    return FetchResult(None, reason)


def classify(exc: BaseException, timeout_s: float) -> str:
    """Unreachable, HTTPError <code> or BadResponse: what went wrong, without anything the endpoint said."""
    if isinstance(exc, AnswerTooSlow):
        return f"Unreachable (no answers within {2 * timeout_s:g}s)"
    if isinstance(exc, AnswerTooLarge):
        return f"BadResponse (an answer over {MAX_ANSWER_BYTES >> 20} MiB)"
    if isinstance(exc, requests.TooManyRedirects):
        code = getattr(exc.response, "status_code", None)
        return f"HTTPError {code} (redirects are not followed)" if code else "BadResponse"
    if isinstance(exc, (requests.JSONDecodeError, ValueError)):
        return "BadResponse"  # an answer that is not JSON
    if isinstance(exc, requests.Timeout):
        return f"Unreachable (no answer within {timeout_s:g}s)"
    if isinstance(exc, requests.ConnectionError):
        # With retries off, requests reports a read timeout as a ConnectionError wrapping urllib3's
        # ReadTimeoutError; name the timeout, which is what the user can act on.
        if "timed out" in str(exc).lower():
            return f"Unreachable (no answer within {timeout_s:g}s)"
        return "Unreachable"
    if isinstance(exc, requests.RequestException):
        return "Unreachable"
    if isinstance(exc, PrometheusApiClientException):
        m = re.match(r"HTTP Status Code (\d{3})\b", str(exc))
        return f"HTTPError {m.group(1)}" if m else "BadResponse"
    return "BadResponse"  # a 200 whose body is not a Prometheus answer (JSON, data.result)
