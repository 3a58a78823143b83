"""Small rules of the engine supervisor and the runtime loop."""

from __future__ import annotations

import socket

from flashserve_testbed.runtime.engine import address_free, backoff_seconds
from flashserve_testbed.runtime.runtime import runnable

KWOK = {"metadata": {"name": "n", "annotations": {"kwok.x-k8s.io/node": "fake"}}}
REAL = {"metadata": {"name": "n"}}


def pod(**status) -> dict:
    return {"metadata": {"name": "p", "labels": {"flashserve.io/serving": "flash"}},
            "spec": {"nodeName": "n"}, "status": {"phase": "Running", **status}}


def test_backoff_doubles_from_the_base_up_to_the_cap():
    assert [backoff_seconds(n, 10, 300) for n in range(7)] == [0, 10, 20, 40, 80, 160, 300]


def test_runnable_only_running_serving_pods_on_kwok_nodes():
    assert runnable(pod(), KWOK)
    assert not runnable(pod(), REAL)
    assert runnable(pod(), REAL, any_node=True)
    assert not runnable(pod(phase="Pending"), KWOK)
    assert not runnable(pod(), None)
    terminating = pod()
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not runnable(terminating, KWOK)
    unlabelled = pod()
    unlabelled["metadata"]["labels"] = {"flashserve.io/serving": ""}
    assert not runnable(unlabelled, KWOK)


def test_address_free_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert not address_free("127.0.0.1", port)
    assert address_free("127.0.0.1", port)
