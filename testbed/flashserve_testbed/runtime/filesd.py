"""Prometheus file_sd target files for the runtime's engines, router pods and own metrics, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "flashserve-runtime.json"
ENGINE_JOB = "vllm"
ROUTER_POD_JOB = "vllm-router"  # router pods' metrics port
RUNTIME_JOB = "flashserve-runtime"  # the runtime's own /metrics (--status-port)


@dataclass(frozen=True)
class EngineTarget:
    address: str
    port: int
    namespace: str
    pod: str
    serving: str
    group: str
    node: str = ""
    job: str = ENGINE_JOB


def target_groups(engines: list[EngineTarget], status: str | None = None) -> list[dict]:
    """One group per engine, so each carries its own labels; sorted, so equal sets give equal files."""
    groups = []
    for e in sorted(engines, key=lambda e: (e.namespace, e.pod)):
        labels = {"job": e.job, "namespace": e.namespace, "pod": e.pod, "serving": e.serving}
        if e.group:
            labels["group"] = e.group
        if e.node:
            labels["node"] = e.node
        groups.append({"targets": [f"{e.address}:{e.port}"], "labels": labels})
    if status:
        groups.append({"targets": [status], "labels": {"job": RUNTIME_JOB}})
    return groups


def write_atomic(path: Path, text: str) -> bool:
    """Write `text` unless the file already holds it; Prometheus only ever sees a whole file. True if written."""
    path = Path(path)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def write_targets(path: Path, engines: list[EngineTarget], status: str | None = None) -> bool:
    return write_atomic(path, json.dumps(target_groups(engines, status), indent=1) + "\n")
