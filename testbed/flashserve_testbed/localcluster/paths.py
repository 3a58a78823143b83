"""Where the local cluster keeps its files, and where the toolchain binaries are."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CLUSTER_NAME = "flashserve"
TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok", "kwokctl")


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def cluster_dir() -> Path:
    """${FLASHSERVE_CLUSTER_DIR:-${XDG_CACHE_HOME:-~/.cache}/flashserve/cluster}"""
    return Path(os.environ.get("FLASHSERVE_CLUSTER_DIR") or cache_home() / "flashserve" / "cluster")


class Layout:
    """Every file of one cluster lives under its directory, so `down` can find all it started."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or cluster_dir())
        self.kubeconfig = self.root / "kubeconfig"
        self.info = self.root / "cluster.json"
        self.lock = self.root / ".lock"
        self.kwok_workdir = self.root / "kwok"  # KWOK_WORKDIR for kwokctl
        self.kwok_cluster = self.kwok_workdir / "clusters" / CLUSTER_NAME
        self.kwokctl_config = self.root / "kwokctl.yaml"
        self.pids = self.root / "pids"
        self.logs = self.root / "logs"
        self.prometheus = self.root / "prometheus"
        self.prometheus_config = self.prometheus / "prometheus.yml"
        self.prometheus_data = self.prometheus / "data"
        self.file_sd = self.prometheus / "targets"


def repo_root() -> Path | None:
    """The checkout this package runs from (editable install) or the current directory's checkout."""
    for start in (Path(__file__).resolve(), Path.cwd().resolve()):
        for d in (start, *start.parents):
            if (d / "e2e" / "toolchain" / "build.sh").is_file():
                return d
    return None


class ToolchainMissing(RuntimeError):
    pass


def toolchain_bin() -> Path:
    """FLASHSERVE_TOOLCHAIN_BIN, else what `e2e/toolchain/build.sh --print` reports."""
    env = os.environ.get("FLASHSERVE_TOOLCHAIN_BIN")
    if env:
        path = Path(env).expanduser()
    else:
        root = repo_root()
        if root is None:
            raise ToolchainMissing("cannot find e2e/toolchain/build.sh; set FLASHSERVE_TOOLCHAIN_BIN instead")
        script = root / "e2e" / "toolchain" / "build.sh"
        proc = subprocess.run(["bash", str(script), "--print"], capture_output=True, text=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise ToolchainMissing(f"the toolchain is not built yet; run `{script.relative_to(root)}` first "
                                   "(20-40 min on a new machine)")
        path = Path(proc.stdout.strip().splitlines()[-1])
    missing = [t for t in TOOLS if not os.access(path / t, os.X_OK)]
    if missing:
        raise ToolchainMissing(f"toolchain at {path} lacks {', '.join(missing)}")
    return path


def prometheus_binary() -> Path | None:
    found = os.environ.get("FLASHSERVE_PROMETHEUS_BINARY") or shutil.which("prometheus")
    return Path(found) if found else None
