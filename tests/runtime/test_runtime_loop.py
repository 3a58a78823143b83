"""The runtime's loop against a stand-in API server: real mock engine processes, status patches and Prometheus
targets, from a pod's start to its deletion, and an engine that dies."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal

import pytest
from flashserve_testbed.runtime.cpuset import CpuManager
from flashserve_testbed.runtime.engine import ProbeSettings
from flashserve_testbed.runtime.launch import LaunchSettings, default_engine_bin
from flashserve_testbed.runtime.runtime import Runtime, RuntimeSettings

from tests.builders import node, pod_from_sample
from tests.runtime.waiting import ready, until

pytestmark = pytest.mark.timeout(90)


def merge(pod: dict, patch: dict) -> dict:
    """A strategic merge of a status patch as the API server applies it: conditions by type, lists replaced."""
    out = copy.deepcopy(pod)
    st = out.setdefault("status", {})
    for key, value in patch["status"].items():
        if key == "conditions":
            by_type = {c["type"]: c for c in st.get("conditions") or []}
            for c in value:
                merged = {**by_type.get(c["type"], {}), **c}
                by_type[c["type"]] = {k: v for k, v in merged.items() if v is not None}
            st["conditions"] = list(by_type.values())
        else:
            st[key] = value
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


class FakeAPI:
    def __init__(self, pod: dict, node_obj: dict) -> None:
        self.pod = pod
        self.node = node_obj
        self.events: asyncio.Queue = asyncio.Queue()
        self.patches: list[dict] = []

    async def get(self, path, params=None, timeout=30):
        if path.startswith("/api/v1/nodes/"):
            return self.node
        return {"metadata": {"resourceVersion": "1"}, "items": [self.pod]}

    async def watch(self, path, params, timeout_seconds=240):
        while True:
            event = await self.events.get()
            yield event

    async def patch_pod_status(self, namespace, name, body):
        self.patches.append(body)
        self.pod = merge(self.pod, body)
        return self.pod


def test_pod_lifecycle_with_a_real_engine(tmp_path):
    pod = pod_from_sample("gb200-minimal.yaml", ip="127.99.250.7")
    pod["metadata"]["resourceVersion"] = "1"
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pod["status"]["containerStatuses"] = [{"name": "vllm", "image": "x", "ready": False, "restartCount": 0,
                                           "state": {"running": {"startedAt": "T0"}}}]
    api = FakeAPI(pod, node("NVIDIA-GB200"))
    file_sd = tmp_path / "targets" / "flashserve-runtime.json"
    settings = RuntimeSettings(
        launch=LaunchSettings(engine_bin=default_engine_bin(), time_scale=10, startup_seconds=5, seed=1),
        probe=ProbeSettings(interval=0.1, backoff_base=1.0), file_sd=file_sd, log_dir=tmp_path / "logs")

    async def scenario():
        runtime = Runtime(api, settings)
        task = asyncio.ensure_future(runtime.run())
        try:
            engine = await until(lambda: next(iter(runtime.engines.values()), None))
            assert engine.launch.address == "127.99.250.7"
            await until(lambda: engine.pid)
            # loading (5 engine-s at 10x): running, not ready, already a Prometheus target
            targets = await until(lambda: file_sd.exists() and json.loads(file_sd.read_text()))
            assert targets[0]["targets"] == ["127.99.250.7:8000"]
            assert targets[0]["labels"]["pod"] == pod["metadata"]["name"]
            assert not ready(api.pod)
            cs = api.pod["status"]["containerStatuses"][0]
            assert cs["containerID"] == f"flashserve-mock://{engine.pid}" and cs["restartCount"] == 0
            assert not engine.healthy
            await until(lambda: ready(api.pod))
            assert api.pod["status"]["containerStatuses"][0]["ready"] is True
            assert engine.healthy

            # the engine dies: not ready at once, terminated with 137, then restarted after the back-off
            pid = engine.pid
            os.kill(pid, signal.SIGKILL)
            await until(lambda: not ready(api.pod), timeout=3)
            term = api.pod["status"]["containerStatuses"][0]["state"]["terminated"]
            assert term["exitCode"] == 137 and term["containerID"] == f"flashserve-mock://{pid}"
            assert not engine.healthy
            await until(lambda: ready(api.pod))
            cs = api.pod["status"]["containerStatuses"][0]
            assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 137
            new_pid = engine.pid

            # a steady ready pod costs no writes
            writes = len(api.patches)
            await asyncio.sleep(0.5)
            assert len(api.patches) == writes

            # the pod is deleted: the engine stops and leaves the targets
            await api.events.put({"type": "DELETED", "object": api.pod})
            await until(lambda: not runtime.engines and _gone(new_pid))
            await until(lambda: json.loads(file_sd.read_text()) == [])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert not file_sd.exists()

    asyncio.run(scenario())


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie not yet reaped."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _run_guaranteed(tmp_path, ip: str, cpu: str, check, cpus: range | None = None) -> None:
    """Run the runtime over one pod the API server classed Guaranteed (its container's limits equal its requests,
    `cpu` cores), on the host's cores or on `cpus`, and `await check(runtime, api)`."""
    pod = pod_from_sample("gb200-minimal.yaml", ip=ip)
    c = pod["spec"]["containers"][0]
    c["resources"]["requests"]["cpu"] = c["resources"]["limits"]["cpu"] = cpu
    pod["status"]["qosClass"] = "Guaranteed"
    pod["metadata"]["resourceVersion"] = "1"
    api = FakeAPI(pod, node("NVIDIA-GB200"))
    settings = RuntimeSettings(
        launch=LaunchSettings(engine_bin=default_engine_bin(), time_scale=10, startup_seconds=5, seed=1),
        probe=ProbeSettings(interval=0.1, backoff_base=1.0), file_sd=None, log_dir=tmp_path / "logs")

    async def scenario():
        runtime = Runtime(api, settings)
        if cpus is not None:
            runtime.cpus = CpuManager(cpus)
        task = asyncio.ensure_future(runtime.run())
        try:
            await check(runtime, api)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_a_guaranteed_pod_runs_on_cores_of_its_own_and_gives_them_back(tmp_path):
    host = sorted(os.sched_getaffinity(0))
    if len(host) < 2:
        pytest.skip("the shared pool keeps one core: pinning needs two")

    async def check(runtime, api):
        engine = await until(lambda: next(iter(runtime.engines.values()), None))
        pid = await until(lambda: engine.pid)
        assert sorted(os.sched_getaffinity(pid)) == host[-1:]
        assert runtime.cpus.shared == set(host[:-1])
        await api.events.put({"type": "DELETED", "object": api.pod})
        await until(lambda: not runtime.cpus.held)
        assert runtime.cpus.shared == set(host)

    _run_guaranteed(tmp_path, "127.99.250.8", "1", check)


def test_a_pod_whose_cores_are_not_free_is_refused_and_not_started(tmp_path):
    async def check(runtime, api):
        term = await until(lambda: next((cs["state"]["terminated"] for cs in api.pod["status"].get(
            "containerStatuses") or [] if "terminated" in cs.get("state", {})), None))
        assert term["reason"] == "UnexpectedAdmissionError"
        assert "2 asked, 2 shared of 2" in term["message"]
        engine = next(iter(runtime.engines.values()))
        assert engine.pid is None and not runtime.cpus.held

    # a 2-core host keeps one core shared: 2 are never free
    _run_guaranteed(tmp_path, "127.99.250.9", "2000m", check, cpus=range(2))
