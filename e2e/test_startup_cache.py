"""Start-up by cache state on the local cluster: a serving with a NodeLocal weights cache and a kernel cache,
both on `local` PersistentVolumes pinned to one GB200 node, run by the mock runtime in external readiness mode
with its start-up model (no --startup-seconds). The first replica on the node pays the download and the
compile; its replacement on the same node finds the weights and the kernels there and starts sooner, measured
from the API's own timestamps (container startedAt -> Ready).

A GB200 replica takes the node's four GPUs, so two replicas never share a node: the second start on the node
is the replica's pod recreated there (the volume's node affinity allows no other node).
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime

import pytest
import yaml

from e2e.support import OperatorProcess, free_port, start_runtime, stop_runtime, wait_until

pytestmark = pytest.mark.timeout(300)

SERVING = "flash-cache"
ENGINE_SELECTOR = "flashserve.io/serving,app.kubernetes.io/component=engine"
GB200 = "NVIDIA-GB200"


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _local_pv(name: str, node: str, modes: list[str], path: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": {"flashserve.io/e2e": "true"}},
            "spec": {"capacity": {"storage": "1Ti"}, "accessModes": modes, "persistentVolumeReclaimPolicy": "Retain",
                     "storageClassName": "flashserve-local-e2e", "local": {"path": path},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}


def _claim(name: str, namespace: str, volume: str, modes: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": modes, "storageClassName": "flashserve-local-e2e", "volumeName": volume,
                     "resources": {"requests": {"storage": "1Ti"}}}}


def _engines(status_url: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"{status_url}/-/engines", timeout=5) as resp:
        return {e["pod"]: e for e in json.load(resp)["engines"] if e["kind"] == "engine"}


def _running_to_ready(pod: dict) -> float:
    """Seconds from the engine container's start to the pod's Ready, as the API records them."""
    cs = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm")
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", pod["status"]
    return _epoch(ready["lastTransitionTime"]) - _epoch(cs["state"]["running"]["startedAt"])


def test_the_second_replica_on_a_node_skips_the_download_and_starts_sooner(external_cluster, kube, kubectl,
                                                                           crd_installed, namespace, tmp_path):
    from kubernetes import client

    info = external_cluster
    core = client.CoreV1Api(kube)
    node = sorted(n.metadata.name for n in core.list_node(label_selector=f"nvidia.com/gpu.product={GB200}").items)[0]
    weights_pv, kernels_pv = f"{namespace}-weights", f"{namespace}-kernels"
    objects = [_local_pv(weights_pv, node, ["ReadWriteOnce"], "/mnt/nvme/flashserve/weights"),
               _local_pv(kernels_pv, node, ["ReadWriteMany"], "/mnt/nvme/flashserve/kernels"),
               _claim("weights", namespace, weights_pv, ["ReadWriteOnce"]),
               _claim("kernels", namespace, kernels_pv, ["ReadWriteMany"])]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    operator = OperatorProcess(info.kubeconfig, namespace, tmp_path).start()
    port = free_port()
    status_url = f"http://127.0.0.1:{port}"
    # The demo profile: a cold start of ~20 engine-s, at time scale 1 (no --startup-seconds: the cache model)
    runtime = start_runtime(info, namespace, tmp_path, "--time-scale", "1", "--profile", "gb200-4gpu-demo",
                            "--status-port", str(port), "--probe-interval", "0.25")
    log = tmp_path / "runtime.log"
    try:
        wait_until(lambda: all(c.status.phase == "Bound" for c in core.list_namespaced_persistent_volume_claim(
            namespace).items), 30, what="the claims bound to their local volumes")
        operator.wait_serving()
        cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
              "metadata": {"name": SERVING, "namespace": namespace},
              "spec": {"placement": {"accelerator": "GB200"}, "replicas": 1,
                       "startup": {"weightsCache": {"scope": "NodeLocal", "claimName": "weights", "prefetch": False},
                                   "kernelCache": {"claimName": "kernels"}}}}
        kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

        def ready_pod(not_uid: str | None = None) -> dict | None:
            pods = json.loads(kubectl("get", "-n", namespace, "pods", "-l", ENGINE_SELECTOR, "-o", "json").stdout)
            for p in pods["items"]:
                if p["metadata"]["uid"] != not_uid and not p["metadata"].get("deletionTimestamp") and any(
                        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []):
                    return p
            assert runtime.poll() is None, log.read_text()[-4000:]
            return None

        first = wait_until(ready_pod, 90, interval=0.5, what="the first replica Ready")
        name = first["metadata"]["name"]
        assert first["spec"]["nodeName"] == node
        first_startup = _engines(status_url)[name]["startup"]
        first_took = _running_to_ready(first)

        # the replica's pod goes; the StatefulSet recreates it, and the volume allows only the same node
        kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
        second = wait_until(lambda: ready_pod(not_uid=first["metadata"]["uid"]), 90, interval=0.5,
                            what="the recreated replica Ready")
        assert second["spec"]["nodeName"] == node
        second_startup = _engines(status_url)[second["metadata"]["name"]]["startup"]
        second_took = _running_to_ready(second)
        with urllib.request.urlopen(f"{status_url}/-/caches", timeout=5) as resp:
            held = json.load(resp)
    finally:
        stop_runtime(runtime)
        operator.stop()
        kubectl("delete", "pv", weights_pv, kernels_pv, "--wait=false", check=False)

    print(f"\nfirst start {first_startup['cacheState']}: {first_startup['phases']} -> running->ready {first_took:.0f}s"
          f"\nsecond start {second_startup['cacheState']}: {second_startup['phases']} -> running->ready "
          f"{second_took:.0f}s")
    assert first_startup["model"] == "caches" and first_startup["cacheState"] == "cold"
    assert first_startup["paid"] == ["pull", "download", "load", "compile", "warmup"]
    assert second_startup["cacheState"] == "warm"
    assert second_startup["paid"] == ["load", "warmup"]  # no pull, download or compile on this node any more
    assert held["weights"][f"{namespace}/weights"] == {"scope": "node", "nodes": [node], "filled": False}
    assert len(held["kernels"]) == 1 and held["kernels"][0].startswith(f"{namespace}/kernels/gb200-")
    # the API's own timestamps (seconds): the download and compile the second start skipped
    assert second_took < first_took - 5, (first_took, second_took)
    assert first_took >= first_startup["seconds"] - 1.5  # Ready no sooner than the modelled start-up
