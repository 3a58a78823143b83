"""Prometheus file_sd targets: labels, determinism, atomic replacement."""

from __future__ import annotations

import json
import os

from flashserve_testbed.runtime.filesd import EngineTarget, target_groups, write_targets

A = EngineTarget("127.64.0.1", 8000, "demo", "flash-g1-0", "flash", "1", "gb200-r0-n00")
B = EngineTarget("127.64.1.1", 8000, "demo", "flash-g0-0", "flash", "0")


def test_one_group_per_engine_with_the_labels_queries_use():
    groups = target_groups([A, B], status="127.0.0.1:18000")
    assert groups[0] == {"targets": ["127.64.1.1:8000"],
                         "labels": {"job": "vllm", "namespace": "demo", "pod": "flash-g0-0", "serving": "flash",
                                    "group": "0"}}
    assert groups[1]["labels"]["node"] == "gb200-r0-n00"
    assert groups[2] == {"targets": ["127.0.0.1:18000"], "labels": {"job": "flashserve-runtime"}}
    assert target_groups([B, A]) == target_groups([A, B])


def test_write_is_atomic_and_skips_unchanged_content(tmp_path):
    path = tmp_path / "targets" / "flashserve-runtime.json"
    assert write_targets(path, [A, B]) is True
    first = os.stat(path)
    assert json.loads(path.read_text())[0]["labels"]["pod"] == "flash-g0-0"
    assert write_targets(path, [B, A]) is False  # same content: Prometheus is not poked
    assert os.stat(path).st_ino == first.st_ino
    assert write_targets(path, [A]) is True
    assert os.stat(path).st_ino != first.st_ino  # replaced by rename, never rewritten in place
    assert len(json.loads(path.read_text())) == 1
    assert [p.name for p in path.parent.iterdir()] == ["flashserve-runtime.json"]  # no temporary left behind


def test_a_router_pod_is_its_own_job_on_its_metrics_port_without_a_group():
    r = EngineTarget("127.64.2.1", 29000, "demo", "flash-router-x", "flash", "", "cpu-0", job="vllm-router")
    (group,) = target_groups([r])
    assert group == {"targets": ["127.64.2.1:29000"],
                     "labels": {"job": "vllm-router", "namespace": "demo", "pod": "flash-router-x",
                                "serving": "flash", "node": "cpu-0"}}
