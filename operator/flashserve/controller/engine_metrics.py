"""Asking an engine how many requests it still holds: GET /metrics on the pod, running plus waiting.

A drain waits on this, not on Prometheus: a scrape is up to an interval (15-30 s) old, and a drain that ends on
a stale zero cuts the requests that arrived since. The engine's own gauges are current to the request.

The address is the pod IP the caller checked (drain.drain_targets) and the port of the rendered spec. The
request goes straight to it: proxies from the environment are ignored (they would send pod traffic out of
the cluster) and redirects are not followed (an answer must not send the operator to another address).
"""

from __future__ import annotations

import http.client
import math
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# An engine answers /metrics in milliseconds; one that takes longer is busy or gone, and a drain asks again
# at its next poll. Short, so one slow pod cannot hold the reconcile of its serving.
PROBE_TIMEOUT_S = 1.0
# vLLM's /metrics is a few hundred KB with every histogram of every local data-parallel rank; far more is not
# an engine's answer.
MAX_METRICS_BYTES = 8 * 1024 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError for the 3xx


def direct_opener() -> urllib.request.OpenerDirector:
    """An opener for pod addresses: no proxy from the environment, no redirect followed."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def requests_in_flight(text: str) -> int | None:
    """Running plus waiting requests over every sample (one per data-parallel rank of the pod) of a vLLM
    /metrics page; None when the page has neither gauge or a value that is not a count."""
    total, seen = 0.0, False
    try:
        for family in text_string_to_metric_families(text):
            if family.name not in (RUNNING, WAITING):
                continue
            for sample in family.samples:
                if sample.name != family.name:
                    continue
                if not math.isfinite(sample.value) or sample.value < 0:
                    return None
                total += sample.value
                seen = True
    except ValueError:  # not the Prometheus text format
        return None
    return round(total) if seen else None


def connection_refused(exc: BaseException) -> bool:
    """Whether a call failed because the connection was refused (urllib wraps it in URLError)."""
    return isinstance(exc.reason if isinstance(exc, urllib.error.URLError) else exc, ConnectionRefusedError)


class EngineMetrics:
    """Reads an engine's requests in flight over HTTP; 0 when the connection is refused (no engine listens);
    None for any other failure (no answer, not 200, too large, not vLLM's metrics)."""

    def __init__(self, timeout: float = PROBE_TIMEOUT_S):
        self.timeout = timeout
        self._opener = direct_opener()

    def requests_in_flight(self, host: str, port: int) -> int | None:
        url = f"http://{host}:{int(port)}/metrics"
        try:
            with self._opener.open(url, timeout=self.timeout) as resp:
                if resp.status != 200:
                    return None
                data = resp.read(MAX_METRICS_BYTES + 1)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # Refused: the pod is there and nothing listens on the engine port (the engine has exited or never
            # started), so it holds no request. A timeout or any other failure says nothing.
            return 0 if connection_refused(exc) else None
        if len(data) > MAX_METRICS_BYTES:
            return None
        return requests_in_flight(data.decode("utf-8", errors="replace"))
