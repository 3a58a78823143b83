"""The operator and the benchmark hand the policy the same thing: the same capacity prior for a replica shape
and SLA, and the same replica counts for the same groups. Each side calls the autoscaling package's one
function; these tests fail when either side computes its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
from flashserve.api.validation import parse_serving
from flashserve.autoscaling.capacity import prior_users_per_replica
from flashserve.autoscaling.replicas import ReplicaCounts
from flashserve.controller.autoscale import Autoscaler
from flashserve.controller.autoscale import replica_counts as operator_counts
from flashserve.controller.observe import Observed, PodView, slim
from flashserve.facts.layout import layout
from flashserve_testbed.bench.fleet import READY, STARTING, Group
from flashserve_testbed.bench.policies import FlashServe
from flashserve_testbed.bench.policies import replica_counts as bench_counts

from tests.builders import bench_context as context

SHAPES = {
    "GB200, 4 GPUs": {"placement": {"accelerator": "GB200"}},
    "B200, 8 GPUs": {"placement": {"accelerator": "B200"}},
    "GB200, 2 nodes": {"placement": {"accelerator": "GB200", "nvlinkDomain": {"enabled": True}},
                       "parallelism": {"tensorParallelSize": 1, "dataParallelSizeLocal": 4, "nodesPerReplica": 2}},
}  # fmt: skip
SLAS = (60.0, 100.0, 120.0, 150.0, 200.0)


def serving(spec: dict, sla: float = 100.0, replicas: int = 2):
    auto = {"enabled": True, "minReplicas": 1, "maxReplicas": 8, "sla": {"perUserTokensPerSecond": sla}}
    return parse_serving({
        "apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
        "metadata": {"name": "flash", "namespace": "team-a", "uid": "u", "generation": 1},
        "spec": {"replicas": replicas, "autoscaling": auto, **spec},
    })  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("sla", SLAS)
def test_operator_and_benchmark_get_the_same_prior(shape, sla, calib):
    obj = serving(SHAPES[shape], sla)
    gpus = layout(obj.spec).gpus_per_replica
    operator = Autoscaler().config(obj)
    bench = FlashServe(replace(calib, gpus_per_replica=gpus), startup_s=300.0).config(context(calib, sla))
    assert operator.prior_capacity == bench.prior_capacity == prior_users_per_replica(gpus, sla)
    assert operator.prior() == bench.prior()


def test_the_shapes_cover_more_than_one_gpu_count():
    assert len({layout(serving(s).spec).gpus_per_replica for s in SHAPES.values()}) > 1


def observed(states: list[str]) -> Observed:
    """One single-pod StatefulSet per group, its pod ready, running but not ready, or unplaceable."""
    obs = Observed()
    for i, state in enumerate(states):
        name = f"flash-g{i}"
        obs.statefulsets[name] = slim({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
            "name": name, "labels": {"flashserve.io/group": str(i)}, "annotations": {}}, "spec": {"replicas": 1}})  # fmt: skip
        phase = "Pending" if state == "unschedulable" else "Running"
        obs.pods.append(PodView(f"{name}-0", i, "", state == "ready", False, phase, state == "unschedulable", 0, "n"))
    return obs


def fleet(states: list[str]) -> list[Group]:
    groups = []
    for i, state in enumerate(states):
        g = Group(i, i, ordered=0.0, startup=60.0)
        g.state = READY if state == "ready" else STARTING
        groups.append(g)
    return groups


@pytest.mark.parametrize("states", [["ready", "ready"], ["ready", "starting", "starting"], ["starting"],
                                    ["ready", "starting", "ready", "ready"]])  # fmt: skip
def test_operator_and_benchmark_count_the_same_groups_alike(states, calib):
    obj = serving(SHAPES["GB200, 4 GPUs"], replicas=len(states))
    op = operator_counts(obj, observed(states))
    bench = bench_counts(context(calib, 100.0, fleet(states)))
    assert op == bench == ReplicaCounts(desired=len(states), ready=states.count("ready"),
                                        starting=states.count("starting"))  # fmt: skip


def test_operator_counts_unplaced_and_missing_groups_as_pending():
    obj = serving(SHAPES["GB200, 4 GPUs"], replicas=4)
    counts = operator_counts(obj, observed(["ready", "starting", "unschedulable"]))
    assert counts == ReplicaCounts(desired=4, ready=1, starting=1, pending=2)
