"""A real Kubernetes on one machine for e2e tests and the demo: the upstream control plane run as local
processes (kwokctl's binary runtime), KWOK nodes shaped like Blackwell fleets, and Prometheus on loopback.

    from flashserve_testbed.localcluster import ensure_up, down
    info = ensure_up()          # reuses a healthy cluster; info.kubeconfig, info.prometheus_url, info.file_sd_dir
    down()                      # stops every process it started and deletes the cluster directory
"""

from .cluster import ClusterInfo, down, ensure_up, load_info
from .paths import Layout, ToolchainMissing, cluster_dir, toolchain_bin
from .status import status

__all__ = ["ClusterInfo", "Layout", "ToolchainMissing", "cluster_dir", "down", "ensure_up", "load_info", "status",
           "toolchain_bin"]
