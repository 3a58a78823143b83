"""How long a replica group takes to start, by phase and cache state: the one model the mock runtime and the
benchmark's simulator both draw from.

The figures are public measurements of DeepSeek-class replicas (docs/startup.md cites them):

* ModelExpress, DeepSeek-V4-Pro on 8xB200: weights from the hub 8 min 53 s; streamed from object storage
  3 min 16 s; from fast local storage 1 min 10 s; process start to API ready with weights P2P 7 min, and with
  weights P2P plus the kernel artefacts (Triton, DeepGEMM, FlashInfer caches) 1 min 44 s, P2P weights alone
  taking 11 s.
* So kernel compilation and autotune cost 7 min - 1 min 44 s = 5 min 16 s when their caches are cold, and
  what no cache removes (process start, expert-parallel setup, CUDA-graph capture) is 1 min 44 s - 11 s.

Phases, in the order a replica meets them: `pull` (the engine image, unless pre-pulled on the node),
`download` (weights from the model source to the node, unless a weights cache already holds them), `load`
(weights from the node's disk or the shared claim into GPU memory), `compile` (kernel JIT and autotune, unless
the kernel cache holds this image and layout), `warmup` (the rest). A group is as slow as its slowest node.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

PHASES = ("pull", "download", "load", "compile", "warmup")

# Weights sources a group's engines read from.
WEIGHTS_HUB = "hub"  # no weights cache: each pod downloads into its own cache volume
WEIGHTS_NODE = "node"  # spec.startup.weightsCache NodeLocal
WEIGHTS_SHARED = "shared"  # spec.startup.weightsCache Shared (an RWX claim)

# The cache-state label of a start-up, as the operator's histogram spells it.
COLD, WEIGHTS_CACHED, WARM = "cold", "weights-cached", "warm"


@dataclass(frozen=True)
class Figures:
    """Seconds per phase of the reference replica (see the module docstring for where each comes from)."""

    pull: float = 90.0  # an assumption, not a measurement: a ~20 GB vLLM image at ~2 Gbit/s
    download: float = 533.0
    load_node: float = 70.0
    load_shared: float = 196.0
    compile: float = 316.0
    warmup: float = 93.0

    def scaled(self, factor: float) -> Figures:
        """Every phase times `factor`: the demo profile runs the same shape in seconds instead of minutes."""
        return Figures(*(getattr(self, f) * factor for f in self.__dataclass_fields__))

    def cold_total(self) -> float:
        return self.pull + self.download + self.load_node + self.compile + self.warmup


REFERENCE = Figures()


@dataclass(frozen=True)
class CacheState:
    """What a starting group finds on its nodes."""

    weights: str = WEIGHTS_HUB
    weights_filled: bool = False  # the cache holds the model (every node of the group, for NodeLocal)
    kernels_warm: bool = False  # the kernel cache holds this image and layout
    image_present: bool = False  # the engine image is already on every node

    @property
    def label(self) -> str:
        if not (self.weights != WEIGHTS_HUB and self.weights_filled):
            return COLD
        return WARM if self.kernels_warm else WEIGHTS_CACHED


def phase_seconds(state: CacheState, figures: Figures = REFERENCE, rng: random.Random | None = None,
                  sigma: float = 0.1) -> dict[str, float]:  # fmt: skip
    """Seconds of each phase for a group in `state`; with `rng`, each non-zero phase varies lognormally by
    `sigma` (disks, networks and compilers are not clockwork)."""
    cached = state.weights != WEIGHTS_HUB and state.weights_filled
    out = {
        "pull": 0.0 if state.image_present else figures.pull,
        "download": 0.0 if cached else figures.download,
        "load": figures.load_shared if state.weights == WEIGHTS_SHARED else figures.load_node,
        "compile": 0.0 if state.kernels_warm else figures.compile,
        "warmup": figures.warmup,
    }
    if rng is not None and sigma > 0:
        out = {k: v * math.exp(rng.gauss(0.0, sigma)) if v else 0.0 for k, v in out.items()}
    return out


@dataclass
class Caches:
    """Which nodes hold the weights and which (image, layout) keys the kernel cache holds, as start-ups fill
    them. The mock runtime keeps one per cluster; the simulator one per run."""

    weights: str = WEIGHTS_HUB
    kernel_cache: bool = False  # spec.startup.kernelCache set: a finished start-up leaves its kernels behind
    prepull: bool = False
    nodes_with_weights: set[str] = field(default_factory=set)
    shared_filled: bool = False
    warm_kernels: set[str] = field(default_factory=set)
    nodes_with_image: set[str] = field(default_factory=set)

    def state(self, nodes: list[str], kernel_key: str) -> CacheState:
        if self.weights == WEIGHTS_NODE:
            filled = bool(nodes) and all(n in self.nodes_with_weights for n in nodes)
        else:
            filled = self.weights == WEIGHTS_SHARED and self.shared_filled
        image = self.prepull or (bool(nodes) and all(n in self.nodes_with_image for n in nodes))
        return CacheState(self.weights, filled, self.kernel_cache and kernel_key in self.warm_kernels, image)

    def prefetched(self, node: str | None = None) -> None:
        """The prefetch finished: on `node` (NodeLocal's DaemonSet pod) or on the shared claim (the Job)."""
        if node is None:
            self.shared_filled = True
        else:
            self.nodes_with_weights.add(node)

    def started(self, nodes: list[str], kernel_key: str) -> None:
        """A group became ready: its nodes hold the image and, where a cache backs them, the weights; the
        kernel cache holds its kernels."""
        self.nodes_with_image.update(nodes)
        if self.weights == WEIGHTS_NODE:
            self.nodes_with_weights.update(nodes)
        elif self.weights == WEIGHTS_SHARED:
            self.shared_filled = True
        if self.kernel_cache:
            self.warm_kernels.add(kernel_key)


def figures_for_cold(cold_seconds: float, figures: Figures = REFERENCE) -> Figures:
    """`figures` scaled so that a cold start (image pull, download, load from the node, compile, warm-up) takes
    `cold_seconds`: how a calibration profile's single start-up median becomes phases of the same shape."""
    if cold_seconds <= 0:
        raise ValueError(f"a cold start-up of {cold_seconds} s: it must be positive")
    return figures.scaled(cold_seconds / figures.cold_total())
