"""The operator's own Prometheus metrics, served on a loopback port by default."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

REGISTRY = CollectorRegistry()


class _ControllerCollector:
    def __init__(self, controller: object):
        self.controller = controller

    def collect(self):
        stats = self.controller.stats
        yield CounterMetricFamily("flashserve_reconciles", "Reconciles run", value=stats.reconciles)
        yield CounterMetricFamily("flashserve_child_writes", "Writes to child objects", value=stats.writes)
        yield CounterMetricFamily("flashserve_status_writes", "Status updates", value=stats.status_writes)
        yield CounterMetricFamily("flashserve_api_requests", "API requests made by reconciles",
                                  value=self.controller.kube.requests)  # fmt: skip
        startups = getattr(self.controller, "startups", None)
        if startups is not None:
            yield from startups.collect()
        yield drain_gauge(getattr(self.controller, "drains", {}))
        scaler = getattr(self.controller, "autoscaler", None)
        if scaler is not None and hasattr(scaler, "collect"):
            yield from scaler.collect()


def drain_gauge(drains: dict) -> GaugeMetricFamily:
    """Requests still in flight on each draining group's engines (those that answered), as of the last poll:
    kept out of status, which would otherwise change at every poll of a busy drain."""
    g = GaugeMetricFamily("flashserve_drain_requests_in_flight",
                          "Running plus waiting requests on a draining replica group's engines that answered",
                          labels=["namespace", "serving", "group", "reason"])  # fmt: skip
    for (namespace, serving), ds in sorted(drains.items()):
        for d in ds:
            if d.in_flight is not None:
                g.add_metric([namespace, serving, str(d.group), d.reason], d.in_flight)
    return g


def serve_metrics(host: str, port: int, controller: object, gate=None, certfile: str | None = None,
                  keyfile: str | None = None):
    """Serve the operator's metrics; with `gate` (metrics_auth.Gate) only to authorised scrapers."""
    from flashserve.controller.metrics_auth import serve

    REGISTRY.register(_ControllerCollector(controller))
    return serve(host, port, REGISTRY, gate=gate, certfile=certfile, keyfile=keyfile)
