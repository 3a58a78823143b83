"""A 409 on the autoscaler's guarded write of spec.replicas: nothing is overwritten blind, nothing is announced,
and the decision is taken again about a second later on the new object (the retry)."""

from __future__ import annotations

import time

from kubernetes.client.rest import ApiException

from tests.builders import body_for, ready_observed
from tests.fakes import RecordingKube, evaluate, loopback_scaler


class ConflictingKube(RecordingKube):
    """The serving changed between the read and the write: the API server answers 409 once."""

    def __init__(self):
        super().__init__()
        self.conflicts = 1

    def patch_spec_replicas(self, namespace, name, replicas, resource_version):
        if self.conflicts:
            self.conflicts -= 1
            self.calls.append(("conflict", replicas, resource_version))
            raise ApiException(status=409, reason="Conflict")
        super().patch_spec_replicas(namespace, name, replicas, resource_version)


def test_conflict_on_the_replicas_write_is_retried_on_the_next_version(prometheus, events):
    url, fake = prometheus
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler, kube = loopback_scaler(), ConflictingKube()
    body = body_for(url)
    conds, scaled = evaluate(scaler, body, ready_observed(2), kube)
    assert scaled is None, "a refused write is not reported as a scaling"
    assert kube.calls[0][0] == "conflict" and kube.calls[0][2] == "42"
    assert not [e for e in events if e["reason"] == "Scaled"], "no Scaled event for a write that did not happen"
    assert scaler.next_evaluation_in(body) <= 1.5, "decides again about a second later, not a whole interval"

    time.sleep(max(0.0, scaler.next_evaluation_in(body) - 0.5) + 0.6)
    body["metadata"]["resourceVersion"] = "43"  # the concurrent edit, as the next event delivers it
    conds, scaled = evaluate(scaler, body, ready_observed(2), kube)
    assert scaled is not None and scaled > 2
    assert ("replicas", "team-a", "flash", scaled, "43") in kube.calls, "retried, guarded by the new version"
    assert [e["reason"] for e in events] == ["Scaled"]

