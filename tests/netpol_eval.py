"""Ingress and egress semantics of networking.k8s.io/v1 NetworkPolicy, as a pure function, for tests: would
Kubernetes let a connection from one pod reach a port of another pod or address?

The local cluster enforces no NetworkPolicy, so the rendered policies are checked by evaluating them here.
The rules follow the Kubernetes API reference (NetworkPolicySpec, NetworkPolicyIngressRule, NetworkPolicyPeer,
NetworkPolicyPort, LabelSelector):

- A pod is isolated for ingress when at least one policy of its namespace selects it (`podSelector`, where an
  empty selector selects every pod) and has `Ingress` among its `policyTypes`. `policyTypes` left out means
  `Ingress`, plus `Egress` when the policy has egress rules. A pod no policy isolates accepts everything.
- An isolated pod accepts a connection that some ingress rule of some policy selecting it admits; policies
  and rules add up, none subtracts.
- A rule admits a connection when its `from` matches the source and its `ports` match the port. `from` empty
  or left out matches every source; `ports` empty or left out matches every port.
- A peer with `podSelector` alone matches pods of the policy's own namespace; `namespaceSelector` alone, every
  pod of the namespaces it selects; both, the pods the pod selector picks in those namespaces; `ipBlock`, a
  source address inside `cidr` and outside every `except`.
- A port entry: `protocol` defaults to TCP; `port` left out matches every port of that protocol; a number
  matches it (up to `endPort` when given); a name matches the destination container port of that name.
- Every namespace carries `kubernetes.io/metadata.name: <name>` (the API server sets it).
- Egress mirrors ingress: a pod is isolated for egress when a policy selecting it has `Egress` among its
  `policyTypes`, and then connects only where some egress rule's `to` matches the destination (a pod, or an
  address outside the cluster given as a Pod with only `ip`) and its `ports` the port. A connection passes
  when the source's egress and the destination's ingress both admit it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    """Named container ports (name -> number), for policies that name a port."""
    ip: str | None = None

    def ns_labels(self) -> dict[str, str]:
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """LabelSelector: every matchLabels pair and every matchExpressions requirement holds; {} matches all."""
    if selector is None:
        raise ValueError("a missing selector is not an empty one: the caller decides what it means")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def _policy_types(spec: dict) -> list[str]:
    if spec.get("policyTypes"):
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def _selects(policy: dict, pod: Pod) -> bool:
    return policy["metadata"]["namespace"] == pod.namespace and selector_matches(policy["spec"].get("podSelector") or {}, pod.labels)


def _peer_matches(peer: dict, policy_namespace: str, src: Pod) -> bool:
    if "ipBlock" in peer:
        if src.ip is None:
            return False
        addr = ipaddress.ip_address(src.ip)
        block = peer["ipBlock"]
        return addr in ipaddress.ip_network(block["cidr"]) and not any(
            addr in ipaddress.ip_network(e) for e in block.get("except") or []
        )
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    if pod_sel is None and ns_sel is None:
        raise ValueError(f"a peer needs podSelector, namespaceSelector or ipBlock: {peer}")
    if ns_sel is None:
        in_namespace = src.namespace == policy_namespace
    else:
        in_namespace = selector_matches(ns_sel, src.ns_labels())
    return in_namespace and (pod_sel is None or selector_matches(pod_sel, src.labels))


def _port_matches(entry: dict, dst: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    want = entry.get("port")
    if want is None:
        return True
    if isinstance(want, str):
        return dst.ports.get(want) == port
    return want <= port <= entry.get("endPort", want)


def _rule_admits(rule: dict, direction: str, policy_namespace: str, peer: Pod, dst: Pod, port: int,
                 protocol: str) -> bool:  # fmt: skip
    """`peer` is the source for an ingress rule and the destination for an egress rule."""
    peers, ports = rule.get("from" if direction == "Ingress" else "to") or [], rule.get("ports") or []
    if peers and not any(_peer_matches(p, policy_namespace, peer) for p in peers):
        return False
    return not ports or any(_port_matches(e, dst, port, protocol) for e in ports)


def _admits(policies: list[dict], direction: str, src: Pod, dst: Pod, port: int, protocol: str) -> bool:
    isolated, peer = (dst, src) if direction == "Ingress" else (src, dst)
    isolating = [
        p for p in policies
        if p["kind"] == "NetworkPolicy" and _selects(p, isolated) and direction in _policy_types(p["spec"])
    ]  # fmt: skip
    if not isolating:
        return True
    return any(
        _rule_admits(rule, direction, p["metadata"]["namespace"], peer, dst, port, protocol)
        for p in isolating
        for rule in p["spec"].get(direction.lower()) or []
    )


def allowed(policies: list[dict], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether Kubernetes admits a connection from `src` to `dst` on `port`, given every NetworkPolicy of the
    cluster (policies of other namespaces are ignored, as the API server scopes them)."""
    return (_admits(policies, "Egress", src, dst, port, protocol)
            and _admits(policies, "Ingress", src, dst, port, protocol))  # fmt: skip
