"""The mock runtime's start-up by cache state: which caches a pod mounts (from the operator's rendering of
spec.startup), what each start finds on its nodes, what prefetch pods fill, and real engines that pay the
phases they were given."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random

import pytest
from flashserve_testbed.engine.replica import ENV_PHASES, MockSettings, parse_phases
from flashserve_testbed.runtime import startup
from flashserve_testbed.runtime.engine import ProbeSettings
from flashserve_testbed.runtime.launch import LaunchSettings, build_launch, default_engine_bin
from flashserve_testbed.runtime.runtime import Runtime, RuntimeSettings
from flashserve_testbed.startup_model import REFERENCE, WEIGHTS_HUB, WEIGHTS_NODE, WEIGHTS_SHARED, figures_for_cold

from tests.builders import node, pod_from_sample
from tests.runtime.waiting import ready, until

pytestmark = pytest.mark.timeout(90)

SETTINGS = LaunchSettings(engine_bin="/opt/venv/bin")
KERNEL_DIR_PREFIX = "gb200-tp1-dp4-n1-ep-"  # the operator's directory for this image and layout


def caches_of(sample: str, index: int = 0) -> startup.PodCaches:
    pod = pod_from_sample(sample, index)
    launch = build_launch(pod, node("NVIDIA-GB200"), SETTINGS)
    return startup.pod_caches(pod, pod["spec"]["containers"][0], launch.env)


# ---------------------------------------------------------------------------------------------- from pod specs
def test_the_caches_sample_mounts_a_weights_claim_and_a_kernel_directory_per_image_and_layout():
    pc = caches_of("gb200-startup-caches.yaml")
    assert pc.namespace == "demo" and pc.weights_claim == "deepseek-weights" and pc.kernel_claim == "deepseek-kernels"
    assert pc.kernel_dir.startswith(KERNEL_DIR_PREFIX) and "/" not in pc.kernel_dir
    assert pc.kernel_key == f"demo/deepseek-kernels/{pc.kernel_dir}"
    assert pc.image.startswith("vllm/vllm-openai:")


def test_a_serving_without_spec_startup_downloads_from_the_hub_and_compiles_every_time():
    pc = caches_of("gb200-minimal.yaml")
    assert pc.weights_claim is None and pc.kernel_key is None  # hf-cache is an emptyDir
    caches = startup.ClusterCaches()
    caches.started(pc, WEIGHTS_HUB, ["n0"])
    state = caches.state(pc, WEIGHTS_HUB, ["n0"])
    assert (state.weights, state.weights_filled, state.kernels_warm, state.image_present) == (WEIGHTS_HUB, False,
                                                                                              False, True)
    phases = startup.plan(state, REFERENCE).phases
    assert phases["download"] == REFERENCE.download and phases["compile"] == REFERENCE.compile
    assert phases["pull"] == 0  # the image stays on the node


@pytest.mark.parametrize("modes, scope", [(["ReadWriteMany"], WEIGHTS_SHARED), (["ReadOnlyMany"], WEIGHTS_SHARED),
                                          (["ReadWriteOnce"], WEIGHTS_NODE), (None, WEIGHTS_NODE)])
def test_the_weights_scope_comes_from_the_claims_access_modes(modes, scope):
    pvc = None if modes is None else {"spec": {"accessModes": modes}}
    assert startup.claim_scope(pvc) == scope


def test_start_up_pods_are_told_apart_by_their_labels_and_owner():
    labels = {startup.OWNER_LABEL: "flash", startup.COMPONENT_LABEL: startup.PREFETCH_COMPONENT}
    ds_pod = {"metadata": {"labels": labels, "ownerReferences": [{"kind": "DaemonSet"}]},
              "spec": {"nodeName": "n3"}}
    job_pod = {"metadata": {"labels": labels, "ownerReferences": [{"kind": "Job"}]}, "spec": {"nodeName": "n3"}}
    prepull = {"metadata": {"labels": {**labels, startup.COMPONENT_LABEL: startup.PREPULL_COMPONENT}}}
    engine = {"metadata": {"labels": {"flashserve.io/serving": "flash"}}}
    assert startup.startup_pod_role(ds_pod) == startup.PREFETCH_COMPONENT
    assert startup.startup_pod_role(prepull) == startup.PREPULL_COMPONENT
    assert startup.startup_pod_role(engine) is None
    assert startup.prefetch_node(ds_pod) == "n3" and startup.prefetch_node(job_pod) is None


# ---------------------------------------------------------------------------------------------- cache tracking
def test_node_local_first_pod_downloads_the_next_on_its_node_does_not_another_node_does():
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    first = startup.plan(caches.state(pc, WEIGHTS_NODE, ["n0"]), REFERENCE)
    assert first.cache_state == "cold" and first.paid == ["pull", "download", "load", "compile", "warmup"]
    caches.started(pc, WEIGHTS_NODE, ["n0"])

    same = startup.plan(caches.state(pc, WEIGHTS_NODE, ["n0"]), REFERENCE)
    assert same.cache_state == "warm" and same.paid == ["load", "warmup"]
    other = startup.plan(caches.state(pc, WEIGHTS_NODE, ["n1"]), REFERENCE)
    # the kernel claim is shared: another node still finds the kernels, but downloads and pulls again
    assert other.paid == ["pull", "download", "load", "warmup"] and other.cache_state == "cold"
    # a group spanning n0 and n1 is as slow as n1
    assert "download" in startup.plan(caches.state(pc, WEIGHTS_NODE, ["n0", "n1"]), REFERENCE).paid


def test_kernels_are_warm_after_the_first_ready_start_of_a_layout_only():
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    assert not caches.state(pc, WEIGHTS_NODE, ["n0"]).kernels_warm
    caches.started(pc, WEIGHTS_NODE, ["n0"])
    assert caches.state(pc, WEIGHTS_NODE, ["n0"]).kernels_warm
    other_layout = startup.PodCaches(pc.namespace, pc.weights_claim, pc.kernel_claim, "gb200-tp4-dp1-n1-abc", pc.image)
    assert not caches.state(other_layout, WEIGHTS_NODE, ["n0"]).kernels_warm
    # the same weights claim, so its node copy serves the other layout too
    assert caches.state(other_layout, WEIGHTS_NODE, ["n0"]).label == "weights-cached"


def test_a_kernel_claim_on_a_nodes_own_volume_is_warm_on_that_node_only():
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    caches.started(pc, WEIGHTS_NODE, ["n0"], kernel_scope=WEIGHTS_NODE)
    assert caches.state(pc, WEIGHTS_NODE, ["n0"], kernel_scope=WEIGHTS_NODE).kernels_warm
    assert not caches.state(pc, WEIGHTS_NODE, ["n1"], kernel_scope=WEIGHTS_NODE).kernels_warm
    assert not caches.state(pc, WEIGHTS_NODE, ["n0", "n1"], kernel_scope=WEIGHTS_NODE).kernels_warm
    caches.started(pc, WEIGHTS_NODE, ["n1"], kernel_scope=WEIGHTS_NODE)
    assert caches.state(pc, WEIGHTS_NODE, ["n0", "n1"], kernel_scope=WEIGHTS_NODE).label == "warm"


def test_a_shared_claim_is_filled_once_for_every_node():
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    assert "download" in startup.plan(caches.state(pc, WEIGHTS_SHARED, ["n0"]), REFERENCE).paid
    caches.started(pc, WEIGHTS_SHARED, ["n0"])
    for nodes in (["n0"], ["n7"], ["n7", "n8"]):
        phases = startup.plan(caches.state(pc, WEIGHTS_SHARED, nodes), REFERENCE).phases
        assert phases["download"] == 0 and phases["load"] == REFERENCE.load_shared


def test_prefetch_fills_its_node_or_the_shared_claim():
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    caches.prefetched("demo", "deepseek-weights", "n2")
    assert caches.state(pc, WEIGHTS_NODE, ["n2"]).weights_filled
    assert not caches.state(pc, WEIGHTS_NODE, ["n3"]).weights_filled
    caches.prefetched("other-ns", "deepseek-weights", None)  # another namespace's claim of the same name
    assert not caches.state(pc, WEIGHTS_SHARED, ["n3"]).weights_filled
    caches.prefetched("demo", "deepseek-weights", None)
    assert caches.state(pc, WEIGHTS_SHARED, ["n3"]).weights_filled


def test_the_profile_median_is_a_cold_start_and_noise_keeps_skipped_phases_at_zero():
    figures = figures_for_cold(20.0)
    assert figures.cold_total() == pytest.approx(20.0)
    assert figures.download / figures.compile == pytest.approx(REFERENCE.download / REFERENCE.compile)
    with pytest.raises(ValueError, match="must be positive"):
        figures_for_cold(0)
    pc = caches_of("gb200-startup-caches.yaml")
    caches = startup.ClusterCaches()
    caches.started(pc, WEIGHTS_NODE, ["n0"])
    totals = []
    for seed in range(200):
        p = startup.plan(caches.state(pc, WEIGHTS_NODE, ["n0"]), figures, random.Random(seed), 0.2)
        assert p.phases["download"] == 0 and p.phases["compile"] == 0 and p.phases["pull"] == 0
        totals.append(p.seconds)
    warm = figures.load_node + figures.warmup
    assert sorted(totals)[100] == pytest.approx(warm, rel=0.1)


# ---------------------------------------------------------------------------------------------- the engine side
def test_the_engine_reads_its_phases_and_refuses_a_malformed_plan():
    plan = startup.plan(startup.ClusterCaches().state(caches_of("gb200-minimal.yaml"), WEIGHTS_HUB, ["n0"]),
                        figures_for_cold(20.0))
    assert startup.ENV_PHASES == ENV_PHASES  # the runtime sets the variable the engine reads
    settings = MockSettings.from_env({ENV_PHASES: plan.env_value()})
    assert settings.cache_state == "cold"
    assert sum(settings.startup_phases.values()) == pytest.approx(plan.seconds, abs=0.01)
    assert list(settings.startup_phases) == ["pull", "download", "load", "compile", "warmup"]
    for bad in ("{", '{"phases": {"nap": 3}}', '{"phases": {"load": -1}}', "[1]"):
        with pytest.raises(ValueError, match=ENV_PHASES):
            parse_phases(bad)


# ---------------------------------------------------------------------------------------------- the runtime
def merge(pod: dict, patch: dict) -> dict:
    out = copy.deepcopy(pod)
    st = out.setdefault("status", {})
    for key, value in patch["status"].items():
        if key == "conditions":
            by_type = {c["type"]: c for c in st.get("conditions") or []}
            for c in value:
                by_type[c["type"]] = {k: v for k, v in {**by_type.get(c["type"], {}), **c}.items() if v is not None}
            st["conditions"] = list(by_type.values())
        else:
            st[key] = value
    out["metadata"]["resourceVersion"] = str(int(out["metadata"].get("resourceVersion") or 1) + 1)
    return out


class FakeAPI:
    """Engine pods of one node, the weights claim (ReadWriteOnce: NodeLocal) and the start-up pods."""

    def __init__(self, pods: list[dict], startup_pods: list[dict]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.startup_pods = startup_pods
        self.events: asyncio.Queue = asyncio.Queue()
        self.claims_read: list[str] = []

    async def get(self, path, params=None, timeout=30):
        if path.startswith("/api/v1/nodes/"):
            found = node("NVIDIA-GB200")
            found["metadata"]["name"] = path.rsplit("/", 1)[1]
            return found
        if "/persistentvolumeclaims/" in path:
            self.claims_read.append(path.rsplit("/", 1)[1])
            return {"spec": {"accessModes": ["ReadWriteOnce"]}}
        if params and params.get("labelSelector") == startup.OWNER_LABEL:
            return {"metadata": {"resourceVersion": "1"}, "items": self.startup_pods}
        return {"metadata": {"resourceVersion": "1"}, "items": list(self.pods.values())}

    async def watch(self, path, params, timeout_seconds=240):
        if params.get("labelSelector") == startup.OWNER_LABEL:
            await asyncio.Event().wait()
        while True:
            yield await self.events.get()

    async def patch_pod_status(self, namespace, name, body):
        if name not in self.pods:
            return None
        self.pods[name] = merge(self.pods[name], body)
        return self.pods[name]


def engine_pod(name: str, uid: str, ip: str) -> dict:
    pod = pod_from_sample("gb200-startup-caches.yaml", ip=ip)
    pod["metadata"].update(name=name, uid=uid, resourceVersion="1")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def test_the_runtime_gives_the_second_pod_on_a_node_no_download_and_fills_prefetched_nodes(tmp_path):
    first = engine_pod("flash-warm-g0-0", "uid-a", "127.99.251.7")
    prefetch = {"metadata": {"name": "prefetch-x", "namespace": "demo", "uid": "uid-p",
                             "labels": {startup.OWNER_LABEL: "flash-warm",
                                        startup.COMPONENT_LABEL: startup.PREFETCH_COMPONENT},
                             "ownerReferences": [{"kind": "DaemonSet", "name": "flash-warm-prefetch"}]},
                "spec": {"nodeName": "gb200-r1-n05", "volumes": [{"name": "hf-cache", "persistentVolumeClaim":
                                                                   {"claimName": "deepseek-weights"}}]},
                "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}  # long ago: done at once
    api = FakeAPI([first], [prefetch])
    # the demo profile: a cold start of ~20 engine-s, at 10x about 2 s
    settings = RuntimeSettings(launch=LaunchSettings(engine_bin=default_engine_bin(), time_scale=10, seed=1,
                                                     profile="gb200-4gpu-demo",
                                                     python_path=os.environ.get("PYTHONPATH")),
                               probe=ProbeSettings(interval=0.05), log_dir=tmp_path / "logs")

    async def scenario():
        runtime = Runtime(api, settings)
        task = asyncio.ensure_future(runtime.run())
        try:
            a = await until(lambda: runtime.engines.get("uid-a"))
            await until(lambda: ready(api.pods["flash-warm-g0-0"]))
            assert a.startup["cacheState"] == "cold" and "download" in a.startup["paid"]
            assert a.startup["phases"]["download"] == pytest.approx(figures_for_cold(20).download, rel=0.5)
            await until(lambda: a.startup_recorded)
            # the prefetch pod, running since long before, filled its own node only
            held = runtime.caches.as_dict()["weights"]["demo/deepseek-weights"]
            assert held["scope"] == WEIGHTS_NODE and set(held["nodes"]) == {"gb200-r0-n03", "gb200-r1-n05"}

            # the pod is replaced by another on the same node
            api.pods.pop("flash-warm-g0-0")
            await api.events.put({"type": "DELETED", "object": first})
            second = engine_pod("flash-warm-g0-1", "uid-b", "127.99.251.8")
            api.pods["flash-warm-g0-1"] = second
            await api.events.put({"type": "ADDED", "object": second})
            b = await until(lambda: runtime.engines.get("uid-b"))
            await until(lambda: ready(api.pods["flash-warm-g0-1"]))
            assert b.startup["cacheState"] == "warm" and b.startup["paid"] == ["load", "warmup"]
            assert b.startup["seconds"] < a.startup["seconds"] / 2
            # both pay the same process start; the first also ~2 s more of modelled phases at 10x
            assert b.ready_after < a.ready_after - 1.0
            assert api.claims_read == ["deepseek-weights", "deepseek-kernels"]  # each claim's scope, once
            log = a.log_path.read_text()
            assert "start-up phase download done" in log and "start-up plan {" in log
            plan = json.loads(log.split("start-up plan ", 1)[1].splitlines()[0])
            assert plan["cacheState"] == "cold" and plan["phases"]["download"] > 0
            assert "start-up phase download skipped (warm)" in b.log_path.read_text()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_an_explicit_start_up_and_the_cold_model_leave_the_caches_out(tmp_path):
    pod = engine_pod("flash-warm-g0-0", "uid-a", "127.99.251.9")
    for launch, model in ((LaunchSettings(engine_bin=default_engine_bin(), startup_seconds=3), startup.MODEL_CACHES),
                          (LaunchSettings(engine_bin=default_engine_bin()), startup.MODEL_COLD)):
        api = FakeAPI([pod], [])
        runtime = Runtime(api, RuntimeSettings(launch=launch, log_dir=tmp_path / "logs", startup_model=model))

        async def start():
            await runtime._sync([pod])
            engine = runtime.engines["uid-a"]
            await runtime.shutdown()
            return engine

        engine = asyncio.run(start())
        assert engine.plan_startup is None and runtime._startup_watch is None and not api.claims_read
        assert engine.startup == ({"model": "override", "seconds": 3.0} if model == startup.MODEL_CACHES
                                  else {"model": "cold"})
    with pytest.raises(ValueError, match="startup_model 'warm'"):
        Runtime(FakeAPI([], []), RuntimeSettings(launch=SETTINGS, startup_model="warm"))


def test_a_group_spanning_nodes_is_planned_on_the_nodes_of_its_pods_the_runtime_runs():
    from types import SimpleNamespace

    runtime = Runtime(FakeAPI([], []), RuntimeSettings(launch=SETTINGS))

    def engine(uid, node_name, group, ns="demo", kind="engine"):
        return SimpleNamespace(uid=uid, node=node_name, group_name=group, namespace=ns,
                               launch=SimpleNamespace(kind=kind))

    leader = engine("a", "n0", "flash-g0")
    runtime.engines = {"a": leader, "b": engine("b", "n1", "flash-g0"), "c": engine("c", "n2", "flash-g1"),
                       "d": engine("d", "n3", "flash-g0", ns="other"),
                       "r": engine("r", "n4", "flash-g0", kind="router")}
    assert runtime._group_nodes(leader) == ["n0", "n1"]
    assert runtime._group_nodes(engine("x", "n5", "")) == ["n5"]  # no group label: its own node
