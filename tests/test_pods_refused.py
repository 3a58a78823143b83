"""Pods the API server refuses (Pod Security admission, a ResourceQuota, a LimitRange, a webhook): the
StatefulSet exists, its pods never do, and the only trace is the StatefulSet controller's FailedCreate Event.
The controller reports `Degraded=True, reason: PodsRefused` with that message once a StatefulSet has lacked
pods for PODS_GRACE_S, reads Events only then, and clears the condition when the pods exist.

Against tests/fakes.py FakeKube (its `refuse_pods` plays admission and the StatefulSet controller), with the
reconciler's clock the `clock` fixture's; the real Kube's Event query against FakeApiClient."""

from __future__ import annotations

import logging

import pytest
from flashserve.clock import iso_ago
from flashserve.controller.kube import Kube
from flashserve.controller.observe import Observed, PodView, pods_missing
from flashserve.controller.plan import GroupState
from flashserve.controller.reconciler import (
    API_MESSAGE_MAX,
    EVENT_BACKOFF_MAX_S,
    PODS_GRACE_S,
    RECENT_WRITE_S,
    REFUSAL_RECHECK_S,
)
from flashserve.controller.status import MESSAGE_MAX_BYTES, group_conditions
from flashserve.render.naming import group_name

from tests.builders import NS, body
from tests.fakes import FakeApiClient, FakeKube, api_error, conditions, controller, reconcile

# What Pod Security admission answers for a pod with spec.engine.ipcLock in a `baseline` namespace.
PSA = ('violates PodSecurity "baseline:latest": non-default capabilities (container "engine" must not include '
       '"IPC_LOCK" in securityContext.capabilities.add)')  # fmt: skip
SPEC = {"replicas": 2, "engine": {"ipcLock": True}}


def event_reads(kube: FakeKube) -> list[str]:
    return [c[2] for c in kube.calls if c[0] == "list" and c[1] == "Event"]


def created(kube: FakeKube, c, spec: dict) -> dict:
    """The serving's children made, and seen by the watches (StatefulSets without pods where refused)."""
    status = reconcile(c, kube, body("flash", spec))
    assert event_reads(kube) == [], "the StatefulSets were not even observed yet"
    return reconcile(c, kube, body("flash", spec, status=status))


def test_refused_pods_are_degraded_with_the_admission_message_after_the_grace_and_clear_when_they_exist(events, clock):
    kube = FakeKube()
    c = controller(kube)
    g0 = group_name("flash", 0)
    kube.refuse_pods(g0, PSA)
    status = created(kube, c, SPEC)

    # Within the grace: a StatefulSet making its pods is not flagged, and no Event is read.
    assert event_reads(kube) == []
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"
    assert c.next_evaluation_in(body("flash", SPEC)) == pytest.approx(PODS_GRACE_S), "looked into once due"

    clock.advance(PODS_GRACE_S)
    events.clear()
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [g0], "only the StatefulSet that lacks pods"
    degraded = conditions(status)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsRefused")
    assert f"group 0 (StatefulSet {g0})" in degraded["message"] and PSA in degraded["message"]
    assert f'pods "{g0}-0" is forbidden' in degraded["message"]
    assert "group 1" not in degraded["message"], "group 1 has its pods"
    assert conditions(status)["Ready"]["reason"] == "PartiallyReady"
    assert events == [{"type": "Warning", "reason": "PodsRefused", "message": degraded["message"]}]

    # Reconciles in quick succession reuse what was read; the same refusal is no new event.
    events.clear()
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [] and events == []
    assert conditions(status)["Degraded"]["reason"] == "PodsRefused"
    clock.advance(PODS_GRACE_S)
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [g0], "read again while it lasts, at most once per grace"

    # The namespace allows the pods now: they exist, the condition clears, nothing more is read.
    kube.refused.discard(g0)
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == []
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"
    assert c.next_evaluation_in(body("flash", SPEC)) == c.resync_seconds


def test_a_serving_with_all_its_pods_never_reads_events(events, clock):
    kube = FakeKube()
    c = controller(kube)
    status = created(kube, c, SPEC)
    for _ in range(3):
        clock.advance(RECENT_WRITE_S + PODS_GRACE_S)
        status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == []
    assert c.next_evaluation_in(body("flash", SPEC)) == c.resync_seconds


def test_missing_pods_without_a_failed_create_event_are_not_a_refusal_and_are_checked_again_later(events, clock):
    kube = FakeKube()
    c = controller(kube)
    g1 = group_name("flash", 1)
    kube.refused.add(g1)  # no pods, and (yet) no Event saying why
    status = created(kube, c, SPEC)
    clock.advance(PODS_GRACE_S)
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [g1]
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"
    assert c.next_evaluation_in(body("flash", SPEC)) == pytest.approx(REFUSAL_RECHECK_S)

    kube.refuse_pods(g1, 'exceeded quota: gpus, requested: requests.nvidia.com/gpu=4, used: 8, limited: 8')
    clock.advance(PODS_GRACE_S)
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [], "not before REFUSAL_RECHECK_S"
    clock.advance(REFUSAL_RECHECK_S - PODS_GRACE_S)
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [g1]
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "PodsRefused" and "exceeded quota: gpus" in degraded["message"]


def test_a_failed_create_event_of_an_earlier_shortage_is_not_quoted(events, clock):
    """Events live about an hour: one left from a shortage that ended long ago says nothing of this one."""
    kube = FakeKube()
    c = controller(kube)
    g1 = group_name("flash", 1)
    stale = iso_ago(EVENT_BACKOFF_MAX_S + 600)
    kube.refuse_pods(g1, "exceeded quota: gpus (fixed an hour ago)", at=stale)
    status = created(kube, c, SPEC)
    clock.advance(PODS_GRACE_S)
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [g1]
    assert conditions(status)["Degraded"]["reason"] == "AsExpected"
    kube.refuse_pods(g1, "violates PodSecurity")  # this shortage's own refusal, recorded now
    clock.advance(REFUSAL_RECHECK_S)
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "PodsRefused" and "PodSecurity" in degraded["message"]
    assert "fixed an hour ago" not in degraded["message"]


def test_a_huge_admission_message_is_capped_per_statefulset_and_in_the_condition(events, clock):
    kube = FakeKube()
    c = controller(kube)
    spec = {**SPEC, "replicas": 6}
    huge = "admission webhook \"deny.example.com\" denied the request: " + "x" * 5000
    for g in range(6):
        kube.refuse_pods(group_name("flash", g), huge)
    status = created(kube, c, spec)
    clock.advance(PODS_GRACE_S)
    events.clear()
    status = reconcile(c, kube, body("flash", spec, status=status))
    message = conditions(status)["Degraded"]["message"]
    assert conditions(status)["Degraded"]["reason"] == "PodsRefused"
    assert len(message.encode()) <= MESSAGE_MAX_BYTES
    assert "x" * API_MESSAGE_MAX not in message, "each quoted message is cut to API_MESSAGE_MAX"
    assert message.count("the API server refuses its pods") >= 2 and "more" in message
    assert len(events) == 1 and events[0]["reason"] == "PodsRefused"


def test_a_failing_event_read_is_logged_not_raised(events, clock, caplog):
    kube = FakeKube()
    c = controller(kube)
    kube.refuse_pods(group_name("flash", 0), PSA)
    status = created(kube, c, SPEC)
    kube.errors[("list", "Event")] = api_error(403, 'events is forbidden: User "system:serviceaccount:x" cannot list')
    clock.advance(PODS_GRACE_S)
    with caplog.at_level(logging.WARNING):
        status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert event_reads(kube) == [group_name("flash", 0)]
    assert conditions(status)["Degraded"]["reason"] == "AsExpected", "not known, so not said"
    assert "403: events is forbidden" in caplog.text


def test_write_failures_outrank_refused_pods(events, clock):
    kube = FakeKube()
    c = controller(kube)
    kube.refuse_pods(group_name("flash", 0), PSA)
    status = created(kube, c, SPEC)
    clock.advance(RECENT_WRITE_S + 1)
    kube.objects.pop(("Service", NS, "flash"))  # deleted by hand: re-created, and that is refused
    kube.errors[("apply", "Service")] = api_error(422, "Service \"flash\" is invalid")
    status = reconcile(c, kube, body("flash", SPEC, status=status))
    assert conditions(status)["Degraded"]["reason"] == "ApplyFailed"


# -- the pure parts


def _sts(name: str, replicas: int, created: int | None = None) -> dict:
    status = {} if created is None else {"replicas": created}
    return {"metadata": {"name": name, "labels": {}}, "spec": {"replicas": replicas}, "status": status}


def _pod(name: str) -> PodView:
    return PodView(name, 0, "h", False, False, "Pending", False, 0, "")


def test_pods_missing_counts_pods_from_the_watch_or_the_statefulset_status():
    observed = Observed(
        statefulsets={"a": _sts("a", 2), "b": _sts("b", 2, created=2), "c": _sts("c", 3, created=1),
                      "d": _sts("d", 0), "e": _sts("e", 1)},
        pods=[_pod("a-0"), _pod("c-0"), _pod("c-1"), _pod("e-0")],
    )  # fmt: skip
    # b: its pods exist (the watch has not shown them yet); d asks for none; e has its one.
    assert pods_missing(observed) == {"a": 1, "c": 1}


def test_refused_pods_outrank_unschedulable_ones_in_degraded():
    groups = [GroupState(0, True, True, False, 1, 1), GroupState(1, True, True, False, 0, 0)]
    assert group_conditions(groups, 2, 0)[-1].reason == "PodsUnschedulable"
    degraded = group_conditions(groups, 2, 0, [(1, "flash-g1", "pods \"flash-g1-0\" is forbidden: quota")])[-1]
    assert (degraded.status, degraded.reason) == ("True", "PodsRefused")
    assert degraded.message == ('group 1 (StatefulSet flash-g1): the API server refuses its pods: '
                                'pods "flash-g1-0" is forbidden: quota')  # fmt: skip


# -- the real Kube's Event query


def test_kube_reads_the_latest_failed_create_event_of_one_statefulset():
    api = FakeApiClient()
    path = "/api/v1/namespaces/team-a/events"
    older = {"message": "old quota", "lastTimestamp": "2026-01-01T00:00:09Z"}
    newer = {"message": "PodSecurity", "lastTimestamp": "2026-01-01T00:00:10Z"}
    series = {"message": "webhook", "eventTime": "2026-01-01T00:00:01.000000Z",
              "series": {"lastObservedTime": "2026-01-01T00:00:05.000000Z"}}  # fmt: skip
    api.answers[("GET", path)] = (200, {"items": [older, newer, series]})
    kube = Kube(api)  # type: ignore[arg-type]
    assert kube.failed_create_message("team-a", "flash-g0", uid="u-1") == "PodSecurity"
    (req,) = api.requests
    assert req["method"] == "GET" and req["path"] == path
    selector = dict(req["query"])["fieldSelector"].split(",")
    assert sorted(selector) == sorted(["involvedObject.kind=StatefulSet", "involvedObject.name=flash-g0",
                                       "reason=FailedCreate", "involvedObject.uid=u-1"])  # fmt: skip

    api.answers[("GET", path)] = (200, {"items": []})
    assert kube.failed_create_message("team-a", "flash-g0") is None
    assert "involvedObject.uid" not in dict(api.requests[-1]["query"])["fieldSelector"]
    api.answers[("GET", path)] = (403, "events is forbidden")
    with pytest.raises(Exception, match="403"):
        kube.failed_create_message("team-a", "flash-g0")
