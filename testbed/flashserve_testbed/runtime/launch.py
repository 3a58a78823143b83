"""What the runtime starts for one pod: the engine container's command line, environment, loopback address,
API port and the calibration profile of the simulated hardware. Pure functions of the pod and its node."""

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


@dataclass(frozen=True)
class LaunchSettings:
    engine_bin: str  # directory whose `vllm` is the mock engine; first on PATH
    time_scale: float = 1.0
    startup_seconds: float | None = None  # engine seconds; None lets the engine draw from its profile
    seed: int = 0
    loopback_shift: int = 0  # moves the second octet, so two runtimes of two clusters do not collide
    profile: str | None = None  # one profile for every pod instead of choosing by GPU and group size


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    address: str
    port: int
    profile: str
    container: str
    notes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


def engine_container(pod: dict) -> dict:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise ValueError("pod has no containers")
    return next((c for c in containers if c.get("name") == ENGINE_CONTAINER), containers[0])


def loopback_address(pod_ip: str | None, key: str, shift: int = 0) -> str:
    """127.B.c.d for pod IP a.b.c.d, B = b shifted within 1..254, so each pod's engine owns an address as it owns
    its pod IP, and two clusters on one machine (same pod CIDRs, different shifts) do not collide. Without an
    IPv4 pod IP the address is hashed from `key` into 127.255/16."""
    try:
        ip = ipaddress.ip_address(pod_ip or "")
    except ValueError:
        ip = None
    if isinstance(ip, ipaddress.IPv4Address) and not ip.is_loopback:
        _, b, c, d = ip.packed
        if d not in (0, 255):
            return f"127.{1 + (b - 1 + shift) % 254}.{c}.{d}"
    h = zlib.crc32(key.encode())
    return f"127.255.{(h >> 8) & 0xFF}.{1 + (h & 0xFF) % 254}"


def cluster_shift(server: str) -> int:
    """The default shift: fixed per API server, so runtimes of two local clusters use different addresses."""
    return zlib.crc32(server.encode()) % 254


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


def build_launch(pod: dict, node: dict | None, settings: LaunchSettings) -> Launch:
    meta, status = pod["metadata"], pod.get("status") or {}
    ns, name = meta.get("namespace", "default"), meta["name"]
    container = engine_container(pod)
    resolved = resolve_env(pod, container)
    argv = command_line(container, resolved.env, IMAGE_ENTRYPOINT)
    notes = list(resolved.notes)
    if not container.get("command"):
        notes.append(f"no command: using the image entry point {' '.join(IMAGE_ENTRYPOINT)}")
    address = loopback_address(status.get("podIP"), f"{ns}/{name}/{meta.get('uid', '')}", settings.loopback_shift)
    # In a pod, vLLM's default host (all interfaces) means the pod IP; here the pod's loopback address stands in
    # for it. The flag goes last, inside "$@" of the multi-node wrapper script too, so argparse takes it.
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
