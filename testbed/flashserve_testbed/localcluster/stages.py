"""KWOK stages of the local cluster: which pod lifecycle each kind of pod goes through."""

from __future__ import annotations

from copy import deepcopy
from importlib import resources
from typing import Any

import yaml

from .pools import MANAGED_BY, MANAGED_LABEL

READINESS_MODES = ("kwok", "external")
SERVING_LABEL = "flashserve.io/serving"
STARTUP_ANNOTATION = "flashserve.io/startup-delay"
MODE_ANNOTATION = "flashserve.io/pod-readiness"


def build(pod_readiness: str = "kwok", pod_startup_seconds: float = 5.0) -> list[dict[str, Any]]:
    if pod_readiness not in READINESS_MODES:
        raise ValueError(f"pod readiness {pod_readiness!r}: expected one of {', '.join(READINESS_MODES)}")
    if pod_startup_seconds < 0:
        raise ValueError("pod start-up seconds must be >= 0")
    doc = yaml.safe_load(resources.files(__package__).joinpath("stages.yaml").read_text())
    out = []
    for stage in deepcopy(doc["stages"]):
        meta = stage["metadata"]
        mode = (meta.get("annotations") or {}).get(MODE_ANNOTATION)
        if mode and mode != pod_readiness:
            continue
        meta.setdefault("labels", {})[MANAGED_LABEL] = MANAGED_BY
        if meta["name"] == "flashserve-serving-ready":
            stage["spec"]["delay"]["durationMilliseconds"] = int(pod_startup_seconds * 1000)
        out.append(stage)
    return out
