"""SLA autoscaling: the pure policy (policy.py, its steps in steps.py), its capacity learner and prior
(capacity.py), the replica counting (replicas.py), the PromQL it reads (promql.py) and the Prometheus reader
(metrics.py). docs/autoscaling.md explains the whole."""

from flashserve.autoscaling.policy import (
    ACTIVE,
    ADVISORY,
    ConditionHint,
    Decision,
    PolicyConfig,
    PolicyInputs,
    PolicyState,
    decide,
)
from flashserve.autoscaling.replicas import (
    GroupReadiness,
    ReplicaCounts,
    count_replicas,
)
from flashserve.autoscaling.snapshot import MetricsSnapshot

__all__ = [
    "ACTIVE",
    "ADVISORY",
    "ConditionHint",
    "Decision",
    "GroupReadiness",
    "MetricsSnapshot",
    "PolicyConfig",
    "PolicyInputs",
    "PolicyState",
    "ReplicaCounts",
    "count_replicas",
    "decide",
]
