"""Conditions follow Kubernetes conventions: lastTransitionTime moves only when status does."""

from __future__ import annotations

from flashserve.controller.plan import GroupState
from flashserve.controller.status import (
    Cond,
    group_conditions,
    merge_conditions,
    transitions,
)


def test_last_transition_time_changes_only_with_status():
    first = merge_conditions(None, [Cond("Ready", "False", "ReplicasNotReady", "0/1")], "T1", 1)
    same = merge_conditions(first, [Cond("Ready", "False", "PartiallyReady", "1/2")], "T2", 2)
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["reason"] == "PartiallyReady"
    flipped = merge_conditions(same, [Cond("Ready", "True", "AllReplicasReady", "2/2")], "T3", 2)
    assert flipped[0]["lastTransitionTime"] == "T3" and flipped[0]["observedGeneration"] == 2


def test_group_conditions():
    g = [GroupState(0, True, True, True, 0, 0, serving=True), GroupState(1, True, False, False, 1, 1)]
    conds = {c.type: c for c in group_conditions(g, 2, 0)}
    assert conds["Ready"].status == "False" and conds["Ready"].reason == "PartiallyReady"
    assert conds["Progressing"].reason == "RollingUpdate"
    assert conds["Degraded"].status == "True" and conds["Degraded"].reason == "PodsUnschedulable"


def test_transitions_emit_events_for_changes_only():
    a = merge_conditions(None, [Cond("Ready", "True", "AllReplicasReady", "")], "T1", 1)
    assert transitions(a, a) == []
    b = merge_conditions(a, [Cond("Ready", "False", "InvalidSpec", "spec.x: bad")], "T2", 2)
    assert transitions(a, b) == [("Warning", "InvalidSpec", "spec.x: bad")]


def test_an_invalid_spec_is_told_once_though_it_sets_two_conditions():
    from flashserve.controller.status import invalid_spec_conditions

    ready = merge_conditions(None, [Cond("Ready", "True", "AllReplicasReady", "")], "T1", 1)
    bad = merge_conditions(ready, invalid_spec_conditions(["spec.x: bad"]), "T2", 2)
    assert {c["type"] for c in bad if c["reason"] == "InvalidSpec"} >= {"Ready", "Degraded"}
    events = transitions(ready, bad)
    assert [e for e in events if e[1] == "InvalidSpec"] == [events[0]] and len(set(events)) == len(events)


def test_long_messages_are_capped_with_a_count_of_what_was_left_out():
    from flashserve.controller.status import (
        MESSAGE_MAX_BYTES,
        invalid_spec_conditions,
        join_capped,
    )

    errors = [f"spec.field{i}: unknown field: remove it" for i in range(2000)]
    msg = invalid_spec_conditions(errors)[0].message
    assert len(msg.encode()) <= MESSAGE_MAX_BYTES and msg.startswith("spec.field0: ")
    shown = msg.count("unknown field")
    assert msg.endswith(f"… and {2000 - shown} more")
    assert join_capped(["a", "b"]) == "a; b"
    assert len(join_capped(["é" * 10000]).encode()) <= MESSAGE_MAX_BYTES  # one huge part is cut, on a character
    merged = merge_conditions(None, [Cond("Ready", "False", "X", "x" * 100_000)], "T", 1)
    assert len(merged[0]["message"].encode()) <= MESSAGE_MAX_BYTES


def test_conditions_of_other_tools_are_kept():
    from flashserve.controller.status import previous_conditions

    theirs = {"type": "example.com/Audited", "status": "True", "reason": "Checked", "message": "",
              "lastTransitionTime": "T0"}  # fmt: skip
    ours = merge_conditions(None, [Cond("Ready", "True", "AllReplicasReady", "")], "T1", 1)
    previous = previous_conditions(ours, [theirs, {"type": "Ready", "status": "False"}])
    merged = merge_conditions(previous, [Cond("Ready", "True", "AllReplicasReady", "")], "T2", 2)
    assert theirs in merged, "another tool's condition survives the operator's status write"
    assert [c for c in merged if c["type"] == "Ready"][0]["lastTransitionTime"] == "T1", "ours come from what we wrote"


def test_the_router_counts_as_rolling_out_until_the_deployment_controller_reports_it_done():
    from flashserve.controller.router_status import router_rolling_out, router_status

    assert router_rolling_out(None), "not observed yet"
    seen = {"metadata": {"generation": 3}, "status": {"observedGeneration": 2}}
    assert router_rolling_out(seen), "a spec change the Deployment controller has not seen"
    done = {"metadata": {"generation": 3}, "status": {"observedGeneration": 3, "conditions": [
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}}  # fmt: skip
    assert not router_rolling_out(done)
    late = {"status": {"conditions": [{"type": "Progressing", "status": "False",
                                       "reason": "ProgressDeadlineExceeded"}]}}  # fmt: skip
    assert not router_rolling_out(late), "past its deadline: no longer coming"
    assert router_status({"status": {"replicas": 2, "readyReplicas": True, "availableReplicas": -1}}) == {
        "replicas": 2, "readyReplicas": 0, "availableReplicas": 0}, "only counts the API could give"


def test_groups_serving_without_a_router_get_a_grace_before_degraded_also_past_the_progress_deadline():
    from flashserve.controller.router_status import ROUTER_GRACE_S, with_router

    groups = [GroupState(0, True, True, True, 0, 0, serving=True)]
    conds = group_conditions(groups, 1, 0)
    # Engines that took longer to start than the router Deployment's progress deadline: its pods could not be
    # ready before, so a router that is not ready yet the moment the engines are is no failure.
    late = {"status": {"replicas": 2, "readyReplicas": 0, "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}  # fmt: skip
    soon = {c.type: (c.status, c.reason) for c in with_router(conds, late, 1, waited_s=5.0)}
    assert soon == {"Ready": ("True", "ServingWithoutRouter"), "Progressing": ("True", "WaitingForRouter"),
                    "Degraded": ("False", "AsExpected")}  # fmt: skip
    later = {c.type: (c.status, c.reason) for c in with_router(conds, late, 1, waited_s=ROUTER_GRACE_S)}
    assert later["Degraded"] == ("True", "RouterUnavailable") and later["Progressing"] == ("False", "Complete")
    stuck = group_conditions([GroupState(0, True, True, True, 1, 0, serving=True)], 1, 0)
    kept = {c.type: c.reason for c in with_router(stuck, late, 1, waited_s=ROUTER_GRACE_S)}
    assert kept["Degraded"] == "PodsUnschedulable", "the first cause reported stays"
    up = {"status": {"availableReplicas": 1}}
    assert with_router(conds, up, 1, waited_s=ROUTER_GRACE_S) == conds
    assert with_router(conds, late, 0, waited_s=ROUTER_GRACE_S) == conds, "nothing said while no group serves"
