"""Where engine pods go: the accelerator's node pool, GPU-node taints, and one NVLink domain per group."""

from __future__ import annotations

from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.facts.accelerators import PRODUCT_LABEL, accelerator
from flashserve.facts.layout import Layout


def node_affinity(spec: DeepSeekServingSpec) -> dict:
    acc = accelerator(spec.placement.accelerator)
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": list(acc.product_labels)}]}
            ]
        }
    }


def group_pod_affinity(spec: DeepSeekServingSpec, lay: Layout, group_selector: dict[str, str]) -> dict | None:
    """Every pod of a multi-node group on nodes with the same NVLink clique value.

    Required pod affinity on the clique key is how the scheduler co-locates a gang without a gang scheduler:
    the first pod picks a clique, the rest must follow it (and stay Pending if that clique is full).
    """
    if not (lay.multi_node and spec.placement.nvlink_domain.enabled):
        return None
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": dict(group_selector)},
                "topologyKey": spec.placement.nvlink_domain.topology_key,
            }
        ]
    }


def group_pod_anti_affinity(lay: Layout, group_selector: dict[str, str]) -> dict:
    """One pod of a group per node: each pod takes a whole node's GPUs, and spreading also keeps two pods
    of a group from landing on one node should GPU accounting be missing (e.g. a cluster without the device
    plugin)."""
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": dict(group_selector)},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }


def tolerations(spec: DeepSeekServingSpec) -> list[dict]:
    return [t.dump() for t in spec.placement.tolerations]


def node_selector(spec: DeepSeekServingSpec) -> dict[str, str]:
    return dict(spec.placement.node_selector)
