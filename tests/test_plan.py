"""The reconcile plan as a pure function: what it writes for a given desired serving and observed children."""

from __future__ import annotations

from flashserve.api.validation import parse_serving
from flashserve.controller.observe import Observed
from flashserve.controller.plan import plan
from flashserve.render.naming import group_name, router_name
from flashserve.render.renderer import render_serving, template_hash

from tests.builders import observe


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


def test_scale_down_deletes_highest_groups_first_and_nothing_else():
    big = serving({"replicas": 4})
    small = serving({"replicas": 1})
    p = plan(small, observe(big))
    assert p.delete == [("StatefulSet", G(3)), ("StatefulSet", G(2)), ("StatefulSet", G(1)),
                        ("Service", G(3)), ("Service", G(2)), ("Service", G(1))]  # fmt: skip
    assert not p.apply and not p.delete_pods


def test_rollout_updates_one_group_at_a_time_and_replaces_its_pods_together():
    old = serving({"replicas": 3, "parallelism": {"nodesPerReplica": 2}})
    new = serving({"replicas": 3, "parallelism": {"nodesPerReplica": 2}, "engine": {"image": "vllm/vllm-openai:v0.33.1"}})
    p = plan(new, observe(old))
    assert p.rolling == [0]
    assert sorted(p.delete_pods) == [f"{G(0)}-0", f"{G(0)}-1"]
    assert [o["metadata"]["name"] for o in p.apply if o["kind"] == "StatefulSet"] == [G(0)]


def test_rollout_budget_allows_max_unavailable_groups():
    old = serving({"replicas": 4})
    new = serving({"replicas": 4, "rollout": {"maxUnavailable": 2}, "engine": {"image": "x:1"}})
    assert plan(new, observe(old)).rolling == [0, 1]


def test_unready_outdated_group_is_updated_even_when_the_budget_is_used():
    old = serving({"replicas": 2})
    new = serving({"replicas": 2, "engine": {"image": "x:1"}})
    observed = observe(old, ready=False)  # both groups already down: replacing them costs nothing
    assert plan(new, observed).rolling == [0, 1]


def test_half_updated_group_is_finished_by_replacing_stale_pods():
    obj = serving({"replicas": 1, "parallelism": {"nodesPerReplica": 2}})
    # The StatefulSet already has the new template, one pod still runs the old one (operator died mid-way).
    observed = observe(obj, pod_hash={f"{G(0)}-1": "old"})
    p = plan(obj, observed)
    assert p.delete_pods == [f"{G(0)}-1"] and not p.rolling


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
    observed = observe(on)
    p = plan(off, observed)
    assert p.rolling == [0]
    assert p.delete_first == [("ComputeDomain", compute_domain_name("flash", 0))], "group 0's, before its new template"
    assert not [d for d in p.delete if d[0] == "ComputeDomain"], "group 1 keeps its domain until its turn"
    assert not [o for o in p.apply if o["kind"] == "ComputeDomain"]


def test_scale_down_deletes_the_compute_domains_of_removed_groups():
    from flashserve.render.naming import compute_domain_name

    spec = {"parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {"enabled": True}}}
    p = plan(serving({**spec, "replicas": 1}), observe(serving({**spec, "replicas": 3})))
    assert [d for d in p.delete if d[0] == "ComputeDomain"] == [("ComputeDomain", compute_domain_name("flash", 2)),
                                                               ("ComputeDomain", compute_domain_name("flash", 1))]  # fmt: skip


def test_network_policy_is_applied_by_default_and_deleted_when_turned_off():
    on = serving({})
    router = router_name("flash")
    assert [o["metadata"]["name"] for o in plan(on, Observed()).apply if o["kind"] == "NetworkPolicy"] == ["flash", router]
    off = serving({"networkPolicy": {"enabled": False}})
    p = plan(off, observe(on))
    assert sorted(p.delete) == [("NetworkPolicy", "flash"), ("NetworkPolicy", router)] and not p.apply
