"""The reconciler against an in-memory API server (tests/fakes.py): one serving never writes or deletes
another's children, children named by earlier versions move to the current names group by group, and any
write the API server refuses ends up in status instead of aborting the reconcile."""

from __future__ import annotations

import copy

import pytest
from flashserve.api.validation import parse_serving
from flashserve.controller.drain import DRAIN_SETTLE_S
from flashserve.render.naming import (
    GROUP_LABEL,
    GROUP_NAME_LABEL,
    SERVING_LABEL,
    group_name,
    legacy_group_name,
    legacy_pdb_name,
    legacy_service_name,
    legacy_serving_label_value,
    router_name,
    service_name,
)
from flashserve.render.renderer import render_serving

from tests.builders import NS, body
from tests.fakes import FakeKube, api_error, conditions, controller, install, reconcile


def legacy_children(b: dict) -> list[dict]:
    """The children an earlier version of the operator made for `b`: its names and label values."""
    name = b["metadata"]["name"]
    old_value = legacy_serving_label_value(name)
    out = []
    for o in render_serving(parse_serving(copy.deepcopy(b))):
        o = copy.deepcopy(o)
        meta = o["metadata"]
        index = meta["labels"].get(GROUP_LABEL)

        def relabel(labels: dict) -> None:
            labels.pop(GROUP_NAME_LABEL, None)
            if SERVING_LABEL in labels:
                labels[SERVING_LABEL] = old_value
            if "app.kubernetes.io/instance" in labels:
                labels["app.kubernetes.io/instance"] = old_value

        relabel(meta["labels"])
        if o["kind"] == "StatefulSet":
            meta["name"] = legacy_group_name(name, int(index))
            o["spec"]["serviceName"] = meta["name"]
            relabel(o["spec"]["selector"]["matchLabels"])
            relabel(o["spec"]["template"]["metadata"]["labels"])
        elif o["kind"] == "Service":
            meta["name"] = legacy_group_name(name, int(index)) if index is not None else legacy_service_name(name)
            relabel(o["spec"]["selector"])
        elif o["kind"] == "PodDisruptionBudget":
            meta["name"] = legacy_pdb_name(name)
            relabel(o["spec"]["selector"]["matchLabels"])
        out.append(o)
    return out


def test_dotted_and_dashed_names_do_not_touch_each_other(events):
    """`a.b` (2 groups, made by an earlier version) and a new `a-b` (1 group) met on the old names: the plan
    of `a-b` deleted `a.b`'s group 1 and took its group 0. Now `a-b` writes only its own children."""
    kube = FakeKube()
    ab_dot = body("a.b", {"replicas": 2})
    install(kube, legacy_children(ab_dot))
    theirs = {k: copy.deepcopy(v) for k, v in kube.objects.items()}
    assert ("StatefulSet", NS, "a-b-g1") in theirs  # the old name `a-b` would also plan

    c = controller(kube)
    reconcile(c, kube, body("a-b", {"replicas": 1}))
    for key, obj in theirs.items():
        assert kube.objects.get(key) == obj, f"{key} of a.b was changed by a-b"
    mine = {n for k, _, n in kube.objects if k == "StatefulSet"} - {k[2] for k in theirs if k[0] == "StatefulSet"}
    assert mine == {group_name("a-b", 0)}


def test_a_name_taken_by_another_object_is_refused_and_reported(events):
    kube = FakeKube()
    c = controller(kube)
    squatter = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "flash", "namespace": NS, "labels": {"app": "mine"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                                  "uid": "uid-web", "controller": True}]},
                "spec": {"selector": {"app": "web"}}}  # fmt: skip
    install(kube, [squatter])
    before = copy.deepcopy(kube.objects[("Service", NS, "flash")])
    status = reconcile(c, kube, body("flash"))
    assert kube.objects[("Service", NS, "flash")] == before, "another object's Service must not be rewritten"
    assert group_name("flash", 0) in kube.names("StatefulSet"), "the rest of the serving is still made"
    degraded = conditions(status)["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "OwnershipConflict"
    assert "Service/flash" in degraded["message"] and "Deployment/web" in degraded["message"]
    assert any(e["reason"] == "OwnershipConflict" and e["type"] == "Warning" for e in events)
    # Still refused (and still reported) on the next reconcile, not forgotten as a "recent write".
    status = reconcile(c, kube, body("flash", status=status))
    assert conditions(status)["Degraded"]["reason"] == "OwnershipConflict"
    assert kube.objects[("Service", NS, "flash")] == before


def test_an_apply_the_api_server_refuses_is_reported_not_raised(events):
    kube = FakeKube()
    kube.errors[("apply", "StatefulSet")] = api_error(422, 'StatefulSet.apps "x" is invalid: spec.template: ' + "x" * 5000)
    c = controller(kube)
    status = reconcile(c, kube, body("flash", {"replicas": 2}))
    degraded = conditions(status)["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "ApplyFailed"
    assert "422" in degraded["message"] and "is invalid" in degraded["message"]
    assert len(degraded["message"].encode()) <= 4096
    assert any(e["reason"] == "ApplyFailed" for e in events)
    assert "flash" in kube.names("Service"), "writes that do not depend on the refused one still happen"
    assert status["observedGeneration"] == 1 and status["replicas"] == 0
    assert not [e for e in events if e["reason"] == "GroupsCreated"], "groups that were not written are not announced"

    del kube.errors[("apply", "StatefulSet")]
    status = reconcile(c, kube, body("flash", {"replicas": 2}, status=status))
    assert conditions(status)["Degraded"]["status"] == "False", "cleared once the write goes through"
    assert kube.names("StatefulSet") == {group_name("flash", 0), group_name("flash", 1)}


def test_pods_of_a_group_whose_statefulset_was_refused_are_not_replaced(events):
    kube = FakeKube()
    c = controller(kube)
    reconcile(c, kube, body("flash", {"replicas": 1}))
    kube.errors[("apply", "StatefulSet")] = api_error(422, "denied by admission webhook")
    kube.calls.clear()
    reconcile(c, kube, body("flash", {"replicas": 1, "engine": {"image": "vllm/vllm-openai:v0.33.1"}}))
    assert not [call for call in kube.calls if call[:2] == ("delete", "Pod")], "old pods would come back unchanged"


@pytest.mark.parametrize("name", ["flash", "a.b"])
def test_children_move_to_the_current_names_group_by_group(events, clock, name):
    kube = FakeKube()
    b = body(name, {"replicas": 3, "parallelism": {"nodesPerReplica": 2}})
    install(kube, legacy_children(b))
    old = {legacy_group_name(name, i) for i in range(3)}
    new = [group_name(name, i) for i in range(3)]
    c = controller(kube)

    # First reconcile: group 0 is created under its current name beside the old one, which keeps serving.
    kube.unready = set(new)
    status = reconcile(c, kube, b)
    assert kube.names("StatefulSet") == old | {new[0]}
    assert status["readyReplicas"] == 3, "the old groups still serve"
    assert conditions(status)["Progressing"]["status"] == "True"
    assert any(e["reason"] == "GroupsRenaming" for e in events)

    # Not ready yet: nothing else moves.
    status = reconcile(c, kube, body(name, b["spec"], status=status))
    assert kube.names("StatefulSet") == old | {new[0]}

    # Ready: the old group 0 leaves routing (its requests finish there) and group 1 starts moving.
    kube.unready = set(new[1:])
    status = reconcile(c, kube, body(name, b["spec"], status=status))
    assert kube.names("StatefulSet") == old | {new[0], new[1]}
    assert {c_[1] for c_ in kube.calls if c_[0] == "pod-routing" and c_[2] == "drain"} == {
        f"{legacy_group_name(name, 0)}-{k}" for k in range(2)}, "the old copy's pods, and only those"
    assert [(d["group"], d["reason"]) for d in status["drainingGroups"]] == [(0, "Rename")]
    assert status["readyReplicas"] == 3, "the current copy serves in its stead"
    assert "DrainStarted" in [e["reason"] for e in events]

    # Drained (idle engines, once the router had time to see the label): the old group 0 goes (StatefulSet and
    # headless Service).
    clock.advance(DRAIN_SETTLE_S + 1)
    status = reconcile(c, kube, body(name, b["spec"], status=status))
    assert kube.names("StatefulSet") == (old - {legacy_group_name(name, 0)}) | {new[0], new[1]}
    assert legacy_group_name(name, 0) not in kube.names("Service")
    assert any(e["reason"] == "GroupsRenamed" for e in events)

    kube.unready = set()
    for _ in range(6):
        status = reconcile(c, kube, body(name, b["spec"], status=status))
        clock.advance(DRAIN_SETTLE_S + 1)
    assert kube.names("StatefulSet") == set(new)
    assert not status.get("drainingGroups") and {d["reason"] for d in status["lastDrains"]} == {"Rename"}
    assert kube.names("Service") == set(new) | {service_name(name)}, "old shared objects go once no old group is left"
    assert kube.names("PodDisruptionBudget") == {name, router_name(name)}, "the engines' and the router's"
    assert status["readyReplicas"] == 3 and conditions(status)["Progressing"]["reason"] == "Complete"


def test_an_invalid_spec_with_a_huge_message_still_gets_a_valid_status(events):
    from flashserve.api.v1alpha1 import DeepSeekServingStatus

    kube = FakeKube()
    spec = {f"unknownField{i:04d}": 1 for i in range(1000)}  # ~100 kB of errors
    status = reconcile(controller(kube), kube, body("flash", spec))
    ready = conditions(status)["Ready"]
    assert ready["reason"] == "InvalidSpec" and "more" in ready["message"]
    DeepSeekServingStatus.model_validate(status)  # within the CRD's limits, so the API server takes the patch


def test_other_tools_conditions_survive_a_reconcile(events):
    kube = FakeKube()
    theirs = {"type": "policy.example.com/Approved", "status": "True", "reason": "Reviewed", "message": "ok",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    status = reconcile(controller(kube), kube, body("flash", status={"conditions": [theirs]}))
    assert theirs in status["conditions"]


def test_a_compute_domain_of_another_owner_is_not_deleted(events):
    from flashserve.render.naming import compute_domain_name

    kube = FakeKube()
    c = controller(kube)
    spec = {"replicas": 1, "parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {"enabled": True}},
            "rollout": {"drainSeconds": 0}}  # the group is replaced at once: drains are tested in test_drain.py
    reconcile(c, kube, body("flash", spec))
    cd = ("ComputeDomain", NS, compute_domain_name("flash", 0))
    assert cd in kube.objects
    kube.objects[cd]["metadata"]["ownerReferences"] = [{"kind": "DeepSeekServing", "name": "other", "uid": "uid-other",
                                                        "controller": True}]  # fmt: skip
    off = {**spec, "placement": {"computeDomain": {"enabled": False}}}
    reconcile(c, kube, body("flash", off))
    assert cd in kube.objects, "not this serving's to delete"
    kube.objects[cd]["metadata"]["ownerReferences"][0]["uid"] = "uid-flash"
    # Back on with the domain, then off again: now it is ours and goes.
    reconcile(c, kube, body("flash", spec))
    c._recent.clear()
    reconcile(c, kube, body("flash", off))
    assert cd not in kube.objects


def test_an_old_named_copy_with_requests_in_flight_stays_until_its_engines_are_idle(events, clock):
    from tests.fakes import FakeEngines

    engines = FakeEngines(default=5)  # the old copy's engines still hold long turns
    kube = FakeKube()
    b = body("flash", {"replicas": 1})
    install(kube, legacy_children(b))
    c = controller(kube, engines)
    status = reconcile(c, kube, b)  # the current copy is made (ready at once here)
    for _ in range(3):
        clock.advance(DRAIN_SETTLE_S + 1)
        status = reconcile(c, kube, body("flash", b["spec"], status=status))
    assert legacy_group_name("flash", 0) in kube.names("StatefulSet"), "not cut while busy"
    assert [(d["group"], d["reason"]) for d in status["drainingGroups"]] == [(0, "Rename")]
    engines.default = 0
    status = reconcile(c, kube, body("flash", b["spec"], status=status))
    assert kube.names("StatefulSet") == {group_name("flash", 0)}
    assert [(d["reason"], d["endedBy"]) for d in status["lastDrains"]] == [("Rename", "Idle")]
    assert "GroupsRenamed" in [e["reason"] for e in events]
