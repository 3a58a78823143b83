"""Router pods in the runtime: the real vllm-router's command line and credentials, built from the pod, and the
loopback guard that keeps it from starting (or running) while any address in the cluster is off loopback."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import types
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from flashserve_testbed.runtime import credentials
from flashserve_testbed.runtime.engine import ProbeSettings
from flashserve_testbed.runtime.launch import LaunchSettings, build_router_launch, is_router_pod, mounts_token
from flashserve_testbed.runtime.runtime import Runtime, RuntimeSettings

from tests.builders import node
from tests.runtime.waiting import until

pytestmark = pytest.mark.timeout(60)

NS = "demo"
CONTRACT_ARGS = ["--host", "0.0.0.0", "--port", "8000", "--policy", "consistent_hash", "--service-discovery",
                 "--selector", "flashserve.io/serving=flash", "app.kubernetes.io/component=engine",
                 "flashserve.io/routing=serve", "--service-discovery-namespace", NS,
                 "--service-discovery-port", "8000", "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]


def router_pod(ip: str = "127.4.2.1", name: str = "flash-router-abc-x1") -> dict:
    """A router pod shaped as the routing contract says the operator renders it."""
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "router"}},
        "spec": {"serviceAccountName": "flash-router", "nodeName": "cpu-0",
                 "containers": [{"name": "router", "image": "vllm-router", "command": ["vllm-router"],
                                 "args": CONTRACT_ARGS,
                                 "env": [{"name": "RUST_LOG", "value": "info"},
                                         {"name": "KUBECONFIG", "value": "/root/.kube/admin"},
                                         {"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"}],
                                 "ports": [{"name": "http", "containerPort": 8000},
                                           {"name": "metrics", "containerPort": 29000}],
                                 "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}}}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "127.4.0.1",
                   "conditions": [{"type": "Ready", "status": "False"}]},
    }


def test_router_pods_are_told_apart_from_engines():
    assert is_router_pod(router_pod())
    engine = router_pod()
    engine["metadata"]["labels"]["app.kubernetes.io/component"] = "engine"
    assert not is_router_pod(engine)
    other = router_pod()
    other["spec"]["containers"][0]["name"] = "proxy"
    assert not is_router_pod(other)


def test_router_launch_runs_the_pods_own_command_on_its_ip_with_its_own_credentials():
    settings = LaunchSettings(engine_bin="/opt/venv/bin", router_bin="/opt/router/bin")
    launch = build_router_launch(router_pod(), settings, "/state/credentials/demo_r.kubeconfig")
    assert launch.argv == ["vllm-router", *CONTRACT_ARGS, "--host", "127.4.2.1", "--prometheus-host", "127.4.2.1"]
    assert (launch.address, launch.port, launch.metrics_port, launch.kind) == ("127.4.2.1", 8000, 29000, "router")
    assert launch.probe_url == "http://127.4.2.1:8000/readiness"  # the readinessProbe, its named port resolved
    env = launch.env
    assert env["PATH"].split(":")[0] == "/opt/router/bin"
    # the pod cannot point the router at other credentials, nor at an in-cluster API address
    assert env["KUBECONFIG"] == "/state/credentials/demo_r.kubeconfig"
    assert "KUBERNETES_SERVICE_HOST" not in env and env["RUST_LOG"] == "info"


def test_a_router_pod_that_mounts_no_token_gets_no_credentials_at_all():
    """automountServiceAccountToken: false (a router the operator feeds): no KUBECONFIG, not even the one the
    pod's env names, as the kubelet would give it no token."""
    pod = router_pod()
    assert mounts_token(pod)
    pod["spec"]["automountServiceAccountToken"] = False
    assert not mounts_token(pod)
    launch = build_router_launch(pod, LaunchSettings(engine_bin="/x"), None)
    assert "KUBECONFIG" not in launch.env and launch.kubeconfig is None


def test_the_launcher_takes_the_appended_host_flags():
    """vllm-router's launcher is argparse: check that the repeated --host/--prometheus-host resolve to the last."""
    launch_router = pytest.importorskip("vllm_router.launch_router")
    launch = build_router_launch(router_pod(), LaunchSettings(engine_bin="/x"), "/k")
    args = launch_router.parse_router_args(launch.argv[1:])
    assert (args.host, args.prometheus_host, args.port, args.prometheus_port) == ("127.4.2.1", "127.4.2.1",
                                                                                  8000, 29000)
    assert args.selector == {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "engine",
                             "flashserve.io/routing": "serve"}
    assert args.service_discovery and args.service_discovery_namespace == NS


def test_a_router_pod_outside_loopback_is_refused_by_name():
    with pytest.raises(ValueError, match=f"pod {NS}/flash-router-abc-x1: status.podIP 10.64.3.9"):
        build_router_launch(router_pod(ip="10.64.3.9"), LaunchSettings(engine_bin="/x"), "/k")


def test_token_request_is_for_the_pods_service_account_and_bound_to_the_pod():
    path, body = credentials.token_request(router_pod())
    assert path == f"/api/v1/namespaces/{NS}/serviceaccounts/flash-router/token"
    assert body["spec"]["boundObjectRef"] == {"apiVersion": "v1", "kind": "Pod", "name": "flash-router-abc-x1",
                                              "uid": "uid-flash-router-abc-x1"}


# -- the runtime's loop, with a stand-in API server and a stand-in vllm-router -------------------------------

FAKE_ROUTER = """#!{python}
import os, sys, pathlib
pathlib.Path(os.environ["FAKE_ROUTER_OUT"]).write_text(" ".join(sys.argv[1:]) + "\\n" + os.environ["KUBECONFIG"])
import time
time.sleep(600)
"""


class FakeAPI:
    host = "https://127.0.0.1:6443"

    def __init__(self, pod: dict, others: list[dict], nodes: list[dict]):
        self.pod, self.others, self.nodes = pod, others, nodes
        self.events: asyncio.Queue = asyncio.Queue()
        self.patches: list[dict] = []
        self.token_requests: list[str] = []

    def ca_pem(self) -> bytes:
        return b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"

    async def get(self, path, params=None, timeout=30):
        if path.startswith("/api/v1/nodes/"):
            return node("none") | {"metadata": {"name": "cpu-0", "annotations": {"kwok.x-k8s.io/node": "fake"}}}
        if path == "/api/v1/nodes":
            return {"items": self.nodes}
        if path == "/api/v1/pods" and not params:  # the guard's list (the watch's has a label selector)
            return {"metadata": {"resourceVersion": "1"}, "items": [self.pod, *self.others]}
        return {"metadata": {"resourceVersion": "1"}, "items": [self.pod]}

    async def watch(self, path, params, timeout_seconds=240):
        while True:
            yield await self.events.get()

    async def post(self, path, body, timeout=30):
        self.token_requests.append(path)
        return {"status": {"token": "sa-token-123"}}

    async def patch_pod_status(self, namespace, name, body):
        self.patches.append(body)
        st = self.pod.setdefault("status", {})
        st.update({k: v for k, v in body["status"].items() if k != "conditions"})
        return self.pod


def _terminated(api: FakeAPI) -> dict:
    for cs in api.pod["status"].get("containerStatuses") or []:
        if cs["name"] == "router":
            return (cs.get("state") or {}).get("terminated") or {}
    return {}


def test_runtime_refuses_a_router_while_a_hostnetwork_pod_has_a_172_16_address_then_runs_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm-router"
    script.write_text(FAKE_ROUTER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "router-started"
    monkeypatch.setenv("FAKE_ROUTER_OUT", str(out))
    pod = router_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "FAKE_ROUTER_OUT", "value": str(out)})
    exporter = {"metadata": {"name": "node-exporter", "namespace": "monitoring"}, "spec": {"hostNetwork": True},
                "status": {"podIP": "172.16.0.2", "hostIP": "172.16.0.2"}}
    nodes = [{"metadata": {"name": "cpu-0"},
              "status": {"addresses": [{"type": "InternalIP", "address": "172.16.0.2"}]}}]
    api = FakeAPI(pod, [exporter], nodes)
    settings = RuntimeSettings(launch=LaunchSettings(engine_bin=str(bin_dir)),
                               probe=ProbeSettings(interval=0.1, backoff_base=0.2, backoff_cap=0.2),
                               log_dir=tmp_path / "logs", credentials_dir=tmp_path / "creds", guard_interval=0.2)

    async def scenario():
        runtime = Runtime(api, settings)
        task = asyncio.ensure_future(runtime.run())
        try:
            term = await until(lambda: _terminated(api))
            assert term["reason"] == "NotLoopback"
            assert "monitoring/node-exporter" in term["message"] and "172.16.0.2" in term["message"]
            assert "cpu-0" in term["message"]
            engine = next(iter(runtime.engines.values()))
            assert engine.pid is None and not out.exists() and not api.token_requests

            # the node and the pod become loopback: the router starts with its own token, not the admin's
            exporter["status"] = {"podIP": "127.4.0.1", "hostIP": "127.4.0.1"}
            nodes[0]["status"]["addresses"][0]["address"] = "127.4.0.1"
            await until(lambda: out.exists() and "\n" in out.read_text())
            argv, kubeconfig_path = out.read_text().split("\n", 1)
            assert argv.endswith("--host 127.4.2.1 --prometheus-host 127.4.2.1")
            assert api.token_requests == [f"/api/v1/namespaces/{NS}/serviceaccounts/flash-router/token"]
            doc = yaml.safe_load(Path(kubeconfig_path).read_text())
            assert stat.S_IMODE(os.stat(kubeconfig_path).st_mode) == 0o600
            token_file = doc["users"][0]["user"]["tokenFile"]
            assert doc["users"][0]["user"] == {"tokenFile": token_file}  # no client certificate, no inline token
            assert Path(token_file).read_text() == "sa-token-123"
            assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
            assert doc["clusters"][0]["cluster"]["server"] == FakeAPI.host
            assert doc["contexts"][0]["context"]["namespace"] == NS

            # a non-loopback address appears while it runs: the guard stops it and the next start is refused
            pid = engine.pid
            exporter["status"] = {"podIP": "172.16.0.2", "hostIP": "172.16.0.2"}
            await until(lambda: engine.pid != pid and _terminated(api).get("reason") == "NotLoopback")
            assert engine.pid is None
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert not Path(kubeconfig_path).exists() and not Path(token_file).exists(), "the token goes with the runtime"

    asyncio.run(scenario())


def test_the_harness_reaches_a_serving_at_a_ready_router_pod_ip():
    from flashserve_testbed.runtime.routerpods import router_selector, router_urls, wait_router_url

    assert router_selector("flash") == "flashserve.io/serving=flash,app.kubernetes.io/component=router"
    ready = router_pod(ip="127.4.2.1", name="r-b")
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    unready, leaving = router_pod(ip="127.4.2.2", name="r-a"), router_pod(ip="127.4.2.3", name="r-c")
    leaving["status"]["conditions"] = ready["status"]["conditions"]
    leaving["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    assert router_urls([unready, ready, leaving]) == ["http://127.4.2.1:8000"]
    asked = []
    assert wait_router_url(lambda sel: asked.append(sel) or [ready], "flash") == "http://127.4.2.1:8000"
    assert asked == [router_selector("flash")]
    with pytest.raises(TimeoutError, match="no Ready router pod of serving 'flash'"):
        wait_router_url(lambda sel: [unready], "flash", timeout=0.1, interval=0.05)


def test_a_token_is_requested_again_at_80_percent_of_the_lifetime_the_api_server_gave_it():
    t0 = 1_800_000_000.0
    stamp = datetime.fromtimestamp(t0 + 1000, timezone.utc).isoformat().replace("+00:00", "Z")
    assert credentials.refresh_due(t0, {"status": {"expirationTimestamp": stamp}}) == pytest.approx(t0 + 800)
    assert credentials.refresh_due(t0, {"status": {}}) == t0 + 0.8 * credentials.TOKEN_SECONDS
    assert credentials.refresh_due(t0, {"status": {"expirationTimestamp": "soon"}}) == t0 + 2880


def test_the_runtime_rewrites_a_running_routers_token_file_when_it_is_due_and_retries_a_failure(tmp_path):
    class TokenAPI:
        host, answers = "https://127.0.0.1:6443", []

        def ca_pem(self):
            return None

        async def post(self, path, body, timeout=30):
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return {"status": {"token": answer}}

    api = TokenAPI()
    runtime = Runtime(api, RuntimeSettings(launch=LaunchSettings(engine_bin="/x"), log_dir=tmp_path / "logs"))
    path = tmp_path / "r.kubeconfig"
    pod = router_pod()
    api.answers = ["t1"]
    due = asyncio.run(credentials.write_pod_kubeconfig(api, pod, path))
    kubeconfig_text = path.read_text()
    engine = types.SimpleNamespace(key=pod["metadata"]["uid"], pod=pod, namespace=NS, name="r",
                                   launch=types.SimpleNamespace(kind="router", kubeconfig=str(path)))  # fmt: skip
    runtime.engines[engine.key] = engine
    runtime.token_due[engine.key] = due
    asyncio.run(runtime.refresh_tokens(now=due - 1))
    assert credentials.token_path(path).read_text() == "t1", "not due yet"
    api.answers = [OSError("connection refused"), "t2"]
    asyncio.run(runtime.refresh_tokens(now=due))
    assert credentials.token_path(path).read_text() == "t1" and runtime.token_due[engine.key] == due, "retried"
    asyncio.run(runtime.refresh_tokens(now=due + 1))
    assert credentials.token_path(path).read_text() == "t2" and runtime.token_due[engine.key] > due
    assert path.read_text() == kubeconfig_text, "the kubeconfig stays: the router re-reads only the token file"
    runtime.engines.clear()
    asyncio.run(runtime.refresh_tokens())
    assert runtime.token_due == {}, "a gone router's entry goes"


def test_router_pods_can_be_pointed_at_another_api_server_url_and_only_a_loopback_one(tmp_path, capsys):
    """The e2e tests put a relay they can hold between the router pods and the API server."""
    from flashserve_testbed.runtime import cli

    api = FakeAPI(router_pod(), [], [])
    settings = RuntimeSettings(launch=LaunchSettings(engine_bin="/x"), log_dir=tmp_path / "logs",
                               router_api_server="https://127.0.0.1:7443")  # fmt: skip
    path = tmp_path / "r.kubeconfig"
    asyncio.run(Runtime(api, settings)._router_prepare(api.pod, path)())
    assert yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:7443"

    for url in ("https://10.0.0.1:6443", "https://127.0.0.1", "ftp://127.0.0.1:21", "https://api.example.com:443"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--router-api-server", url])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"--router-api-server {url!r}: expected http(s)://<loopback address>:<port>" in err
    assert cli.loopback_url("https://127.0.0.1:7443") == "https://127.0.0.1:7443"
