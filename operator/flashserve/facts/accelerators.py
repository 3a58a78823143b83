"""The Blackwell accelerators FlashServe places on, and what each implies for a node and a group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

@dataclass(frozen=True)
class Accelerator:
    name: str
    gpus_per_node: int
    product_labels: tuple[str, ...]  # values of nvidia.com/gpu.product written by GPU Feature Discovery
    multi_node_nvlink: bool  # NVL72 racks: one NVLink domain (clique) spans many nodes
    nodes_per_nvlink_domain: int  # nodes in one clique (1 where NVLink stops at the node)
    gpu_memory_gib: int


ACCELERATORS: dict[str, Accelerator] = {
    "GB200": Accelerator("GB200", 4, ("NVIDIA-GB200",), True, 18, 186),
    "GB300": Accelerator("GB300", 4, ("NVIDIA-GB300",), True, 18, 279),
    "B200": Accelerator("B200", 8, ("NVIDIA-B200",), False, 1, 180),
    "B300": Accelerator("B300", 8, ("NVIDIA-B300", "NVIDIA-B300-SXM6-AC"), False, 1, 270),
}
# The API's enum of accelerators is these names; the CRD's CEL rules are generated from the table too.
AcceleratorName = Literal[tuple(ACCELERATORS)]  # type: ignore[valid-type]

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
CLIQUE_LABEL = "nvidia.com/gpu.clique"


def accelerator(name: str) -> Accelerator:
    return ACCELERATORS[name]
