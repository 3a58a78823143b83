"""Replica counting: the one function the operator and the benchmark both reduce their groups to."""

from __future__ import annotations

from flashserve.autoscaling.replicas import GroupReadiness, ReplicaCounts, count_replicas

READY = GroupReadiness(exists=True, ready=True)
STARTING = GroupReadiness(exists=True, ready=False)
UNSCHEDULABLE = GroupReadiness(exists=True, ready=False, unschedulable=True)
MISSING = GroupReadiness(exists=False, ready=False)


def test_each_group_lands_in_its_count():
    counts = count_replicas(6, [READY, STARTING, READY, UNSCHEDULABLE, MISSING, STARTING])
    assert counts == ReplicaCounts(desired=6, ready=2, starting=2, pending=2)


def test_a_serving_group_with_an_unplaced_pod_is_ready_and_pending():
    """An old copy serves while its replacement waits for GPUs: it serves, and GPUs are short."""
    serving_but_unplaced = GroupReadiness(exists=True, ready=True, unschedulable=True)
    assert count_replicas(2, [serving_but_unplaced, READY]) == ReplicaCounts(desired=2, ready=2, starting=0, pending=1)


def test_desired_is_spec_replicas_not_the_number_of_groups_seen():
    assert count_replicas(3, iter([READY])) == ReplicaCounts(desired=3, ready=1)
