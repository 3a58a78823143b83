"""Node pools of the local cluster: read from a YAML file, sized by overrides, turned into KWOK Node objects."""

from __future__ import annotations

import os
import uuid
from copy import deepcopy
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import loopback

MANAGED_BY = "flashserve-localcluster"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
POOL_LABEL = "flashserve.io/pool"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# GPU Feature Discovery writes clique ids as <NVLink domain UUID>.<clique id>; 32766 is what an
# unpartitioned NVL72 rack reports.
CLIQUE_ID = 32766
KUBELET_VERSION = "v1.35.4"
SIZE_FIELDS = ("racks", "nodesPerRack", "nodes")


@dataclass(frozen=True)
class PoolSpec:
    name: str
    fields: dict[str, Any]

    @property
    def racks(self) -> int:
        return int(self.fields.get("racks", 0))

    @property
    def node_count(self) -> int:
        if self.racks:
            return self.racks * int(self.fields.get("nodesPerRack", 0))
        return int(self.fields.get("nodes", 0))


def load(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    path = path or os.environ.get("FLASHSERVE_CLUSTER_POOLS_FILE")
    if path:
        text = Path(path).read_text()
    else:
        text = resources.files(__package__).joinpath("nodepools.yaml").read_text()
    doc = yaml.safe_load(text) or {}
    if not isinstance(doc.get("pools"), dict):
        raise ValueError(f"{path or 'nodepools.yaml'}: expected a mapping under 'pools'")
    return doc


def parse_overrides(items: list[str]) -> list[tuple[str, str, Any]]:
    """`gb200.racks=4` -> ("gb200", "racks", 4). Comma-separated lists are accepted too."""
    out = []
    for item in (part.strip() for entry in items for part in entry.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        pool, dot, field = key.strip().partition(".")
        if not sep or not dot or not pool or not field:
            raise ValueError(f"pool override {item!r}: expected POOL.FIELD=VALUE, e.g. gb200.racks=4")
        parsed: Any = yaml.safe_load(value.strip())
        if field in SIZE_FIELDS and (not isinstance(parsed, int) or parsed < 0):
            raise ValueError(f"pool override {item!r}: {field} must be a non-negative integer")
        out.append((pool, field, parsed))
    return out


def resolve(overrides: list[str] | None = None, path: str | None = None) -> tuple[list[PoolSpec], dict[str, Any]]:
    """Pools in file order with overrides applied: env FLASHSERVE_CLUSTER_POOLS first, then `overrides`."""
    doc = load(path)
    pools = deepcopy(doc["pools"])
    env = os.environ.get("FLASHSERVE_CLUSTER_POOLS", "")
    for pool, field, value in parse_overrides([env, *(overrides or [])]):
        if pool not in pools:
            raise ValueError(f"pool override for unknown pool {pool!r} (known: {', '.join(pools)})")
        pools[pool][field] = value
    return [PoolSpec(name, dict(fields or {})) for name, fields in pools.items()], dict(doc.get("reserved") or {})


def _minus(quantity: str, reserved: str | None) -> str:
    """Allocatable = capacity - reserved, for the plain units used in the pools file (cores, m, Gi, Ti)."""
    if not reserved:
        return str(quantity)
    cap, res = _to_base(str(quantity)), _to_base(str(reserved))
    if cap[1] != res[1]:
        raise ValueError(f"cannot subtract {reserved} from {quantity}")
    value, unit = cap[0] - res[0], cap[1]
    if unit == "m":
        return f"{value}m"
    return f"{value // 1024**2}Mi" if unit == "bytes" else str(value)


def _to_base(q: str) -> tuple[int, str]:
    for suffix, mult in (("Ki", 1024), ("Mi", 1024**2), ("Gi", 1024**3), ("Ti", 1024**4)):
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * mult, "bytes"
    if q.endswith("m"):
        return int(q[:-1]), "m"
    return int(q) * 1000, "m"


def clique_id(pool: str, rack: int) -> str:
    # Stable across runs so a recreated cluster keeps the same label values.
    domain = uuid.uuid5(uuid.NAMESPACE_URL, f"https://flashserve.io/localcluster/{pool}/rack/{rack}")
    return f"{domain}.{CLIQUE_ID}"


def node_names(pool: PoolSpec) -> list[tuple[str, int | None]]:
    """(node name, rack) for every node of the pool."""
    if pool.racks:
        per = int(pool.fields.get("nodesPerRack", 0))
        width = max(2, len(str(per - 1)))
        return [(f"{pool.name}-r{r}-n{n:0{width}d}", r) for r in range(pool.racks) for n in range(per)]
    return [(f"{pool.name}-{n}", None) for n in range(pool.node_count)]


def build_nodes(pools: list[PoolSpec], reserved: dict[str, Any], slot: int = 0) -> list[dict[str, Any]]:
    """Node objects of every pool; `slot` places the cluster's addresses in 127.0.0.0/8 (loopback.py)."""
    nodes = []
    for p_index, pool in enumerate(pools):
        for n_index, (name, rack) in enumerate(node_names(pool)):
            nodes.append(_node(pool, name, rack, p_index, n_index, reserved, slot))
    return nodes


def _node(pool: PoolSpec, name: str, rack: int | None, p_index: int, n_index: int, reserved: dict,
          slot: int) -> dict:
    f = pool.fields
    arch = f.get("arch", "amd64")
    labels = {
        MANAGED_LABEL: MANAGED_BY,
        POOL_LABEL: pool.name,
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "node.kubernetes.io/instance-type": str(f.get("instanceType", pool.name)),
    }
    capacity = {
        "cpu": str(f.get("cpu", "8")),
        "memory": str(f.get("memory", "32Gi")),
        "ephemeral-storage": str(f.get("ephemeralStorage", "100Gi")),
        "pods": str(f.get("pods", "110")),
    }
    allocatable = dict(capacity)
    allocatable["cpu"] = _minus(capacity["cpu"], reserved.get("cpu"))
    allocatable["memory"] = _minus(capacity["memory"], reserved.get("memory"))
    gpus = int(f.get("gpus", 0))
    if gpus:
        labels.update({
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": str(f["gpuProduct"]),
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": str(f.get("gpuMemoryMiB", 0)),
            "nvidia.com/gpu.family": str(f.get("gpuFamily", "blackwell")),
        })
        capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(gpus)
    if rack is not None:
        labels[CLIQUE_LABEL] = clique_id(pool.name, rack)
        labels["flashserve.io/rack"] = f"{pool.name}-r{rack}"
    labels.update({str(k): str(v) for k, v in (f.get("labels") or {}).items()})
    # Fixed per pool and node index, so resizing a pool never changes an existing node's (immutable) podCIDR.
    # Loopback, so pods' and nodes' addresses are ones local processes can listen on and discoverers can reach.
    pod_cidr = loopback.pod_cidr(slot, p_index, n_index, pool.name)
    internal_ip = loopback.node_ip(slot, p_index, n_index, pool.name)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [dict(t) for t in (f.get("taints") or [])],
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": arch,
                "operatingSystem": "linux",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.8.0-kwok",
                "osImage": "Ubuntu 24.04 LTS (simulated by KWOK)",
                "machineID": "",
                "bootID": "",
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.localcluster.flashserve.io")),
            },
        },
    }


def summary(pools: list[PoolSpec]) -> str:
    parts = []
    for p in pools:
        gpus = int(p.fields.get("gpus", 0))
        shape = f"{p.racks}x{p.fields.get('nodesPerRack')} nodes" if p.racks else f"{p.node_count} nodes"
        parts.append(f"{p.name}: {shape}" + (f" x {gpus} GPUs" if gpus else ""))
    return ", ".join(parts)
