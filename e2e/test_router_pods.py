"""Router pods on the local cluster: the mock runtime runs a router Deployment's pods as the real `vllm-router`
on their loopback pod IPs, with a kubeconfig carrying their own ServiceAccount's token. The router discovers
the engine pods through the API server (pods, not endpoints: loopback IPs are refused in EndpointSlices), the
`openai` client streams a chat completion through http://<router pod IP>:8000/v1, two router replicas send one
session to one engine, the Role is what grants discovery (without `list` nothing is found), and the loopback
guard stops the routers while a hostNetwork pod has a 172.16.x node address.

The engine pods and the router Deployment are written here by hand, shaped as the routing contract (issue 18)
says the operator renders them, so this test does not depend on the operator's rendering.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from e2e.support import fresh_namespace, start_runtime, stop_runtime, wait_until

pytestmark = pytest.mark.timeout(300)

SERVING = "flash"
ROUTER = "flash-router"
ENGINE_PORT, ROUTER_PORT, METRICS_PORT = 8000, 8000, 29000
ENGINE_LABELS = {"flashserve.io/serving": SERVING, "app.kubernetes.io/component": "engine",
                 "flashserve.io/routing": "serve"}
ROUTER_LABELS = {"flashserve.io/serving": SERVING, "app.kubernetes.io/component": "router"}
# Loopback only: never through a proxy that http_proxy in the environment may name.
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def engine_pod(name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": ENGINE_LABELS,
                         "annotations": {"flashserve.io/startup-delay": "2s"}},
            "spec": {"nodeSelector": {"flashserve.io/pool": "cpu"},
                     "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                     "command": ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash",
                                                 "--port", str(ENGINE_PORT)],
                                     "ports": [{"name": "http", "containerPort": ENGINE_PORT}]}]}}


def router_objects(namespace: str, verbs: list[str]) -> list[dict]:
    """ServiceAccount, Role (pods: `verbs`), RoleBinding and Deployment of the routing contract."""
    meta = {"name": ROUTER, "namespace": namespace, "labels": ROUTER_LABELS}
    args = ["--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--policy", "consistent_hash", "--service-discovery",
            "--selector", *(f"{k}={v}" for k, v in ENGINE_LABELS.items()),
            "--service-discovery-namespace", namespace, "--service-discovery-port", str(ENGINE_PORT),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    container = {"name": "router", "image": "vllm-router", "command": ["vllm-router"], "args": args,
                 "ports": [{"name": "http", "containerPort": ROUTER_PORT},
                           {"name": "metrics", "containerPort": METRICS_PORT}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                 "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                                     "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER},
         "subjects": [{"kind": "ServiceAccount", "name": ROUTER, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": 2, "selector": {"matchLabels": ROUTER_LABELS},
                  "template": {"metadata": {"labels": ROUTER_LABELS},
                               "spec": {"serviceAccountName": ROUTER, "automountServiceAccountToken": True,
                                        "nodeSelector": {"flashserve.io/pool": "cpu"},
                                        "containers": [container]}}}},
    ]


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def metrics(ip: str) -> str:
    with LOCAL.open(f"http://{ip}:{METRICS_PORT}/metrics", timeout=5) as resp:
        return resp.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a Prometheus exposition, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class Stack:
    namespace: str
    core: object
    runtime: subprocess.Popen
    runtime_log: Path
    logs: Path

    def pods(self, labels: dict[str, str]) -> list:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def ready_ips(self, labels: dict[str, str], count: int = 2) -> list[str]:
        pods = [p for p in self.pods(labels) if not p.metadata.deletion_timestamp]
        if len(pods) == count and all(_ready(p) and p.status.pod_ip for p in pods):
            return sorted(p.status.pod_ip for p in pods)
        return []

    def router_log(self, pod_name: str) -> str:
        path = self.logs / "engines" / f"{self.namespace}_{pod_name}.log"
        return re.sub(r"\x1b\[[0-9;]*m", "", path.read_text(errors="replace")) if path.exists() else ""

    def runtime_tail(self) -> str:
        return self.runtime_log.read_text(errors="replace")[-5000:]


@pytest.fixture(scope="module")
def stack(external_cluster, kube, kubectl, tmp_path_factory):
    from kubernetes import client

    info = external_cluster
    core = client.CoreV1Api(kube)
    namespace = fresh_namespace(kube, "e2e-router-pods")
    logs = tmp_path_factory.mktemp("router-pods")
    runtime_log = logs / "runtime.log"
    runtime = start_runtime(info, namespace, logs, "--startup-seconds", "2", "--probe-interval", "0.5",
                            "--restart-backoff", "2", "--file-sd", str(logs / "targets.json"))
    st = Stack(namespace, core, runtime, runtime_log, logs)
    try:
        docs = [engine_pod(f"{SERVING}-e{i}", namespace) for i in range(2)]
        docs += router_objects(namespace, ["get", "list", "watch"])
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        wait_until(lambda: st.ready_ips(ENGINE_LABELS) and st.ready_ips(ROUTER_LABELS) or runtime.poll() is not None,
                   90, what="engine and router pods Ready")
        assert runtime.poll() is None, st.runtime_tail()
        yield st
    finally:
        stop_runtime(runtime)
        core.delete_namespace(namespace, propagation_policy="Background")
    pids = re.findall(rf"{namespace}/{ROUTER}-[a-z0-9-]+: engine pid (\d+) on ", runtime_log.read_text())
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert pids and not left, f"router processes left running: {left}"


def test_router_pods_run_vllm_router_on_their_pod_ip_and_discover_both_engines(stack):
    engines = stack.ready_ips(ENGINE_LABELS)
    assert all(ip.startswith("127.") for ip in engines + stack.ready_ips(ROUTER_LABELS))
    for pod in stack.pods(ROUTER_LABELS):
        ip = pod.status.pod_ip

        def found():
            text = metrics(ip)
            return sample(text, "vllm_router_active_workers") == 2 and all(
                sample(text, "vllm_router_worker_health", worker=f"http://{e}:{ENGINE_PORT}") == 1 for e in engines)

        wait_until(found, 30, what=f"router {pod.metadata.name} discovering both engines")
        log = stack.router_log(pod.metadata.name)
        assert f"Starting router on {ip}:{ROUTER_PORT}" in log
        for e in engines:
            assert f"Added worker: http://{e}:{ENGINE_PORT}" in log


def test_the_router_uses_its_own_service_account_token_never_the_admin_credentials(stack):
    for pod in stack.pods(ROUTER_LABELS):
        # vllm-router sets its process title over its environment block, so /proc/<pid>/environ is no witness;
        # the file is the one the runtime hands it as KUBECONFIG (tests/runtime/test_router_pods.py)
        path = stack.logs / "credentials" / f"{stack.namespace}_{pod.metadata.name}_{pod.metadata.uid}.kubeconfig"
        assert path.stat().st_mode & 0o077 == 0
        doc = yaml.safe_load(path.read_text())
        # no client certificate, no inline token: not the admin's; a token file the runtime refreshes
        assert list(doc["users"][0]["user"]) == ["tokenFile"]
        token_file = Path(doc["users"][0]["user"]["tokenFile"])
        assert token_file.stat().st_mode & 0o077 == 0
        claims = json.loads(_b64url(token_file.read_text().strip().split(".")[1]))
        assert claims["sub"] == f"system:serviceaccount:{stack.namespace}:{ROUTER}"
        assert claims["kubernetes.io"]["pod"]["name"] == pod.metadata.name  # bound to this pod


def _b64url(part: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_openai_client_streams_through_a_router_pod_and_replicas_agree_on_the_engine(stack):
    import openai

    routers = stack.ready_ips(ROUTER_LABELS)
    chosen = []
    for ip in routers:
        api = openai.OpenAI(base_url=f"http://{ip}:{ROUTER_PORT}/v1", api_key="unused", max_retries=0, timeout=30)
        model = api.models.list().data[0].id
        before = {e: _served(e) for e in stack.ready_ips(ENGINE_LABELS)}
        stream = api.chat.completions.create(model=model, stream=True, max_tokens=12,
                                             messages=[{"role": "user", "content": "hello"}],
                                             extra_headers={"X-Session-ID": "e2e-session-1"})
        chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len(chunks) > 2 and "".join(chunks).strip()
        after = {e: _served(e) for e in before}
        chosen.append([e for e in before if after[e] > before[e]])
    # consistent_hash over the same discovered engines: one session, one engine, whichever replica it meets
    assert chosen[0] == chosen[1] and len(chosen[0]) == 1, chosen


def _served(engine_ip: str) -> float:
    with LOCAL.open(f"http://{engine_ip}:{ENGINE_PORT}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_the_guard_stops_routers_while_a_hostnetwork_pod_has_a_172_16_address(stack, kube):
    """A foreign node (InternalIP 172.16.9.9, a 10.x podCIDR) with a hostNetwork pod: the runtime stops the
    running routers and refuses to start them, naming the pod and its IP; once it is gone they come back."""
    from kubernetes import client

    name = f"foreign-{uuid.uuid4().hex[:5]}"
    node = {"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"type": "kwok", "flashserve.io/e2e": "true"}},
            "spec": {"podCIDR": "10.99.0.0/24", "podCIDRs": ["10.99.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "172.16.9.9"}],
                       "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                       "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"}}}
    pod = {"metadata": {"name": "exporter", "namespace": stack.namespace},
           "spec": {"nodeName": name, "hostNetwork": True, "containers": [{"name": "c", "image": "x"}]}}
    core = client.CoreV1Api(kube)
    core.create_node(node)
    try:
        core.create_namespaced_pod(stack.namespace, pod)
        wait_until(lambda: core.read_namespaced_pod("exporter", stack.namespace).status.pod_ip, 30,
                   what="the hostNetwork pod's IP")
        assert core.read_namespaced_pod("exporter", stack.namespace).status.pod_ip == "172.16.9.9"

        def refused():
            for p in stack.pods(ROUTER_LABELS):
                for cs in p.status.container_statuses or []:
                    term = cs.state.terminated if cs.state else None
                    if not (term and term.reason == "NotLoopback"):
                        return False
                    assert f"pod {stack.namespace}/exporter" in term.message and "172.16.9.9" in term.message
            return True

        wait_until(refused, 30, what="router pods refused (NotLoopback)")
        for ip in (p.status.pod_ip for p in stack.pods(ROUTER_LABELS)):
            with pytest.raises(OSError):
                metrics(ip)  # nothing listens: the processes are gone
    finally:
        core.delete_namespaced_pod("exporter", stack.namespace, grace_period_seconds=0)
        core.delete_node(name)
    wait_until(lambda: stack.ready_ips(ROUTER_LABELS), 60, what="routers back once the address is gone")


def test_without_list_in_its_role_the_router_discovers_nothing(stack, kubectl):
    """Last: it changes the Role. The new router pods start, get tokens, and find no engine."""
    kubectl("-n", stack.namespace, "patch", "role", ROUTER, "--type=json",
            "-p", json.dumps([{"op": "replace", "path": "/rules/0/verbs", "value": ["get", "watch"]}]))
    old = {p.metadata.name for p in stack.pods(ROUTER_LABELS)}
    kubectl("-n", stack.namespace, "delete", "pod", "-l", "app.kubernetes.io/component=router", "--wait=false")
    wait_until(lambda: stack.ready_ips(ROUTER_LABELS) and not old & {p.metadata.name for p in stack.pods(ROUTER_LABELS)},
               60, what="new router pods Ready")
    for pod in stack.pods(ROUTER_LABELS):
        wait_until(lambda: "cannot list resource \"pods\"" in stack.router_log(pod.metadata.name), 30,
                   what=f"{pod.metadata.name} refused the pod list")
        assert sample(metrics(pod.status.pod_ip), "vllm_router_active_workers") in (None, 0.0)
        with pytest.raises(urllib.error.HTTPError) as e:
            req = urllib.request.Request(f"http://{pod.status.pod_ip}:{ROUTER_PORT}/v1/chat/completions",
                                         data=json.dumps({"model": "m", "messages": [
                                             {"role": "user", "content": "hi"}]}).encode(),
                                         headers={"Content-Type": "application/json"})
            LOCAL.open(req, timeout=30)
        assert e.value.code >= 500
