"""The reconcile plan as a pure function: what it writes for a given desired serving and observed children."""

from __future__ import annotations

import dataclasses

from flashserve.api.validation import parse_serving
from flashserve.clock import iso_at
from flashserve.controller.drain import DRAIN_SETTLE_S
from flashserve.controller.observe import Observed
from flashserve.controller.plan import plan
from flashserve.render.naming import ROUTING_DRAIN, group_name, router_name
from flashserve.render.renderer import render_serving, template_hash

from tests.builders import observe

T0 = 1_767_225_600.0  # when the drains of these tests start


def out_of_routing(observed: Observed, groups, since: float = T0, in_flight: int | None = 0) -> Observed:
    """`observed` with the pods of `groups` taken out of routing at `since`, each reporting `in_flight`."""
    for i, p in enumerate(observed.pods):
        if p.group in groups:
            observed.pods[i] = dataclasses.replace(p, routing=ROUTING_DRAIN, drain_since=iso_at(since))
            observed.in_flight[p.name] = in_flight
    return observed


def at(observed: Observed, now: float) -> Observed:
    """`observed` at `now`, every router pod having confirmed its workers then (as when all answer the reconcile:
    the drain's wait for a router that does not is pinned by its own test)."""
    observed.now = observed.routers_synced_at = now
    return observed


def pods_of(observed: Observed, *groups: int) -> list[str]:
    return sorted(p.name for p in observed.pods if p.group in groups)


def G(i: int) -> str:
    return group_name("flash", i)


def serving(spec: dict):
    return parse_serving({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                          "metadata": {"name": "flash", "namespace": "ns", "uid": "u1"}, "spec": spec})  # fmt: skip


def test_in_sync_makes_no_writes():
    obj = serving({"replicas": 3, "parallelism": {"nodesPerReplica": 2}})
    p = plan(obj, observe(obj))
    assert p.writes == 0 and all(g.ready and g.updated for g in p.groups)


def test_empty_cluster_creates_every_group_and_shared_objects():
    obj = serving({"replicas": 2})
    p = plan(obj, Observed())
    kinds = sorted(o["kind"] for o in p.apply)
    assert kinds == ["Deployment", "NetworkPolicy", "NetworkPolicy", "PodDisruptionBudget", "PodDisruptionBudget",
                     "Role", "RoleBinding", "Service", "Service", "Service", "ServiceAccount", "StatefulSet",
                     "StatefulSet"]  # fmt: skip
    assert p.created_groups == [0, 1] and not p.restored


def test_scale_down_drains_the_groups_beyond_then_deletes_them_highest_first():
    big = serving({"replicas": 4})
    small = serving({"replicas": 1})
    observed = at(observe(big), T0)
    p = plan(small, observed)
    assert sorted(n for n, _, _ in p.drain_pods) == pods_of(observed, 1, 2, 3), "out of routing first"
    assert {since for _, _, since in p.drain_pods} == {iso_at(T0)}
    assert [uid for n, uid, _ in p.drain_pods] == [f"uid-{n}" for n, _, _ in p.drain_pods], "the pods' own uids"
    assert not p.delete and not p.apply and not p.delete_pods
    assert p.drain_started == [3, 2, 1] and [(d.group, d.reason) for d in p.draining] == [
        (3, "ScaleDown"), (2, "ScaleDown"), (1, "ScaleDown")]

    # Idle at once, but inside the settle time the router may not have seen the label yet: they stay.
    observed = out_of_routing(at(observe(big), T0 + DRAIN_SETTLE_S - 1), {1, 2, 3})
    p = plan(small, observed)
    assert not p.delete and not p.drain_pods and [d.in_flight for d in p.draining] == [0, 0, 0]

    p = plan(small, at(observed, T0 + DRAIN_SETTLE_S))
    assert p.delete == [("StatefulSet", G(3)), ("StatefulSet", G(2)), ("StatefulSet", G(1)),
                        ("Service", G(3)), ("Service", G(2)), ("Service", G(1))]  # fmt: skip
    assert [(d.group, d.ended_by) for d in p.drained] == [(3, "Idle"), (2, "Idle"), (1, "Idle")]
    assert p.deleted_groups == [3, 2, 1] and not p.draining and not p.apply and not p.undrain_pods


def test_a_busy_group_waits_until_it_is_idle_or_drain_seconds_pass():
    big = serving({"replicas": 2, "rollout": {"drainSeconds": 60}})
    small = serving({"replicas": 1, "rollout": {"drainSeconds": 60}})
    observed = out_of_routing(at(observe(big), T0 + 59), {1}, in_flight=3)
    p = plan(small, observed)
    assert not p.delete and [(d.group, d.in_flight) for d in p.draining] == [(1, 3)]

    p = plan(small, at(observed, T0 + 60))
    assert ("StatefulSet", G(1)) in p.delete
    assert [(d.group, d.ended_by, d.in_flight) for d in p.drained] == [(1, "Timeout", 3)]

    # An engine that did not answer is not known to be idle: only the timeout ends its drain.
    observed = out_of_routing(at(observe(big), T0 + 59), {1}, in_flight=None)
    p = plan(small, observed)
    assert not p.delete and [d.in_flight for d in p.draining] == [None]


def test_where_the_operator_keeps_the_routers_workers_an_idle_group_waits_for_every_router_to_confirm():
    routing = {"rollout": {"drainSeconds": 60}, "routing": {"policy": "rendezvous_hash"}}
    big, small = serving({"replicas": 2, **routing}), serving({"replicas": 1, **routing})
    observed = out_of_routing(at(observe(big), T0 + DRAIN_SETTLE_S), {1})
    # Not since the operator started; only before the group left routing; in the second the annotation holds,
    # which may have been before the label.
    for synced in (None, T0 - 1, T0 + 0.5):
        observed.routers_synced_at = synced
        p = plan(small, observed)
        assert not p.delete and [(d.group, d.routers_behind) for d in p.draining] == [(1, True)]
    observed.routers_synced_at = T0 + 1
    assert [(d.group, d.ended_by) for d in plan(small, observed).drained] == [(1, "Idle")]

    # A router that never confirms holds the group until drainSeconds, and the ended drain says so.
    at(observed, T0 + 60).routers_synced_at = None
    (d,) = plan(small, observed).drained
    assert (d.ended_by, d.ended()["routersBehind"]) == ("Timeout", True)


def test_under_a_discovery_policy_an_idle_group_waits_for_every_router_to_confirm_it_left():
    """The routers' pod watch drops the group; the drain goes once every router pod has confirmed it did."""
    big, small = serving({"replicas": 2}), serving({"replicas": 1})
    observed = out_of_routing(at(observe(big), T0 + DRAIN_SETTLE_S), {1})
    for synced in (None, T0 + 0.5):
        observed.routers_synced_at = synced
        p = plan(small, observed)
        assert not p.delete and [(d.group, d.routers_behind) for d in p.draining] == [(1, True)]
    observed.routers_synced_at = T0 + 1
    (d,) = plan(small, observed).drained
    assert d.ended_by == "Idle" and "routersBehind" not in d.ended()

    # A plain Service has no router to wait for: the settle time is all a drain waits.
    off = {"routing": {"enabled": False}}
    observed = out_of_routing(at(observe(serving({"replicas": 2, **off})), T0 + DRAIN_SETTLE_S), {1})
    observed.routers_synced_at = None
    (d,) = plan(serving({"replicas": 1, **off}), observed).drained
    assert d.ended_by == "Idle" and "routersBehind" not in d.ended()


def test_pods_without_an_ip_count_as_idle_and_unready_ones_as_their_engine_answers():
    big = serving({"replicas": 2, "parallelism": {"nodesPerReplica": 2}})
    small = serving({"replicas": 1, "parallelism": {"nodesPerReplica": 2}})
    observed = out_of_routing(at(observe(big), T0 + DRAIN_SETTLE_S), {1}, in_flight=None)
    g1 = [i for i, p in enumerate(observed.pods) if p.group == 1]
    observed.pods[g1[0]] = dataclasses.replace(observed.pods[g1[0]], ready=False)
    observed.pods[g1[1]] = dataclasses.replace(observed.pods[g1[1]], ip="")
    assert plan(small, observed).drained == [], "an unready engine that did not answer is not known to be idle"
    for load, drained in ((3, []), (0, [(1, "Idle")])):
        observed.in_flight[observed.pods[g1[0]].name] = load
        assert [(d.group, d.ended_by) for d in plan(small, observed).drained] == drained


def test_scaling_back_up_cancels_the_drain():
    observed = out_of_routing(at(observe(serving({"replicas": 3})), T0 + 1), {1, 2}, in_flight=2)
    p = plan(serving({"replicas": 3}), observed)
    assert sorted(p.undrain_pods) == [(n, f"uid-{n}") for n in pods_of(observed, 1, 2)]
    assert p.drain_cancelled == [1, 2] and not p.delete and not p.draining and not p.drain_pods

    # Back up part of the way: group 1 serves again, group 2 keeps draining.
    p = plan(serving({"replicas": 2}), observed)
    assert p.undrain_pods == [(n, f"uid-{n}") for n in pods_of(observed, 1)]
    assert [d.group for d in p.draining] == [2] and p.drain_cancelled == [1]


def test_drain_seconds_zero_removes_groups_at_once():
    p = plan(serving({"replicas": 1, "rollout": {"drainSeconds": 0}}), at(observe(serving({"replicas": 3})), T0))
    assert [d for d in p.delete if d[0] == "StatefulSet"] == [("StatefulSet", G(2)), ("StatefulSet", G(1))]
    assert not p.drain_pods and not p.drained and not p.drain_started


def test_rollout_drains_a_group_before_replacing_its_pods_together():
    old = serving({"replicas": 3, "parallelism": {"nodesPerReplica": 2}})
    new = serving({"replicas": 3, "parallelism": {"nodesPerReplica": 2}, "engine": {"image": "vllm/vllm-openai:v0.33.1"}})
    observed = at(observe(old), T0)
    p = plan(new, observed)
    assert sorted(n for n, _, _ in p.drain_pods) == pods_of(observed, 0), "one group at a time, drained first"
    assert not p.rolling and not p.delete_pods
    assert not [o for o in p.apply if o["kind"] == "StatefulSet"], "its old template stays while it drains"
    assert [(d.group, d.reason) for d in p.draining] == [(0, "Rollout")]

    observed = out_of_routing(at(observe(old), T0 + DRAIN_SETTLE_S), {0})
    p = plan(new, observed)
    assert p.rolling == [0] and not p.drain_pods
    assert sorted(p.delete_pods) == [f"{G(0)}-0", f"{G(0)}-1"]
    assert [o["metadata"]["name"] for o in p.apply if o["kind"] == "StatefulSet"] == [G(0)]
    assert [(d.group, d.ended_by) for d in p.drained] == [(0, "Idle")]


def test_rollout_budget_allows_max_unavailable_groups_and_a_draining_group_uses_it():
    old = serving({"replicas": 4})
    new = serving({"replicas": 4, "rollout": {"maxUnavailable": 2}, "engine": {"image": "x:1"}})
    assert plan(new, at(observe(old), T0)).drain_started == [0, 1]
    observed = out_of_routing(at(observe(old), T0 + DRAIN_SETTLE_S), {0, 1})
    assert plan(new, observed).rolling == [0, 1]

    # Group 0 is still busy: it holds one unit of the budget of 1, so group 1 waits.
    one = serving({"replicas": 4, "engine": {"image": "x:1"}})
    observed = out_of_routing(at(observe(old), T0 + 1), {0}, in_flight=5)
    p = plan(one, observed)
    assert [d.group for d in p.draining] == [0] and not p.drain_pods and not p.rolling


def test_unready_outdated_group_is_updated_even_when_the_budget_is_used():
    old = serving({"replicas": 2})
    new = serving({"replicas": 2, "engine": {"image": "x:1"}})
    observed = at(observe(old, ready=False), T0)  # both groups already down: replacing them costs nothing
    assert plan(new, observed).drain_started == [0, 1]
    observed = out_of_routing(at(observe(old, ready=False), T0 + DRAIN_SETTLE_S), {0, 1}, in_flight=None)
    assert plan(new, observed).rolling == [], "not ready says nothing of the requests its engines hold"
    observed = out_of_routing(at(observe(old, ready=False), T0 + DRAIN_SETTLE_S), {0, 1}, in_flight=0)
    assert plan(new, observed).rolling == [0, 1], "engines that answer idle (or refuse: nothing runs) go at once"


def test_half_updated_group_is_finished_by_replacing_stale_pods():
    obj = serving({"replicas": 1, "parallelism": {"nodesPerReplica": 2}})
    # The StatefulSet already has the new template, one pod still runs the old one (operator died mid-way).
    observed = at(observe(obj, pod_hash={f"{G(0)}-1": "old"}), T0)
    p = plan(obj, observed)
    assert [n for n, _, _ in p.drain_pods] == [f"{G(0)}-1"] and not p.delete_pods
    observed = out_of_routing(at(observe(obj, pod_hash={f"{G(0)}-1": "old"}), T0 + DRAIN_SETTLE_S), {0})
    p = plan(obj, observed)
    assert p.delete_pods == [f"{G(0)}-1"] and not p.rolling
    assert p.undrain_pods == [(f"{G(0)}-0", f"uid-{G(0)}-0")], "the pod already on the new template serves again"


def test_drift_in_a_child_is_restored_and_reported():
    obj = serving({"replicas": 1})
    observed = observe(obj)
    observed.statefulsets[G(0)]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    del observed.services["flash"]
    p = plan(obj, observed)
    assert sorted(o["metadata"]["name"] for o in p.apply) == ["flash", G(0)]
    assert f"StatefulSet/{G(0)}" in p.restored


def test_template_hash_is_what_the_statefulset_and_pods_carry():
    obj = serving({})
    sts = [o for o in render_serving(obj) if o["kind"] == "StatefulSet"][0]
    h = template_hash(obj.spec)
    assert sts["metadata"]["annotations"]["flashserve.io/template-hash"] == h
    assert sts["spec"]["template"]["metadata"]["annotations"]["flashserve.io/template-hash"] == h


def test_turning_compute_domains_off_deletes_them_group_by_group():
    from flashserve.render.naming import compute_domain_name

    spec = {"replicas": 2, "parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {"enabled": True}}}
    on = serving(spec)
    off = serving({**spec, "placement": {"computeDomain": {"enabled": False}}})
    observed = out_of_routing(at(observe(on), T0 + DRAIN_SETTLE_S), {0})
    p = plan(off, observed)
    assert p.rolling == [0]
    assert p.delete_first == [("ComputeDomain", compute_domain_name("flash", 0))], "group 0's, before its new template"
    assert not [d for d in p.delete if d[0] == "ComputeDomain"], "group 1 keeps its domain until its turn"
    assert not [o for o in p.apply if o["kind"] == "ComputeDomain"]


def test_scale_down_deletes_the_compute_domains_of_removed_groups():
    from flashserve.render.naming import compute_domain_name

    spec = {"parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {"enabled": True}}}
    observed = out_of_routing(at(observe(serving({**spec, "replicas": 3})), T0 + DRAIN_SETTLE_S), {1, 2})
    p = plan(serving({**spec, "replicas": 1}), observed)
    assert [d for d in p.delete if d[0] == "ComputeDomain"] == [("ComputeDomain", compute_domain_name("flash", 2)),
                                                               ("ComputeDomain", compute_domain_name("flash", 1))]  # fmt: skip


def test_network_policy_is_applied_by_default_and_deleted_when_turned_off():
    on = serving({})
    router = router_name("flash")
    assert [o["metadata"]["name"] for o in plan(on, Observed()).apply if o["kind"] == "NetworkPolicy"] == ["flash", router]
    off = serving({"networkPolicy": {"enabled": False}})
    p = plan(off, observe(on))
    assert sorted(p.delete) == [("NetworkPolicy", "flash"), ("NetworkPolicy", router)] and not p.apply


def _set(observed: Observed, group: int, **fields) -> Observed:
    observed.pods = [dataclasses.replace(p, **fields) if p.group == group else p for p in observed.pods]
    return observed


def test_a_single_group_rolls_out_through_a_surge_group_and_keeps_serving():
    old = serving({"replicas": 1})
    new = serving({"replicas": 1, "engine": {"image": "x:1"}})
    two = serving({"replicas": 2, "engine": {"image": "x:1"}})  # what the cluster holds once the surge exists
    old_hash = template_hash(old.spec)

    # 1. The surge group comes first, on the new template; group 0 is left alone.
    p = plan(new, at(observe(old), T0))
    assert p.surge == 1 and p.created_groups == [1]
    made = [o for o in p.apply if o["kind"] == "StatefulSet"]
    assert [o["metadata"]["name"] for o in made] == [G(1)]
    assert made[0]["metadata"]["annotations"]["flashserve.io/template-hash"] == template_hash(new.spec)
    assert not p.drain_pods and not p.rolling and not p.delete_pods and not p.delete

    # 2. Not ready yet: group 0 keeps serving, nothing is drained; pods no node takes are reported.
    starting = _set(at(observe(two, hash_override={0: old_hash}), T0), 1, ready=False)
    p = plan(new, starting)
    assert p.surge == 1 and not p.writes and not p.surge_unschedulable
    p = plan(new, _set(starting, 1, unschedulable=True, phase="Pending"))
    assert p.surge_unschedulable and not p.writes

    # 3. The surge group is ready: group 0 is drained, then replaced.
    both = at(observe(two, hash_override={0: old_hash}), T0)
    p = plan(new, both)
    assert sorted(n for n, _, _ in p.drain_pods) == pods_of(both, 0) and not p.rolling and not p.delete
    p = plan(new, out_of_routing(at(observe(two, hash_override={0: old_hash}), T0 + DRAIN_SETTLE_S), {0}))
    assert p.rolling == [0] and p.delete_pods == [f"{G(0)}-0"] and not p.delete

    # 4. Group 0's new pods start: the surge group keeps serving.
    p = plan(new, _set(at(observe(two), T0 + 60), 0, ready=False))
    assert p.surge == 1 and not p.writes

    # 5. Group 0 is ready on the new template: the surge group is beyond the desired count, drained, removed.
    p = plan(new, at(observe(two), T0 + 60))
    assert p.surge is None and sorted(n for n, _, _ in p.drain_pods) == pods_of(observe(two), 1)
    assert [(d.group, d.reason) for d in p.draining] == [(1, "ScaleDown")]
    p = plan(new, out_of_routing(at(observe(two), T0 + 60 + DRAIN_SETTLE_S), {1}, since=T0 + 60))
    assert p.deleted_groups == [1] and ("StatefulSet", G(1)) in p.delete


def test_without_surge_a_single_group_is_drained_and_replaced_in_place():
    old = serving({"replicas": 1})
    for spec in ({"rollout": {"surge": False}}, {"autoscaling": {"enabled": True, "maxReplicas": 1}}):
        new = serving({"replicas": 1, "engine": {"image": "x:1"}, **spec})
        observed = at(observe(old), T0)
        p = plan(new, observed)
        assert p.surge is None and not p.created_groups, spec
        assert sorted(n for n, _, _ in p.drain_pods) == pods_of(observed, 0), spec


def test_a_group_1_on_the_old_template_is_no_surge():
    """Scaled from 2 to 1 in the same edit as a template change: group 1 is removed first, then the surge made."""
    old = serving({"replicas": 2})
    new = serving({"replicas": 1, "engine": {"image": "x:1"}})
    p = plan(new, at(observe(old), T0))
    assert p.surge is None and [(d.group, d.reason) for d in p.draining] == [(1, "ScaleDown")]
    assert not p.created_groups and not [n for n, _, _ in p.drain_pods if n.startswith(G(0))]


def test_pods_without_the_routing_label_get_it_and_nothing_more():
    """Pods an operator made before the label existed: labelled `serve` once, no drain called off."""
    obj = serving({"replicas": 2})
    observed = at(observe(obj), T0)
    observed.pods = [dataclasses.replace(p, routing="") if p.group == 1 else p for p in observed.pods]
    p = plan(obj, observed)
    assert p.undrain_pods == [(n, f"uid-{n}") for n in pods_of(observed, 1)]
    assert not p.drain_cancelled and p.writes == len(p.undrain_pods)
