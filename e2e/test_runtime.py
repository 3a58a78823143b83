"""The mock GPU runtime on the local cluster in external pod-readiness mode: engines start for a serving's pods,
pods turn Ready only once their engines have loaded, Prometheus scrapes the engines and the router pods,
`flashserve load` makes tokens flow per pod, the official `openai` client streams through the serving's router
(the operator's router Deployment, run by the runtime as the real vllm-router, reached at a router pod's IP),
and a killed engine takes its pod out of readiness, and out of the router, until the runtime restarts it.

One serving (two single-node GB200 replica groups) is shared by the tests of this module; the operator and the
runtime run as separate processes, like in a real cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from e2e.support import (
    OperatorProcess,
    free_port,
    fresh_namespace,
    start_runtime,
    stop_runtime,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)

STARTUP = 8.0  # engine seconds to "load the weights"; the runtime runs engines in real time here
SERVING = "flash"


ENGINE_SELECTOR = "flashserve.io/serving,app.kubernetes.io/component=engine"
ROUTER_SELECTOR = "flashserve.io/serving,app.kubernetes.io/component=router"


@dataclass
class Stack:
    namespace: str
    status: str  # the runtime's own endpoint (/-/engines)
    prometheus: str
    runtime: subprocess.Popen
    runtime_log: Path
    kubeconfig: Path
    router: str = ""  # http://<router pod IP>:8000, once a router pod is Ready
    timeline: dict[str, dict] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"{self.router}/v1"

    def engines(self) -> dict[str, dict]:
        with urllib.request.urlopen(f"{self.status}/-/engines", timeout=5) as resp:
            return {e["pod"]: e for e in json.load(resp)["engines"] if e["kind"] == "engine"}

    def logs(self) -> str:
        return self.runtime_log.read_text(errors="replace")[-6000:]


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def prom_query(prometheus: str, query: str) -> list[dict]:
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _watch_until_ready(core, stack: Stack, timeout: float) -> None:
    """Record, per pod, when it was first seen Running, what its engine's /health said before the pod turned
    Ready, and when it turned Ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(stack.namespace, label_selector=ENGINE_SELECTOR).items
        now = time.monotonic()
        try:
            engines = stack.engines()
        except OSError:
            engines = {}
        for p in pods:
            t = stack.timeline.setdefault(p.metadata.name, {"running": None, "ready": None, "health_before_ready": []})
            if p.status.phase == "Running" and t["running"] is None:
                t["running"] = now
            if t["running"] is not None and t["ready"] is None:
                if _ready(p):
                    t["ready"] = now
                elif p.metadata.name in engines:
                    t["health_before_ready"].append((now - t["running"],
                                                     _http_status(engines[p.metadata.name]["url"] + "/health")))
        if len(pods) == 2 and all(t["ready"] for t in stack.timeline.values()):
            return
        time.sleep(0.25)
    raise AssertionError(f"pods not Ready after {timeout}s: {stack.timeline}\n{stack.logs()}")


@pytest.fixture(scope="module")
def stack(external_cluster, kube, kubectl, crd_installed, router_url, tmp_path_factory):
    from kubernetes import client

    info = external_cluster
    if info.prometheus_url is None:
        pytest.skip("the local cluster runs without Prometheus")
    core = client.CoreV1Api(kube)
    namespace = fresh_namespace(kube, "e2e-runtime")
    logs = tmp_path_factory.mktemp("runtime")
    operator = OperatorProcess(info.kubeconfig, namespace, logs).start()
    port = free_port()
    runtime_log = logs / "runtime.log"
    runtime = start_runtime(info, namespace, logs, "--time-scale", "1", "--startup-seconds", str(STARTUP),
                            "--status-port", str(port), "--probe-interval", "0.5", "--restart-backoff", "2")
    st = Stack(namespace, f"http://127.0.0.1:{port}", info.prometheus_url, runtime, runtime_log, info.kubeconfig)
    try:
        operator.wait_serving()
        wait_until(lambda: _http_status(f"{st.status}/metrics") == 200 or runtime.poll() is not None, 30,
                   what="the runtime's status endpoint")
        assert runtime.poll() is None, st.logs()
        cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
              "metadata": {"name": SERVING, "namespace": namespace},
              # logLevel info: the router logs a worker it drops only at info (docs/routing.md, "Log level")
              "spec": {"placement": {"accelerator": "GB200"}, "replicas": 2, "routing": {"logLevel": "info"}}}
        kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        _watch_until_ready(core, st, timeout=60)
        st.router = router_url(namespace, SERVING, timeout=60)
        yield st
    finally:
        try:
            pids = [e["pid"] for e in st.engines().values() if e["pid"]]
        except OSError:
            pids = []
        stop_runtime(runtime)
        operator.stop()
        core.delete_namespace(namespace, propagation_policy="Background")
    # the runtime takes its engines and its Prometheus targets with it
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], f"engines left running: {pids}"
    assert not (Path(info.file_sd_dir) / "flashserve-runtime.json").exists()


def test_pods_become_ready_only_after_their_engines_have_loaded(stack):
    assert len(stack.timeline) == 2
    for pod, t in stack.timeline.items():
        took = t["ready"] - t["running"]
        # Ready never before the engine's load time (the test may see Running up to a poll late), and soon after
        assert STARTUP - 1.0 <= took <= STARTUP + 8, (pod, took)
        early = [code for at, code in t["health_before_ready"] if at < STARTUP - 2]
        assert early and set(early) <= {0, 503}, (pod, t["health_before_ready"])  # loading, and the pod not Ready
        assert 503 in early


def test_pods_carry_the_engine_process_in_their_container_status(stack, kubectl):
    engines = stack.engines()
    pods = json.loads(kubectl("get", "-n", stack.namespace, "pods", "-l", ENGINE_SELECTOR, "-o", "json").stdout)["items"]
    assert len(pods) == 2
    for p in pods:
        name = p["metadata"]["name"]
        cs = p["status"]["containerStatuses"][0]
        assert cs["ready"] is True and "running" in cs["state"]
        assert cs["containerID"] == f"flashserve-mock://{engines[name]['pid']}"
        # the engine listens on the pod IP itself, which the local cluster gives from 127.0.0.0/8
        assert p["status"]["podIP"].startswith("127.")
        assert engines[name]["url"] == f"http://{p['status']['podIP']}:8000"
        assert engines[name]["profile"] == "gb200-4gpu"


def test_prometheus_scrapes_every_engine(stack):
    query = f'up{{job="vllm",namespace="{stack.namespace}",serving="{SERVING}"}}'

    def both_up():
        result = prom_query(stack.prometheus, query)
        return len(result) == 2 and all(r["value"][1] == "1" for r in result) and result

    result = wait_until(both_up, 30, interval=1, what=query)
    assert {r["metric"]["pod"] for r in result} == set(stack.timeline)
    assert {r["metric"]["group"] for r in result} == {"0", "1"}
    routers = f'up{{job="vllm-router",namespace="{stack.namespace}",serving="{SERVING}"}}'
    result = wait_until(lambda: [r for r in prom_query(stack.prometheus, routers) if r["value"][1] == "1"], 30,
                        interval=1, what=routers)
    assert len(result) == 2  # the Deployment's two router pods, on their metrics port


def test_openai_client_streams_a_chat_completion_through_the_router(stack):
    import openai

    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a haiku about GPUs."}], max_tokens=60,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    arrivals, text, usage = [], [], None
    t0 = time.monotonic()
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - t0)
            text.append(chunk.choices[0].delta.content)
    assert usage is not None and usage.completion_tokens == 60
    assert len("".join(text)) == 4 * 60  # the mock's 4-character tokens
    # streamed as generated (~150 tok/s with MTP): chunks spread over ~0.4 s, not delivered at once
    assert len(arrivals) > 10 and arrivals[-1] - arrivals[0] > 0.2


def test_generation_rate_per_pod_under_flashserve_load(stack, tmp_path):
    report = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "flashserve.cli", "load", "--base-url", stack.base_url, "--schedule",
           "ramp 0 6 4s; hold 6 26s", "--prompt-scale", "0.2", "--gap-seconds", "1", "--sla", "100",
           "--json", str(report), "--progress-interval", "10"]
    load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    query = f'sum by (pod) (rate(vllm:generation_tokens_total{{namespace="{stack.namespace}"}}[1m]))'
    try:
        def every_pod_generates():
            result = prom_query(stack.prometheus, query)
            rates = {r["metric"]["pod"]: float(r["value"][1]) for r in result}
            return len(rates) == 2 and all(v > 0 for v in rates.values()) and rates

        rates = wait_until(every_pod_generates, 40, interval=1, what=query)
    finally:
        out, _ = load.communicate(timeout=90)
    assert load.returncode == 0, out
    assert set(rates) == set(stack.timeline)
    summary = json.loads(report.read_text())["summary"]
    assert summary["ok"] > 10 and not summary["errors"], out
    # the router spread the sessions: both engines generate (above); vllm-router sets no per-engine header
    assert summary["cached_fraction"] > 0.5  # resent conversations hit the prefix cache
    assert 100 < summary["per_user_tokens_per_s"]["p50"] < 200, out  # ~150 tok/s per user at this light load


def test_a_killed_engine_takes_its_pod_out_of_readiness_until_restarted(stack, kube):
    from kubernetes import client

    core = client.CoreV1Api(kube)
    pod = sorted(stack.timeline)[0]
    pid = stack.engines()[pod]["pid"]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()

    def not_ready():
        p = core.read_namespaced_pod(pod, stack.namespace)
        return not _ready(p) and p

    p = wait_until(not_ready, 10, interval=0.2, what=f"{pod} Ready=False")
    assert time.monotonic() - t0 < 5
    cs = p.status.container_statuses[0]
    term = cs.state.terminated or (cs.last_state.terminated if cs.last_state else None)
    assert term is not None and term.exit_code == 137 and term.container_id == f"flashserve-mock://{pid}"
    # every router replica drops it from its workers: vllm-router follows the pod's Ready condition
    worker = f"http://{p.status.pod_ip}:8000"
    routers = core.list_namespaced_pod(stack.namespace, label_selector=ROUTER_SELECTOR).items
    assert len(routers) == 2
    for r in routers:
        log = stack.runtime_log.parent / "engines" / f"{stack.namespace}_{r.metadata.name}.log"
        wait_until(lambda: f"Removed worker: {worker}" in log.read_text(errors="replace"), 10, interval=0.2,
                   what=f"{r.metadata.name} dropping {worker}")

    # restartPolicy Always: the runtime restarts it after the back-off, and it serves again once loaded
    def ready_again():
        p = core.read_namespaced_pod(pod, stack.namespace)
        return _ready(p) and p

    p = wait_until(ready_again, STARTUP + 25, interval=0.5, what=f"{pod} Ready again")
    cs = p.status.container_statuses[0]
    assert cs.restart_count == 1 and cs.last_state.terminated.exit_code == 137
    assert stack.engines()[pod]["pid"] != pid
