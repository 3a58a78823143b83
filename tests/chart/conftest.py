"""Fixtures for the Helm chart tests: the pinned helm binary and a renderer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "flashserve"
RELEASE, NAMESPACE = "flashserve", "flashserve-system"
KUBE_VERSION = "1.35.0"

# The main value combinations, each with a golden rendering in tests/chart/golden/<name>.yaml.
COMBOS: dict[str, list[str]] = {
    "defaults": [],
    "watch-namespaces": ["--set", "watchNamespaces={team-a,team-b}"],
    "monitoring": ["--set", "monitoring.enabled=true",
                   "--set", "operator.prometheusUrl=http://prometheus-operated.monitoring.svc:9090"],
    "metrics-auth": ["--set", "metrics.auth=token", "--set", "monitoring.enabled=true"],
    "metrics-tls": ["--set", "metrics.auth=token", "--set", "monitoring.enabled=true",
                    "--set", "metrics.tls.secretName=flashserve-metrics-tls"],
}  # fmt: skip


def _helm_path() -> str | None:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    try:
        from flashserve_testbed.localcluster import ToolchainMissing, toolchain_bin

        try:
            return str(toolchain_bin() / "helm")
        except ToolchainMissing:
            pass
    except ImportError:
        pass
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm() -> str:
    path = _helm_path()
    if not path or not Path(path).exists():
        pytest.skip("helm not found: run `make deps` (builds the pinned toolchain with helm) or set HELM")
    return path


class Rendered:
    def __init__(self, text: str):
        self.text = text
        self.docs = [d for d in yaml.safe_load_all(text) if d]

    def find(self, kind: str, name: str | None = None, namespace: str | None = None) -> dict:
        hits = self.all(kind, name, namespace)
        assert len(hits) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, got {len(hits)}"
        return hits[0]

    def all(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
        return [
            d for d in self.docs
            if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)
            and (namespace is None or d["metadata"].get("namespace") == namespace)
        ]  # fmt: skip


@pytest.fixture(scope="session")
def render(helm):
    cache: dict[tuple, Rendered] = {}

    def run(*args: str, check: bool = True, release: str = RELEASE) -> Rendered | subprocess.CompletedProcess:
        cmd = [helm, "template", release, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args]
        if not check:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        args = (release, *args)
        if args not in cache:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, f"helm template {' '.join(args)} failed:\n{proc.stderr}"
            cache[args] = Rendered(proc.stdout)
        return cache[args]

    return run
