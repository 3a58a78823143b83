"""Authenticated scrapes against the real API server: a TokenReview of a real ServiceAccount token and a
SubjectAccessReview of a real ClusterRole decide who reads the operator's metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

from flashserve.controller.metrics_auth import Gate, KubeReviewer, serve
from prometheus_client import CollectorRegistry, Counter


def _get(url: str, token: str | None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_only_a_service_account_granted_metrics_reads_them(kube, kubectl, namespace):
    role = f"flashserve-e2e-metrics-reader-{uuid.uuid4().hex[:6]}"
    kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kubectl("create", "serviceaccount", "stranger", "-n", namespace)
    kubectl("create", "clusterrole", role, "--verb=get", "--non-resource-url=/metrics")
    try:
        kubectl("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--serviceaccount={namespace}:reader")
        reader = kubectl("create", "token", "reader", "-n", namespace).stdout.strip()
        stranger = kubectl("create", "token", "stranger", "-n", namespace).stdout.strip()
        registry = CollectorRegistry()
        Counter("flashserve_e2e_total", "a counter", registry=registry).inc()
        server = serve("127.0.0.1", 0, registry, gate=Gate(KubeReviewer(kube)))
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        try:
            assert _get(url, reader) == 200
            assert _get(url, stranger) == 403
            assert _get(url, reader[:-4] + "abcd") == 401  # a forged signature
            assert _get(url, None) == 401
        finally:
            server.shutdown()
    finally:
        kubectl("delete", "clusterrolebinding", role, "--ignore-not-found", check=False)
        kubectl("delete", "clusterrole", role, "--ignore-not-found", check=False)
