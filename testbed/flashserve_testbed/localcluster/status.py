"""`flashserve cluster status`: each component's process, its own health endpoint, and its memory."""

from __future__ import annotations

from dataclasses import dataclass

from . import kube, pools, procs, prometheus
from .cluster import load_info
from .controlplane import ControlPlane
from .paths import Layout, toolchain_bin


@dataclass
class Status:
    exists: bool
    healthy: bool
    lines: list[str]


def status(layout: Layout | None = None) -> Status:
    layout = layout or Layout()
    info = load_info(layout)
    try:
        cp = ControlPlane(layout, toolchain_bin())
    except RuntimeError as e:
        return Status(False, False, [f"toolchain: {e}"])
    if not cp.exists():
        return Status(False, False, [f"no cluster at {layout.root} (run `flashserve cluster up`)"])
    lines, healthy, total_rss = [], True, 0
    for c in cp.health():
        healthy &= c.healthy
        total_rss += c.rss_kib
        mem = f"{c.rss_kib / 1024:7.0f} MiB" if c.pid else "        -  "
        lines.append(f"{c.name:<24} {'ok' if c.healthy else 'DOWN':<5} pid {c.pid or '-':<8} {mem}  {c.detail}")
    lines.append(f"{'control plane total':<24} {'':<5} {'':<12} {total_rss / 1024:7.0f} MiB")
    if info and info.settings.get("prometheus"):
        port = prometheus.running_port(layout)
        ok = port is not None and prometheus.ready(port)
        healthy &= ok
        pid = procs.read_pid(prometheus.pid_file(layout)) if port else None
        mem = f"{procs.rss_kib(pid) / 1024:7.0f} MiB" if pid else "        -  "
        lines.append(f"{'prometheus':<24} {'ok' if ok else 'DOWN':<5} pid {pid or '-':<8} {mem}  "
                     f"{prometheus.url(port) if port else 'not running'}")
    if healthy and info:
        lines.append(_node_summary(layout))
    if info:
        lines += [f"kubeconfig: {info.kubeconfig}", f"file_sd:    {info.file_sd_dir}",
                  f"readiness:  {info.pod_readiness} (serving start-up {info.pod_startup_seconds:g}s)"]
    return Status(True, healthy, lines)


def _node_summary(layout: Layout) -> str:
    api = kube.api_client(layout.kubeconfig)
    try:
        nodes = kube.client.CoreV1Api(api).list_node(label_selector=kube.MANAGED_SELECTOR).items
    finally:
        api.close()
    by_pool: dict[str, list[int]] = {}
    for n in nodes:
        counts = by_pool.setdefault((n.metadata.labels or {}).get(pools.POOL_LABEL, "?"), [0, 0])
        counts[0] += 1
        counts[1] += kube._schedulable(n)
    return "nodes:      " + ", ".join(f"{p} {r}/{t} ready" for p, (t, r) in sorted(by_pool.items()))
