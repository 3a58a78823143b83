"""Where the API server answers, so the router pods' NetworkPolicy can let them reach it and nothing else
beyond the engines (render/renderer.py, the router's NetworkPolicy).

vllm-router serves its worker routes (/add_worker, /remove_worker) on the port that serves the OpenAI API, to
any client and without credentials (tests/router/test_vllm_router.py pins it on the binary): a client could
add a server of its own as a worker and receive other clients' requests, or make the router connect anywhere
its pod can. An egress rule that admits only the serving's engines and the API server (which the router
watches for engine pods) takes that away. The router finds the API server at the `kubernetes` Service's
ClusterIP (kube-client's in-cluster config reads KUBERNETES_SERVICE_HOST, no DNS); NetworkPolicy
implementations match the address that ClusterIP is translated to, which the Service's EndpointSlice in
`default` lists, and some match the ClusterIP itself, so both are admitted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Callable, Mapping

from flashserve.render.renderer import ApiServer

log = logging.getLogger(__name__)

NAMESPACE = "default"
SLICE = "kubernetes"  # the API server names its own Service's EndpointSlice after the Service
# Control planes move seldom (an upgrade, a managed cluster's maintenance); a stale answer costs router
# pods their discovery only until the next read.
REFRESH_S = 300.0


def _cidr(address: str) -> str | None:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return f"{ip}/{ip.max_prefixlen}"


def api_server_addresses(endpoint_slice: dict | None, env: Mapping[str, str]) -> ApiServer:
    """(CIDR, port) pairs of the API server: each ready address of its EndpointSlice on each of the slice's
    ports, and with them the ClusterIP and port from the in-cluster environment where there is one (pure).
    Empty when the slice gives no address: most NetworkPolicy implementations match the translated address,
    so a rule admitting the ClusterIP alone would cut the router off the API server."""
    out: set[tuple[str, int]] = set()
    slice_ = endpoint_slice or {}
    ports = [p.get("port") for p in slice_.get("ports") or []]
    ports = [p for p in ports if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536]
    for ep in slice_.get("endpoints") or []:
        if (ep.get("conditions") or {}).get("ready") is False:
            continue
        for address in ep.get("addresses") or []:
            if (cidr := _cidr(str(address))) is not None:
                out.update((cidr, p) for p in ports)
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "")
    if out and host and port.isdigit() and 0 < int(port) < 65536 and (cidr := _cidr(host)) is not None:
        out.add((cidr, int(port)))
    return tuple(sorted(out))


def read_slice(kube) -> dict | None:
    """The API server's EndpointSlice through controller/kube.py's Kube (None where there is none)."""
    return kube.get(NAMESPACE, "EndpointSlice", SLICE)


class ApiServerAddresses:
    """The API server's addresses as last read: read once before the operator starts reconciling and again
    every REFRESH_S, off the reconcile path (a serving in steady state costs no request). A failed read
    keeps the last answer; with none yet the answer is empty and the router's egress stays open, which the
    log says once per streak of failures."""

    def __init__(self, read_slice: Callable[[], dict | None], env: Mapping[str, str]) -> None:
        self._read, self._env = read_slice, env
        self.value: ApiServer = ()
        self._warned = False

    def refresh(self) -> None:
        try:
            value = api_server_addresses(self._read(), self._env)
        except Exception as exc:  # noqa: BLE001 (any failure to read leaves the last answer in place)
            value, why = (), f"cannot read EndpointSlice {NAMESPACE}/{SLICE}: {exc}"
        else:
            why = f"EndpointSlice {NAMESPACE}/{SLICE} lists no ready address"
        if value:
            if value != self.value:
                log.info("router pods may reach the API server at %s", ", ".join(f"{c} port {p}" for c, p in value))
            self.value, self._warned = value, False
        elif not self.value and not self._warned:
            self._warned = True
            log.warning("router pods' egress is left open: %s (the operator needs get on it: docs/routing.md, "
                        "\"Who can steer the router\")", why)

    async def keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await asyncio.to_thread(self.refresh)
