"""cluster.json across versions: fields a newer checkout wrote do not hide the cluster from an older one, and a
file from before prometheus_discovery reads as file_sd."""

from __future__ import annotations

import json
from pathlib import Path

from flashserve_testbed.localcluster.cluster import ClusterInfo


def _info() -> ClusterInfo:
    return ClusterInfo(name="flashserve", dir=Path("/c"), kubeconfig=Path("/c/kubeconfig"), server="https://127.0.0.1:1",
                       toolchain_bin=Path("/t"), kubectl=Path("/t/kubectl"), prometheus_url=None,
                       file_sd_dir=Path("/c/prometheus/targets"), pod_readiness="kwok", pod_startup_seconds=5.0,
                       pools={}, settings={"loopback_slot": 3}, prometheus_discovery="kubernetes_sd")


def test_unknown_fields_are_dropped_and_missing_ones_default():
    raw = json.loads(_info().to_json())
    raw["written_by_a_newer_version"] = True
    assert ClusterInfo.from_json(json.dumps(raw)) == _info()
    del raw["prometheus_discovery"]
    assert ClusterInfo.from_json(json.dumps(raw)).prometheus_discovery == "file_sd"
