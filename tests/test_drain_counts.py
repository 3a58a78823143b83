"""What counts as a ready replica group while groups drain: one out of routing (drained before its pods are
replaced) takes no new request, so status' readyReplicas, the Ready condition and the autoscaler's replica
counts leave it out; a one-group rollout keeps counting one group through its surge group."""

from __future__ import annotations

from flashserve.api.validation import parse_serving
from flashserve.controller.autoscale import replica_counts
from flashserve.controller.drain import DRAIN_SETTLE_S
from flashserve.controller.reconciler import RECENT_WRITE_S
from flashserve.render.naming import ROUTING_SERVE, serving_label_value

from tests.builders import NS, body
from tests.fakes import FakeEngines, FakeKube, conditions, controller, reconcile, routing_patches, settled

NEW = {"engine": {"image": "vllm/vllm-openai:v0.33.1"}}


def serving_groups(kube: FakeKube) -> set[int]:
    """Groups whose every pod is ready and in routing, as the watches show them."""
    by_group: dict[int, list] = {}
    for p in kube.observed(NS, "flash").pods:
        by_group.setdefault(p.group, []).append(p)
    return {g for g, ps in by_group.items() if all(p.ready and p.routing == ROUTING_SERVE for p in ps)}


def counts(kube, spec: dict) -> tuple[int, int]:
    """The autoscaler's (ready, starting) for the serving as the watches show it."""
    reps = replica_counts(parse_serving(body("flash", spec)), kube.observed(NS, serving_label_value("flash")))
    return reps.ready, reps.starting


def test_a_group_draining_for_a_rollout_is_not_counted_ready(events, clock):
    engines = FakeEngines(default=3)  # busy engines: the drain lasts
    spec = {"replicas": 2}
    kube, c, status = settled(spec, clock, engines)
    assert status["readyReplicas"] == 2 and counts(kube, spec) == (2, 0)
    new = {**spec, **NEW}
    status = reconcile(c, kube, body("flash", new, status=status, generation=2))
    assert routing_patches(kube), "one group left routing"
    status = reconcile(c, kube, body("flash", new, status=status, generation=2))
    assert len(serving_groups(kube)) == 1 and status["drainingGroups"][0]["reason"] == "Rollout"
    assert status["readyReplicas"] == 1, "its pods are ready but it serves no new request"
    assert conditions(status)["Ready"]["reason"] == "PartiallyReady"
    assert counts(kube, new) == (1, 1), "the autoscaler counts it as on its way back, not as capacity"


def test_a_scale_down_drain_leaves_the_desired_groups_counted(events, clock):
    engines = FakeEngines(default=3)
    kube, c, status = settled({"replicas": 3}, clock, engines)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status, generation=2))
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status, generation=2))
    assert len(status["drainingGroups"]) == 2
    assert status["readyReplicas"] == 1 and conditions(status)["Ready"]["reason"] == "AllReplicasReady"


def test_a_one_group_rollout_counts_one_ready_group_throughout(events, clock):
    spec = {"replicas": 1, "parallelism": {"nodesPerReplica": 2}}
    kube, c, status = settled(spec, clock)
    new = {**spec, **NEW}
    seen, ready = [], []
    for _ in range(12):
        status = reconcile(c, kube, body("flash", new, status=status, generation=2))
        seen += [e["reason"] for e in events]
        events.clear()
        ready.append((status["readyReplicas"], serving_groups(kube) != set()))
        clock.advance(DRAIN_SETTLE_S + RECENT_WRITE_S)
    assert "SurgeCreated" in seen and seen.count("Drained") == 2
    assert ready == [(1, True)] * len(ready), "group 0 drains and is replaced while the surge group serves"
