"""The operator against the real API server: create, rollout, scale, delete, drift, invalid spec, crashes,
and two replicas. The operator runs as a separate process watching the test's namespace."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from flashserve.render.naming import group_name

from e2e.support import OperatorProcess, condition, get_json, wait_until

SAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "manifests" / "samples"


@pytest.fixture
def operator(cluster, namespace, crd_installed, tmp_path_factory):
    cluster.require_pools()
    procs: list[OperatorProcess] = []

    def start(**kw) -> OperatorProcess:
        op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path_factory.mktemp("op"), **kw).start()
        procs.append(op)
        return op

    op = start()
    op.wait_serving()
    op.start_another = start  # type: ignore[attr-defined]
    yield op
    for p in procs:
        p.stop()


def flashserve_status(cluster, *args: str) -> str:
    """`flashserve status ARGS` against the suite's cluster; its output (it must exit 0)."""
    out = subprocess.run([sys.executable, "-m", "flashserve.cli", "status", "--kubeconfig", str(cluster.kubeconfig),
                          *args], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def apply_serving(kubectl, namespace: str, spec: dict, name: str = "flash") -> dict:
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    return cr


def serving(kubectl, ns: str, name: str = "flash") -> dict:
    return get_json(kubectl, "-n", ns, "dss", name)


def statefulsets(kubectl, ns: str) -> list[dict]:
    return get_json(kubectl, "-n", ns, "statefulsets")["items"]


def pods(kubectl, ns: str) -> list[dict]:
    """The engine pods (the router's pods carry the serving label too)."""
    return get_json(kubectl, "-n", ns, "pods", "-l", "app.kubernetes.io/component=engine")["items"]


def ready(kubectl, ns: str, name: str = "flash", replicas: int | None = None) -> bool:
    obj = serving(kubectl, ns, name)
    st = obj.get("status") or {}
    want = obj["spec"]["replicas"] if replicas is None else replicas
    return (
        condition(obj, "Ready").get("status") == "True"
        and st.get("observedGeneration") == obj["metadata"]["generation"]
        and st.get("readyReplicas") == want
        and st.get("updatedReplicas") == want
    )


WIDE = {"parallelism": {"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency", "dbo": {"enabled": True}},
        "placement": {"accelerator": "GB200"}, "replicas": 2}  # fmt: skip


def test_create_places_groups_in_one_clique_and_becomes_ready(operator, kubectl, namespace, cluster):
    apply_serving(kubectl, namespace, WIDE)
    wait_until(lambda: ready(kubectl, namespace), 90, what="Ready=True")
    obj = serving(kubectl, namespace)
    uid = obj["metadata"]["uid"]
    stss = statefulsets(kubectl, namespace)
    assert sorted(s["metadata"]["name"] for s in stss) == [group_name("flash", 0), group_name("flash", 1)]
    for kind in ("statefulsets", "services", "poddisruptionbudgets"):
        for child in get_json(kubectl, "-n", namespace, kind)["items"]:
            refs = child["metadata"].get("ownerReferences") or []
            assert any(r["uid"] == uid and r.get("controller") for r in refs), f"{kind} not owned"
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(kubectl, "nodes")["items"]}
    by_group: dict[str, set[str]] = {}
    for p in pods(kubectl, namespace):
        assert p["status"]["phase"] == "Running"
        labels = nodes[p["spec"]["nodeName"]]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
        by_group.setdefault(p["metadata"]["labels"]["flashserve.io/group"], set()).add(labels["nvidia.com/gpu.clique"])
    assert len(by_group) == 2 and all(len(cliques) == 1 for cliques in by_group.values()), by_group
    status = obj["status"]
    assert status["selector"] == "flashserve.io/serving=flash"
    assert status["endpoint"] == f"http://flash.{namespace}.svc:8000/v1"
    table = kubectl("-n", namespace, "get", "dss", "flash").stdout.split("\n")
    assert table[0].split()[:3] == ["NAME", "READY", "DESIRED"] and table[1].split()[1:3] == ["2", "2"]
    # the same through `flashserve status`, which also names the router pods and the last start-up
    assert flashserve_status(cluster, "-n", namespace).splitlines()[1].split()[:2] == ["flash", "2/2"]
    text = flashserve_status(cluster, "flash", "-n", namespace)
    assert "groups        2 ready of 2 desired (2 exist, 2 on the current template)" in text, text
    assert re.search(r"\n    Ready +True +AllReplicasReady \(", text), text


def test_steady_state_makes_no_writes(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, {"replicas": 2})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready=True")
    time.sleep(3)
    before = operator.metrics()
    time.sleep(15)  # three resync periods
    after = operator.metrics()
    assert after["flashserve_reconciles_total"] > before["flashserve_reconciles_total"], "resync ran"
    for key in ("flashserve_child_writes_total", "flashserve_status_writes_total", "flashserve_api_requests_total"):
        assert after[key] == before[key], f"{key} grew while idle: {before[key]} -> {after[key]}"


def test_image_update_rolls_out_group_by_group(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, WIDE)
    wait_until(lambda: ready(kubectl, namespace), 90, what="Ready=True")
    new_image = "vllm/vllm-openai:v0.33.1"
    kubectl("-n", namespace, "patch", "dss", "flash", "--type", "merge",
            "-p", f'{{"spec":{{"engine":{{"image":"{new_image}"}}}}}}')  # fmt: skip
    started_at: dict[str, float] = {}
    done_at: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = time.monotonic()
        groups: dict[str, list[dict]] = {}
        for p in pods(kubectl, namespace):
            if not p["metadata"].get("deletionTimestamp"):
                groups.setdefault(p["metadata"]["labels"]["flashserve.io/group"], []).append(p)
        for g, ps in groups.items():
            images = {p["spec"]["containers"][0]["image"] for p in ps}
            assert len(images) == 1, f"group {g} runs mixed versions: {images}"
            if images == {new_image}:
                started_at.setdefault(g, now)
                if len(ps) == 2 and all(condition(p, "Ready").get("status") == "True" for p in ps):
                    done_at.setdefault(g, now)
        if len(done_at) == 2 and ready(kubectl, namespace):
            break
        time.sleep(0.3)
    assert len(done_at) == 2, f"rollout incomplete: started {started_at}, done {done_at}"
    first, second = sorted(started_at, key=started_at.get)
    assert started_at[second] >= done_at[first], "the second group started before the first was ready again"


@pytest.mark.parametrize("path", [[2, 4, 1]])
def test_scale_with_kubectl_scale(operator, kubectl, namespace, path):
    apply_serving(kubectl, namespace, {"replicas": path[0]})
    for n in path:
        kubectl("-n", namespace, "scale", "dss/flash", f"--replicas={n}")
        wait_until(lambda: ready(kubectl, namespace, replicas=n), 60, what=f"{n} ready groups")
        want = [group_name("flash", i) for i in range(n)]
        # Surplus groups leave routing first and go once drained (no engine listens here: at once after the
        # drain's settle time), so their StatefulSets may outlive the ready count by a few seconds.
        wait_until(lambda: sorted(s["metadata"]["name"] for s in statefulsets(kubectl, namespace)
                                  if not s["metadata"].get("deletionTimestamp")) == want, 60,
                   what=f"StatefulSets {want}")  # fmt: skip
    scale = get_json(kubectl, "-n", namespace, "dss", "flash", "--subresource=scale")
    assert scale["status"]["replicas"] == path[-1] and scale["status"]["selector"] == "flashserve.io/serving=flash"


def test_delete_garbage_collects_children(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, {"replicas": 2})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready=True")
    kubectl("-n", namespace, "delete", "dss", "flash", "--wait=true", timeout=60)
    wait_until(lambda: not statefulsets(kubectl, namespace) and not pods(kubectl, namespace)
               and not get_json(kubectl, "-n", namespace, "services")["items"], 60, what="children gone")  # fmt: skip


def test_drift_is_restored(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, {"replicas": 2})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready=True")
    sts_uid = get_json(kubectl, "-n", namespace, "sts", group_name("flash", 1))["metadata"]["uid"]
    kubectl("-n", namespace, "delete", "sts", group_name("flash", 1), "--wait=false")
    kubectl("-n", namespace, "delete", "svc", "flash")
    kubectl("-n", namespace, "patch", "sts", group_name("flash", 0), "--type", "merge",
            "-p", '{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":30}}}}')  # fmt: skip
    wait_until(lambda: get_json(kubectl, "-n", namespace, "sts", group_name("flash", 1))["metadata"]["uid"] != sts_uid, 20,
               what="deleted StatefulSet recreated")  # fmt: skip
    wait_until(lambda: kubectl("-n", namespace, "get", "svc", "flash", check=False).returncode == 0, 20,
               what="client Service recreated")  # fmt: skip
    wait_until(lambda: get_json(kubectl, "-n", namespace, "sts", group_name("flash", 0))["spec"]["template"]["spec"]
               ["terminationGracePeriodSeconds"] == 120, 20, what="edited StatefulSet restored")  # fmt: skip
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.kind=DeepSeekServing")
    assert any(e["reason"] == "DriftCorrected" for e in events["items"])
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready again")


def test_invalid_spec_is_reported_and_changes_nothing(operator, kubectl, namespace, cluster):
    # A token inline in env is refused at admission, and the refusal does not echo it.
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "flash"},
          "spec": {"engine": {"env": [{"name": "HF_TOKEN", "value": "hf_sEcReT-value-7"}]}}}  # fmt: skip
    out = kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert out.returncode != 0 and "spec.engine.env[0].name" in out.stderr and "sEcReT" not in out.stderr
    # An extraArgs item vLLM would not read passes admission (the CRD judges each item alone, see
    # docs/api-validation.md) but not the operator's validation.
    apply_serving(kubectl, namespace, {"engine": {"extraArgs": ["--no-such-flag"]}})
    wait_until(lambda: condition(serving(kubectl, namespace), "Ready").get("reason") == "InvalidSpec", 30,
               what="InvalidSpec")  # fmt: skip
    cond = condition(serving(kubectl, namespace), "Ready")
    assert cond["status"] == "False" and "spec.engine.extraArgs[0]" in cond["message"]
    assert "Ready=InvalidSpec" in flashserve_status(cluster, "-n", namespace).splitlines()[1]
    assert "spec.engine.extraArgs[0]" in flashserve_status(cluster, "flash", "-n", namespace)
    time.sleep(3)
    assert statefulsets(kubectl, namespace) == []
    kubectl("-n", namespace, "patch", "dss", "flash", "--type", "json", "-p", '[{"op":"remove","path":"/spec/engine/extraArgs"}]')
    wait_until(lambda: ready(kubectl, namespace), 60, what="recovered after the fix")


def test_admission_rejects_cel_rule(kubectl, namespace, crd_installed):
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "bad"},
          "spec": {"engine": {"extraArgs": ["--max-num-seqs=4"]}}}  # fmt: skip
    out = kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert out.returncode != 0 and "extraArgs may not set what the operator manages" in out.stderr, out.stderr


def _no_duplicates_or_orphans(kubectl, namespace: str, replicas: int, nodes: int) -> bool:
    names = sorted(s["metadata"]["name"] for s in statefulsets(kubectl, namespace))
    live = [p for p in pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")]
    return names == [group_name("flash", i) for i in range(replicas)] and len(live) == replicas * nodes


def test_sigkill_mid_scale_up_converges(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, {"replicas": 1})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready=True")
    kubectl("-n", namespace, "scale", "dss/flash", "--replicas=6")
    wait_until(lambda: len(statefulsets(kubectl, namespace)) >= 2, 20, interval=0.05, what="scale-up under way")
    operator.kill(signal.SIGKILL)
    again = operator.start_another()
    again.wait_serving(40)
    wait_until(lambda: ready(kubectl, namespace, replicas=6), 90, what="6 ready groups after restart")
    assert _no_duplicates_or_orphans(kubectl, namespace, 6, 1)


def test_sigkill_mid_rollout_leaves_no_half_updated_group(operator, kubectl, namespace):
    apply_serving(kubectl, namespace, {**WIDE, "replicas": 3})
    wait_until(lambda: ready(kubectl, namespace), 90, what="Ready=True")
    kubectl("-n", namespace, "patch", "dss", "flash", "--type", "merge",
            "-p", '{"spec":{"engine":{"image":"vllm/vllm-openai:v0.33.1"}}}')  # fmt: skip
    wait_until(lambda: any(p["spec"]["containers"][0]["image"].endswith("v0.33.1") for p in pods(kubectl, namespace)),
               30, interval=0.1, what="rollout under way")  # fmt: skip
    operator.kill(signal.SIGKILL)
    again = operator.start_another()
    again.wait_serving(40)
    wait_until(lambda: ready(kubectl, namespace, replicas=3), 150, what="rollout finished after restart")
    assert _no_duplicates_or_orphans(kubectl, namespace, 3, 2)
    assert {p["spec"]["containers"][0]["image"] for p in pods(kubectl, namespace)} == {"vllm/vllm-openai:v0.33.1"}


def test_two_operators_never_both_act(operator, kubectl, namespace):
    standby = operator.start_another()
    time.sleep(8)
    assert standby.metrics() == {}, "the standby serves metrics only once it leads"
    assert "standing by" in standby.logs()
    apply_serving(kubectl, namespace, {"replicas": 1})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready via the leader")
    operator.kill(signal.SIGKILL)
    standby.wait_serving(40)  # the lease expires (15 s) and the standby takes over
    kubectl("-n", namespace, "scale", "dss/flash", "--replicas=2")
    wait_until(lambda: ready(kubectl, namespace, replicas=2), 60, what="the new leader acts")
