"""The runtime's static CPU manager: which containers get cores of their own, how cores are handed out and
refused, and that a running process group is moved onto its cores."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from flashserve_testbed.runtime.cpuset import CpuManager, NotEnoughCpus, allowed_cpus, pin_groups, whole_cpus


def _pod(qos: str | None, cpu: str | None) -> tuple[dict, dict]:
    container = {"name": "router", "resources": {"requests": {"memory": "1Gi", **({"cpu": cpu} if cpu else {})}}}
    return {"status": {"qosClass": qos} if qos else {}}, container


@pytest.mark.parametrize("qos,cpu,cores", [
    ("Guaranteed", "2", 2),
    ("Guaranteed", "2000m", 2),  # the kubelet reads the quantity, not its spelling
    ("Guaranteed", "1500m", 0),  # a fraction of a core: the shared pool
    ("Guaranteed", None, 0),
    ("Burstable", "2", 0),  # a request without an equal limit
    (None, "2", 0),  # the API server has not classed it
])  # fmt: skip
def test_only_guaranteed_whole_cores_are_pinned(qos, cpu, cores):
    assert whole_cpus(*_pod(qos, cpu)) == cores


def test_cores_are_handed_out_high_first_and_the_shared_pool_keeps_one():
    m = CpuManager(range(4))
    assert m.allocate("a", 2) == {2, 3}
    assert m.shared == {0, 1}
    assert m.allocate("a", 2) == {2, 3}  # a restart keeps its cores
    with pytest.raises(NotEnoughCpus, match="2 asked, 2 shared of 4, 1 of them reserved"):
        m.allocate("b", 2)
    assert m.allocate("b", 1) == {1}
    assert m.cpus_for("b") == {1} and m.cpus_for("other") == {0}
    assert m.release("a") and not m.release("a")
    assert m.shared == {0, 2, 3}
    assert m.allocate("c", 2) == {2, 3}


def test_a_running_process_group_moves_onto_its_cores():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores to tell a pinned process from an unpinned one")
    # a leader and a child in one new session, as the runtime starts a pod's command
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        children = []
        for _ in range(50):
            children = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
            if children:
                break
            time.sleep(0.02)
        assert children and allowed_cpus(children[0]) == cpus
        moved = pin_groups({proc.pid}, frozenset(cpus[-1:]))
        assert moved >= 2
        assert allowed_cpus(proc.pid) == cpus[-1:] and allowed_cpus(children[0]) == cpus[-1:]
        pin_groups({proc.pid}, frozenset(cpus))
        assert allowed_cpus(children[0]) == cpus
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
