"""A child deleted by hand is made again by its DELETED watch event, not by the periodic resync: the operator
runs with a resync far longer than the test, so only the watch can explain a prompt restore."""

from __future__ import annotations

import time

import pytest
from flashserve.render.naming import group_name

from e2e.support import OperatorProcess, get_json, wait_until
from e2e.test_operator import apply_serving, ready

RESYNC_S = 300.0
RESTORE_WITHIN_S = 10.0  # a watch event and one reconcile; the resync would take RESYNC_S


@pytest.fixture
def slow_resync_operator(cluster, namespace, crd_installed, tmp_path):
    cluster.require_pools()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, resync=RESYNC_S).start()
    op.wait_serving()
    yield op
    op.stop()


def _uid(kubectl, namespace: str, kind: str, name: str) -> str | None:
    out = kubectl("-n", namespace, "get", kind, name, "-o", "jsonpath={.metadata.uid}", check=False)
    return out.stdout.strip() or None if out.returncode == 0 else None


def test_deleted_children_are_restored_by_their_watch_event(slow_resync_operator, kubectl, namespace):
    op = slow_resync_operator
    apply_serving(kubectl, namespace, {"replicas": 1})
    wait_until(lambda: ready(kubectl, namespace), 90, what="Ready")
    started = time.monotonic()
    children = [("statefulset", group_name("flash", 0)), ("service", "flash"), ("poddisruptionbudget", "flash")]
    took = {}
    for kind, name in children:
        before = _uid(kubectl, namespace, kind, name)
        assert before, f"{kind}/{name} exists before the test deletes it"
        t0 = time.monotonic()
        kubectl("-n", namespace, "delete", kind, name, "--wait=false")
        wait_until(lambda: _uid(kubectl, namespace, kind, name) not in (None, before), RESTORE_WITHIN_S,  # noqa: B023
                   interval=0.1, what=f"{kind}/{name} made again")  # fmt: skip
        took[f"{kind}/{name}"] = time.monotonic() - t0
    elapsed = time.monotonic() - started
    assert elapsed < RESYNC_S / 2, "the test ran long enough for a resync to explain a restore"
    assert not op.exited(), op.logs()

    def drift_events() -> str:
        events = get_json(kubectl, "-n", namespace, "events", "--field-selector",
                          "involvedObject.kind=DeepSeekServing")  # fmt: skip
        return " ".join(e.get("message", "") for e in events["items"] if e.get("reason") == "DriftCorrected")

    # A StatefulSet missing beside its headless Service was deleted by hand, and is reported as such.
    wait_until(lambda: f"StatefulSet/{group_name('flash', 0)}" in drift_events(), 20, what="DriftCorrected event")
    print(f"\nrestored by the watch (resync {RESYNC_S:.0f} s): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in took.items()))  # fmt: skip
