"""Pods the API server refuses, against the real API server: Pod Security admission in a `baseline` namespace
refuses pods with the IPC_LOCK capability (spec.engine.ipcLock, docs/reliability.md#security). The serving
says so (`Degraded=True, reason: PodsRefused`, with the admission message and an Event) instead of staying
ReplicasNotReady with no reason, and clears once the namespace admits the pods."""

from __future__ import annotations

import time

from flashserve.render.naming import group_name

from e2e.support import condition, get_json, wait_until
from e2e.test_operator import apply_serving, operator, pods, serving  # noqa: F401

ENFORCE = "pod-security.kubernetes.io/enforce"
SPEC = {"replicas": 1, "parallelism": {"nodesPerReplica": 2}, "engine": {"ipcLock": True}}


def test_pods_refused_by_pod_security_are_degraded_with_the_admission_message(operator, kubectl, namespace):  # noqa: F811
    kubectl("label", "namespace", namespace, f"{ENFORCE}=baseline", "--overwrite")
    start = time.monotonic()
    apply_serving(kubectl, namespace, SPEC)

    def refused() -> bool:
        return condition(serving(kubectl, namespace), "Degraded").get("reason") == "PodsRefused"

    wait_until(refused, 30, what="Degraded PodsRefused")
    took = time.monotonic() - start
    degraded = condition(serving(kubectl, namespace), "Degraded")
    sts = group_name("flash", 0)
    assert degraded["status"] == "True"
    assert f"group 0 (StatefulSet {sts})" in degraded["message"]
    assert "is forbidden" in degraded["message"] and 'violates PodSecurity "baseline' in degraded["message"]
    assert "IPC_LOCK" in degraded["message"]
    assert pods(kubectl, namespace) == []
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector",
                      "involvedObject.kind=DeepSeekServing,reason=PodsRefused")["items"]  # fmt: skip
    assert len(events) == 1 and events[0]["type"] == "Warning" and "IPC_LOCK" in events[0]["message"]
    print(f"\nPodsRefused reported {took:.1f} s after the serving was applied")

    # The namespace admits the pods now; the StatefulSet controller retries (with its back-off), the pods
    # appear, and the condition clears.
    kubectl("label", "namespace", namespace, f"{ENFORCE}=privileged", "--overwrite")
    cleared = time.monotonic()
    wait_until(lambda: condition(serving(kubectl, namespace), "Degraded").get("reason") == "AsExpected"
               and len(pods(kubectl, namespace)) == 2, 180, what="pods created, Degraded cleared")  # fmt: skip
    print(f"cleared {time.monotonic() - cleared:.1f} s after the namespace allowed the pods")
