"""The upstream control plane (etcd, kube-apiserver, controller-manager, scheduler) and the kwok controller,
run as local processes by `kwokctl --runtime binary` from the toolchain's binaries."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import loopback, procs
from .paths import CLUSTER_NAME, Layout

ADMISSION_PLUGINS = "OwnerReferencesPermissionEnforcement"  # beside the API server's default ones
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")
CONTEXT = "flashserve-local"


class ControlPlaneError(RuntimeError):
    pass


@dataclass
class ComponentHealth:
    name: str
    pid: int | None
    healthy: bool
    detail: str
    rss_kib: int = 0


class ControlPlane:
    def __init__(self, layout: Layout, bin_dir: Path, loopback_slot: int | None = None):
        self.layout = layout
        self.bin = bin_dir
        self.loopback_slot = loopback_slot  # None: leave kwok's own --cidr default (teardown needs no plan)

    # -- kwokctl -------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        # The toolchain first on PATH: kwokctl looks up kubectl there and would otherwise download one.
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["KWOK_WORKDIR"] = str(self.layout.kwok_workdir)
        return env

    def kwokctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / "kwokctl"), "--name", CLUSTER_NAME, "--config", str(self.layout.kwokctl_config), *args]
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def _write_kwokctl_config(self) -> None:
        b = self.bin
        doc = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": {
                "runtime": "binary",
                "bindAddress": "127.0.0.1",  # kwokctl's default is 0.0.0.0 and it has no flag for it
                "kubeApiserverBinary": str(b / "kube-apiserver"),
                "kubeControllerManagerBinary": str(b / "kube-controller-manager"),
                "kubeSchedulerBinary": str(b / "kube-scheduler"),
                "kubectlBinary": str(b / "kubectl"),
                "etcdBinary": str(b / "etcd"),
                "kwokControllerBinary": str(b / "kwok"),
            },
            # OpenShift enables it, and it is where a missing `finalizers` grant shows: setting
            # blockOwnerDeletion on a child then needs `update` on the owner's finalizers, so the e2e tests that
            # run the operator as the chart's ServiceAccount check that grant.
            "componentsPatches": [{"name": "kube-apiserver", "extraArgs": [
                {"key": "enable-admission-plugins", "value": ADMISSION_PLUGINS}]}],
        }
        docs = [doc]
        if self.loopback_slot is not None:
            # Pods of nodes that set no podCIDR (ours all do) would otherwise get kwok's 10.0.0.0/24. kwokctl
            # copies this document into the controller's configuration as it is, without kwok's defaults, so
            # those that must not be zero are spelled out (kwok v0.8.0's zz_generated.defaults.go).
            docs.append({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                         "options": {"cidr": loopback.default_cidr(self.loopback_slot),
                                     "podPlayStageParallelism": 4, "nodePlayStageParallelism": 4,
                                     "nodeLeaseParallelism": 4, "podsOnNodeSyncParallelism": 1,
                                     "enableDebuggingHandlers": True, "enableProfilingHandler": True,
                                     "enablePodsOnNodeSyncListPager": True}})
        self.layout.kwokctl_config.parent.mkdir(parents=True, exist_ok=True)
        self.layout.kwokctl_config.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def exists(self) -> bool:
        return (self.layout.kwok_cluster / "kwok.yaml").is_file()

    def create(self) -> None:
        self._write_kwokctl_config()
        proc = self.kwokctl(
            # --kubeconfig "": leave ~/.kube/config alone. --enable-crds Stage: stages are API objects, so `up`
            # can change pod lifecycles on a live cluster.
            "create", "cluster", "--runtime", "binary", "--kubeconfig", "", "--timeout", "5m",
            "--kube-authorization", "--kube-admission", "--enable-crds", "Stage",
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"kwokctl create cluster failed:\n{_tail(proc)}")
        self._write_kubeconfig()

    def start(self) -> None:
        """Start the components that are not running (after a reboot, or one that crashed)."""
        self._write_kwokctl_config()
        self._forget_stale_pids()
        try:
            # kwokctl forks the components at once, then waits up to 2 minutes for the API; a healthy start
            # takes seconds, so a long wait only means the repair is not going to work.
            proc = self.kwokctl("start", "cluster", timeout=45)
        except subprocess.TimeoutExpired as e:
            raise ControlPlaneError("kwokctl start cluster: the API server did not come up within 45s") from e
        if proc.returncode != 0:
            raise ControlPlaneError(f"kwokctl start cluster failed:\n{_tail(proc)}")
        self._write_kubeconfig()

    def _forget_stale_pids(self) -> None:
        """kwokctl trusts any live pid in its pid files: it would skip starting that component, or kill that
        process on delete. A zombie, or a pid reused after a reboot, is not ours; drop such pid files."""
        for pid_file in (self.layout.kwok_cluster / "pids").glob("*.pid"):
            if not procs.alive(procs.read_pid(pid_file), str(self.layout.kwok_cluster)):
                pid_file.unlink(missing_ok=True)

    def delete(self) -> None:
        if self.exists():
            self._write_kwokctl_config()
            self._forget_stale_pids()
            proc = self.kwokctl("delete", "cluster", timeout=120)
            if proc.returncode != 0 and self.exists():
                raise ControlPlaneError(f"kwokctl delete cluster failed:\n{_tail(proc)}")

    def _write_kubeconfig(self) -> None:
        """A self-contained copy of kwokctl's kubeconfig (certificates inlined), under a stable context name."""
        src = yaml.safe_load((self.layout.kwok_cluster / "kubeconfig.yaml").read_text())
        cluster, user = src["clusters"][0]["cluster"], src["users"][0]["user"]
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": CONTEXT, "cluster": {"server": cluster["server"], **_inline(cluster, "certificate-authority")}}
            ],
            "users": [
                {"name": CONTEXT, "user": {**_inline(user, "client-certificate"), **_inline(user, "client-key")}}
            ],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
            "current-context": CONTEXT,
        }
        tmp = self.layout.kubeconfig.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(self.layout.kubeconfig)

    def server(self) -> str:
        doc = yaml.safe_load(self.layout.kubeconfig.read_text())
        return doc["clusters"][0]["cluster"]["server"]

    # -- health --------------------------------------------------------------------------------------------
    def pid(self, component: str) -> int | None:
        pid = procs.read_pid(self.layout.kwok_cluster / "pids" / f"{component}.pid")
        return pid if procs.alive(pid, str(self.layout.kwok_cluster)) else None

    def health(self) -> list[ComponentHealth]:
        out = []
        for name in COMPONENTS:
            pid = self.pid(name)
            if pid is None:
                out.append(ComponentHealth(name, None, False, "not running"))
                continue
            ok, detail = _probe(name, procs.cmdline(pid), self.layout.kwok_cluster / "pki")
            out.append(ComponentHealth(name, pid, ok, detail, procs.rss_kib(pid)))
        return out

    def healthy(self) -> bool:
        return self.layout.kubeconfig.is_file() and all(c.healthy for c in self.health())

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if all(c.healthy for c in health):
                return
            if time.monotonic() > deadline:
                bad = ", ".join(f"{c.name}: {c.detail}" for c in health if not c.healthy)
                logs = self.layout.kwok_cluster / "logs"
                raise ControlPlaneError(f"control plane not healthy after {timeout:.0f}s ({bad}); logs in {logs}")
            time.sleep(0.5)


def _inline(section: dict, key: str) -> dict:
    if f"{key}-data" in section:
        return {f"{key}-data": section[f"{key}-data"]}
    return {f"{key}-data": base64.b64encode(Path(section[key]).read_bytes()).decode()}


def _flag(args: list[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def _probe(component: str, args: list[str], pki: Path) -> tuple[bool, str]:
    """Ask the component's own health endpoint, found from the flags kwokctl started it with."""
    if component == "etcd":
        url = (_flag(args, "listen-client-urls") or "").split(",")[0] + "/health"
    elif component == "kwok-controller":
        url = f"http://{_flag(args, 'server-address')}/healthz"
    else:
        path = "readyz" if component == "kube-apiserver" else "healthz"
        url = f"https://127.0.0.1:{_flag(args, 'secure-port')}/{path}"
    ctx = ssl.create_default_context()
    # Loopback endpoints serving kwokctl's self-signed certificates.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if component == "kube-apiserver":
        ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx if url.startswith("https") else None) as resp:
            return resp.status == 200, f"{url} -> {resp.status}"
    except urllib.error.HTTPError as e:
        return False, f"{url} -> {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{url} -> {getattr(e, 'reason', e)}"


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 30) -> str:
    text = (proc.stdout or "") + (proc.stderr or "")
    return "\n".join(text.strip().splitlines()[-lines:])
