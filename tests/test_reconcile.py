"""Controller.reconcile against an in-memory API server (tests/fakes.py FakeKube): what it writes on the first
reconcile, that a serving in steady state costs no request at all, that a change writes only what changed,
the status and events it reports, and what each kind of failure of the API server comes to.

The oracle for "which children" is the renderer itself (what a serving renders to), not a list written here.
The reconciler's clock for write skipping (RECENT_WRITE_S) and for condition times is the `clock` fixture's."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest
import urllib3
from flashserve.api.validation import parse_serving
from flashserve.controller import handlers
from flashserve.controller import reconciler as reconciler_mod
from flashserve.controller.kube import FIELD_MANAGER, Kube
from flashserve.controller.observe import Observed
from flashserve.controller.reconciler import API_MESSAGE_MAX, RECENT_WRITE_S
from flashserve.controller.status import MESSAGE_MAX_BYTES
from flashserve.render.naming import GROUP_LABEL, group_name, router_name, serving_label_value
from flashserve.render.renderer import render_serving, serve_selector
from kubernetes.client.rest import ApiException

from tests.builders import NS, body
from tests.fakes import (
    SERVING_KIND,
    Clock,
    FakeApiClient,
    FakeKube,
    api_error,
    conditions,
    controller,
    install,
    reconcile,
    settled,
)

LOG = logging.getLogger("test")


def children(b: dict) -> dict[tuple[str, str], dict]:
    """What the serving renders to, by (kind, name): the children the controller must make."""
    return {(o["kind"], o["metadata"]["name"]): o for o in render_serving(parse_serving(copy.deepcopy(b)))}


def applied(kube: FakeKube) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in kube.calls if c[0] == "apply"]


def deleted(kube: FakeKube) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in kube.calls if c[0] == "delete"]


# The client Service moves to the router one reconcile after the router is up; tests of what becomes of one
# write leave the router out, so that the move is not among the writes they count.
NO_ROUTER = {"routing": {"enabled": False}}


def settled(spec: dict, clock: Clock) -> tuple:
    """A serving made and ready, with the write-skipping window passed: (kube, controller, status)."""
    kube = FakeKube()
    c = controller(kube)
    status = reconcile(c, kube, body("flash", spec))
    status = reconcile(c, kube, body("flash", spec, status=status))  # the pods came up: status says so
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    kube.status_patches.clear()
    return kube, c, status


# -- (a) the first reconcile


def test_first_reconcile_creates_every_child_and_then_writes_status_once(events, clock):
    kube = FakeKube()
    c = controller(kube)
    b = body("flash", {"replicas": 2})
    status = reconcile(c, kube, b)

    want = children(b)
    assert sorted(applied(kube)) == sorted(want), "every rendered child, each once"
    # The client Service points at the engines until the router has an available pod (the next reconcile
    # moves it: tests/test_reconcile_routing.py).
    want[("Service", "flash")]["spec"]["selector"] = serve_selector("flash")
    written = {k: kube.objects[(k[0], NS, k[1])] for k in want}
    written[("Deployment", router_name("flash"))].pop("status")  # the fake's Deployment controller's
    assert written == {
        k: {**o, "metadata": {**o["metadata"], "uid": f"uid-{k[0]}-{k[1]}"}} for k, o in want.items()
    }, "written as rendered"
    # The name of each child is checked (not taken by another object) before it is written.
    for i, call in enumerate(kube.calls):
        if call[0] == "apply":
            assert kube.calls[i - 1] == ("get", call[1], call[2])
    assert [call for call in kube.writes() if call[0] != "apply"] == [("status", "flash")]
    assert kube.calls[-1] == ("status", "flash"), "status after the children"
    assert kube.status_patches == [status]
    assert c.stats.writes == len(want) and c.stats.status_writes == 1
    assert events == [{"type": "Normal", "reason": "GroupsCreated", "message": "created replica groups [0, 1]"}]


# -- (b) steady state


def test_a_serving_in_steady_state_costs_no_request_at_all(events, clock):
    kube, c, status = settled({"replicas": 2}, clock)
    events.clear()
    requests = kube.requests
    for _ in range(3):
        status = reconcile(c, kube, body("flash", {"replicas": 2}, status=status))
    assert kube.calls == [] and kube.requests == requests
    assert events == []
    # Also for an operator that has just started (nothing recent, no status of its own): the plan and the
    # status comparison alone find nothing to do, not the write skipping.
    fresh = controller(kube)
    reconcile(fresh, kube, body("flash", {"replicas": 2}, status=status))
    assert kube.calls == [] and events == []


def test_turning_autoscaling_off_clears_what_it_reported_once(events, clock):
    kube, c, status = settled({"replicas": 2}, clock)
    status = copy.deepcopy(status)
    status.update(slaState="Met", sla={"perUserTokensPerSecondP90": 120.0}, lastScaling={"to": 2})
    status["conditions"] = [*status["conditions"],
                            {"type": "MetricsAvailable", "status": "False", "reason": "NoMetrics", "message": ""},
                            {"type": "ScalingLimited", "status": "True", "reason": "AtMax", "message": ""}]  # fmt: skip
    c = controller(kube)  # an operator (re)started after autoscaling was turned off: the status is the body's
    status = reconcile(c, kube, body("flash", {"replicas": 2}, status=status))
    (patch,) = kube.status_patches
    assert (patch["slaState"], patch["sla"], patch["lastScaling"]) == (None, None, None)
    assert {x["type"] for x in patch["conditions"]}.isdisjoint({"MetricsAvailable", "ScalingLimited"})
    kube.calls.clear()
    kube.status_patches.clear()
    reconcile(c, kube, body("flash", {"replicas": 2}, status=status))
    assert kube.calls == [] and kube.status_patches == [], "cleared once: steady state writes nothing"


def test_quantities_the_api_server_stores_in_another_spelling_are_not_written_again(events, clock):
    """The API server keeps a quantity's amount and stores its canonical spelling (`1024Gi` as `1Ti`, `1.5` as
    `1500m`): a resync compares the amounts, and a serving written with such spellings is still at rest."""
    canonical = {"1024Gi": "1Ti", "1.5": "1500m", "16384Mi": "16Gi", "1024Mi": "1Gi"}
    spec = {"replicas": 1, "engine": {"resources": {"memory": "1024Gi", "cpu": "1.5", "shmSize": "16384Mi"}},
            "routing": {"resources": {"memory": "1024Mi"}}}  # fmt: skip
    kube, c, status = settled(spec, clock)

    def respell(node: object) -> object:
        if isinstance(node, dict):
            quantities = ("sizeLimit", "cpu", "memory")
            return {k: (canonical.get(v, v) if k in quantities else respell(v)) for k, v in node.items()}
        return [respell(v) for v in node] if isinstance(node, list) else node

    for key, obj in list(kube.objects.items()):
        kube.objects[key] = respell(obj)
    assert {"1Ti", "1500m", "16Gi", "1Gi"} <= set(str(kube.objects).replace("'", " ").split()), "respelled"
    for _ in range(2):
        clock.advance(RECENT_WRITE_S + 1)
        status = reconcile(c, kube, body("flash", spec, status=status))
    assert kube.writes() == [] and [e["reason"] for e in events if e["reason"] == "DriftCorrected"] == []
    bigger = {**spec, "engine": {"resources": {**spec["engine"]["resources"], "memory": "1025Gi"}}}
    reconcile(c, kube, body("flash", bigger, status=status))
    assert ("apply", "StatefulSet") in [c[:2] for c in kube.writes()], "a different amount is still written"


def test_a_write_is_not_repeated_while_the_watch_has_not_shown_it_yet(events, clock):
    kube = FakeKube()
    c = controller(kube)
    b = body("flash", {"replicas": 1})
    status = reconcile(c, kube, b)
    made = sorted(applied(kube))
    kube.calls.clear()

    clock.advance(RECENT_WRITE_S - 1)  # the watch events of those writes have not arrived: nothing observed
    asyncio.run(c.reconcile(body("flash", b["spec"], status=status), Observed(), LOG))
    assert kube.calls == [], "identical writes moments ago are not repeated (nor re-checked)"

    clock.advance(2)  # past the window the same view means the children really are gone: they are made again
    asyncio.run(c.reconcile(body("flash", b["spec"], status=status), Observed(), LOG))
    assert sorted(applied(kube)) == made


# -- (c) a spec change


NO_DRAIN = {"rollout": {"drainSeconds": 0}}  # groups go at once: drains and the surge are tested in test_drain.py


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({"replicas": 1, **NO_DRAIN}, {"replicas": 1, "engine": {"image": "vllm/vllm-openai:v0.33.1"},
                                                   **NO_DRAIN}, id="image"),  # fmt: skip
        pytest.param({"replicas": 1}, {"replicas": 2}, id="scale-up"),
        pytest.param({"replicas": 2, **NO_DRAIN}, {"replicas": 1, **NO_DRAIN}, id="scale-down"),
        pytest.param({"replicas": 1}, {"replicas": 1, "networkPolicy": {"enabled": False}}, id="network-policy-off"),
    ],
)
def test_a_spec_change_writes_only_the_children_it_changes(events, clock, before, after):
    kube, c, status = settled(before, clock)
    untouched = {k: copy.deepcopy(v) for k, v in kube.objects.items()}
    old, new = children(body("flash", before)), children(body("flash", after))
    reconcile(c, kube, body("flash", after, status=status, generation=2))

    assert sorted(applied(kube)) == sorted(k for k, o in new.items() if old.get(k) != o)
    gone = [k for k in old if k not in new]
    assert sorted(k for k in deleted(kube) if k[0] != "Pod") == sorted(gone)
    changed_groups = {o["metadata"]["labels"][GROUP_LABEL] for k, o in new.items()
                      if k[0] == "StatefulSet" and k in old and old[k] != o}  # fmt: skip
    pods = [n for kind, n in deleted(kube) if kind == "Pod"]
    assert pods == [f"{group_name('flash', int(g))}-0" for g in sorted(changed_groups)], "a new template: its pods"
    for key, obj in untouched.items():
        if (key[0], key[2]) in new and (key[0], key[2]) not in applied(kube):
            assert kube.objects[key] == obj
    assert len(kube.status_patches) == 1 and kube.status_patches[0]["observedGeneration"] == 2


# -- (d) status


def test_status_fields_and_conditions_as_written(events, clock):
    kube = FakeKube()
    c = controller(kube)
    b = body("flash", {"replicas": 2})
    first_time = clock.iso()
    status = reconcile(c, kube, b)
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "observedGeneration": 1, "replicas": 0, "readyReplicas": 0, "updatedReplicas": 0, "desiredReplicas": 2,
        "selector": status["selector"], "endpoint": status["endpoint"],
        "router": {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0},  # not observed yet
    }  # fmt: skip
    conds = conditions(status)
    assert [(t, cd["status"], cd["reason"]) for t, cd in conds.items()] == [
        ("Ready", "False", "ReplicasNotReady"), ("Progressing", "True", "Scaling"), ("Degraded", "False", "AsExpected")]
    assert all(cd["observedGeneration"] == 1 and cd["lastTransitionTime"] == first_time for cd in conds.values())

    # The selector selects the engine pods, and the endpoint is the client Service's.
    objs = children(b)
    wanted = dict(pair.split("=", 1) for pair in status["selector"].split(","))
    for (kind, _), o in objs.items():
        if kind == "StatefulSet":
            assert wanted.items() <= o["spec"]["template"]["metadata"]["labels"].items()
    client = [o for (kind, _), o in objs.items() if kind == "Service" and GROUP_LABEL not in o["metadata"]["labels"]]
    port = client[0]["spec"]["ports"][0]["port"]
    assert status["endpoint"] == f"http://{client[0]['metadata']['name']}.{NS}.svc:{port}/v1"

    clock.advance(60)
    status = reconcile(c, kube, body("flash", b["spec"], status=status))
    conds = conditions(status)
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    assert (conds["Ready"]["status"], conds["Ready"]["reason"], conds["Ready"]["message"]) == (
        "True", "AllReplicasReady", "2/2 replica groups ready")
    assert conds["Ready"]["lastTransitionTime"] == clock.iso() != first_time
    assert conds["Degraded"]["lastTransitionTime"] == first_time, "its status did not change: nor does its time"

    # A new generation that changes nothing rendered: only observedGeneration moves, on every condition.
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", b["spec"], status=status, generation=5))
    assert kube.writes() == [("status", "flash")]
    assert kube.status_patches[-1]["observedGeneration"] == 5
    assert all(cd["observedGeneration"] == 5 for cd in status["conditions"])


# -- (e) events


def test_events_of_a_serving_coming_up(events, clock):
    kube = FakeKube()
    c = controller(kube)
    status = reconcile(c, kube, body("flash", {"replicas": 1}))
    assert [e["reason"] for e in events] == ["GroupsCreated"], "not ready yet is not news for a new serving"
    events.clear()
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "AllReplicasReady"), ("Normal", "RolloutComplete")]


def test_an_invalid_spec_is_reported_with_its_field_path_and_no_child_is_written(events, clock):
    kube, c, status = settled({"replicas": 2}, clock)
    before = copy.deepcopy(kube.objects)
    events.clear()
    status = reconcile(c, kube, body("flash", {"replicas": -1, "engine": {"image": 3}}, status=status, generation=2))

    assert kube.writes() == [("status", "flash")] and kube.objects == before, "children are left as they are"
    conds = conditions(status)
    for t in ("Ready", "Degraded"):
        assert conds[t]["reason"] == "InvalidSpec"
        assert "spec.replicas" in conds[t]["message"] and "spec.engine.image" in conds[t]["message"]
    assert conds["Progressing"]["status"] == "False" and status["observedGeneration"] == 2
    assert events and {(e["type"], e["reason"]) for e in events} == {("Warning", "InvalidSpec")}
    assert all("spec.replicas" in e["message"] for e in events)

    # Still invalid: nothing new to say or write.
    events.clear()
    kube.calls.clear()
    reconcile(c, kube, body("flash", {"replicas": -1, "engine": {"image": 3}}, status=status, generation=2))
    assert kube.calls == [] and events == []


def test_a_name_taken_by_another_object_is_an_ownership_conflict_event(events, clock):
    kube = FakeKube()
    squatter = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "flash", "namespace": NS,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                                  "uid": "uid-web", "controller": True}]},
                "spec": {"selector": {"app": "web"}}}  # fmt: skip
    install(kube, [squatter])
    c = controller(kube)
    status = reconcile(c, kube, body("flash"))
    assert ("Service", "flash") not in applied(kube)
    assert conditions(status)["Degraded"]["reason"] == "OwnershipConflict"
    conflict = [e for e in events if e["reason"] == "OwnershipConflict"]
    assert len(conflict) == 1 and conflict[0]["type"] == "Warning"
    assert "Service/flash" in conflict[0]["message"] and "Deployment/web" in conflict[0]["message"]


# -- (f) the API server refuses or fails


def test_an_apply_refused_with_422_is_reported_capped_and_the_rest_is_written(events, clock):
    kube = FakeKube()
    huge = 'StatefulSet.apps "flash-g0" is invalid: spec.template.spec.containers[0].image: ' + "x" * 5000
    kube.errors[("apply", "StatefulSet")] = api_error(422, huge)
    c = controller(kube)
    b = body("flash", {"replicas": 2, **NO_ROUTER})
    status = reconcile(c, kube, b)  # does not raise

    want = children(b)
    assert sorted(applied(kube)) == sorted(want), "every child is attempted"
    assert {(k, n) for k, _, n in kube.objects} == {k for k in want if k[0] != "StatefulSet"}
    degraded = conditions(status)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyFailed")
    for g in (0, 1):
        assert f"StatefulSet/{group_name('flash', g)}: 422: {huge[:80]}" in degraded["message"]
    assert len(degraded["message"].encode()) <= MESSAGE_MAX_BYTES
    # Each API answer is quoted up to API_MESSAGE_MAX characters, so both refusals fit in one message.
    assert degraded["message"].count("422: ") == 2 and "x" * (API_MESSAGE_MAX + 1) not in degraded["message"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "ApplyFailed")], "no GroupsCreated"

    # Retried at once on the next reconcile (not skipped as a recent write); what went through is not repeated.
    kube.calls.clear()
    events.clear()
    status = reconcile(c, kube, body("flash", b["spec"], status=status))
    assert sorted(applied(kube)) == sorted(k for k in want if k[0] == "StatefulSet")
    assert events == [], "the same failure again is not a new event"

    del kube.errors[("apply", "StatefulSet")]
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", b["spec"], status=status))
    assert sorted(applied(kube)) == sorted(k for k in want if k[0] == "StatefulSet")
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"
    assert [e["reason"] for e in events] == ["GroupsCreated"], "made at last: created, not drift corrected"


def test_a_409_on_apply_is_reported_and_retried(events, clock):
    kube = FakeKube()
    conflict = api_error(409, "Operation cannot be fulfilled: the object has been modified")
    kube.errors[("apply", "PodDisruptionBudget")] = [conflict]
    c = controller(kube)
    spec = {"replicas": 1, **NO_ROUTER}
    status = reconcile(c, kube, body("flash", spec))
    assert "PodDisruptionBudget/flash: 409: Operation cannot be fulfilled" in conditions(status)["Degraded"]["message"]
    assert group_name("flash", 0) in kube.names("StatefulSet"), "a conflict on one child holds back no other"
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", spec, status=status))
    assert applied(kube) == [("PodDisruptionBudget", "flash")]
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(api_error(500, "etcdserver: request timed out"), id="500"),
        pytest.param(urllib3.exceptions.MaxRetryError(None, "/apis/apps/v1", ConnectionRefusedError(111, "refused")),
                     id="connection"),  # fmt: skip
    ],
)
def test_a_failing_api_server_on_a_write_is_reported_in_status_not_raised(events, clock, error):
    kube = FakeKube()
    kube.errors[("apply", "StatefulSet")] = error
    c = controller(kube)
    spec = {"replicas": 1, **NO_ROUTER}
    status = reconcile(c, kube, body("flash", spec))  # does not raise: the write is reported, and retried next time
    msg = conditions(status)["Degraded"]["message"]
    assert f"StatefulSet/{group_name('flash', 0)}: " in msg
    quoted = "500: etcdserver: request timed out" if isinstance(error, ApiException) else "MaxRetryError: "
    assert quoted in msg
    assert kube.status_patches, "the status still goes out"
    kube.calls.clear()
    reconcile(c, kube, body("flash", spec, status=status))
    assert applied(kube) == [("StatefulSet", group_name("flash", 0))]


def test_a_failing_name_check_writes_nothing_blind(events, clock):
    kube = FakeKube()
    kube.errors[("get", "Service")] = api_error(500, "etcdserver: leader changed")
    c = controller(kube)
    status = reconcile(c, kube, body("flash"))
    assert not [k for k in applied(kube) if k[0] == "Service"], "whether the name is taken is not known"
    assert "Service/flash: 500: etcdserver: leader changed" in conditions(status)["Degraded"]["message"]
    assert group_name("flash", 0) in kube.names("StatefulSet")


def test_a_refused_delete_is_reported_and_the_group_is_not_announced_as_deleted(events, clock):
    kube, c, status = settled({"replicas": 2, **NO_DRAIN}, clock)
    events.clear()
    g1 = group_name("flash", 1)
    kube.errors[("delete", "StatefulSet")] = [api_error(500, "etcdserver: request timed out")]
    status = reconcile(c, kube, body("flash", {"replicas": 1, **NO_DRAIN}, status=status, generation=2))
    assert ("StatefulSet", NS, g1) in kube.objects
    assert f"StatefulSet/{g1}: 500" in conditions(status)["Degraded"]["message"]
    assert "GroupsDeleted" not in [e["reason"] for e in events]

    events.clear()
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", {"replicas": 1, **NO_DRAIN}, status=status, generation=2))
    assert ("StatefulSet", g1) in deleted(kube) and ("StatefulSet", NS, g1) not in kube.objects
    assert "GroupsDeleted" in [e["reason"] for e in events]


def test_a_group_deleted_moments_ago_is_not_deleted_or_announced_again_while_the_watch_lags(events, clock):
    kube, c, status = settled({"replicas": 2, **NO_DRAIN}, clock)
    g1 = group_name("flash", 1)
    lagging = kube.observed(NS, "flash")  # what the watches show before the deletion reaches them
    events.clear()
    status = reconcile(c, kube, body("flash", {"replicas": 1, **NO_DRAIN}, status=status, generation=2))
    assert [e["reason"] for e in events].count("GroupsDeleted") == 1
    assert ("StatefulSet", NS, g1) not in kube.objects
    again = body("flash", {"replicas": 1, **NO_DRAIN}, status=status, generation=2)
    events.clear()
    kube.calls.clear()
    asyncio.run(c.reconcile(again, lagging, logging.getLogger("test")))
    assert ("StatefulSet", g1) not in deleted(kube), "the delete of moments ago is not repeated"
    assert "GroupsDeleted" not in [e["reason"] for e in events]
    clock.advance(RECENT_WRITE_S + 1)  # the watch lags longer than the repeat window: the delete finds nothing
    asyncio.run(c.reconcile(again, lagging, logging.getLogger("test")))
    assert ("StatefulSet", g1) in deleted(kube)
    assert "GroupsDeleted" not in [e["reason"] for e in events], "told once, when the group went"


def test_a_failed_status_patch_raises_and_is_made_again_on_the_next_reconcile(events, clock):
    kube = FakeKube()
    kube.errors[("status", SERVING_KIND)] = [api_error(500, "etcdserver: request timed out")]
    c = controller(kube)
    spec = {"replicas": 1, **NO_ROUTER}
    with pytest.raises(ApiException) as err:
        reconcile(c, kube, body("flash", spec))
    assert err.value.status == 500
    assert kube.names("StatefulSet") and kube.status_patches == [] and c.stats.status_writes == 0

    kube.calls.clear()
    status = reconcile(c, kube, body("flash", spec))  # the body still has no status: the patch is made again
    assert [call for call in kube.writes() if call[0] != "status"] == [], "the children are not written again"
    assert kube.status_patches == [status] and status["observedGeneration"] == 1


def test_a_serving_gone_without_a_deletion_event_stops_its_worker(events, caplog):
    """After a 410 kopf lists again and sends nothing for a serving deleted meanwhile: the 404 of its status
    write is the sign, and the worker stops instead of making children for an owner that no longer exists."""
    kube = FakeKube()
    kube.errors[("status", SERVING_KIND)] = api_error(404, "deepseekservings.flashserve.io \"flash\" not found")
    c = controller(kube)
    c.resync_seconds = 0.05
    key = (NS, serving_label_value("flash"))
    no_children = {c.field: {} for c in handlers.CHILDREN}

    async def main() -> None:
        handlers._bodies[key] = body("flash")
        task = asyncio.create_task(handlers._worker(key, [key], c, no_children, LOG))
        try:
            await asyncio.wait_for(asyncio.shield(task), 5)
        finally:
            handlers._bodies.pop(key, None)
            task.cancel()

    with caplog.at_level(logging.INFO, logger="test"):
        asyncio.run(main())
    assert c.stats.reconciles == 1 and key not in handlers._bodies
    assert "is gone (its status cannot be written): stopping its worker" in caplog.text


def test_the_worker_survives_a_failed_reconcile_and_retries_soon(events, caplog):
    """The exception of a failed reconcile reaches the serving's worker (not kopf): logged, then retried after
    a back-off bounded by the resync period."""
    kube = FakeKube()
    kube.errors[("status", SERVING_KIND)] = [api_error(500, "etcdserver: request timed out")]
    c = controller(kube)
    c.resync_seconds = 0.05
    key = (NS, serving_label_value("flash"))
    no_children = {c.field: {} for c in handlers.CHILDREN}  # one index per watched kind

    async def main() -> float:
        handlers._bodies[key] = body("flash")
        loop = asyncio.get_running_loop()
        start = loop.time()
        task = asyncio.create_task(handlers._worker(key, [key], c, no_children, LOG))
        try:
            while not kube.status_patches and loop.time() - start < 10:
                await asyncio.sleep(0.02)
            return loop.time() - start
        finally:
            handlers._bodies.pop(key, None)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="test"):
        took = asyncio.run(main())
    assert kube.status_patches, "the second reconcile wrote the status"
    assert c.stats.reconciles >= 2 and took < 5
    assert "reconcile of team-a/flash failed (attempt 1)" in caplog.text


def test_a_child_deleted_by_hand_is_made_again(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    svc = kube.objects.pop(("Service", NS, "flash"))
    reconcile(c, kube, body("flash", status=status))
    assert applied(kube) == [("Service", "flash")] and kube.objects[("Service", NS, "flash")]["spec"] == svc["spec"]
    assert kube.writes() == [("apply", "Service", "flash")], "status unchanged: not written"

    # Deleted moments after the operator wrote it: taken for a watch that lags, made again once the window
    # has passed (the worker's next resync at the latest).
    kube.objects.pop(("Service", NS, "flash"))
    kube.calls.clear()
    reconcile(c, kube, body("flash", status=status))
    assert applied(kube) == []
    clock.advance(RECENT_WRITE_S + 1)
    reconcile(c, kube, body("flash", status=status))
    assert applied(kube) == [("Service", "flash")]


def test_a_child_whose_deletion_the_watch_showed_is_made_again_within_the_write_window(events, clock):
    kube, c, status = settled({"replicas": 1}, clock)
    g0 = group_name("flash", 0)
    for kind, name in (("Service", "flash"), ("StatefulSet", g0), ("PodDisruptionBudget", "flash")):
        kube.objects.pop((kind, NS, name))
        reconcile(c, kube, body("flash", status=status))
        kube.objects.pop((kind, NS, name))  # deleted again moments after the operator made it
        kube.calls.clear()
        handlers.child_deleted(c, kind, NS, name, {})  # its DELETED event: no lag, a real deletion
        reconcile(c, kube, body("flash", status=status))
        assert applied(kube) == [(kind, name)], f"{kind}/{name} made again without waiting for the window"


def test_a_statefulset_deleted_by_hand_is_drift_even_when_its_first_re_creation_fails(events, clock, caplog):
    kube, c, status = settled({"replicas": 1}, clock)
    g0 = group_name("flash", 0)
    kube.objects.pop(("StatefulSet", NS, g0))
    kube.errors[("apply", "StatefulSet")] = [api_error(500, "etcdserver: request timed out")]
    events.clear()
    status = reconcile(c, kube, body("flash", status=status))
    assert "DriftCorrected" not in [e["reason"] for e in events], "not restored yet"
    with caplog.at_level(logging.WARNING, logger="test"):
        status = reconcile(c, kube, body("flash", status=status))
    assert ("StatefulSet", NS, g0) in kube.objects
    drift = [e for e in events if e["reason"] == "DriftCorrected"]
    assert len(drift) == 1 and f"StatefulSet/{g0}" in drift[0]["message"]
    assert not [r for r in caplog.records if r.name == "test"], "no warning on kopf's per-object logger: one Event"
    assert "GroupsCreated" not in [e["reason"] for e in events]


# -- the real Kube's side of these errors


def test_kube_turns_404_and_409_on_delete_into_success_and_raises_the_rest():
    api = FakeApiClient()
    kube = Kube(api)  # type: ignore[arg-type]
    path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/flash-g0"
    for status in (404, 409):
        api.answers[("DELETE", path)] = (status, "gone or replaced")
        assert kube.delete(NS, "StatefulSet", "flash-g0", uid="u1") is False  # nothing was deleted now
    assert api.requests[-1]["body"] == {"propagationPolicy": "Background", "preconditions": {"uid": "u1"}}
    api.answers[("DELETE", path)] = (500, "etcdserver: request timed out")
    with pytest.raises(ApiException) as err:
        kube.delete(NS, "StatefulSet", "flash-g0")
    assert err.value.status == 500
    assert reconciler_mod._api_message(err.value) == "500: etcdserver: request timed out"

    api.answers[("GET", path)] = (404, "not found")
    assert kube.get(NS, "StatefulSet", "flash-g0") is None
    api.answers[("GET", path)] = (403, "forbidden")
    with pytest.raises(ApiException):
        kube.get(NS, "StatefulSet", "flash-g0")


def test_kube_applies_server_side_under_one_field_manager_with_force():
    api = FakeApiClient()
    obj = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "flash-g0", "namespace": NS}}
    Kube(api).apply(obj)  # type: ignore[arg-type]
    (req,) = api.requests
    assert (req["method"], req["path"]) == ("PATCH", f"/apis/apps/v1/namespaces/{NS}/statefulsets/flash-g0")
    assert req["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert req["query"] == [("fieldManager", FIELD_MANAGER), ("force", "true")]
    api.answers[("PATCH", req["path"])] = (422, "StatefulSet.apps \"flash-g0\" is invalid")
    with pytest.raises(ApiException) as err:
        Kube(api).apply(obj)  # type: ignore[arg-type]
    assert reconciler_mod._api_message(err.value) == '422: StatefulSet.apps "flash-g0" is invalid'
