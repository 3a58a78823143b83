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
from flashserve.controller.router_status import ROUTER_GRACE_S
from flashserve.render.naming import group_name, router_name
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


ENGINES = {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "engine", "flashserve.io/routing": "serve"}
ROUTERS = {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "router"}


def selector(kube: FakeKube) -> dict:
    """What the client Service selects."""
    return kube.objects[("Service", NS, "flash")]["spec"]["selector"]


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


def test_the_service_moves_to_the_router_once_a_router_pod_is_available(events, clock):
    kube = FakeKube()
    c = controller(kube)
    kube.unready.add(ROUTER)  # the router pods do not pass /readiness yet (no healthy engine, image pull)
    status = reconcile(c, kube, body("flash", {"replicas": 1}))
    assert selector(kube) == ENGINES, "meanwhile the engines serve directly"
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert selector(kube) == ENGINES
    kube.unready.discard(ROUTER)
    kube.apply(copy.deepcopy(kube.objects[("Deployment", NS, ROUTER)]))  # the Deployment controller's report
    kube.calls.clear()
    events.clear()
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert applied(kube) == [("Service", "flash")] and selector(kube) == ROUTERS
    assert "DriftCorrected" not in [e["reason"] for e in events], "a move by design is not drift"


def test_turning_routing_on_keeps_the_engines_behind_the_service_until_the_router_is_up(events, clock):
    off = {"replicas": 1, "routing": {"enabled": False}}
    kube, c, status = settled(off, clock)
    assert selector(kube) == ENGINES
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert ("Deployment", ROUTER) in applied(kube) and ("Service", "flash") not in applied(kube)
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert selector(kube) == ROUTERS


@pytest.mark.parametrize("kind", ["Deployment", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget", "NetworkPolicy"])
def test_a_router_child_deleted_by_hand_is_made_again(events, clock, kind):
    kube, c, status = settled({"replicas": 1}, clock)
    want = copy.deepcopy(kube.objects[(kind, NS, ROUTER)])
    del kube.objects[(kind, NS, ROUTER)]
    handlers.child_deleted(c, kind, NS, ROUTER, {})
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    if kind == "Deployment":
        # No router pod meanwhile: the client Service goes back to the engines until the new one is up.
        assert sorted(applied(kube)) == [("Deployment", ROUTER), ("Service", "flash")]
        assert selector(kube) == ENGINES
        kube.calls.clear()
        reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
        assert applied(kube) == [("Service", "flash")] and selector(kube) == ROUTERS
    else:
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


def test_the_startup_children_are_made_restored_renamed_and_deleted(events, clock):
    """spec.startup's prefetch (a DaemonSet for a node-local cache, a Job for a shared one) and the image
    pre-pull are children like the router's: made, made again when deleted, and gone when turned off. A Job's pod
    template cannot change, so a new model makes a Job under a new name and the old one is deleted."""
    kube, c, status = settled({"replicas": 1}, clock)
    local = {"replicas": 1, "startup": {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"},
                                        "imagePrepull": {"enabled": True}}}  # fmt: skip
    reconcile(c, kube, body("flash", local, status=status))
    made = {o for o in rendered(local) if o[0] == "DaemonSet"}
    assert len(made) == 2 and made <= present(kube)
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    (_, prefetch) = sorted(made)[0]
    del kube.objects[("DaemonSet", NS, prefetch)]
    handlers.child_deleted(c, "DaemonSet", NS, prefetch, {})
    reconcile(c, kube, body("flash", local, status=status))
    assert ("DaemonSet", prefetch) in applied(kube)

    shared = {"replicas": 1, "startup": {"weightsCache": {"scope": "Shared", "claimName": "weights"}}}
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    reconcile(c, kube, body("flash", shared, status=status))
    (job,) = [n for k, n in rendered(shared) if k == "Job"]
    assert ("Job", job) in applied(kube)
    assert sorted(n for k, n in deleted(kube) if k == "DaemonSet") == sorted(n for _, n in made)

    revised = {"replicas": 1, "model": {"revision": "abc123"}, "startup": shared["startup"]}
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    reconcile(c, kube, body("flash", revised, status=status))
    (job2,) = [n for k, n in rendered(revised) if k == "Job"]
    assert job2 != job and ("Job", job2) in applied(kube) and ("Job", job) in deleted(kube)

    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert ("Job", job2) in deleted(kube)
    assert not {k for k, _ in present(kube)} & {"DaemonSet", "Job"}


# -- the router's readiness in status


def conds_of(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_says_how_many_router_pods_serve_and_that_none_does_while_the_router_comes_up(events, clock):
    kube = FakeKube()
    c = controller(kube)
    kube.unready.add(ROUTER)  # the Deployment is still rolling out: its pods have found no healthy engine yet
    status = reconcile(c, kube, body("flash", {"replicas": 1}))
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    since = clock.iso()  # when the first group served with no router pod
    assert status["readyReplicas"] == 1 and status["router"] == {"replicas": 2, "readyReplicas": 0,
                                                                  "availableReplicas": 0,
                                                                  "unavailableSince": since}  # fmt: skip
    assert conds_of(status) == {"Ready": ("True", "ServingWithoutRouter"), "Progressing": ("True", "WaitingForRouter"),
                                "Degraded": ("False", "AsExpected")}, "coming up is no degradation"  # fmt: skip
    assert "engines directly" in next(c["message"] for c in status["conditions"] if c["type"] == "Ready")
    assert selector(kube) == ENGINES
    kube.unready.discard(ROUTER)
    kube.apply(copy.deepcopy(kube.objects[("Deployment", NS, ROUTER)]))
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert kube.status_patches[-1]["router"]["unavailableSince"] is None, "cleared (the patch is a merge patch)"
    status["router"] = {k: v for k, v in status["router"].items() if v is not None}  # as the API server keeps it
    assert status["router"] == {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2}
    assert conds_of(status) == {"Ready": ("True", "AllReplicasReady"), "Progressing": ("False", "Complete"),
                                "Degraded": ("False", "AsExpected")}  # fmt: skip
    clock.advance(RECENT_WRITE_S + 1)
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert len(kube.status_patches) == 3, "a steady router writes no status"


def test_a_router_that_loses_every_pod_after_its_rollout_is_reported_degraded(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    assert conds_of(status)["Degraded"] == ("False", "AsExpected")
    dep = kube.objects[("Deployment", NS, ROUTER)]
    # The rollout is over (NewReplicaSetAvailable) but the pods died or fail their probe since.
    dep["status"].update(readyReplicas=0, availableReplicas=0)
    events.clear()
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert selector(kube) == ENGINES, "the endpoint keeps a backend"
    assert conds_of(status)["Progressing"] == ("True", "WaitingForRouter"), "a moment's grace first"
    assert conds_of(status)["Degraded"] == ("False", "AsExpected")
    c.resync_seconds = 10 * ROUTER_GRACE_S  # the wake-up below is the grace's own, not a resync
    assert ROUTER_GRACE_S - 1 < c.next_evaluation_in(body("flash", {"replicas": 1})) <= ROUTER_GRACE_S + 1
    clock.advance(ROUTER_GRACE_S)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert conds_of(status)["Degraded"] == ("True", "RouterUnavailable")
    assert c.next_evaluation_in(body("flash", {"replicas": 1})) == c.resync_seconds, "no busy loop once reported"
    assert conds_of(status)["Ready"] == ("True", "ServingWithoutRouter")
    assert status["router"]["availableReplicas"] == 0
    assert ("Warning", "RouterUnavailable") in [(e["type"], e["reason"]) for e in events]
    dep["status"].update(readyReplicas=1, availableReplicas=1)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert conds_of(status)["Degraded"] == ("False", "AsExpected") and selector(kube) == ROUTERS


def test_no_router_condition_while_no_group_serves_and_none_with_routing_off(events, clock):
    kube = FakeKube()
    c = controller(kube)
    kube.unready |= {ROUTER, group_name("flash", 0)}  # the engines are starting: no router pod can be ready
    status = reconcile(c, kube, body("flash", {"replicas": 1}))
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert conds_of(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conds_of(status)["Progressing"][1] != "WaitingForRouter" and conds_of(status)["Degraded"][0] == "False"
    off = {"replicas": 1, "routing": {"enabled": False}}
    status = reconcile(c, kube, body("flash", off, status=status))
    assert "router" not in {k for k, v in status.items() if v is not None}
    assert kube.status_patches[-1]["router"] is None, "the field is cleared"


def test_the_router_grace_runs_from_the_time_in_status_across_an_operator_restart(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    dep = kube.objects[("Deployment", NS, ROUTER)]
    dep["status"].update(readyReplicas=0, availableReplicas=0)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    since = status["router"]["unavailableSince"]
    assert since == clock.iso() and conds_of(status)["Progressing"] == ("True", "WaitingForRouter")
    clock.advance(ROUTER_GRACE_S - 10)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert status["router"]["unavailableSince"] == since, "the start of the wait is kept, not moved"

    restarted = controller(kube)  # a new operator process: nothing in memory, only what status says
    restarted.resync_seconds = 10 * ROUTER_GRACE_S
    assert 9 < restarted.next_evaluation_in(body("flash", {"replicas": 1}, status=status)) <= 11, \
        "it looks again when the grace that began before the restart ends"
    clock.advance(10)
    status = reconcile(restarted, kube, body("flash", {"replicas": 1}, status=status))
    assert conds_of(status)["Degraded"] == ("True", "RouterUnavailable"), "the grace did not start over"
