"""Start-up by cache state on the local cluster: a serving with a NodeLocal weights cache and a kernel cache,
both on `local` PersistentVolumes pinned to one GB200 node, run by the mock runtime in external readiness mode
with its start-up model (no --startup-seconds). The first replica on the node pays the download and the
compile; its replacement on the same node finds the weights and the kernels there and starts sooner, measured
from the API's own timestamps (container startedAt -> Ready).

A GB200 replica takes the node's four GPUs, so two replicas never share a node: the second start on the node
is the replica's pod recreated there (the volume's node affinity allows no other node).

With prefetch and image pre-pull, the runtime marks the node filled once the prefetch pod has been running for
the download time (KWOK runs it without its init container), and a replica placed afterwards pays neither.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from e2e.support import OperatorProcess, free_port, start_runtime, stop_runtime, wait_until

pytestmark = pytest.mark.timeout(300)

SERVING = "flash-cache"
ENGINE_SELECTOR = "flashserve.io/serving,app.kubernetes.io/component=engine"
GB200 = "NVIDIA-GB200"


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _local_pv(name: str, nodes: list[str], modes: list[str], path: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"flashserve.io/e2e": "true"}},
            "spec": {"capacity": {"storage": "1Ti"}, "accessModes": modes, "persistentVolumeReclaimPolicy": "Retain",
                     "storageClassName": "flashserve-local-e2e", "local": {"path": path},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}}


def _claim(name: str, namespace: str, volume: str, modes: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": modes, "storageClassName": "flashserve-local-e2e", "volumeName": volume,
                     "resources": {"requests": {"storage": "1Ti"}}}}


def _running_to_ready(pod: dict) -> float:
    """Seconds from the engine container's start to the pod's Ready, as the API records them."""
    cs = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm")
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", pod["status"]
    return _epoch(ready["lastTransitionTime"]) - _epoch(cs["state"]["running"]["startedAt"])


@dataclass
class Stack:
    namespace: str
    node: str  # the one GB200 node the caches' volumes allow
    status_url: str
    kubectl: object
    runtime: object
    log: Path

    def engines(self) -> dict[str, dict]:
        with urllib.request.urlopen(f"{self.status_url}/-/engines", timeout=5) as resp:
            return {e["pod"]: e for e in json.load(resp)["engines"] if e["kind"] == "engine"}

    def caches(self) -> dict:
        with urllib.request.urlopen(f"{self.status_url}/-/caches", timeout=5) as resp:
            return json.load(resp)

    def apply(self, startup: dict, replicas: int) -> None:
        cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
              "metadata": {"name": SERVING, "namespace": self.namespace},
              "spec": {"placement": {"accelerator": "GB200"}, "replicas": replicas,
                       "startup": {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"},
                                   "kernelCache": {"claimName": "kernels"}, **startup}}}
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    def ready_pod(self, not_uid: str | None = None) -> dict | None:
        pods = json.loads(self.kubectl("get", "-n", self.namespace, "pods", "-l", ENGINE_SELECTOR, "-o",
                                       "json").stdout)
        for p in pods["items"]:
            if p["metadata"]["uid"] != not_uid and not p["metadata"].get("deletionTimestamp") and any(
                    c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []):
                return p
        assert self.runtime.poll() is None, self.log.read_text()[-4000:]
        return None


@contextlib.contextmanager
def cache_stack(info, kube, kubectl, namespace: str, tmp_path: Path, node_index: int | None,
                claims: tuple[str, str] = ("weights", "kernels")):
    """Local volumes for the weights (ReadWriteOnce: NodeLocal) and kernel (ReadWriteMany) claims on one GB200
    node (every GB200 node with `node_index` None: each node has its own disk under the path), the operator,
    and the mock runtime with its start-up model (the demo profile: a cold start of ~20 engine-s, at time
    scale 1). `claims` names the weights and kernel claims."""
    from kubernetes import client

    core = client.CoreV1Api(kube)
    nodes = sorted(n.metadata.name for n in core.list_node(label_selector=f"nvidia.com/gpu.product={GB200}").items)
    node = nodes[node_index] if node_index is not None else ""
    on = [node] if node_index is not None else nodes
    weights_pv, kernels_pv = f"{namespace}-weights", f"{namespace}-kernels"
    objects = [_local_pv(weights_pv, on, ["ReadWriteOnce"], "/mnt/nvme/flashserve/weights"),
               _local_pv(kernels_pv, on, ["ReadWriteMany"], "/mnt/nvme/flashserve/kernels"),
               _claim(claims[0], namespace, weights_pv, ["ReadWriteOnce"]),
               _claim(claims[1], namespace, kernels_pv, ["ReadWriteMany"])]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    operator = OperatorProcess(info.kubeconfig, namespace, tmp_path).start()
    port = free_port()
    runtime = start_runtime(info, namespace, tmp_path, "--time-scale", "1", "--profile", "gb200-4gpu-demo",
                            "--status-port", str(port), "--probe-interval", "0.25")
    try:
        wait_until(lambda: all(c.status.phase == "Bound" for c in core.list_namespaced_persistent_volume_claim(
            namespace).items), 30, what="the claims bound to their local volumes")
        operator.wait_serving()
        yield Stack(namespace, node, f"http://127.0.0.1:{port}", kubectl, runtime, tmp_path / "runtime.log")
    finally:
        stop_runtime(runtime)
        operator.stop()
        kubectl("delete", "pv", weights_pv, kernels_pv, "--wait=false", check=False)


def test_the_second_replica_on_a_node_skips_the_download_and_starts_sooner(external_cluster, kube, kubectl,
                                                                           crd_installed, namespace, tmp_path):
    with cache_stack(external_cluster, kube, kubectl, namespace, tmp_path, node_index=0) as stack:
        stack.apply({"weightsCache": {"scope": "NodeLocal", "claimName": "weights", "prefetch": False}}, replicas=1)
        first = wait_until(stack.ready_pod, 90, interval=0.5, what="the first replica Ready")
        name = first["metadata"]["name"]
        assert first["spec"]["nodeName"] == stack.node
        first_startup = stack.engines()[name]["startup"]
        first_took = _running_to_ready(first)

        # the replica's pod goes; the StatefulSet recreates it, and the volume allows only the same node
        kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
        second = wait_until(lambda: stack.ready_pod(not_uid=first["metadata"]["uid"]), 90, interval=0.5,
                            what="the recreated replica Ready")
        assert second["spec"]["nodeName"] == stack.node
        second_startup = stack.engines()[second["metadata"]["name"]]["startup"]
        second_took = _running_to_ready(second)
        held = stack.caches()

    print(f"\nfirst start {first_startup['cacheState']}: {first_startup['phases']} -> running->ready {first_took:.0f}s"
          f"\nsecond start {second_startup['cacheState']}: {second_startup['phases']} -> running->ready "
          f"{second_took:.0f}s")
    assert first_startup["model"] == "caches" and first_startup["cacheState"] == "cold"
    assert first_startup["paid"] == ["pull", "download", "load", "compile", "warmup"]
    assert second_startup["cacheState"] == "warm"
    assert second_startup["paid"] == ["load", "warmup"]  # no pull, download or compile on this node any more
    assert held["weights"][f"{namespace}/weights"] == {"scope": "node", "nodes": [stack.node], "filled": False}
    assert len(held["kernels"]) == 1 and held["kernels"][0].startswith(f"{namespace}/kernels/gb200-")
    # the API's own timestamps (seconds): the download and compile the second start skipped
    assert second_took < first_took - 5, (first_took, second_took)
    assert first_took >= first_startup["seconds"] - 1.5  # Ready no sooner than the modelled start-up


def test_a_prefetched_and_pre_pulled_node_starts_its_first_replica_without_pull_or_download(
        external_cluster, kube, kubectl, crd_installed, namespace, tmp_path):
    with cache_stack(external_cluster, kube, kubectl, namespace, tmp_path, node_index=1) as stack:
        # no replica yet: the prefetch and pre-pull DaemonSets warm the pool first (docs/startup.md)
        stack.apply({"imagePrepull": {"enabled": True}}, replicas=0)

        def warm() -> dict | None:
            held = stack.caches()
            claim = held["weights"].get(f"{namespace}/weights") or {}
            return held if stack.node in claim.get("nodes", []) and any(
                stack.node in nodes for nodes in held["images"].values()) else None

        held = wait_until(warm, 60, interval=0.5, what="the node prefetched and pre-pulled")
        log = stack.log.read_text()
        assert "prefetch done: claim weights filled on node " + stack.node in log
        # only the node the volume allows: the other nodes' prefetch pods cannot be placed
        assert held["weights"][f"{namespace}/weights"]["nodes"] == [stack.node]

        stack.apply({"imagePrepull": {"enabled": True}}, replicas=1)
        pod = wait_until(stack.ready_pod, 90, interval=0.5, what="the replica Ready")
        started = stack.engines()[pod["metadata"]["name"]]["startup"]

    print(f"\nafter prefetch and pre-pull: {started['cacheState']}: {started['phases']} -> running->ready "
          f"{_running_to_ready(pod):.0f}s")
    assert started["cacheState"] == "weights-cached"  # the kernels are compiled by this first start
    assert started["paid"] == ["load", "compile", "warmup"]


def test_the_caches_sample_applies_and_runs_with_its_prefetch_and_pre_pull(external_cluster, kube, kubectl,
                                                                            crd_installed, namespace, tmp_path):
    """`kubectl apply` of manifests/samples/gb200-startup-caches.yaml as shipped (its two claims, bound here to
    local volumes spanning the GB200 nodes, and its token Secret made first, as its header says): the prefetch
    and pre-pull DaemonSets are made, both replicas turn Ready, and each group's start-up is in status with the
    cache state it found."""
    sample = Path(__file__).resolve().parents[1] / "manifests" / "samples" / "gb200-startup-caches.yaml"
    cr = yaml.safe_load(sample.read_text())
    cr["metadata"]["namespace"] = namespace
    wc, kc = cr["spec"]["startup"]["weightsCache"]["claimName"], cr["spec"]["startup"]["kernelCache"]["claimName"]
    secret = cr["spec"]["model"]["source"]["huggingFace"]["tokenSecretRef"]["name"]
    kubectl("create", "secret", "generic", secret, "-n", namespace, "--from-literal=token=hf_e2e")
    with cache_stack(external_cluster, kube, kubectl, namespace, tmp_path, node_index=None, claims=(wc, kc)) as stack:
        kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        name = cr["metadata"]["name"]

        def both_recorded() -> list | None:
            obj = json.loads(kubectl("get", "dss", name, "-n", namespace, "-o", "json").stdout)
            recent = ((obj.get("status") or {}).get("startup") or {}).get("recent") or []
            return recent if len(recent) >= cr["spec"]["replicas"] else None

        recent = wait_until(both_recorded, 150, interval=1.0, what="both groups' start-ups in status")
        kinds = json.loads(kubectl("get", "daemonsets", "-n", namespace, "-o", "json").stdout)["items"]
        engines = stack.engines()
    components = sorted(d["metadata"]["labels"].get("app.kubernetes.io/component", "") for d in kinds)
    print(f"\nsample {sample.name}: {[(r['group'], r['cacheState'], r['seconds']) for r in recent]}; "
          f"engines {[(e['pod'], e['startup']['cacheState'], e['startup']['paid']) for e in engines.values()]}")
    assert components == ["image-prepull", "weights-prefetch"], components
    assert {r["group"] for r in recent} == set(range(cr["spec"]["replicas"]))
    assert all(r["cacheState"] in ("cold", "weights-cached", "warm") for r in recent)
    assert all(r["seconds"]["ready"] is not None and r["seconds"]["ready"] >= r["seconds"]["running"] for r in recent)
    assert len(engines) == cr["spec"]["replicas"] and all(e["startup"]["model"] == "caches" for e in engines.values())
