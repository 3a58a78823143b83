"""Quantities derived from a spec's parallelism and accelerator: how a replica group maps onto GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashserve.facts.accelerators import accelerator

if TYPE_CHECKING:  # the API's types import these facts, so the facts read the spec without importing its module
    from flashserve.api.v1alpha1 import DeepSeekServingSpec


@dataclass(frozen=True)
class Layout:
    gpus_per_node: int
    tensor_parallel: int
    dp_local: int  # data-parallel ranks on one node (one pod)
    nodes: int  # pods (= nodes) in one replica group

    @property
    def dp_size(self) -> int:
        return self.dp_local * self.nodes

    @property
    def gpus_per_pod(self) -> int:
        return self.tensor_parallel * self.dp_local

    @property
    def gpus_per_replica(self) -> int:
        return self.gpus_per_pod * self.nodes

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def start_rank(self, pod_index: int) -> int:
        return pod_index * self.dp_local


def layout(spec: DeepSeekServingSpec) -> Layout:
    gpus = accelerator(spec.placement.accelerator).gpus_per_node
    tp = spec.parallelism.tensor_parallel_size
    dpl = spec.parallelism.data_parallel_size_local or max(1, gpus // tp)
    return Layout(gpus_per_node=gpus, tensor_parallel=tp, dp_local=dpl, nodes=spec.parallelism.nodes_per_replica)
