"""Draining a replica group before it goes: the pure part (which pods to take out of routing, whether a drain
has ended and why), and which pods the operator may ask for their load.

A drain's whole state lives on the pods: the routing label (`serve` -> `drain`, which the router's selector and
the plain Service's drop) and the annotation saying since when. An operator that restarts reads it back from
the watch and carries on; nothing is kept in memory.

A drain ends when every engine of the group reports no running and no waiting request (`Idle`), once the
router has had time to see the label and every router pod has confirmed that the group left it, or when
spec.rollout.drainSeconds has passed since the first pod was taken out (`Timeout`), whichever comes first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.clock import iso_at, parse_iso
from flashserve.controller.observe import Observed, PodView, controlled_by, statefulset_of
from flashserve.render.naming import ROUTING_DRAIN

# The router drops a pod when its pod watch shows the new label (the drain also asks it whether it did), and
# kube-proxy when the EndpointSlice does: until then a new request may still be sent to the group, and one sent
# just before may still be on its way to the engine. An engine that reads idle inside this window can be about
# to get work, so idle counts only after it. Watch delivery takes well under a second on a healthy API server;
# 5 s covers a busy one, and costs nothing against drains that wait minutes for long generations.
DRAIN_SETTLE_S = 5.0

# drain-since is written as Kubernetes writes times: whole seconds (clock.iso_at).
ANNOTATION_RESOLUTION_S = 1.0

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCALE_DOWN = "ScaleDown"
ROLLOUT = "Rollout"
RENAME = "Rename"  # an old-named copy of a group, once the copy under its current name serves
IDLE = "Idle"
TIMEOUT = "Timeout"


@dataclass(frozen=True)
class Drain:
    group: int
    reason: str  # SCALE_DOWN, ROLLOUT or RENAME
    since: float  # seconds since the epoch: when the first pod was taken out of routing
    in_flight: int | None  # running + waiting requests over the engines that answered; None: none answered
    ended_by: str | None = None  # IDLE or TIMEOUT when the drain ended in this plan
    ended_at: float = 0.0
    routers_behind: bool = False  # a router pod had not confirmed that the group left its workers

    def status(self) -> dict:
        """status.drainingGroups' entry: what changes only when the drain starts or ends. The requests still in
        flight change at every poll (DRAIN_POLL_S) and would rewrite status with them: they are a metric
        (flashserve_drain_requests_in_flight), and in lastDrains once the drain ends."""
        return {"group": self.group, "since": iso_at(self.since), "reason": self.reason}

    def ended(self) -> dict:
        out = {"group": self.group, "reason": self.reason, "endedBy": self.ended_by,
               "seconds": round(max(0.0, self.ended_at - self.since), 1), "time": iso_at(self.ended_at)}  # fmt: skip
        if self.in_flight is not None:
            out["requestsInFlight"] = self.in_flight
        if self.routers_behind:
            out["routersBehind"] = True
        return out


@dataclass
class DrainStep:
    """What one group's drain asks of this plan."""

    done: bool  # the pods may be deleted now
    label: list[tuple[str, str, str]]  # (pod, uid, since) to take out of routing
    drain: Drain | None  # None when nothing was drained (drains off, no live pod)
    started: bool  # no pod of the group was out of routing before this plan


def out_since(p: PodView, now: float) -> float | None:
    """When a drain took the pod out of routing; None while it takes traffic, or when its annotation is unreadable
    or later than `now` (a hand edit, or a leader whose clock ran ahead: it would hold the drain for the gap, and
    one past year 9999 could not be written into status), and the drain labels it again with the time now."""
    since = parse_iso(p.drain_since) if p.routing == ROUTING_DRAIN else None
    if since is None or since > now + ANNOTATION_RESOLUTION_S:
        return None
    return min(since, now)


# A pod in these phases runs nothing, and the IP its status still shows may be another pod's by now.
TERMINAL_PHASES = ("Succeeded", "Failed")


def in_flight(p: PodView, observed: Observed) -> int | None:
    """Requests a draining pod still holds, as its engine answered (drain_targets); a pod without an IP, or one
    that has ended (TERMINAL_PHASES), runs nothing and counts as idle, one that did not answer is unknown.
    Readiness says nothing here: a pod turns NotReady when its health check times out under load or its node
    goes NotReady, and keeps serving the requests it holds, so an unready pod is asked like a ready one (an
    engine that is not listening, one still starting or one that exited, refuses the connection and counts as
    idle)."""
    if not p.ip or p.phase in TERMINAL_PHASES:
        return 0
    return observed.in_flight.get(p.name)


def drain_step(index: int, reason: str, pods: list[PodView], spec: DeepSeekServingSpec, observed: Observed) -> DrainStep:
    """One plan's step of draining `pods` (the live pods of group `index` that are to go)."""
    seconds = spec.rollout.drain_seconds
    if seconds == 0 or not pods:
        return DrainStep(True, [], None, False)
    now = observed.now
    marked = {p.name: t for p in pods if (t := out_since(p, now)) is not None}
    label = [(p.name, p.uid, iso_at(now)) for p in pods if p.name not in marked]
    first = min(marked.values(), default=now)
    last = now if label else max(marked.values())
    loads = [in_flight(p, observed) for p in pods]
    known = [x for x in loads if x is not None]
    requests = sum(known) if known else None
    idle = all(x == 0 for x in loads)
    behind = routers_behind(spec, observed, last)
    ended_by = None
    if not label and idle and not behind and now - last >= DRAIN_SETTLE_S:
        ended_by = IDLE
    elif now - first >= seconds:
        ended_by = TIMEOUT
    drain = Drain(index, reason, first, requests, ended_by, now if ended_by else 0.0, behind)
    return DrainStep(ended_by is not None, label, drain, not marked)


def routers_behind(spec: DeepSeekServingSpec, observed: Observed, last: float) -> bool:
    """Whether a router may still send the group work although its pods were out of routing by `last`. A
    router pod that has not dropped the group keeps sending new requests to its idle engines: one whose pod
    watch has stalled, or, where the operator keeps the router's workers, one its DELETE has not reached. So
    the drain waits for a reconcile after `last` in which every router pod confirmed that it lists no pod out
    of routing (controller/router_workers.py; observed.routers_synced_at, None: none since the operator
    started). The annotation holds whole seconds, so a reconcile in the same second as `last` may have come
    before the label: it does not count. A plain Service (routing off) has no router to wait for."""
    if not spec.routing.enabled:
        return False
    return observed.routers_synced_at is None or observed.routers_synced_at < last + ANNOTATION_RESOLUTION_S


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Comma-separated CIDRs (the operator's --engine-networks); ValueError names the one that is not."""
    out = []
    for part in (t.strip() for t in text.split(",")):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"--engine-networks: {part!r} is not a network (e.g. 10.64.0.0/10 or fd00::/8)") from None
    return tuple(out)


def drain_targets(observed: Observed, networks: tuple[IPNetwork, ...] = ()) -> list[PodView]:
    """The pods whose engines the operator asks for their load: live pods out of routing whose controller is a
    StatefulSet among the observed ones (the serving's own: `observed` is what observe.owned kept), with a pod
    IP that is a unicast address, inside one of `networks` when any are given (the operator's
    --engine-networks: the local cluster's loopback pod range). The address is only ever the pod's status.podIP
    (set by the cluster, not by any user), and the port the rendered spec's: no field of a serving can point the
    operator elsewhere. A hostNetwork pod (its IP is a node's) is never asked: the serving's StatefulSets never
    render one."""
    out = []
    for p in observed.pods:
        if p.routing != ROUTING_DRAIN or p.terminating or p.host_network or p.phase in TERMINAL_PHASES:
            continue
        if not controlled_by(p, observed.statefulsets.get(statefulset_of(p.name)), strict=True):
            continue
        if reachable_host(p, networks) is None:
            continue
        out.append(p)
    return out


def reachable_host(pod: PodView, networks: tuple[IPNetwork, ...] = ()) -> str | None:
    """The pod's address as a URL host when the operator may connect to it: a unicast status.podIP, not of a
    hostNetwork pod (its IP is a node's), inside one of `networks` when any are given; else None."""
    host = engine_address(pod.ip) if pod.ip else None
    if host is None or pod.host_network:
        return None
    if networks and not any(ipaddress.ip_address(pod.ip) in n for n in networks):
        return None
    return host


def engine_address(ip: str) -> str | None:
    """The pod IP as a URL host (IPv6 in brackets), or None when it is not a plain unicast IP address."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if addr.is_unspecified or addr.is_multicast:
        return None
    return f"[{addr}]" if addr.version == 6 else str(addr)
