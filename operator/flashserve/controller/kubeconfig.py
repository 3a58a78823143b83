"""Where the operator and `flashserve status` find the API server: a kubeconfig when one is named (the flag or
$KUBECONFIG) or when not in a pod, else the pod's service account."""

from __future__ import annotations

import os


def uses_kubeconfig(kubeconfig: str | None) -> bool:
    return bool(kubeconfig or os.environ.get("KUBECONFIG") or not os.environ.get("KUBERNETES_SERVICE_HOST"))


def load(kubeconfig: str | None) -> None:
    """Configure the kubernetes client's default configuration from the kubeconfig or the service account."""
    from kubernetes import config

    if uses_kubeconfig(kubeconfig):
        config.load_kube_config(config_file=kubeconfig)
    else:
        config.load_incluster_config()
