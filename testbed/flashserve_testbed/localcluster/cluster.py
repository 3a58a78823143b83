"""Bringing the whole local cluster up, reporting on it, and taking it down.

`ensure_up()` is idempotent: a healthy cluster is reused, a stopped or crashed one is restarted, and one that
cannot be repaired is recreated. Settings (pod readiness mode, start-up delay, pool sizes, Prometheus port)
stick to the cluster: a later `ensure_up()` without them keeps what the cluster runs with."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from . import kube, loopback, pools, procs, prometheus, stages
from .controlplane import COMPONENTS, ControlPlane, ControlPlaneError
from .paths import CLUSTER_NAME, Layout, prometheus_binary, toolchain_bin

DEFAULT_PROMETHEUS_PORT = 9090
STAGE_CRD = "stages.kwok.x-k8s.io"
DEFAULTS: dict[str, Any] = {"pod_readiness": "kwok", "pod_startup_seconds": 5.0, "pool_overrides": [],
                            "pools_file": None, "prometheus": True, "prometheus_port": DEFAULT_PROMETHEUS_PORT,
                            "loopback_slot": None}
ENV = {"pod_readiness": "FLASHSERVE_POD_READINESS", "pod_startup_seconds": "FLASHSERVE_POD_STARTUP_SECONDS",
       "prometheus_port": "FLASHSERVE_PROMETHEUS_PORT", "loopback_slot": loopback.SLOT_ENV}
PROMETHEUS_NAMESPACE = "kube-system"
PROMETHEUS_ACCOUNT = "flashserve-prometheus"
PROMETHEUS_TOKEN_SECONDS = 30 * 24 * 3600  # renewed by `cluster up` once it no longer works
# Everything `down` may have to stop, by program name (kwokctl names the kwok binary kwok-controller).
PROGRAMS = {*COMPONENTS, "kwok", "prometheus"}


@dataclass
class ClusterInfo:
    """What tests, the demo and the mock runtime need to use the cluster; also stored as <dir>/cluster.json."""

    name: str
    dir: Path
    kubeconfig: Path
    server: str
    toolchain_bin: Path
    kubectl: Path
    prometheus_url: str | None
    file_sd_dir: Path
    pod_readiness: str
    pod_startup_seconds: float
    pools: dict[str, dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    # "kubernetes_sd": Prometheus finds serving pods itself (the runtime writes no targets); "file_sd": it does not
    prometheus_discovery: str = "file_sd"

    def env(self) -> dict[str, str]:
        out = {"KUBECONFIG": str(self.kubeconfig)}
        if self.prometheus_url:
            out["FLASHSERVE_PROMETHEUS_URL"] = self.prometheus_url
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "ClusterInfo":
        raw = json.loads(text)
        # Fields a newer version wrote are dropped, so an older checkout still finds the cluster.
        known = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        for key in ("dir", "kubeconfig", "toolchain_bin", "kubectl", "file_sd_dir"):
            raw[key] = Path(raw[key])
        return cls(**raw)


def load_info(layout: Layout | None = None) -> ClusterInfo | None:
    layout = layout or Layout()
    try:
        return ClusterInfo.from_json(layout.info.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


class Progress:
    """Progress lines on stderr with the time since bring-up started (stdout stays for `export` lines)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.start = time.monotonic()
        self.quiet = quiet
        self.stream = stream or sys.stderr

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[cluster {self.elapsed():5.1f}s] {msg}", file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


@contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    # Beside the cluster directory, not in it: `down` deletes the directory while holding the lock.
    lock_path = layout.root.with_name(layout.root.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _settings(layout: Layout, explicit: dict[str, Any], reset: bool = False) -> dict[str, Any]:
    """Explicit arguments, then environment, then what the running cluster uses (unless `reset`), then defaults."""
    previous = None if reset else load_info(layout)
    merged = dict(DEFAULTS)
    if previous:
        merged.update({k: v for k, v in previous.settings.items() if k in DEFAULTS})
    for key, var in ENV.items():
        if os.environ.get(var):
            merged[key] = os.environ[var]
    merged.update({k: v for k, v in explicit.items() if v is not None})
    merged["pod_startup_seconds"] = float(merged["pod_startup_seconds"])
    merged["prometheus_port"] = int(merged["prometheus_port"])
    merged["pool_overrides"] = list(merged["pool_overrides"] or [])
    # Chosen once and kept with the cluster: a node's podCIDR cannot change without recreating the node.
    slot = merged["loopback_slot"]
    merged["loopback_slot"] = loopback.check_slot(
        loopback.default_slot(str(layout.root)) if slot is None else _int(slot, loopback.SLOT_ENV))
    return merged


def _int(value: Any, where: str) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value  # check_slot names it


def ensure_up(
    *,
    pod_readiness: str | None = None,
    pod_startup_seconds: float | None = None,
    pool_overrides: list[str] | None = None,
    pools_file: str | None = None,
    prometheus_enabled: bool | None = None,
    prometheus_port: int | None = None,
    recreate: bool = False,
    reset: bool = False,
    quiet: bool = False,
    layout: Layout | None = None,
    log: Callable[[str], None] | None = None,
) -> ClusterInfo:
    """Bring the local cluster up (or reuse it) and return how to reach it."""
    layout = layout or Layout()
    log = log or Progress(quiet)
    started = time.monotonic()
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout):
        s = _settings(layout, {
            "pod_readiness": pod_readiness, "pod_startup_seconds": pod_startup_seconds,
            "pool_overrides": pool_overrides or None, "pools_file": pools_file,
            # Asking for a port means asking for Prometheus, even after an earlier --no-prometheus.
            "prometheus": True if prometheus_port is not None and prometheus_enabled is None else prometheus_enabled,
            "prometheus_port": prometheus_port,
        }, reset)
        pool_specs, reserved = pools.resolve(s["pool_overrides"], s["pools_file"])
        stage_objs = stages.build(s["pod_readiness"], s["pod_startup_seconds"])  # validate before starting anything
        bin_dir = toolchain_bin()
        cp = ControlPlane(layout, bin_dir, s["loopback_slot"])
        previous = load_info(layout)
        reused = _ensure_control_plane(cp, layout, previous, bin_dir, recreate, log)
        api = kube.api_client(layout.kubeconfig)
        if reused is not None and not kube.crd_exists(api, STAGE_CRD):
            # Components run but the cluster's state is gone (etcd data deleted): start from scratch.
            api.close()
            log("control plane: KWOK's Stage CRD is missing (etcd data lost?), recreating")
            reused = _ensure_control_plane(cp, layout, previous, bin_dir, True, log)
            api = kube.api_client(layout.kubeconfig)
        try:
            _reconcile(api, s, stage_objs, pool_specs, reserved, log)
            prom_kubeconfig = _prometheus_discovery(api, layout, log) if _discovers(s) else None
        finally:
            api.close()
        prom_url = _ensure_prometheus(layout, s, log, prom_kubeconfig)
        if prom_url:
            s["prometheus_port"] = int(prom_url.rpartition(":")[2])
        info = ClusterInfo(
            name=CLUSTER_NAME, dir=layout.root, kubeconfig=layout.kubeconfig, server=cp.server(),
            toolchain_bin=bin_dir, kubectl=bin_dir / "kubectl", prometheus_url=prom_url,
            file_sd_dir=layout.file_sd, pod_readiness=s["pod_readiness"],
            pod_startup_seconds=s["pod_startup_seconds"],
            prometheus_discovery="kubernetes_sd" if prom_url and prom_kubeconfig else "file_sd",
            pools={p.name: {"nodes": p.node_count, "racks": p.racks, "gpusPerNode": int(p.fields.get("gpus", 0)),
                            "nodesPerRack": int(p.fields.get("nodesPerRack", 0)) or None} for p in pool_specs},
            settings=s,
        )
        layout.info.write_text(info.to_json())
    log(f"cluster {'reused' if reused else 'up'} in {time.monotonic() - started:.1f}s")
    return info


def _reconcile(api, s: dict[str, Any], stage_objs: list[dict], pool_specs: list[pools.PoolSpec],
               reserved: dict[str, Any], log: Callable[[str], None]) -> None:
    """KWOK stages first (nodes need node-initialize to become Ready), then the node pools."""
    kube.wait_for_crd(api, STAGE_CRD)
    changed, deleted = kube.apply_stages(api, stage_objs)
    log(f"stages: pod readiness {s['pod_readiness']}, serving start-up {s['pod_startup_seconds']:g}s"
        + (f" ({changed} applied, {deleted} removed)" if changed or deleted else " (unchanged)"))
    node_objs = pools.build_nodes(pool_specs, reserved, s["loopback_slot"])
    created, updated, removed = kube.apply_nodes(api, node_objs)
    log(f"nodes: {pools.summary(pool_specs)} ({created} created, {updated} updated, {removed} removed); "
        f"pod CIDRs in 127.0.0.0/8, slot {s['loopback_slot']}")
    kube.wait_nodes_ready(api, [n["metadata"]["name"] for n in node_objs],
                          progress=lambda r, t: log(f"nodes: {r}/{t} ready"))
    kube.wait_default_service_account(api)


def _discovers(s: dict[str, Any]) -> bool:
    binary = prometheus_binary()
    return bool(s["prometheus"]) and binary is not None and prometheus.supports_kubernetes_sd(binary)


def _prometheus_discovery(api, layout: Layout, log: Callable[[str], None]) -> Path:
    """Prometheus' own kubeconfig for pod discovery (a ServiceAccount token allowed to list pods and nothing
    else), after the loopback guard: it scrapes every pod it discovers, so it does not start while any pod or
    node address is outside 127.0.0.0/8 (its relabelling also drops such pods while it runs)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    pods = [api.sanitize_for_serialization(p) for p in core.list_pod_for_all_namespaces().items]
    nodes = [api.sanitize_for_serialization(n) for n in core.list_node().items]
    loopback.require_loopback(pods, nodes, "Prometheus with kubernetes_sd_configs")
    path = layout.prometheus / "kubeconfig"
    if kube.token_works(path):
        return path
    token = kube.service_account_token(api, PROMETHEUS_NAMESPACE, PROMETHEUS_ACCOUNT, PROMETHEUS_TOKEN_SECONDS,
                                       rules=[{"apiGroups": [""], "resources": ["pods"],
                                               "verbs": ["get", "list", "watch"]}])
    kube.write_token_kubeconfig(path, layout.kubeconfig, token)
    log(f"prometheus: discovers pods as {PROMETHEUS_NAMESPACE}/{PROMETHEUS_ACCOUNT} (pods: get, list, watch)")
    return path


def _ensure_prometheus(layout: Layout, s: dict[str, Any], log: Callable[[str], None],
                       kubeconfig: Path | None = None) -> str | None:
    if not s["prometheus"]:
        prometheus.stop(layout)
        return None
    binary = prometheus_binary()
    if binary is None:
        raise prometheus.PrometheusError(
            "prometheus not found; install it (apt-get install --no-install-recommends prometheus), "
            "set FLASHSERVE_PROMETHEUS_BINARY, or pass --no-prometheus")
    return prometheus.ensure(layout, binary, s["prometheus_port"], log=log, kubeconfig=kubeconfig)


def _ensure_control_plane(cp: ControlPlane, layout: Layout, previous: ClusterInfo | None, bin_dir: Path,
                          recreate: bool, log: Callable[[str], None]) -> bool | None:
    """True when a running control plane was reused as it was, False when repaired, None when created."""
    if cp.exists() and previous and previous.toolchain_bin != bin_dir:
        log(f"control plane: toolchain changed ({previous.toolchain_bin.parent.name} -> {bin_dir.parent.name}), "
            "recreating")
        recreate = True
    if cp.exists() and not recreate:
        if cp.healthy():
            log(f"control plane: healthy, reusing ({cp.server()})")
            return True
        down_list = ", ".join(c.name for c in cp.health() if not c.healthy)
        log(f"control plane: not healthy ({down_list}), restarting stopped components")
        try:
            cp.start()
            cp.wait_healthy(timeout=30)
            log("control plane: repaired")
            return False
        except (ControlPlaneError, OSError) as e:
            log(f"control plane: repair failed ({str(e).splitlines()[0]}), recreating")
    if cp.exists() or procs.referencing(layout.root, PROGRAMS):
        _teardown(cp, layout, log, keep_prometheus=True)
    log("control plane: creating etcd, kube-apiserver, controller-manager, scheduler, kwok (first start ~30s)")
    cp.create()
    cp.wait_healthy(timeout=180)
    log(f"control plane: ready at {cp.server()}")
    return None


def _teardown(cp: ControlPlane, layout: Layout, log: Callable[[str], None], keep_prometheus: bool = False) -> None:
    try:
        cp.delete()
    except (ControlPlaneError, OSError) as e:
        log(f"kwokctl delete failed ({str(e).splitlines()[0]}); stopping processes directly")
    if not keep_prometheus:
        prometheus.stop(layout)
    # Whatever kwokctl's pid files missed (a crashed delete, pid files removed by hand).
    programs = PROGRAMS - ({"prometheus"} if keep_prometheus else set())
    for pid in procs.referencing(layout.kwok_cluster if keep_prometheus else layout.root, programs):
        log(f"stopping leftover process {pid} ({' '.join(procs.cmdline(pid)[:1])})")
        procs.stop(pid)
    shutil.rmtree(layout.kwok_workdir, ignore_errors=True)


def down(layout: Layout | None = None, quiet: bool = False, log: Callable[[str], None] | None = None) -> list[int]:
    """Stop every process of the cluster and delete its files. Returns pids still running (should be empty)."""
    layout = layout or Layout()
    log = log or Progress(quiet)
    started = time.monotonic()
    if not layout.root.exists():
        log(f"no cluster at {layout.root}")
        return []
    with _locked(layout):
        try:
            cp = ControlPlane(layout, toolchain_bin())
        except RuntimeError:
            cp = ControlPlane(layout, Path("/nonexistent"))  # kwokctl gone: the process sweep below still works
        running = procs.referencing(layout.root, PROGRAMS)
        _teardown(cp, layout, log)
        procs.wait_gone(running)
        left = procs.referencing(layout.root, PROGRAMS)
        if not left:
            shutil.rmtree(layout.root, ignore_errors=True)
    log(f"cluster down in {time.monotonic() - started:.1f}s" + (f"; still running: {left}" if left else ""))
    return left
