"""Prometheus on loopback, scraping whatever target files the mock runtime and e2e tests drop in file_sd, and,
where the binary has Kubernetes discovery, the serving pods it finds through the local API server
(kubernetes_sd_configs, role pod, with its own ServiceAccount's token), since pod IPs are loopback.

Debian's prometheus package (2.42.0+ds, what e2e/install-system-deps.sh installs) is built without Kubernetes
service discovery: its config parser knows no `kubernetes_sd_configs` ("field kubernetes_sd_configs not found in
type config.ScrapeConfig"), so with it the runtime's file_sd targets stay (`supports_kubernetes_sd`)."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from . import procs
from .paths import Layout

SCRAPE_INTERVAL = "5s"
PODS_JOB = "kubernetes-pods"
ENGINE_JOB = "vllm"
ROUTER_JOB = "vllm-router"
# Loopback only: never through a proxy that http_proxy in the environment may name.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(RuntimeError):
    pass


def _meta_label(label: str) -> str:
    """A pod label as kubernetes_sd names it: __meta_kubernetes_pod_label_<name, non-alphanumerics as _>."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def pods_job(kubeconfig: Path) -> dict:
    """Serving pods found through the API: engines on their port named http (job vllm), routers on their port
    named metrics (job vllm-router), labelled as the autoscaler's PromQL selects them (namespace, serving,
    group) and as the runtime's file_sd targets were (pod, node)."""
    serving, component = _meta_label("flashserve.io/serving"), _meta_label("app.kubernetes.io/component")
    relabel = [
        # The guard, on every refresh: a discovered pod IP off loopback is never scraped.
        {"source_labels": ["__meta_kubernetes_pod_ip"], "regex": r"127\.[0-9]+\.[0-9]+\.[0-9]+", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
        {"source_labels": [serving], "regex": ".+", "action": "keep"},
        {"source_labels": [component, "__meta_kubernetes_pod_container_port_name"], "separator": ";",
         "regex": "engine;http|router;metrics", "action": "keep"},
        {"source_labels": [component], "regex": "engine", "target_label": "job", "replacement": ENGINE_JOB},
        {"source_labels": [component], "regex": "router", "target_label": "job", "replacement": ROUTER_JOB},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": [serving], "target_label": "serving"},
        {"source_labels": [_meta_label("flashserve.io/group")], "regex": "(.+)", "target_label": "group"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]
    return {"job_name": PODS_JOB,
            "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
            "relabel_configs": relabel}


@functools.cache
def supports_kubernetes_sd(binary: Path) -> bool:
    """Whether this Prometheus parses kubernetes_sd_configs: asked of the promtool beside it (or on PATH)."""
    promtool = Path(binary).with_name("promtool")
    tool = str(promtool) if promtool.exists() else shutil.which("promtool")
    if tool is None:
        return False
    probe = {"scrape_configs": [{"job_name": "probe", "kubernetes_sd_configs": [
        {"role": "pod", "api_server": "https://127.0.0.1:1"}]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as fh:
        fh.write(yaml.safe_dump(probe))
        fh.flush()
        try:
            proc = subprocess.run([tool, "check", "config", fh.name], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return proc.returncode == 0


def config(layout: Layout, port: int, kubeconfig: Path | None = None) -> str:
    """`kubeconfig`: Prometheus' own credentials for pod discovery; None leaves discovery out (file_sd only)."""
    doc = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "4s", "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            {
                # A target file may set its own `job` label; it then replaces this job's name.
                "job_name": "file_sd",
                "file_sd_configs": [
                    {
                        "files": [str(layout.file_sd / "*.json"), str(layout.file_sd / "*.yaml")],
                        "refresh_interval": SCRAPE_INTERVAL,
                    }
                ],
            },
            *([pods_job(kubeconfig)] if kubeconfig is not None else []),
        ],
    }
    header = "# Written by `flashserve cluster up` (edits are overwritten). Add targets as files in file_sd_configs.\n"
    if kubeconfig is not None and kubeconfig.exists():
        # A new token changes this file too, so `ensure` reloads Prometheus and it reads the new credentials.
        header += f"# credentials: {hashlib.sha256(kubeconfig.read_bytes()).hexdigest()[:16]}\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def pid_file(layout: Layout) -> Path:
    return layout.pids / "prometheus.pid"


def running_port(layout: Layout) -> int | None:
    """Port of the Prometheus this cluster started, if it still runs."""
    pid = procs.read_pid(pid_file(layout))
    if not procs.alive(pid, str(layout.prometheus_config)):
        return None
    for arg in procs.cmdline(pid):  # type: ignore[arg-type]
        if arg.startswith("--web.listen-address="):
            return int(arg.rpartition(":")[2])
    return None


def ready(port: int, timeout: float = 2.0) -> bool:
    try:
        with _LOCAL.open(url(port) + "/-/ready", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _serves(port: int, layout: Layout) -> bool:
    """Whether the Prometheus answering on `port` runs with this cluster's configuration file."""
    try:
        with _LOCAL.open(url(port) + "/api/v1/status/flags", timeout=2.0) as resp:
            flags = json.load(resp).get("data") or {}
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return flags.get("config.file") == str(layout.prometheus_config)


def ensure(layout: Layout, binary: Path, port: int, log=print, kubeconfig: Path | None = None) -> str:
    """Start Prometheus, or keep the running one (reloading its config). Port 0 picks a free port."""
    layout.file_sd.mkdir(parents=True, exist_ok=True)
    layout.prometheus_data.mkdir(parents=True, exist_ok=True)
    current = running_port(layout)
    if current is None and port and _serves(port, layout):
        current = port  # ours, though its pid file does not say so (e.g. rewritten by a concurrent start)
    if current is not None and port in (0, current):
        changed = _write_config(layout, current, kubeconfig)
        if ready(current):
            if changed:
                _reload(current)
            log(f"prometheus: running at {url(current)} (reused)")
            return url(current)
    # Checked before stopping the running one, so a bad port leaves the cluster as it was.
    if port not in (0, current) and procs.port_in_use(port):
        raise _port_taken(port)
    stop(layout)
    # A port picked free can be taken again before Prometheus binds it: then try another.
    attempts = 3 if port == 0 else 1
    problem = ""
    for attempt in range(attempts):
        chosen = procs.free_port() if port == 0 else port
        if port != 0 and procs.port_in_use(chosen):
            raise _port_taken(chosen)
        problem = _start(layout, binary, chosen, kubeconfig)
        if not problem:
            log(f"prometheus: started at {url(chosen)}")
            return url(chosen)
        if attempt + 1 < attempts:
            stop(layout)
            log(f"prometheus: {problem} on port {chosen}; trying another port")
        # Otherwise it is left running: one still replaying its WAL is reused by the next `ensure`.
    log_file = layout.logs / "prometheus.log"
    raise PrometheusError(f"prometheus {problem}; see {log_file}, which ends:\n{_log_tail(log_file)}")


def _start(layout: Layout, binary: Path, port: int, kubeconfig: Path | None = None) -> str:
    """Start Prometheus on `port` and wait until it answers: "" when ready, else what went wrong."""
    _write_config(layout, port, kubeconfig)
    args = [
        str(binary),
        f"--config.file={layout.prometheus_config}",
        f"--storage.tsdb.path={layout.prometheus_data}",
        "--storage.tsdb.retention.time=2d",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    pid = procs.start(args, pid_file(layout), layout.logs / "prometheus.log")
    # Generous: on a busy machine replaying the write-ahead log of a restarted Prometheus takes a while.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ready(port):
            return ""
        # Our own child, by pid: not through the pid file and command line that `running_port` checks for
        # processes started by earlier commands.
        if not procs.alive(pid):
            return f"(pid {pid}) exited during start-up"
        time.sleep(0.3)
    return f"did not answer {url(port)}/-/ready within 120 s"


def _log_tail(log_file: Path, lines: int = 15) -> str:
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _port_taken(port: int) -> PrometheusError:
    return PrometheusError(
        f"127.0.0.1:{port} is already in use by another process. Pass --prometheus-port N "
        f"(or set FLASHSERVE_PROMETHEUS_PORT), use --prometheus-port 0 to pick a free port, or --no-prometheus."
    )


def _write_config(layout: Layout, port: int, kubeconfig: Path | None = None) -> bool:
    text = config(layout, port, kubeconfig)
    if layout.prometheus_config.exists() and layout.prometheus_config.read_text() == text:
        return False
    layout.prometheus_config.parent.mkdir(parents=True, exist_ok=True)
    layout.prometheus_config.write_text(text)
    return True


def _reload(port: int) -> None:
    req = urllib.request.Request(url(port) + "/-/reload", method="POST")
    with _LOCAL.open(req, timeout=10):
        pass


def stop(layout: Layout) -> bool:
    return procs.stop_pid_file(pid_file(layout), expect=str(layout.prometheus_config))
