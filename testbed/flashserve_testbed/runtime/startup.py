"""Which start-up phases an engine pod pays: the caches its serving's spec.startup gives it (read from the pod's
volumes and environment as the operator renders them) and what earlier start-ups, prefetch and pre-pull pods
left on its nodes. The model itself is flashserve_testbed/startup_model.py; docs/startup.md says what each cache
buys in it.

Pure functions and a tracker; the runtime (runtime.py) does the API reads and the timing.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from flashserve.render.startup import KERNEL_VOLUME, OWNER_LABEL, PREFETCH_COMPONENT, PREPULL_COMPONENT, WEIGHTS_VOLUME
from flashserve.render.vllm_args import KERNEL_CACHE_MOUNT

from flashserve_testbed.startup_model import (
    PHASES,
    WEIGHTS_HUB,
    WEIGHTS_NODE,
    WEIGHTS_SHARED,
    Caches,
    CacheState,
    Figures,
    phase_seconds,
)

ENV_PHASES = "FLASHSERVE_MOCK_STARTUP_PHASES"  # the engine's start-up by phase, JSON (engine/replica.py: ENV_PHASES)
COMPONENT_LABEL = "app.kubernetes.io/component"
GROUP_NAME_LABEL = "flashserve.io/group-name"
MODEL_CACHES, MODEL_COLD = "caches", "cold"
STARTUP_MODELS = (MODEL_CACHES, MODEL_COLD)


@dataclass(frozen=True)
class PodCaches:
    """The caches an engine pod mounts, as the operator renders spec.startup into it."""

    namespace: str
    weights_claim: str | None = None  # the hf-cache volume's claim; None: the pod's own empty cache (the hub)
    kernel_claim: str | None = None  # the kernel-cache volume's claim
    kernel_dir: str = ""  # this image and layout's directory in the kernel cache
    image: str = ""

    @property
    def weights_key(self) -> str | None:
        return f"{self.namespace}/{self.weights_claim}" if self.weights_claim else None

    @property
    def kernel_key(self) -> str | None:
        """The claim and this image's layout: another layout or image on the same claim compiles again."""
        return f"{self.namespace}/{self.kernel_claim}/{self.kernel_dir}" if self.kernel_claim else None


def claim_of(pod: dict, volume: str) -> str | None:
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if v.get("name") == volume:
            return (v.get("persistentVolumeClaim") or {}).get("claimName") or None
    return None


def pod_caches(pod: dict, container: dict, env: dict[str, str]) -> PodCaches:
    """From the engine pod: its hf-cache and kernel-cache claims, and the kernel directory the operator points
    VLLM_CACHE_ROOT into (<mount>/<accelerator>-tp..-<image digest>/vllm)."""
    meta = pod.get("metadata") or {}
    kernel_claim = claim_of(pod, KERNEL_VOLUME)
    kernel_dir = ""
    if kernel_claim:
        root = env.get("VLLM_CACHE_ROOT", "")
        prefix = KERNEL_CACHE_MOUNT.rstrip("/") + "/"
        if root.startswith(prefix):
            kernel_dir = root[len(prefix):].split("/", 1)[0]
        else:
            # not the operator's layout: the image and the command line stand for the layout
            kernel_dir = f"{container.get('image', '')}|{' '.join(map(str, container.get('args') or []))}"
    return PodCaches(namespace=meta.get("namespace", "default"), weights_claim=claim_of(pod, WEIGHTS_VOLUME),
                     kernel_claim=kernel_claim, kernel_dir=kernel_dir, image=str(container.get("image", "")))


def claim_scope(pvc: dict | None) -> str:
    """How a cache claim is shared: a ReadWriteMany (or ReadOnlyMany) claim is one copy for every node
    (spec.startup.weightsCache Shared); anything else, a `local` PersistentVolume above all, is a copy per node
    (NodeLocal). An unreadable claim counts as NodeLocal, the weights cache's default scope."""
    modes = set(((pvc or {}).get("spec") or {}).get("accessModes") or [])
    return WEIGHTS_SHARED if modes & {"ReadWriteMany", "ReadOnlyMany"} else WEIGHTS_NODE


def startup_pod_role(pod: dict) -> str | None:
    """PREFETCH_COMPONENT or PREPULL_COMPONENT for the operator's start-up pods (flashserve.io/startup-of)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not labels.get(OWNER_LABEL):
        return None
    role = labels.get(COMPONENT_LABEL)
    return role if role in (PREFETCH_COMPONENT, PREPULL_COMPONENT) else None


def prefetch_node(pod: dict) -> str | None:
    """The node a prefetch pod fills (its DaemonSet's pod), or None for the shared claim's Job."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if any(o.get("kind") == "Job" for o in owners):
        return None
    return (pod.get("spec") or {}).get("nodeName")


@dataclass(frozen=True)
class StartupPlan:
    """The phases (engine seconds) one engine start pays, and why."""

    cache_state: str  # cold | weights-cached | warm
    phases: dict[str, float]
    state: CacheState
    nodes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())

    @property
    def paid(self) -> list[str]:
        return [p for p in PHASES if self.phases.get(p, 0.0) > 0]

    def env_value(self) -> str:
        return json.dumps({"cacheState": self.cache_state, "phases": {p: round(self.phases[p], 3) for p in PHASES}},
                          separators=(",", ":"))

    def as_dict(self) -> dict:
        return {"model": MODEL_CACHES, "cacheState": self.cache_state, "seconds": round(self.seconds, 3),
                "phases": {p: round(self.phases[p], 3) for p in PHASES}, "paid": self.paid,
                "weights": self.state.weights, "weightsFilled": self.state.weights_filled,
                "kernelsWarm": self.state.kernels_warm, "imagePresent": self.state.image_present,
                "nodes": list(self.nodes)}


def plan(state: CacheState, figures: Figures, rng: random.Random | None = None, sigma: float = 0.0,
         nodes: tuple[str, ...] = ()) -> StartupPlan:  # fmt: skip
    return StartupPlan(state.label, phase_seconds(state, figures, rng, sigma), state, nodes)


@dataclass
class ClusterCaches:
    """What the cluster's caches hold, as start-ups, prefetch and pre-pull pods fill them: per weights claim
    (a NodeLocal claim per node, a Shared one once), kernel directories per claim and layout, and images per
    node. The runtime keeps one; it starts empty (a fresh local cluster's disks are empty)."""

    weights: dict[str, Caches] = field(default_factory=dict)  # by namespace/claim
    kernels: Caches = field(default_factory=lambda: Caches(kernel_cache=True))
    images: dict[str, set[str]] = field(default_factory=dict)  # image -> nodes holding it

    def _claim(self, key: str, scope: str) -> Caches:
        caches = self.weights.setdefault(key, Caches(weights=scope))
        caches.weights = scope
        return caches

    @staticmethod
    def _kernel_keys(pc: PodCaches, kernel_scope: str, nodes: list[str]) -> list[str]:
        """A kernel claim on ReadWriteMany storage is one cache for every node; on a node's own volume, each
        node has its own copy of the layout's directory."""
        if pc.kernel_key is None:
            return []
        if kernel_scope == WEIGHTS_NODE:
            return [f"{pc.kernel_key}@{n}" for n in nodes]
        return [pc.kernel_key]

    def state(self, pc: PodCaches, scope: str, nodes: list[str], kernel_scope: str = WEIGHTS_SHARED) -> CacheState:
        """What a group of `pc` pods on `nodes` finds; `scope` and `kernel_scope` are its weights and kernel
        claims' (claim_scope)."""
        if pc.weights_key is None:
            weights, filled = WEIGHTS_HUB, False
        else:
            w = self._claim(pc.weights_key, scope).state(nodes, "")
            weights, filled = w.weights, w.weights_filled
        keys = self._kernel_keys(pc, kernel_scope, nodes)
        kernels = bool(keys) and all(self.kernels.state(nodes, k).kernels_warm for k in keys)
        on = self.images.get(pc.image, set())
        image = bool(nodes) and all(n in on for n in nodes)
        return CacheState(weights, filled, kernels, image)

    def started(self, pc: PodCaches, scope: str, nodes: list[str], kernel_scope: str = WEIGHTS_SHARED) -> None:
        """Pods of `pc` became ready on `nodes`: the weights they read stay on the nodes (or the claim), their
        kernels in the kernel cache, and the image on the nodes."""
        if pc.weights_key is not None:
            self._claim(pc.weights_key, scope).started(nodes, "")
        for key in self._kernel_keys(pc, kernel_scope, nodes):
            self.kernels.started(nodes, key)
        self.images.setdefault(pc.image, set()).update(nodes)

    def prefetched(self, namespace: str, claim: str, node: str | None) -> None:
        """A prefetch finished: the claim's copy on `node` (NodeLocal's DaemonSet) or the claim itself (Shared's
        Job, node None)."""
        scope = WEIGHTS_SHARED if node is None else WEIGHTS_NODE
        key = f"{namespace}/{claim}"
        caches = self.weights.get(key) or self._claim(key, scope)
        caches.prefetched(node)

    def pulled(self, image: str, node: str) -> None:
        self.images.setdefault(image, set()).add(node)

    def as_dict(self) -> dict:
        return {"weights": {k: {"scope": c.weights, "nodes": sorted(c.nodes_with_weights), "filled": c.shared_filled}
                            for k, c in sorted(self.weights.items())},
                "kernels": sorted(self.kernels.warm_kernels),
                "images": {k: sorted(v) for k, v in sorted(self.images.items())}}
