"""Group start-ups on the real API server: the operator's status.startup holds, for each replica group, the
StatefulSet's creation and its pods' PodScheduled, engine start and Ready times exactly as the API server
holds them (to the second), and the histogram on its metrics endpoint counts each start-up once; a group
placed after the node-local prefetch is weights-cached, and the next group of the same kernel-cache key warm."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import yaml

from e2e.support import OperatorProcess, condition, get_json, wait_until

WIDE = {"parallelism": {"nodesPerReplica": 2}, "placement": {"accelerator": "GB200"}, "replicas": 2,
        "routing": {"enabled": False}}  # fmt: skip


@pytest.fixture
def operator(cluster, namespace, crd_installed, tmp_path_factory):
    cluster.require_pools()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path_factory.mktemp("op")).start()
    op.wait_serving()
    yield op
    op.stop()


def seconds(text: str | None) -> float | None:
    return None if not text else dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def latest(pods: list[dict], when) -> float | None:
    times = [when(p) for p in pods]
    return None if any(t is None for t in times) else max(times)


def scheduled_at(p: dict) -> float | None:
    c = condition(p, "PodScheduled")
    return seconds(c.get("lastTransitionTime")) if c.get("status") == "True" else None


def started_at(p: dict) -> float | None:
    engine = next((c for c in p["status"].get("containerStatuses") or [] if c["name"] == "vllm"), {})
    return seconds(((engine.get("state") or {}).get("running") or {}).get("startedAt"))


def ready_at(p: dict) -> float | None:
    c = condition(p, "Ready")
    return seconds(c.get("lastTransitionTime")) if c.get("status") == "True" else None


def test_status_startup_holds_each_groups_times_as_the_api_server_gives_them(operator, kubectl, namespace):
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": "flash", "namespace": namespace}, "spec": WIDE}  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    def recorded() -> list[dict]:
        startup = (get_json(kubectl, "-n", namespace, "dss", "flash").get("status") or {}).get("startup") or {}
        return startup.get("recent") or []

    records = wait_until(lambda: len(recorded()) == 2 and recorded(), 120, what="two start-ups in status.startup")
    obj = get_json(kubectl, "-n", namespace, "dss", "flash")
    assert obj["status"]["startup"]["last"] == records[-1]
    stss = {s["metadata"]["uid"]: s for s in get_json(kubectl, "-n", namespace, "statefulsets")["items"]}
    engines = get_json(kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/component=engine")["items"]
    assert sorted(r["group"] for r in records) == [0, 1]
    for r in records:
        sts = stss[r["uid"]]
        assert r["statefulSet"] == sts["metadata"]["name"] and r["cacheState"] == "cold"
        mine = [p for p in engines if any(o["uid"] == r["uid"] for o in p["metadata"].get("ownerReferences") or [])]
        assert len(mine) == 2
        want = {"created": seconds(sts["metadata"]["creationTimestamp"]), "scheduled": latest(mine, scheduled_at),
                "running": latest(mine, started_at), "ready": latest(mine, ready_at)}  # fmt: skip
        assert None not in want.values(), want
        for phase, t in want.items():
            assert abs(seconds(r[phase]) - t) <= 1, (phase, r, want)
        for phase in ("scheduled", "running", "ready"):
            assert abs(r["seconds"][phase] - (want[phase] - want["created"])) <= 1, (phase, r)

    # Each start-up observed once per phase; nothing more while the serving is steady.
    def counts() -> dict[str, float]:
        return {k: v for k, v in operator.metrics().items()
                if k.startswith("flashserve_group_startup_seconds_count") and f'namespace="{namespace}"' in k}  # fmt: skip

    got = wait_until(lambda: len(counts()) == 3 and counts(), 30, what="histogram series")
    assert sorted(got.values()) == [2.0, 2.0, 2.0], got
    writes = operator.metrics()["flashserve_status_writes_total"]
    time.sleep(12)  # two resync periods
    assert counts() == got and operator.metrics()["flashserve_status_writes_total"] == writes


def local_volume(name: str, claim: str, namespace: str, path: str) -> list[dict]:
    """A `local` PersistentVolume spanning the GB200 pool and the claim bound to it (docs/startup.md)."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
          "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteOnce"], "storageClassName": name,
                   "persistentVolumeReclaimPolicy": "Retain", "local": {"path": path},
                   "claimRef": {"namespace": namespace, "name": claim},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-GB200"]}]}]}}}}  # fmt: skip
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": name, "volumeName": name,
                    "resources": {"requests": {"storage": "1Ti"}}}}  # fmt: skip
    return [pv, pvc]


def test_a_group_placed_after_the_prefetch_is_weights_cached_and_the_next_one_warm(operator, kubectl, namespace):
    volumes = [*local_volume(f"{namespace}-w", "weights", namespace, "/mnt/weights"),
               *local_volume(f"{namespace}-k", "kernels", namespace, "/mnt/kernels")]  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(volumes))
    try:
        spec = {**WIDE, "replicas": 0, "startup": {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"},
                                                   "kernelCache": {"claimName": "kernels"}}}  # fmt: skip
        cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
              "metadata": {"name": "flash", "namespace": namespace}, "spec": spec}  # fmt: skip
        kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

        def prefetched() -> bool:
            items = get_json(kubectl, "-n", namespace, "daemonsets")["items"]
            ds = [d for d in items if d["metadata"]["name"].endswith("-prefetch")]
            st = (ds[0].get("status") or {}) if ds else {}
            return bool(st.get("desiredNumberScheduled")) and st.get("numberReady") == st["desiredNumberScheduled"]

        wait_until(prefetched, 120, what="the prefetch DaemonSet Ready on every GB200 node")

        def recent() -> list[dict]:
            obj = get_json(kubectl, "-n", namespace, "dss", "flash")
            return ((obj.get("status") or {}).get("startup") or {}).get("recent") or []

        for replicas in (1, 2):
            kubectl("-n", namespace, "patch", "dss", "flash", "--type", "merge", "-p",
                    f'{{"spec":{{"replicas":{replicas}}}}}')  # fmt: skip
            wait_until(lambda: len(recent()) == replicas, 120, what=f"{replicas} start-ups in status.startup")
        first, second = recent()
        assert (first["group"], first["cacheState"]) == (0, "weights-cached"), first
        assert (second["group"], second["cacheState"]) == (1, "warm"), second
        startup = get_json(kubectl, "-n", namespace, "dss", "flash")["status"]["startup"]
        assert [k["since"] for k in startup["warmKernelCaches"]] == [first["ready"]]
    finally:
        kubectl("delete", "pv", f"{namespace}-w", f"{namespace}-k", "--wait=false", check=False)
