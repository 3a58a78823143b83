"""What the runtime starts for one pod: the engine container's command line, environment, address (the pod IP),
API port and the calibration profile of the simulated hardware; for a router pod, the real `vllm-router` with
its own command line. Pure functions of the pod and its node."""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from flashserve_testbed.runtime.podenv import command_line, resolve_env

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
STARTUP_ANNOTATION = "flashserve.io/startup-delay"
ENGINE_CONTAINER = "vllm"
# The vllm/vllm-openai image's ENTRYPOINT, for pods that set only args.
IMAGE_ENTRYPOINT = ["vllm", "serve"]
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
COMPONENT_LABEL = "app.kubernetes.io/component"
SERVING_LABEL = "flashserve.io/serving"
ROUTER_COMPONENT = "router"
ROUTER_CONTAINER = "router"
ROUTER_ENTRYPOINT = ["vllm-router"]
ROUTER_DEFAULT_PORT = 30000  # vllm-router's own --port default


@dataclass(frozen=True)
class LaunchSettings:
    engine_bin: str  # directory whose `vllm` is the mock engine; first on PATH
    time_scale: float = 1.0
    startup_seconds: float | None = None  # engine seconds; None lets the engine draw from its profile
    seed: int = 0
    profile: str | None = None  # one profile for every pod instead of choosing by GPU and group size
    router_bin: str | None = None  # directory whose `vllm-router` router pods run; None: engine_bin
    # The runtime's own PYTHONPATH, handed to the engines so they run the same flashserve_testbed as the
    # runtime (a source checkout's, not only the venv's installed copy); None: none.
    python_path: str | None = None


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    address: str
    port: int
    profile: str
    container: str
    notes: list[str] = field(default_factory=list)
    kind: str = "engine"  # or "router"
    probe_path: str = "/health"
    probe_port: int | None = None  # None: `port`
    kubeconfig: str | None = None  # a router's own credentials, written by the runtime before each start
    metrics_port: int | None = None  # a router's --prometheus-port

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def probe_url(self) -> str:
        return f"http://{self.address}:{self.probe_port or self.port}{self.probe_path}"


def engine_container(pod: dict) -> dict:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise ValueError("pod has no containers")
    return next((c for c in containers if c.get("name") == ENGINE_CONTAINER), containers[0])


def pod_address(pod_ip: str | None, where: str = "pod") -> str:
    """The address a pod's process listens on: its pod IP itself, which the local cluster gives from
    127.0.0.0/8 (localcluster/loopback.py), so what discovers the pod through the API reaches the process."""
    try:
        ip = ipaddress.ip_address(pod_ip or "")
    except ValueError:
        raise ValueError(f"{where}: status.podIP {pod_ip!r} is not an IP address yet") from None
    if not ip.is_loopback or ip == ipaddress.ip_address("127.0.0.1"):
        raise ValueError(f"{where}: status.podIP {pod_ip} is outside 127.0.0.0/8 (or 127.0.0.1 itself); the mock "
                         "runtime listens only on loopback pod IPs: give the pod's node a podCIDR inside "
                         "127.0.0.0/8, as `flashserve cluster up` does for its node pools")
    return str(ip)


def _flag_value(argv: list[str], *names: str) -> str | None:
    """The last value given to any of `names` (`--flag value` or `--flag=value`), as argparse keeps it."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _normalise(argv: list[str]) -> list[str]:
    """vLLM reads `--x_y` as `--x-y`."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            arg = "--" + flag[2:].replace("_", "-") + eq + value
        out.append(arg)
    return out


def api_port(argv: list[str], container: dict) -> int:
    value = _flag_value(_normalise(argv), "--port")
    if value is not None and value.isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == "http":
            return int(port["containerPort"])
    return 8000


def group_nodes(argv: list[str]) -> int:
    """Nodes one replica spans: data-parallel size over the ranks this pod runs."""
    norm = _normalise(argv)
    dp = _flag_value(norm, "--data-parallel-size", "-dp")
    local = _flag_value(norm, "--data-parallel-size-local", "-dpl")
    try:
        dp_n, local_n = int(dp or 1), int(local or dp or 1)
    except ValueError:
        return 1
    return max(1, -(-dp_n // max(1, local_n)))


@functools.cache
def _profiles() -> tuple[tuple[str, str, int], ...]:
    from flashserve_testbed.engine import profile

    out = []
    for name in profile.available():
        p = profile.load(name)
        out.append((name, p.gpu_product, p.nodes_per_replica))
    return tuple(out)


def choose_profile(gpu_product: str | None, nodes: int) -> str:
    """The calibration profile for the node's GPU and the group's size: same GPU, then the closest node count
    (a multi-node group never gets a single-node profile when a multi-node one exists)."""
    from flashserve_testbed.engine.profile import DEFAULT_PROFILE

    same = [(name, n) for name, product, n in _profiles() if product == gpu_product]
    if not same:
        return DEFAULT_PROFILE
    # the shortest name among equals: the base profile, not its variants (e.g. gb200-4gpu over gb200-4gpu-demo)
    return min(same, key=lambda c: (abs(c[1] - nodes), len(c[0]), c[0]))[0]


def duration_seconds(text: str) -> float:
    """"90s", "2m", "1h", "1m30s" or a bare number of seconds."""
    text = str(text).strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]*)?", text):
        return float(text)
    parts = re.findall(r"([0-9]+(?:\.[0-9]*)?)(ms|h|m|s)", text)
    if not parts or "".join(a + u for a, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(a) * scale[u] for a, u in parts)


def pod_seed(seed: int, namespace: str, name: str) -> int:
    return zlib.crc32(f"{seed}/{namespace}/{name}".encode()) & 0x7FFFFFFF


def is_router_pod(pod: dict) -> bool:
    """A serving's router: the component label says so and it has the `router` container (routing contract)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    return (labels.get(COMPONENT_LABEL) == ROUTER_COMPONENT and bool(labels.get(SERVING_LABEL))
            and any(c.get("name") == ROUTER_CONTAINER for c in containers))


def _container_port(container: dict, port, where: str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"{where}: port {port!r} is not a port of container {container.get('name')!r}")


def probe_target(container: dict, default_port: int, where: str) -> tuple[str, int]:
    """(path, port) the runtime probes: the readinessProbe's httpGet when it has one, else /health."""
    http = ((container.get("readinessProbe") or {}).get("httpGet")) or {}
    if not http:
        return "/health", default_port
    path = str(http.get("path") or "/")
    port = _container_port(container, http.get("port", default_port), f"{where}: readinessProbe.httpGet")
    return (path if path.startswith("/") else "/" + path), port


def router_container(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c.get("name") == ROUTER_CONTAINER)


def mounts_token(pod: dict) -> bool:
    """Whether the kubelet would give the pod its ServiceAccount's token (the pod's own setting; the
    ServiceAccount's is not read)."""
    return (pod.get("spec") or {}).get("automountServiceAccountToken") is not False


def build_router_launch(pod: dict, settings: LaunchSettings, kubeconfig: str | None) -> Launch:
    """The router container's own command (vllm-router ...) with `--host <podIP> --prometheus-host <podIP>`
    appended (its launcher is argparse with plain `store` options: the last value wins), and KUBECONFIG set to
    `kubeconfig`, the pod's own ServiceAccount credentials the runtime writes (None: a pod that mounts no token
    gets no KUBECONFIG at all)."""
    meta = pod["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    where = f"pod {ns}/{name}"
    container = router_container(pod)
    resolved = resolve_env(pod, container)
    argv = command_line(container, resolved.env, ROUTER_ENTRYPOINT)
    notes = list(resolved.notes)
    if not container.get("command"):
        notes.append(f"no command: using {' '.join(ROUTER_ENTRYPOINT)}")
    address = pod_address((pod.get("status") or {}).get("podIP"), where)
    argv += ["--host", address, "--prometheus-host", address]
    value = _flag_value(argv, "--port")
    if value is not None and value.isdigit():
        port = int(value)
    else:
        port = next((int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == "http"),
                    ROUTER_DEFAULT_PORT)
    probe_path, probe_port = probe_target(container, port, where)
    metrics = _flag_value(argv, "--prometheus-port")
    metrics_port = int(metrics) if metrics is not None and metrics.isdigit() else next(
        (int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == "metrics"), None)
    bin_dir = settings.router_bin or settings.engine_bin
    env = {"PATH": f"{bin_dir}{os.pathsep}{SYSTEM_PATH}", "HOME": "/tmp", "LANG": "C.UTF-8", "HOSTNAME": name}
    env.update(resolved.env)
    if "PATH" in resolved.env:
        env["PATH"] = f"{bin_dir}{os.pathsep}{resolved.env['PATH']}"
    # Last, so nothing in the pod can point the router at other credentials (the admin's above all).
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(var, None)
    return Launch(argv=argv, env=env, address=address, port=port, profile="", container=ROUTER_CONTAINER,
                  notes=notes, kind="router", probe_path=probe_path, probe_port=probe_port, kubeconfig=kubeconfig,
                  metrics_port=metrics_port)


def build_launch(pod: dict, node: dict | None, settings: LaunchSettings) -> Launch:
    meta, status = pod["metadata"], pod.get("status") or {}
    ns, name = meta.get("namespace", "default"), meta["name"]
    container = engine_container(pod)
    resolved = resolve_env(pod, container)
    argv = command_line(container, resolved.env, IMAGE_ENTRYPOINT)
    notes = list(resolved.notes)
    if not container.get("command"):
        notes.append(f"no command: using the image entry point {' '.join(IMAGE_ENTRYPOINT)}")
    address = pod_address(status.get("podIP"), f"pod {ns}/{name}")
    # In a pod, vLLM's default host (all interfaces) means the pod IP; here the process binds that IP alone (all
    # interfaces would be every pod's). The flag goes last, inside "$@" of the multi-node wrapper script too,
    # so argparse takes it.
    argv.append("--host")
    argv.append(address)
    port = api_port(argv, container)
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    profile = settings.profile or choose_profile(labels.get(GPU_PRODUCT_LABEL), group_nodes(argv))

    startup = settings.startup_seconds
    delay = (meta.get("annotations") or {}).get(STARTUP_ANNOTATION)
    if delay:
        try:
            startup = duration_seconds(delay)
        except ValueError:
            notes.append(f"ignoring annotation {STARTUP_ANNOTATION}={delay!r}: not a duration")
    env = {
        "PATH": f"{settings.engine_bin}{os.pathsep}{SYSTEM_PATH}",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "HOSTNAME": name,
        "FLASHSERVE_MOCK_PROFILE": profile,
        "FLASHSERVE_MOCK_TIME_SCALE": f"{settings.time_scale:g}",
        "FLASHSERVE_MOCK_SEED": str(pod_seed(settings.seed, ns, name)),
    }
    if startup is not None:
        env["FLASHSERVE_MOCK_STARTUP_SECONDS"] = f"{startup:g}"
    if settings.python_path:
        env["PYTHONPATH"] = settings.python_path
    env.update(resolved.env)  # the pod's own settings win, FLASHSERVE_MOCK_* from spec.engine.env included
    if "PATH" in resolved.env:
        env["PATH"] = f"{settings.engine_bin}{os.pathsep}{resolved.env['PATH']}"
    return Launch(argv=argv, env=env, address=address, port=port, profile=env["FLASHSERVE_MOCK_PROFILE"],
                  container=container.get("name", ENGINE_CONTAINER), notes=notes)


def default_engine_bin() -> str:
    """The directory of the running interpreter's console scripts (the venv's bin, holding the mock `vllm`)."""
    import shutil
    import sys

    here = Path(sys.executable).parent
    if (here / "vllm").exists():
        return str(here)
    found = shutil.which("vllm")
    return str(Path(found).parent) if found else str(here)
