"""Replica groups as the policy counts them: serving, on their way, or stuck waiting for GPUs.

The operator (from the StatefulSets and pods it observes) and the benchmark (from its simulated fleet) both
reduce their groups to GroupReadiness and count them here, so the two cannot count differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaCounts:
    """Replica groups with an index below spec.replicas (groups being removed are not counted)."""

    desired: int
    """spec.replicas now."""
    ready: int
    """Groups whose pods are all ready (serving)."""
    starting: int = 0
    """Groups created and scheduled but not ready yet (pulling, loading weights, capturing graphs)."""
    pending: int = 0
    """Groups that cannot serve soon: a pod the scheduler cannot place (the pool is exhausted), or a group
    whose StatefulSet does not exist yet."""


@dataclass(frozen=True)
class GroupReadiness:
    """One replica group below spec.replicas, as far as the policy cares."""

    exists: bool
    """Its StatefulSet exists."""
    ready: bool
    """Every pod of it is ready on the current template."""
    unschedulable: bool = False
    """A pod of it cannot be scheduled."""


def count_replicas(desired: int, groups: Iterable[GroupReadiness]) -> ReplicaCounts:
    """Counts of the groups below spec.replicas. Each count is taken on its own: a group that serves while a
    pod of it cannot be scheduled (an old copy serving until its replacement is placed) is both ready and
    pending, since it serves now and more GPUs would not be found for another group either. A group whose
    StatefulSet does not exist yet is pending: nothing of it has been scheduled."""
    groups = list(groups)
    return ReplicaCounts(
        desired=desired,
        ready=sum(g.ready for g in groups),
        starting=sum(g.exists and not g.ready and not g.unschedulable for g in groups),
        pending=sum(g.unschedulable for g in groups) + sum(not g.exists for g in groups),
    )
