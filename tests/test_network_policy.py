"""Who may reach which port of the engines, by evaluating the rendered NetworkPolicy with the Kubernetes
semantics in tests/netpol_eval.py (the local cluster enforces no NetworkPolicy). Also checks the evaluator
itself on the rules the matrix depends on."""

from __future__ import annotations

import pytest
from flashserve.render.renderer import render

from tests.builders import by_kind, cr
from tests.netpol_eval import Pod, allowed

NS = "team-a"
API, RPC, NCCL = 8000, 29550, 40123  # NCCL's bootstrap and socket transport pick ephemeral ports


def _serving(name: str = "flash", **network_policy) -> list[dict]:
    spec = {"parallelism": {"nodesPerReplica": 2}, "replicas": 2}
    if network_policy:
        spec["networkPolicy"] = network_policy
    c = cr(spec, name=name)
    c["metadata"]["namespace"] = NS
    return render(c)


def _engine_pod(objs: list[dict], group: int = 0) -> Pod:
    sts = by_kind(objs, "StatefulSet")[group]
    template = sts["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    return Pod(sts["metadata"]["namespace"], template["metadata"]["labels"], ports=ports)


def _router_pod(objs: list[dict]) -> Pod:
    dep = by_kind(objs, "Deployment")[0]
    template = dep["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    return Pod(dep["metadata"]["namespace"], template["metadata"]["labels"], ports=ports)


def _policies(*servings: list[dict]) -> list[dict]:
    return [o for objs in servings for o in by_kind(objs, "NetworkPolicy")]


def _matrix(policies: list[dict], dst: Pod, sources: dict[str, Pod]) -> dict[str, tuple[bool, bool, bool]]:
    return {who: tuple(allowed(policies, src, dst, port) for port in (API, RPC, NCCL)) for who, src in sources.items()}


def test_default_policy_matrix():
    flash, other = _serving(allowedNamespaces=["gateway"]), _serving("other")
    policies = _policies(flash, other)
    assert len(policies) == 4, "the engines' and the router's policies are on by default"
    dst = _engine_pod(flash, 0)
    own_labels = _engine_pod(flash, 1).labels
    sources = {
        "same group": _engine_pod(flash, 0),
        "other group of the serving": _engine_pod(flash, 1),
        "other serving, same namespace": _engine_pod(other, 0),
        "plain pod, same namespace": Pod(NS, {"app": "client"}),
        "gateway (allowedNamespaces)": Pod("gateway", {"app": "envoy"}),
        "prometheus (monitoringNamespaces)": Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}),
        "random namespace": Pod("elsewhere", {"app": "x"}),
        "random namespace with the serving's labels": Pod("elsewhere", own_labels),
        "gateway with the serving's labels": Pod("gateway", own_labels),
        "the operator's namespace": Pod("flashserve-system", {"app.kubernetes.io/component": "operator"}),
        "router of the serving": _router_pod(flash),
        "router of another serving": _router_pod(other),
    }
    #                                                 API    RPC    NCCL
    assert _matrix(policies, dst, sources) == {
        "same group":                                 (True, True, True),
        "other group of the serving":                 (True, True, True),
        "other serving, same namespace":              (True, False, False),
        "plain pod, same namespace":                  (True, False, False),
        "gateway (allowedNamespaces)":                (True, False, False),
        "prometheus (monitoringNamespaces)":          (True, False, False),
        "random namespace":                           (False, False, False),
        "random namespace with the serving's labels": (False, False, False),
        "gateway with the serving's labels":          (True, False, False),
        "the operator's namespace":                   (True, False, False),
        "router of the serving":                      (True, False, False),
        "router of another serving":                  (True, False, False),
    }  # fmt: skip
    # The other serving's engines are isolated from this serving's in the same way.
    assert not allowed(policies, dst, _engine_pod(other, 0), RPC)
    assert allowed(policies, _engine_pod(other, 1), _engine_pod(other, 0), RPC)


def test_the_ports_are_the_rendered_ones():
    objs = _serving()
    dst = _engine_pod(objs)
    assert dst.ports == {"http": API, "dp-rpc": RPC}
    moved = render(cr({"engine": {"port": 9000}, "parallelism": {"nodesPerReplica": 2}}))
    policies, moved_dst = _policies(moved), _engine_pod(moved)
    client = Pod("ns", {"app": "client"})
    assert allowed(policies, client, moved_dst, 9000) and not allowed(policies, client, moved_dst, API)


def test_router_policy_matrix():
    """The router takes the API from the namespace, allowedNamespaces and the operator (which lists its workers
    to confirm drains), /metrics from monitoringNamespaces; nothing reaches the engines' ports on it, and
    nothing else reaches it."""
    flash = _serving(allowedNamespaces=["gateway"])
    policies = _policies(flash, _serving("other"))
    dst = _router_pod(flash)
    http, metrics = dst.ports["http"], dst.ports["metrics"]
    assert (http, metrics) == (8000, 29000)
    sources = {
        "plain pod, same namespace": Pod(NS, {"app": "client"}),
        "gateway (allowedNamespaces)": Pod("gateway", {"app": "envoy"}),
        "prometheus (monitoringNamespaces)": Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}),
        "the operator's namespace": Pod("flashserve-system", {}),
        "random namespace with the router's labels": Pod("elsewhere", dst.labels),
    }
    got = {who: (allowed(policies, src, dst, http), allowed(policies, src, dst, metrics)) for who, src in sources.items()}
    #                                                http   metrics
    assert got == {
        "plain pod, same namespace":                 (True, False),
        "gateway (allowedNamespaces)":               (True, False),
        "prometheus (monitoringNamespaces)":         (False, True),
        "the operator's namespace":                  (True, False),
        "random namespace with the router's labels": (False, False),
    }  # fmt: skip


APISERVER = (("192.0.2.2/32", 6443), ("10.96.0.1/32", 443))


def test_router_egress_reaches_the_serving_engines_and_the_api_server_only():
    """vllm-router adds any worker a client of its API port names (/add_worker), so the router pods may
    connect only to the serving's engines, on their API port, and to the API server it watches."""
    c = cr({"parallelism": {"nodesPerReplica": 2}, "replicas": 2}, name="flash")
    c["metadata"]["namespace"] = NS
    flash, other = render(c, api_server=APISERVER), _serving("other")
    policies, router = _policies(flash, other), _router_pod(flash)
    (rule,) = [p for p in _policies(flash) if p["metadata"]["name"].endswith("router")]
    assert rule["spec"]["policyTypes"] == ["Ingress", "Egress"]
    reachable = {
        "engine, API port": (_engine_pod(flash, 1), API, True),
        "engine, RPC port": (_engine_pod(flash, 0), RPC, False),
        "API server": (Pod("", ip="192.0.2.2"), 6443, True),
        "API server's ClusterIP": (Pod("", ip="10.96.0.1"), 443, True),
        "API server, another port": (Pod("", ip="192.0.2.2"), API, False),
        "a client's own server": (Pod("", ip="203.0.113.9"), API, False),
        "cloud metadata": (Pod("", ip="169.254.169.254"), 80, False),
        "another serving's engine": (_engine_pod(other, 0), API, False),
        "a pod of another namespace": (Pod("elsewhere", {"app": "x"}, ip="10.0.3.3"), API, False),
    }
    got = {who: allowed(policies, router, dst, port) for who, (dst, port, _) in reachable.items()}
    assert got == {who: want for who, (_, _, want) in reachable.items()}
    assert allowed(policies, Pod(NS, {"app": "client"}), router, API), "clients still reach the router"


def test_router_egress_stays_open_while_the_api_servers_addresses_are_unknown():
    """Without them an egress rule would cut the router off its discovery; the operator says so in its log."""
    flash = _serving()
    (rule,) = [p for p in _policies(flash) if p["metadata"]["name"].endswith("router")]
    assert rule["spec"]["policyTypes"] == ["Ingress"] and "egress" not in rule["spec"]
    assert allowed(_policies(flash), _router_pod(flash), Pod("", ip="203.0.113.9"), API)


def test_routing_off_leaves_no_router_policy_and_no_router_rule():
    c = cr({"routing": {"enabled": False}})
    c["metadata"]["namespace"] = NS
    objs = render(c)
    (pol,) = _policies(objs)
    assert not any(p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "router"
                   for rule in pol["spec"]["ingress"] for p in rule["from"])  # fmt: skip


def test_the_operator_namespace_is_a_render_option():
    """The operator reads the engines' /metrics while draining: its own namespace (as it passes it) reaches
    the API port and nothing else; another namespace does not."""
    c = cr({"parallelism": {"nodesPerReplica": 2}})
    c["metadata"]["namespace"] = NS
    objs = render(c, operator_namespace="ops")
    dst, policies = _engine_pod(objs), _policies(objs)
    assert allowed(policies, Pod("ops", {}), dst, API) and not allowed(policies, Pod("ops", {}), dst, RPC)
    assert not allowed(policies, Pod("flashserve-system", {}), dst, API)


def test_monitoring_namespaces():
    prom = Pod("observability", {"app": "prometheus"})
    default_prom = Pod("monitoring", {"app": "prometheus"})
    stranger = Pod("elsewhere", {})
    objs = _serving(monitoringNamespaces=["observability"])
    dst = _engine_pod(objs)
    assert allowed(_policies(objs), prom, dst, API) and not allowed(_policies(objs), prom, dst, RPC)
    assert not allowed(_policies(objs), default_prom, dst, API)
    # None at all: the rule is left out rather than rendered with an empty `from`, which would admit everyone.
    objs = _serving(monitoringNamespaces=[])
    dst = _engine_pod(objs)
    assert not allowed(_policies(objs), default_prom, dst, API)
    assert not allowed(_policies(objs), stranger, dst, API)
    assert allowed(_policies(objs), Pod(NS, {}), dst, API)


def test_turned_off_everyone_reaches_every_port():
    objs = _serving(enabled=False)
    assert not _policies(objs)
    dst = _engine_pod(objs)
    assert allowed(_policies(objs), Pod("elsewhere", {}), dst, RPC)


def test_allowed_namespaces_must_be_namespace_names():
    from flashserve.api.validation import SpecError

    with pytest.raises(SpecError, match="allowedNamespaces"):
        render(cr({"networkPolicy": {"allowedNamespaces": ["Not_A_Namespace"]}}))
    with pytest.raises(SpecError, match="monitoringNamespaces"):
        render(cr({"networkPolicy": {"monitoringNamespaces": [""]}}))


# ------------------------------------------------------------------------------------- the evaluator


def _policy(ns: str, pod_selector: dict, ingress: list | None, **spec) -> dict:
    body = {"podSelector": pod_selector, **spec}
    if ingress is not None:
        body["ingress"] = ingress
    return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": ns}, "spec": body}


A = Pod("a", {"app": "web"}, ports={"http": 80})
B_SAME_NS = Pod("a", {"app": "db"})
C_OTHER_NS = Pod("c", {"app": "db"}, namespace_labels={"team": "blue"})


def test_eval_unselected_pods_accept_everything_and_policy_types_matter():
    assert allowed([], C_OTHER_NS, A, 1)
    assert allowed([_policy("a", {"matchLabels": {"app": "other"}}, [])], C_OTHER_NS, A, 1)
    assert allowed([_policy("c", {}, [])], C_OTHER_NS, A, 1), "a policy of another namespace does not isolate"
    assert not allowed([_policy("a", {}, [])], B_SAME_NS, A, 1), "an empty selector isolates every pod"
    egress_only = _policy("a", {}, None, policyTypes=["Egress"])
    assert allowed([egress_only], C_OTHER_NS, A, 1)
    implied_both = _policy("a", {}, None, egress=[{}])
    assert not allowed([implied_both], C_OTHER_NS, A, 1)


def test_eval_empty_from_and_ports_match_everything():
    assert allowed([_policy("a", {}, [{}])], C_OTHER_NS, A, 12345)
    only_80 = _policy("a", {}, [{"ports": [{"port": 80}]}])
    assert allowed([only_80], C_OTHER_NS, A, 80) and not allowed([only_80], C_OTHER_NS, A, 81)
    assert not allowed([only_80], C_OTHER_NS, A, 80, "UDP")


def test_eval_peers():
    same_ns_db = _policy("a", {}, [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}])
    assert allowed([same_ns_db], B_SAME_NS, A, 1) and not allowed([same_ns_db], C_OTHER_NS, A, 1)
    blue = _policy("a", {}, [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}])
    assert allowed([blue], C_OTHER_NS, A, 1) and not allowed([blue], B_SAME_NS, A, 1)
    both = [{"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": {"matchLabels": {"app": "web"}}}]
    assert not allowed([_policy("a", {}, [{"from": both}])], C_OTHER_NS, A, 1), "both selectors must match"
    either = [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}, {"podSelector": {"matchLabels": {"app": "web"}}}]
    assert allowed([_policy("a", {}, [{"from": either}])], C_OTHER_NS, A, 1), "separate peers add up"
    by_name = _policy("a", {}, [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}]}])
    assert allowed([by_name], C_OTHER_NS, A, 1)
    cidr = _policy("a", {}, [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}])
    assert allowed([cidr], Pod("x", ip="10.2.3.4"), A, 1) and not allowed([cidr], Pod("x", ip="10.1.3.4"), A, 1)


def test_eval_egress_isolates_the_source_and_both_ends_must_admit():
    to_db = _policy("a", {"matchLabels": {"app": "web"}}, None, policyTypes=["Egress"],
                    egress=[{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": 5432}]}])
    assert allowed([to_db], A, B_SAME_NS, 5432) and not allowed([to_db], A, B_SAME_NS, 5433)
    assert not allowed([to_db], A, C_OTHER_NS, 5432), "a podSelector alone picks the policy's namespace"
    assert allowed([to_db], B_SAME_NS, A, 1), "the destination's egress rules say nothing of what reaches it"
    to_block = _policy("a", {}, None, policyTypes=["Egress"], egress=[{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}])
    assert allowed([to_block], A, Pod("", ip="192.0.2.7"), 1) and not allowed([to_block], A, Pod("", ip="10.0.0.1"), 1)
    db_closed = _policy("a", {"matchLabels": {"app": "db"}}, [])
    assert not allowed([to_db, db_closed], A, B_SAME_NS, 5432), "the destination's ingress must admit it too"


def test_eval_ports_and_expressions():
    ranged = _policy("a", {}, [{"ports": [{"port": 100, "endPort": 200}]}])
    assert allowed([ranged], C_OTHER_NS, A, 200) and not allowed([ranged], C_OTHER_NS, A, 201)
    named = _policy("a", {}, [{"ports": [{"port": "http"}]}])
    assert allowed([named], C_OTHER_NS, A, 80) and not allowed([named], C_OTHER_NS, A, 8080)
    expr = _policy("a", {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, [])
    assert allowed([expr], C_OTHER_NS, A, 1), "the selector does not pick A, so A is not isolated"
    exists = _policy("a", {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, [])
    assert not allowed([exists], C_OTHER_NS, A, 1)
    rules_add_up = [_policy("a", {}, [{"ports": [{"port": 1}]}]), _policy("a", {}, [{"ports": [{"port": 2}]}])]
    assert allowed(rules_add_up, C_OTHER_NS, A, 1) and allowed(rules_add_up, C_OTHER_NS, A, 2)


def test_operator_reaches_engines_only_to_read_a_draining_group():
    """The operator reads pod readiness from the API server and engine metrics for autoscaling from
    Prometheus; the one connection it makes to an engine is the drain's (GET /metrics of a draining group,
    docs/drain.md), so the engine policy must let the operator's namespace reach the API port. Guard that this
    stays the only one: only reconciler.py names the engine port (for its probe, and for the engine URLs it
    registers with a router, looks for in a router's list or asks a router to add back, which it sends or
    compares and never opens), only
    engine_metrics.py and router_workers.py (to the router pods' port) open HTTP connections, and nothing
    names the data-parallel RPC port."""
    from pathlib import Path

    import flashserve.controller as controller

    for path in Path(controller.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "rpc_port" not in text, f"{path.name} talks to engines' RPC port"
        if path.name != "reconciler.py":
            assert "engine.port" not in text, f"{path.name} talks to engines"
        if path.name not in ("engine_metrics.py", "router_workers.py"):
            assert "urllib.request" not in text and "http.client" not in text, f"{path.name} opens connections"
    probe = (Path(controller.__file__).parent / "reconciler.py").read_text()
    assert probe.count("engine.port") == 4 and "self._probe(mine, spec.engine.port)" in probe
    assert "desired_workers(mine, spec.engine.port," in probe and "out_of_routing(mine, spec.engine.port," in probe
    assert "port, now, networks = spec.engine.port," in probe and "discovery_repair(urls, mine, port," in probe
    registrar = (Path(controller.__file__).parent / "router_workers.py").read_text()
    assert registrar.count("self._opener.open(") == 1 and "router_targets(" not in probe.replace(
        "router_targets(mine, spec.routing.port, self.engine_networks)", ""), "routers are asked on routing.port only"
