"""The router's children and the InferencePool under Controller.reconcile against the in-memory API server
(tests/fakes.py FakeKube): made with the serving, put back when deleted or edited by hand, deleted when routing
or the pool is turned off. The oracle for "which children" is the renderer (tests/test_reconcile.py does the
same for the engines' children)."""

from __future__ import annotations

import copy

import pytest
from flashserve.api.validation import parse_serving
from flashserve.controller import handlers
from flashserve.controller.reconciler import RECENT_WRITE_S
from flashserve.render.naming import router_name
from flashserve.render.renderer import render_serving

from tests.builders import NS, body
from tests.fakes import FakeKube, controller, reconcile

ROUTER = router_name("flash")
ROUTER_CHILDREN = {("ServiceAccount", ROUTER), ("Role", ROUTER), ("RoleBinding", ROUTER), ("Deployment", ROUTER),
                   ("PodDisruptionBudget", ROUTER), ("NetworkPolicy", ROUTER)}  # fmt: skip


def rendered(spec: dict) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in render_serving(parse_serving(copy.deepcopy(body("flash", spec))))}


def present(kube: FakeKube) -> set[tuple[str, str]]:
    return {(k, n) for k, ns, n in kube.objects if ns == NS}


def applied(kube: FakeKube) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in kube.calls if c[0] == "apply"]


def deleted(kube: FakeKube) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in kube.calls if c[0] == "delete"]


def settled(spec: dict, clock):
    kube = FakeKube()
    c = controller(kube)
    status = reconcile(c, kube, body("flash", spec))
    status = reconcile(c, kube, body("flash", spec, status=status))
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    return kube, c, status


def test_the_router_is_made_with_the_serving_and_its_rbac_before_its_pods(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    assert ROUTER_CHILDREN <= present(kube) and present(kube) == rendered({"replicas": 1})
    # A steady serving with a router costs nothing either.
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert kube.calls == []
    fresh = FakeKube()
    reconcile(controller(fresh), fresh, body("flash", {"replicas": 1}))
    order = [k for k, n in applied(fresh) if n == ROUTER]
    assert order.index("ServiceAccount") < order.index("Role") < order.index("RoleBinding") < order.index("Deployment")


@pytest.mark.parametrize("kind", ["Deployment", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget", "NetworkPolicy"])
def test_a_router_child_deleted_by_hand_is_made_again(events, clock, kind):
    kube, c, status = settled({"replicas": 1}, clock)
    want = copy.deepcopy(kube.objects[(kind, NS, ROUTER)])
    del kube.objects[(kind, NS, ROUTER)]
    handlers.child_deleted(c, kind, NS, ROUTER, {})
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert applied(kube) == [(kind, ROUTER)]
    assert kube.objects[(kind, NS, ROUTER)] == want


def test_edits_by_hand_to_the_routers_rbac_and_deployment_are_undone(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    role = kube.objects[("Role", NS, ROUTER)]
    want_rules = copy.deepcopy(role["rules"])
    role["rules"][0]["verbs"].append("delete")  # someone widens the router's access
    binding = kube.objects[("RoleBinding", NS, ROUTER)]
    binding["subjects"].append({"kind": "ServiceAccount", "name": "default", "namespace": NS})
    dep = kube.objects[("Deployment", NS, ROUTER)]
    dep["spec"]["template"]["spec"]["containers"][0]["args"][5] = "random"  # --policy
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert sorted(applied(kube)) == [("Deployment", ROUTER), ("Role", ROUTER), ("RoleBinding", ROUTER)]
    assert kube.objects[("Role", NS, ROUTER)]["rules"] == want_rules
    assert len(kube.objects[("RoleBinding", NS, ROUTER)]["subjects"]) == 1
    assert kube.objects[("Deployment", NS, ROUTER)]["spec"]["template"]["spec"]["containers"][0]["args"][5] == "consistent_hash"


def test_turning_routing_off_deletes_the_router_and_points_the_service_at_the_engines(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    off = {"replicas": 1, "routing": {"enabled": False}}
    reconcile(c, kube, body("flash", off, status=status))
    assert set(deleted(kube)) == ROUTER_CHILDREN
    assert ("Service", "flash") in applied(kube)
    assert kube.objects[("Service", NS, "flash")]["spec"]["selector"]["app.kubernetes.io/component"] == "engine"
    assert present(kube) == rendered(off)
    # And back on.
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert present(kube) == rendered({"replicas": 1}) and not deleted(kube)


def test_one_router_replica_drops_its_budget(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    reconcile(c, kube, body("flash", {"replicas": 1, "routing": {"replicas": 1}}, status=status))
    assert deleted(kube) == [("PodDisruptionBudget", ROUTER)]
    assert ("PodDisruptionBudget", "flash") in present(kube), "the engines' budget stays"
    assert kube.objects[("Deployment", NS, ROUTER)]["spec"]["replicas"] == 1


def test_the_inference_pool_follows_its_switch(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    on = {"replicas": 1, "routing": {"inferencePool": {"enabled": True}}}
    reconcile(c, kube, body("flash", on, status=status))
    assert applied(kube) == [("InferencePool", "flash")]
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    del kube.objects[("InferencePool", NS, "flash")]
    handlers.child_deleted(c, "InferencePool", NS, "flash", {})
    reconcile(c, kube, body("flash", on, status=status))
    assert applied(kube) == [("InferencePool", "flash")], "made again"
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert deleted(kube) == [("InferencePool", "flash")] and not applied(kube)


def test_turning_network_policies_off_deletes_the_routers_too(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    reconcile(c, kube, body("flash", {"replicas": 1, "networkPolicy": {"enabled": False}}, status=status))
    assert sorted(deleted(kube)) == [("NetworkPolicy", "flash"), ("NetworkPolicy", ROUTER)]


def test_the_operator_namespace_reaches_the_engines_policy(events, clock):
    kube = FakeKube()
    c = controller(kube)
    c.operator_namespace = "ops"
    reconcile(c, kube, body("flash", {"replicas": 1}))
    rules = kube.objects[("NetworkPolicy", NS, "flash")]["spec"]["ingress"]
    peers = [p for r in rules for p in r["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}} in peers
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "flashserve-system"}}} not in peers
