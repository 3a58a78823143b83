"""The runtime's own metrics, read from its engines when scraped (served on the router's /metrics)."""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import GaugeMetricFamily

STATES = ("starting", "ready", "unready", "exited")


class RuntimeCollector:
    def __init__(self, runtime) -> None:
        self.runtime = runtime

    def collect(self):
        engines = list(self.runtime.engines.values())
        by_state = GaugeMetricFamily("flashserve_runtime_engines", "Engine processes by state", labels=["state"])
        counts = Counter(e.state for e in engines)
        for state in STATES:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state
        restarts = GaugeMetricFamily("flashserve_runtime_engine_restarts",
                                     "Times the pod's engine was restarted after it died",
                                     labels=["namespace", "pod", "serving"])
        ready = GaugeMetricFamily("flashserve_runtime_engine_ready_seconds",
                                  "Wall seconds from the pod seen Running to its Ready patch",
                                  labels=["namespace", "pod", "serving"])
        for e in engines:
            restarts.add_metric([e.namespace, e.name, e.serving], e.restarts)
            if e.ready_after is not None:
                ready.add_metric([e.namespace, e.name, e.serving], e.ready_after)
        yield restarts
        yield ready
