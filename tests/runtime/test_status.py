"""Status patches: conditions merged by type, containerStatuses sent back whole."""

from __future__ import annotations

from flashserve_testbed.runtime import status

NOW = "2026-01-01T00:00:10Z"


def pod(ready: bool = False) -> dict:
    value = "True" if ready else "False"
    return {"metadata": {"name": "p"}, "status": {
        "conditions": [{"type": "Initialized", "status": "True"},
                       {"type": "Ready", "status": value, "lastTransitionTime": "T0", "reason": "ContainersNotReady"},
                       {"type": "ContainersReady", "status": value, "lastTransitionTime": "T0"}],
        "containerStatuses": [
            {"name": "sidecar", "image": "s", "ready": True, "restartCount": 0, "state": {"running": {}}},
            {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "ready": ready, "restartCount": 0, "started": True,
             "state": {"running": {"startedAt": "T0"}}},
        ]}}


def test_ready_patch_sets_both_conditions_and_keeps_every_container_entry():
    body = status.readiness(pod(), "vllm", True, now=NOW)["status"]
    conds = {c["type"]: c for c in body["conditions"]}
    assert set(conds) == {"Ready", "ContainersReady"}
    assert conds["Ready"] == {"type": "Ready", "status": "True", "lastTransitionTime": NOW, "reason": None,
                              "message": None}
    names = [c["name"] for c in body["containerStatuses"]]
    assert names == ["sidecar", "vllm"]
    vllm = body["containerStatuses"][1]
    assert vllm["ready"] is True and vllm["state"] == {"running": {"startedAt": "T0"}} and vllm["image"]


def test_transition_time_only_moves_on_a_change():
    body = status.readiness(pod(ready=True), "vllm", True, now=NOW)["status"]
    assert all(c["lastTransitionTime"] == "T0" for c in body["conditions"])
    down = status.readiness(pod(ready=True), "vllm", False, now=NOW)["status"]
    assert all(c["lastTransitionTime"] == NOW and c["status"] == "False" for c in down["conditions"])
    assert down["conditions"][0]["reason"] == "ContainersNotReady"


def test_terminated_by_a_signal_then_restarted():
    p = pod(ready=True)
    term = status.terminated(p, "vllm", "flashserve-mock://42", -9, "T0", "killed", now=NOW)["status"]
    vllm = term["containerStatuses"][1]
    assert vllm["ready"] is False and vllm["started"] is False
    assert vllm["state"]["terminated"] == {"exitCode": 137, "reason": "Error", "signal": 9, "startedAt": "T0",
                                           "finishedAt": NOW, "containerID": "flashserve-mock://42",
                                           "message": "killed"}
    assert {c["status"] for c in term["conditions"]} == {"False"}
    p["status"]["containerStatuses"] = term["containerStatuses"]
    again = status.started(p, "vllm", "flashserve-mock://43", NOW, restarted=True, now=NOW)["status"]
    vllm = again["containerStatuses"][1]
    assert vllm["restartCount"] == 1 and vllm["state"] == {"running": {"startedAt": NOW}}
    assert vllm["lastState"]["terminated"]["exitCode"] == 137
    assert vllm["containerID"] == "flashserve-mock://43" and vllm["ready"] is False


def test_exit_details():
    assert status.exit_details(0) == (0, "Completed")
    assert status.exit_details(1) == (1, "Error")
    assert status.exit_details(-15) == (143, "Error")


def test_missing_container_status_is_added():
    p = {"metadata": {"name": "p"}, "status": {}}
    body = status.readiness(p, "vllm", False, now=NOW)["status"]
    assert body["containerStatuses"] == [{"name": "vllm", "image": "", "restartCount": 0, "ready": False}]
