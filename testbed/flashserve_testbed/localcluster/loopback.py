"""The local cluster's addresses, all inside 127.0.0.0/8, and the guard that discovering components start behind.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a pod IP there is an address a mock process can
listen on, and a component that discovers pods through the API (vllm-router, Prometheus with
kubernetes_sd_configs) reaches it without any traffic leaving the machine.

Address plan of one cluster (its *slot*, 0..SLOTS-1, fixed for the cluster's lifetime, since a node's podCIDR
is immutable): pool p of the cluster owns the second octet B = FIRST_OCTET2 + SLOT_WIDTH * slot + p;
node n of that pool gets podCIDR 127.B.(n+1).0/24 and InternalIP 127.B.0.(n+1); pods of nodes without a
podCIDR (kwok's --cidr) get 127.B0.255.0/24 (B0: the slot's first pool). 127.0-3.x.x stays free for the
machine's own services (API server, Prometheus on 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
import zlib
from dataclasses import dataclass
from typing import Iterable

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
FIRST_OCTET2 = 4
SLOT_WIDTH = 4  # pools per cluster
SLOTS = (255 - FIRST_OCTET2) // SLOT_WIDTH  # 62: second octets 4..251
MAX_NODES_PER_POOL = 254
SLOT_ENV = "FLASHSERVE_CLUSTER_LOOPBACK_SLOT"


class AddressPlanError(ValueError):
    pass


def default_slot(cluster_root: str) -> int:
    """A slot from the cluster directory, so two clusters in two directories usually get different addresses
    (1 in 62 collide: set FLASHSERVE_CLUSTER_LOOPBACK_SLOT then; the runtime refuses an address in use)."""
    return zlib.crc32(cluster_root.encode()) % SLOTS


def check_slot(slot: int) -> int:
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < SLOTS:
        raise AddressPlanError(f"loopback slot {slot!r}: expected an integer 0..{SLOTS - 1} "
                               f"(set {SLOT_ENV} or the cluster's loopback_slot setting)")
    return slot


def _octet2(slot: int, pool_index: int) -> int:
    check_slot(slot)
    if not 0 <= pool_index < SLOT_WIDTH:
        raise AddressPlanError(f"the local cluster has room for {SLOT_WIDTH} node pools in 127.0.0.0/8 per "
                               f"cluster; pool #{pool_index + 1} is one too many (merge pools in the pools file)")
    return FIRST_OCTET2 + SLOT_WIDTH * slot + pool_index


def _check_node(pool: str, node_index: int) -> None:
    if not 0 <= node_index < MAX_NODES_PER_POOL:
        raise AddressPlanError(f"pool {pool!r}: node #{node_index + 1} is over the {MAX_NODES_PER_POOL} nodes a "
                               f"pool can address in 127.0.0.0/8 (lower its racks/nodesPerRack/nodes)")


def pod_cidr(slot: int, pool_index: int, node_index: int, pool: str = "") -> str:
    _check_node(pool, node_index)
    return f"127.{_octet2(slot, pool_index)}.{node_index + 1}.0/24"


def node_ip(slot: int, pool_index: int, node_index: int, pool: str = "") -> str:
    _check_node(pool, node_index)
    return f"127.{_octet2(slot, pool_index)}.0.{node_index + 1}"


def default_cidr(slot: int) -> str:
    """kwok's --cidr (KwokConfiguration options.cidr): pod IPs on nodes that set no podCIDR of their own."""
    return f"127.{_octet2(slot, 0)}.255.0/24"


# -- the guard ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Violation:
    kind: str  # "pod" or "node"
    name: str  # namespace/name for pods
    field: str  # where the address was found, e.g. status.podIPs[0].ip
    address: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.field} {self.address} is outside 127.0.0.0/8"


class NotLoopback(RuntimeError):
    """A discovering component would connect to an address off this machine."""

    def __init__(self, violations: list[Violation], component: str = "a discovering component"):
        self.violations = violations
        shown = "; ".join(str(v) for v in violations[:5])
        more = f" (and {len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(
            f"refusing to start {component}: {shown}{more}. It would connect to every pod IP it discovers, and "
            "the local stack sends traffic to 127.0.0.0/8 only. Give the node a podCIDR and InternalIP inside "
            "127.0.0.0/8 (`flashserve cluster up` does for its own pools) or delete the pod.")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in LOOPBACK
    except ValueError:
        return False


def _get(obj, *path):
    for key in path:
        obj = (obj or {}).get(key) if isinstance(obj, dict) else None
    return obj


# Node address types that hold IPs; Hostname/InternalDNS/ExternalDNS are names that nothing here resolves
# for discovery (kubernetes_sd role pod and vllm-router use pod IPs; role node takes InternalIP first).
IP_ADDRESS_TYPES = ("InternalIP", "ExternalIP")


def violations(pods: Iterable[dict], nodes: Iterable[dict]) -> list[Violation]:
    """Every address a discovering component could reach that is outside 127.0.0.0/8 (pure).

    Pods: status.podIP/podIPs (a hostNetwork pod's are its node's), status.hostIP/hostIPs. Nodes: their
    IP-typed addresses. An empty address (a pod not yet given one) is no violation: nothing can reach it."""
    out: list[Violation] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        host = " (hostNetwork: the node's address)" if _get(pod, "spec", "hostNetwork") else ""
        for field in ("podIP", "hostIP"):
            value = status.get(field)
            if value and not _is_loopback(value):
                out.append(Violation("pod", name, f"status.{field}{host if field == 'podIP' else ''}", value))
        for field in ("podIPs", "hostIPs"):
            for i, item in enumerate(status.get(field) or []):
                value = (item or {}).get("ip")
                if value and not _is_loopback(value) and value not in (status.get("podIP"), status.get("hostIP")):
                    out.append(Violation("pod", name, f"status.{field}[{i}].ip", value))
    for node in nodes:
        name = _get(node, "metadata", "name") or ""
        for i, addr in enumerate(_get(node, "status", "addresses") or []):
            if addr.get("type") in IP_ADDRESS_TYPES and addr.get("address") and not _is_loopback(addr["address"]):
                out.append(Violation("node", name, f"status.addresses[{i}] ({addr['type']})", addr["address"]))
    return out


def require_loopback(pods: Iterable[dict], nodes: Iterable[dict], component: str = "a discovering component") -> None:
    """Raise NotLoopback naming each pod or node whose address is outside 127.0.0.0/8."""
    found = violations(pods, nodes)
    if found:
        raise NotLoopback(found, component)
