"""Session fixtures for the e2e suite.

Which cluster: if KUBECONFIG points at a reachable cluster that is not the local one (kind, a dev cluster),
the suite runs there and skips what needs the simulated GPU pools. Otherwise the local cluster (upstream
control plane + KWOK node pools + Prometheus) is brought up once, reusing a healthy one, and torn down at the
end only if this session created it and FLASHSERVE_KEEP_CLUSTER is unset.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from flashserve_testbed.localcluster import (
    ClusterInfo,
    Layout,
    ToolchainMissing,
    down,
    ensure_up,
    load_info,
    toolchain_bin,
)
from flashserve_testbed.localcluster.controlplane import ControlPlane

from e2e.support import wait_established

REPO = Path(__file__).resolve().parents[1]
E2E = Path(__file__).resolve().parent
CRD_FILE = REPO / "crds" / "flashserve.io_deepseekservings.yaml"
CRD_NAME = "deepseekservings.flashserve.io"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class E2ECluster:
    kubeconfig: Path
    kubectl_bin: str
    local: bool  # the local KWOK cluster, with its GPU node pools
    info: ClusterInfo | None  # set when local

    @property
    def prometheus_url(self) -> str | None:
        return self.info.prometheus_url if self.info else None

    def require_pools(self) -> ClusterInfo:
        if not self.local or self.info is None:
            pytest.skip("needs the local cluster's simulated GPU node pools; KUBECONFIG points at another cluster "
                        "(fake GPU capacity is not added to foreign clusters)")
        return self.info


def _kubectl_path() -> str:
    try:
        return str(toolchain_bin() / "kubectl")
    except ToolchainMissing:
        return shutil.which("kubectl") or "kubectl"


def _reachable(kubeconfig: str, kubectl: str) -> bool:
    try:
        proc = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz", "--request-timeout=10s"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _is_ours(kubeconfig: str, layout: Layout) -> bool:
    if Path(kubeconfig).expanduser().resolve() == layout.kubeconfig.resolve():
        return True
    info = load_info(layout)
    if info is None:
        return False
    try:
        text = Path(kubeconfig).expanduser().read_text()
    except OSError:
        return False
    return info.server in text


@pytest.fixture(scope="session")
def cluster() -> E2ECluster:
    layout = Layout()
    external = os.environ.get("KUBECONFIG", "")
    if external and os.pathsep not in external and not _is_ours(external, layout):
        kubectl = shutil.which("kubectl") or _kubectl_path()
        if _reachable(external, kubectl):
            yield E2ECluster(Path(external), kubectl, local=False, info=None)
            return
        print(f"\nKUBECONFIG={external} is not reachable; using the local cluster instead")

    try:
        bin_dir = toolchain_bin()
    except ToolchainMissing as e:
        pytest.skip(f"no cluster: KUBECONFIG is unset and the local cluster cannot start ({e})")
    was_healthy = ControlPlane(layout, bin_dir).healthy()
    # The suite's baseline is KWOK's own pod readiness: a cluster a demo or benchmark left in external mode
    # (pods wait for a runtime) would leave every test that runs no runtime waiting for Ready.
    info = ensure_up(pod_readiness="kwok")
    yield E2ECluster(info.kubeconfig, str(info.kubectl), local=True, info=info)
    if not was_healthy and not os.environ.get("FLASHSERVE_KEEP_CLUSTER"):
        left = down()
        assert not left, f"processes left after cluster down: {left}"


@pytest.fixture(scope="module")
def external_cluster(cluster: E2ECluster) -> ClusterInfo:
    """The local cluster with serving pods left Not Ready until a runtime starts their engines (the mock
    runtime's mode); the previous mode is put back after the module."""
    info = cluster.require_pools()
    previous = info.pod_readiness
    if previous != "external":
        info = ensure_up(pod_readiness="external", quiet=True)
    yield info
    if previous != "external":
        ensure_up(pod_readiness=previous, quiet=True)


@pytest.fixture(scope="session")
def kube(cluster: E2ECluster):
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


KubectlRun = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def kubectl(cluster: E2ECluster) -> KubectlRun:
    """kubectl(*args, input=None, check=True, timeout=120) -> CompletedProcess, against the suite's cluster."""

    def run(*args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [cluster.kubectl_bin, "--kubeconfig", str(cluster.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[3:])} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    return run


@pytest.fixture
def namespace(request, kube, kubectl: KubectlRun) -> str:
    """A fresh namespace per test (its default ServiceAccount exists, so pods are admitted), deleted after."""
    from flashserve_testbed.localcluster.kube import wait_default_service_account
    from kubernetes import client

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"flashserve.io/e2e": "true"}}})
    wait_default_service_account(kube, name)
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def crd_installed(kubectl: KubectlRun) -> str:
    """The generated DeepSeekServing CRD, applied and Established."""
    if not CRD_FILE.exists():
        pytest.skip(f"{CRD_FILE.relative_to(REPO)} does not exist yet")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    wait_established(kubectl, CRD_NAME)
    # Discovery of the new resource lags Established by a moment; kubectl apply of a CR needs it.
    deadline = time.monotonic() + 30
    while kubectl("get", "deepseekservings", "-A", check=False).returncode != 0:
        assert time.monotonic() < deadline, "DeepSeekServing resource not served after 30s"
        time.sleep(0.5)
    return CRD_NAME


@pytest.fixture(scope="session")
def router_url(kube) -> Callable[..., str]:
    """router_url(namespace, serving, timeout=60) -> http://<pod IP>:<port> of a Ready router pod of the serving.
    Loopback pod IPs have no Service endpoints (the API server refuses them), so clients go to a router pod."""
    from flashserve_testbed.runtime.routerpods import wait_router_url
    from kubernetes import client

    core = client.CoreV1Api(kube)

    def find(namespace: str, serving: str, timeout: float = 60) -> str:
        def pods(selector: str) -> list[dict]:
            return [kube.sanitize_for_serialization(p)
                    for p in core.list_namespaced_pod(namespace, label_selector=selector).items]

        return wait_router_url(pods, serving, timeout)

    return find
