"""Smoke tests against a real API server: the CRD, CEL admission, server-side validation of everything the
renderer emits, and clique-aware scheduling on the simulated GB200 racks."""

from __future__ import annotations

import copy
import json
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

if TYPE_CHECKING:
    from e2e.conftest import E2ECluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "flashserve.io_deepseekservings.yaml"
SAMPLES = sorted((REPO / "manifests" / "samples").glob("*.yaml"))
WIDE_EP = REPO / "manifests" / "samples" / "gb200-nvl72-wide-ep.yaml"
CLIQUE = "nvidia.com/gpu.clique"
SERVING = "flashserve.io/serving"
GROUP = "flashserve.io/group"


def render(cr: dict) -> list[dict]:
    from flashserve.render.renderer import render as render_

    return render_(cr)


def load_cr(path: Path, namespace: str, name: str | None = None) -> dict:
    cr = yaml.safe_load(path.read_text())
    cr["metadata"]["namespace"] = namespace
    if name:
        cr["metadata"]["name"] = name
    return cr


def as_list(objs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def pods(kube, namespace: str, selector: str = "") -> list:
    from kubernetes import client

    return client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=selector).items


def wait_for(what: str, check, timeout: float = 90, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def condition(pod, type_: str):
    return next((c for c in (pod.status.conditions or []) if c.type == type_), None)


def node_labels(kube) -> dict[str, dict[str, str]]:
    from kubernetes import client

    return {n.metadata.name: n.metadata.labels or {} for n in client.CoreV1Api(kube).list_node().items}


# -- the cluster itself ----------------------------------------------------------------------------------------

def test_node_pools_look_like_blackwell_fleets(cluster: E2ECluster, kube):
    from kubernetes import client

    info = cluster.require_pools()
    managed = "app.kubernetes.io/managed-by=flashserve-localcluster"
    nodes = client.CoreV1Api(kube).list_node(label_selector=managed).items
    by_pool = Counter(n.metadata.labels["flashserve.io/pool"] for n in nodes)
    assert dict(by_pool) == {name: p["nodes"] for name, p in info.pools.items() if p["nodes"]}

    gb200 = [n for n in nodes if n.metadata.labels["flashserve.io/pool"] == "gb200"]
    cliques = Counter(n.metadata.labels[CLIQUE] for n in gb200)
    assert len(cliques) == info.pools["gb200"]["racks"]
    assert set(cliques.values()) == {info.pools["gb200"]["nodesPerRack"]}
    for n in gb200:
        assert n.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
        assert n.metadata.labels["nvidia.com/gpu.count"] == "4"
        assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert n.status.capacity["nvidia.com/gpu"] == n.status.allocatable["nvidia.com/gpu"] == "4"
        assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in n.spec.taints)
    for n in nodes:
        assert condition(n, "Ready").status == "True", n.metadata.name


def test_prometheus_scrapes_file_sd_targets(cluster: E2ECluster):
    info = cluster.require_pools()
    if not info.prometheus_url:
        pytest.skip("the local cluster runs without Prometheus")
    port = urllib.parse.urlparse(info.prometheus_url).port
    target = info.file_sd_dir / "e2e-smoke.json"
    # Prometheus scraping itself under another job name proves the file_sd directory is watched.
    target.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"job": "e2e-smoke"}}]))
    try:
        def up():
            q = urllib.parse.urlencode({"query": 'up{job="e2e-smoke"}'})
            with urllib.request.urlopen(f"{info.prometheus_url}/api/v1/query?{q}", timeout=5) as resp:
                result = json.load(resp)["data"]["result"]
            return result and result[0]["value"][1] == "1"

        wait_for("Prometheus to scrape the file_sd target", up, timeout=60, interval=1)
    finally:
        target.unlink(missing_ok=True)


# -- the CRD and admission -------------------------------------------------------------------------------------

def test_crd_is_established(crd_installed: str, kubectl):
    crd = json.loads(kubectl("get", "crd", crd_installed, "-o", "json").stdout)
    conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conds.get("NamesAccepted") == "True"
    assert conds.get("Established") == "True"
    assert conds.get("NonStructuralSchema") is None


def _cel_message(rule: str) -> str:
    def walk(node):
        if isinstance(node, dict):
            for v in node.get("x-kubernetes-validations", []):
                if v.get("rule") == rule:
                    return v["message"]
            return next((m for m in map(walk, node.values()) if m), None)
        if isinstance(node, list):
            return next((m for m in map(walk, node) if m), None)
        return None

    message = walk(yaml.safe_load(CRD_FILE.read_text()))
    assert message, f"CRD has no rule {rule!r}"
    return message


def test_cel_rule_rejects_at_admission(crd_installed: str, namespace: str, kubectl):
    message = _cel_message("self.minReplicas <= self.maxReplicas")
    cr = load_cr(REPO / "manifests" / "samples" / "gb200-autoscaling.yaml", namespace, "bad-bounds")
    cr["spec"]["autoscaling"].update(minReplicas=5, maxReplicas=2)
    proc = kubectl("apply", "-f", "-", input=json.dumps(cr), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "Invalid value" in proc.stderr and message in proc.stderr, proc.stderr
    assert kubectl("get", "deepseekservings", "-n", namespace, "-o", "name").stdout.strip() == ""


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_sample_and_its_objects_pass_server_dry_run(sample: Path, crd_installed: str, namespace: str, kubectl):
    cr = load_cr(sample, namespace)
    # InferencePools need the gateway's CRD: test_inferencepool.py dry-runs every sample's pool against ours.
    objs = [o for o in render(copy.deepcopy(cr)) if o["kind"] != "InferencePool"]
    assert objs, f"{sample.name} rendered nothing"
    assert {o["metadata"].get("namespace", namespace) for o in objs} == {namespace}
    kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(cr))
    out = kubectl("apply", "--dry-run=server", "-f", "-", input=as_list(objs)).stdout
    assert out.count("(server dry run)") == len(objs), out


# -- scheduling on the simulated racks ---------------------------------------------------------------------------

def test_multi_node_groups_stay_in_one_clique(cluster: E2ECluster, namespace: str, kube, kubectl):
    cluster.require_pools()
    objs = render(load_cr(WIDE_EP, namespace))
    statefulsets = [o for o in objs if o["kind"] == "StatefulSet"]
    expected = sum(s["spec"]["replicas"] for s in statefulsets)
    assert len(statefulsets) >= 2 and expected >= 4
    kubectl("apply", "-f", "-", input=as_list(objs))

    def all_running():
        ps = pods(kube, namespace, "app.kubernetes.io/component=engine")  # the router's pods are not counted
        return ps if len(ps) == expected and all(p.status.phase == "Running" for p in ps) else None

    running = wait_for(f"{expected} pods Running", all_running, timeout=120)
    labels = node_labels(kube)
    for sts in statefulsets:
        group = [p for p in running if p.metadata.labels[GROUP] == sts["metadata"]["labels"][GROUP]]
        assert len(group) == sts["spec"]["replicas"]
        assert len({labels[p.spec.node_name][CLIQUE] for p in group}) == 1, [p.spec.node_name for p in group]
        assert len({p.spec.node_name for p in group}) == len(group), "two pods of a group share a node"
        for p in group:
            assert labels[p.spec.node_name]["nvidia.com/gpu.product"] == "NVIDIA-GB200"


def test_group_larger_than_a_clique_stays_pending(cluster: E2ECluster, namespace: str, kube, kubectl):
    info = cluster.require_pools()
    per_rack = info.pools["gb200"]["nodesPerRack"]
    objs = render(load_cr(WIDE_EP, namespace, "too-big"))
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    sts["spec"]["replicas"] = per_rack + 1  # one node more than an NVLink domain holds
    kubectl("apply", "-f", "-", input=as_list([o for o in objs if o["kind"] == "Service"] + [sts]))
    selector = f"{GROUP}={sts['metadata']['labels'][GROUP]},{SERVING}={sts['metadata']['labels'][SERVING]}"

    def settled():
        ps = pods(kube, namespace, selector)
        running = [p for p in ps if p.status.phase == "Running"]
        pending = [p for p in ps if p.status.phase == "Pending" and (c := condition(p, "PodScheduled"))
                   and c.status == "False" and c.reason == "Unschedulable"]
        return (running, pending) if len(running) == per_rack and len(pending) == 1 else None

    running, pending = wait_for(f"{per_rack} pods Running and 1 Unschedulable", settled, timeout=120)
    labels = node_labels(kube)
    assert len({labels[p.spec.node_name][CLIQUE] for p in running}) == 1
    assert "affinity" in condition(pending[0], "PodScheduled").message


def test_pod_asking_for_more_gpus_than_a_node_has_is_unschedulable(cluster: E2ECluster, namespace: str, kube, kubectl):
    cluster.require_pools()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "five-gpus", "namespace": namespace},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                       "values": ["NVIDIA-GB200"]}]}]}}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "5"}}}],
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def unschedulable():
        p = pods(kube, namespace)[0]
        c = condition(p, "PodScheduled")
        return c if c and c.status == "False" and c.reason == "Unschedulable" else None

    c = wait_for("the pod to be Unschedulable", unschedulable, timeout=60)
    assert "Insufficient nvidia.com/gpu" in c.message


def test_external_readiness_leaves_ready_to_the_runtime(cluster: E2ECluster, namespace: str, kube, kubectl):
    """With --pod-readiness=external, KWOK starts serving pods but an outside process decides Ready."""
    from flashserve_testbed.localcluster import ensure_up
    from kubernetes import client

    info = cluster.require_pools()
    before = info.pod_readiness
    ensure_up(pod_readiness="external", quiet=True)
    try:
        serving = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "engine", "namespace": namespace, "labels": {SERVING: "ext"}},
                   "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sidecar", "namespace": namespace},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        kubectl("apply", "-f", "-", input=as_list([serving, other]))
        core = client.CoreV1Api(kube)

        def started():
            p = core.read_namespaced_pod("engine", namespace)
            return p if p.status.phase == "Running" and p.status.pod_ip else None

        p = wait_for("the serving pod to run", started, timeout=60)
        time.sleep(2)  # a stage that wrongly sets Ready would have done so by now
        p = core.read_namespaced_pod("engine", namespace)
        assert condition(p, "Ready").status == "False"
        def other_ready():
            c = condition(core.read_namespaced_pod("sidecar", namespace), "Ready")
            return c and c.status == "True"

        wait_for("the other pod to be Ready", other_ready)

        # What the mock runtime does once its engine answers /health. containerStatuses is replaced as a whole
        # by a patch, so every entry is sent back.
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = [dict(kube.sanitize_for_serialization(s), ready=True) for s in p.status.container_statuses]
        core.patch_namespaced_pod_status("engine", namespace, {"status": {"containerStatuses": statuses, "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}})
        time.sleep(2)
        p = core.read_namespaced_pod("engine", namespace)
        assert condition(p, "Ready").status == "True" and p.status.phase == "Running"
        assert all(s.ready and s.state.running for s in p.status.container_statuses)
    finally:
        ensure_up(pod_readiness=before, quiet=True)


# The API server and `flashserve validate` must agree on the rules vLLM imposes (server-side dry run).
_VLLM_RULE_CASES = {
    "dbo-with-speculative": {"parallelism": {"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency",
                                             "dbo": {"enabled": True}}, "engine": {"speculative": {"enabled": True}}},
    "dbo-default-backend": {"parallelism": {"nodesPerReplica": 2, "dbo": {"enabled": True}}},
    "dbo-deepep": {"parallelism": {"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency", "dbo": {"enabled": True}}},
    "eplb-moonep": {"parallelism": {"all2allBackend": "moonep", "eplb": {"enabled": True}}},
    "context-1.5K": {"engine": {"maxModelLen": "1.5K"}},
    "context-2M": {"engine": {"maxModelLen": "2M"}},
    "context-1e5": {"engine": {"maxModelLen": "1e5"}},
    "context-0": {"engine": {"maxModelLen": 0}},
    "context-25.6k": {"engine": {"maxModelLen": "25.6k"}},
    "context-32K": {"engine": {"maxModelLen": "32K"}},
    "context-auto": {"engine": {"maxModelLen": "auto"}},
    "extra-sc": {"engine": {"extraArgs": ["-sc", '{"method":"dspark"}']}},
    "extra-no-async": {"engine": {"extraArgs": ["--no-async-scheduling"]}},
    "extra-disable-ep": {"engine": {"extraArgs": ["--disable-expert-parallel"]}},
    "extra-log-requests": {"engine": {"extraArgs": ["--enable-log-requests"]}},
    "async-off": {"engine": {"asyncScheduling": False}},
}


@pytest.mark.parametrize("case", sorted(_VLLM_RULE_CASES))
def test_api_server_and_validate_agree_on_vllm_rules(case: str, crd_installed: str, namespace: str, kubectl):
    from flashserve.api.validation import SpecError, parse_serving

    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": "rule-" + case.lower().replace(".", "-"), "namespace": namespace},
          "spec": _VLLM_RULE_CASES[case]}
    try:
        parse_serving(copy.deepcopy(cr))
        ours = True
    except SpecError:
        ours = False
    proc = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(cr), check=False)
    assert (proc.returncode == 0) == ours, f"validate {'admits' if ours else 'refuses'}; API server: {proc.stderr or proc.stdout}"


def test_kubectl_reads_a_yaml_file_as_validate_does(crd_installed: str, namespace: str, kubectl, tmp_path):
    """`flashserve validate` reads YAML as kubectl does (go-yaml v2 through sigs.k8s.io/yaml): no base-60, `y`
    and `on` as booleans, boolean and number keys written as text. Here kubectl reads the same file and the API
    server stores it: the stored object must be what the offline reader read."""
    from flashserve.commands.kubectl_yaml import Loader

    text = (f"apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\n"
            f"metadata:\n  name: yaml-read\n  namespace: {namespace}\n"
            "  labels: {on: a, 1: b, 1.5: c, no: d, 2.0: e}\n"
            "  annotations: {t: 15:00, d: 2024-01-01}\n"
            "spec:\n  replicas: 1.0\n  placement: {nodeSelector: {yes: z}}\n"
            "  autoscaling: {enabled: Y, minReplicas: 1e0, maxReplicas: 0x3}\n")  # fmt: skip
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    ours = Loader(text).get_single_data()
    stored = json.loads(kubectl("apply", "--dry-run=server", "-o", "json", "-f", str(path)).stdout)
    assert stored["metadata"]["labels"] == ours["metadata"]["labels"] == {"true": "a", "1": "b", "1.5": "c",
                                                                           "false": "d", "2": "e"}  # fmt: skip
    annotations = {k: v for k, v in stored["metadata"]["annotations"].items() if not k.startswith("kubectl.")}
    assert annotations == ours["metadata"]["annotations"] == {"t": "15:00", "d": "2024-01-01"}
    # the API server adds its defaults: compare what the file wrote
    assert stored["spec"]["replicas"] == ours["spec"]["replicas"] == 1
    assert stored["spec"]["placement"]["nodeSelector"] == ours["spec"]["placement"]["nodeSelector"] == {"true": "z"}
    written = ours["spec"]["autoscaling"]
    assert {k: stored["spec"]["autoscaling"][k] for k in written} == written == {"enabled": True, "minReplicas": 1,
                                                                                  "maxReplicas": 3}  # fmt: skip


def _probe_documents(rng) -> list[tuple[str, str]]:
    """(kind, YAML text) of the inputs whose reading kubectl judges: the unit tests' tables (tests/test_kubectl_yaml.py)
    and seeded random keys and values made of the characters numbers are made of."""
    from tests.test_kubectl_yaml import KEYS, REFUSED_KEYS, VALUES

    chars = "0123456789+-._xXoObBeE"
    randoms = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 8))) for _ in range(400)]
    randoms += [str(rng.randint(-(10**25), 10**25)) for _ in range(50)]
    randoms += [repr(rng.uniform(-1e10, 1e10)) for _ in range(50)]
    keys = [k for k, _ in KEYS] + [k for k, _ in REFUSED_KEYS] + randoms
    values = [v for v, _ in VALUES] + randoms
    return [("key", f"{k}: v") for k in keys] + [("value", f"k: {v}") for v in values]


def test_kubectl_reads_tricky_keys_and_values_as_validate_does(crd_installed: str, kubectl, tmp_path):
    """The real kubectl judges the YAML reader: every input of the unit tests' tables and 500 seeded random ones,
    each as a map in a DeepSeekServing document, through `kubectl create --dry-run=client --validate=false -o
    json` (kubectl's own decoding, no schema). Where ours reads a document, kubectl must read the same JSON;
    where ours refuses one, kubectl must refuse it too. Differences by design, left out: infinities and NaN,
    which ours reads and the field checks refuse, and which kubectl cannot put into JSON."""
    import math
    import random

    import yaml as pyyaml
    from flashserve.commands.kubectl_yaml import Loader

    head = ("apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\nmetadata: {name: probe-%d}\n"
            "spec:\n  probe: {%s}\n")
    ours: dict[int, object] = {}
    refused: list[int] = []
    docs = _probe_documents(random.Random(7))
    for i, (_, body) in enumerate(docs):
        try:
            probe = pyyaml.load(head % (i, body), Loader=Loader)["spec"]["probe"]  # noqa: S506 - a SafeLoader
        except pyyaml.YAMLError:
            refused.append(i)
            continue
        if not any(isinstance(v, float) and not math.isfinite(v) for v in probe.values()):
            ours[i] = probe
    path = tmp_path / "probes.yaml"
    path.write_text("---\n".join(head % (i, docs[i][1]) for i in ours))
    out = kubectl("create", "--dry-run=client", "--validate=false", "-o", "json", "-f", str(path)).stdout
    theirs, decoder, at = {}, json.JSONDecoder(), 0
    while at < len(out.rstrip()):
        obj, at = decoder.raw_decode(out, at)
        at = len(out) - len(out[at:].lstrip())
        theirs[int(obj["metadata"]["name"].split("-")[1])] = obj["spec"]["probe"]
    def same(a: object, b: object) -> bool:
        # numbers beyond float64's exact integers are float64 on both sides once sent: compare them so
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) and abs(a) >= 2**53:
            return float(a) == float(b)
        return a == b and type(a) is type(b)

    differ = [(docs[i][1], ours[i], theirs.get(i)) for i in ours if not same(ours[i], theirs.get(i))]
    assert not differ, f"{len(differ)} of {len(ours)} read differently (input, ours, kubectl's): {differ[:10]}"
    accepted = [docs[i][1] for i in refused
                if kubectl("create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-",
                           input=head % (i, docs[i][1]), check=False).returncode == 0]  # fmt: skip
    assert not accepted, f"refused by ours, read by kubectl: {accepted[:10]}"
    assert len(ours) > 900 and len(refused) >= 8, (len(ours), len(refused))
