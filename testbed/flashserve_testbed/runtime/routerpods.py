"""Where a client of the local cluster reaches a serving: one of its router pods, at the pod IP.

The API server refuses loopback addresses in Endpoints and EndpointSlices, so with the local cluster's loopback
pod IPs a Service has no endpoints; the harness (demo, e2e tests) finds a Ready router pod of the serving by
its labels instead, as vllm-router finds engine pods."""

from __future__ import annotations

import time
from typing import Callable

from flashserve.render.naming import COMPONENT_LABEL, SERVING_LABEL, serving_label_value

ROUTER_COMPONENT = "router"
ROUTER_CONTAINER = "router"
DEFAULT_PORT = 8000


def router_selector(serving: str) -> str:
    """The label selector of a serving's router pods (the Deployment's selector, routing contract)."""
    return f"{SERVING_LABEL}={serving_label_value(serving)},{COMPONENT_LABEL}={ROUTER_COMPONENT}"


def _ready(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def pod_url(pod: dict, container: str, port_name: str, default: int | None = None) -> str | None:
    """`http://<pod IP>:<port>` of one container's named port, `default` where it names none (pure); None
    while the pod has no IP."""
    ip = (pod.get("status") or {}).get("podIP")
    c = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == container), {})
    port = next((p["containerPort"] for p in c.get("ports") or [] if p.get("name") == port_name), default)
    return f"http://{ip}:{port}" if ip and port else None


def router_urls(pods: list[dict]) -> list[str]:
    """`http://<pod IP>:<http port>` of each Ready, not terminating router pod, by name (pure)."""
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if pod["metadata"].get("deletionTimestamp") or not _ready(pod):
            continue
        if url := pod_url(pod, ROUTER_CONTAINER, "http", DEFAULT_PORT):
            out.append(url)
    return out


def wait_router_url(list_pods: Callable[[str], list[dict]], serving: str, timeout: float = 60.0,
                    interval: float = 0.5) -> str:
    """The first router URL of `serving` once one is Ready. `list_pods(selector)` lists pods of the serving's
    namespace as dicts (e.g. through the kubernetes client's sanitize_for_serialization)."""
    deadline = time.monotonic() + timeout
    selector = router_selector(serving)
    while True:
        urls = router_urls(list_pods(selector))
        if urls:
            return urls[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Ready router pod of serving {serving!r} ({selector}) after {timeout:.0f}s")
        time.sleep(interval)
