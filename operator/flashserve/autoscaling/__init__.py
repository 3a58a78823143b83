"""SLA autoscaling: the pure policy (policy.py), its capacity learner (capacity.py), the PromQL it reads
(promql.py) and the Prometheus reader (metrics.py). docs/autoscaling.md explains the whole."""

from flashserve.autoscaling.policy import (
    ACTIVE,
    ADVISORY,
    ConditionHint,
    Decision,
    PolicyConfig,
    PolicyInputs,
    PolicyState,
    ReplicaCounts,
    decide,
)
from flashserve.autoscaling.snapshot import MetricsSnapshot

__all__ = [
    "ACTIVE",
    "ADVISORY",
    "ConditionHint",
    "Decision",
    "MetricsSnapshot",
    "PolicyConfig",
    "PolicyInputs",
    "PolicyState",
    "ReplicaCounts",
    "decide",
]
