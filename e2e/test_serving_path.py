"""The serving path under load: agentic sessions stream through the operator's router (vllm-router, run by the
mock runtime, reached at a router pod's IP) while the serving scales down 4 -> 1 and while its one group rolls out
to a new template through a surge group. No stream may fail, be cut before [DONE], or end short of its tokens:
groups leave routing, drain, and only then go (docs/drain.md). Last, a serving whose router asks for cores of its
own gets one (routing.resources.dedicatedCpus, the runtime playing the kubelet's static CPU manager).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from flashserve.render.naming import router_name

from e2e.support import (
    OperatorProcess,
    free_port,
    fresh_namespace,
    start_runtime,
    stop_runtime,
    wait_until,
)

pytestmark = pytest.mark.timeout(420)

SERVING = "path"
STARTUP = 3.0  # engine seconds to load: the surge and the replaced group start quickly


@pytest.fixture(scope="module")
def path_stack(external_cluster, kube, kubectl, crd_installed, router_url, tmp_path_factory):
    from kubernetes import client

    info = external_cluster
    namespace = fresh_namespace(kube, "e2e-path")
    logs = tmp_path_factory.mktemp("serving-path")
    operator = OperatorProcess(info.kubeconfig, namespace, logs).start()
    status_port = free_port()
    runtime = start_runtime(info, namespace, logs, "--time-scale", "1", "--startup-seconds", str(STARTUP),
                            "--status-port", str(status_port), "--probe-interval", "0.5")
    try:
        operator.wait_serving()
        cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
              "metadata": {"name": SERVING, "namespace": namespace},
              "spec": {"placement": {"accelerator": "GB200"}, "replicas": 4,
                       "rollout": {"drainSeconds": 120}}}  # fmt: skip
        kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        wait_until(lambda: _ready_groups(kubectl, namespace) == 4, 120, interval=1, what="4 ready groups")
        url = router_url(namespace, SERVING, timeout=90)

        def routed() -> bool:
            st = _dss(kubectl, namespace).get("status") or {}
            ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
            available = (st.get("router") or {}).get("availableReplicas", 0)
            return available >= 1 and ready.get("reason") == "AllReplicasReady"

        wait_until(routed, 60, interval=1, what="status.router with an available pod and Ready AllReplicasReady")
        router = _dss(kubectl, namespace)["status"]["router"]
        assert "unavailableSince" not in router, f"cleared once a router pod is available: {router}"
        yield namespace, url, logs, operator, f"http://127.0.0.1:{status_port}"
    finally:
        stop_runtime(runtime)
        operator.stop()
        client.CoreV1Api(kube).delete_namespace(namespace, propagation_policy="Background")


def _dss(kubectl, namespace: str) -> dict:
    return json.loads(kubectl("get", "dss", SERVING, "-n", namespace, "-o", "json").stdout)


def _ready_groups(kubectl, namespace: str) -> int:
    return int((_dss(kubectl, namespace).get("status") or {}).get("readyReplicas") or 0)


def _statefulsets(kubectl, namespace: str) -> dict[str, str]:
    """StatefulSet name -> its template hash."""
    items = json.loads(kubectl("get", "statefulsets", "-n", namespace, "-o", "json").stdout)["items"]
    return {s["metadata"]["name"]: s["metadata"]["annotations"].get("flashserve.io/template-hash", "")
            for s in items if not s["metadata"].get("deletionTimestamp")}


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> str:
    with _LOCAL.open(url, timeout=10) as resp:
        return resp.read().decode()


def _complete(url: str, prompt: str, session: str) -> None:
    """One short completion through a router at `url`, with the session key the router places it by."""
    body = json.dumps({"model": "deepseek-flash", "prompt": prompt, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={
        "content-type": "application/json", "X-Session-ID": session})
    with _LOCAL.open(req, timeout=30) as resp:
        assert resp.status == 200


def _served_per_rank(kubectl, namespace: str) -> dict[tuple[str, str], float]:
    """(engine pod IP, data-parallel rank) -> requests finished, over the serving's engine pods."""
    from flashserve_testbed.router.bench_vllm_router import per_rank

    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l",
                              f"flashserve.io/serving={SERVING},app.kubernetes.io/component=engine",
                              "-o", "json").stdout)["items"]  # fmt: skip
    out: dict[tuple[str, str], float] = {}
    for pod in pods:
        ip = pod["status"].get("podIP")
        if not ip:
            continue
        for rank, served in enumerate(per_rank(_get(f"http://{ip}:8000/metrics"), "vllm:request_success_total")):
            out[(ip, str(rank))] = served
    return out


def test_the_router_the_operator_renders_sends_a_session_to_one_rank_of_one_pod(path_stack, kubectl):
    """routing.dataParallelAware (the default): the real vllm-router, discovering the pods through the API server,
    lists each of the 4 ranks of each of the 4 engine pods as a worker and keeps a session on one of them. At the
    default routing.logLevel (warn) the session key stays out of the router pods' logs."""
    namespace, url, logs, _, _ = path_stack
    router_ip = url.split("//", 1)[1].rsplit(":", 1)[0]
    metrics = _get(f"http://{router_ip}:29000/metrics")
    workers = [re.search(r'worker="([^"]+)"', line).group(1) for line in metrics.splitlines()
               if line.startswith("vllm_router_worker_health{") and float(line.rsplit(" ", 1)[1]) == 1]
    assert len(workers) == 16 and all(re.fullmatch(r"http://127(\.\d+){3}:8000@[0-3]", w) for w in workers), workers
    before = _served_per_rank(kubectl, namespace)
    for _ in range(3):
        _complete(url, "the same session", "e2e-one-rank")
    after = _served_per_rank(kubectl, namespace)
    moved = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    assert list(moved.values()) == [3.0], moved
    router_logs = sorted((logs / "engines").glob(f"{namespace}_{router_name(SERVING)}-*.log"))
    assert router_logs and all(p.stat().st_size for p in router_logs), "the runtime keeps each router pod's output"
    assert not [p.name for p in router_logs if "e2e-one-rank" in p.read_text(errors="replace")]


def _start_load(url: str, report: Path, seconds: int, model: str | None = None) -> subprocess.Popen:
    """`model` named, or the first of the endpoint's /models."""
    cmd = [sys.executable, "-m", "flashserve.cli", "load", "--base-url", f"{url}/v1", "--schedule",
           f"ramp 0 8 3s; hold 8 {seconds}s", "--prompt-scale", "0.2", "--gap-seconds", "1", "--sla", "100",
           "--json", str(report), "--progress-interval", "15", *(["--model", model] if model else [])]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(load: subprocess.Popen, report: Path) -> dict:
    out, _ = load.communicate(timeout=240)
    assert load.returncode == 0, out
    doc = json.loads(report.read_text())
    failed = [r for r in doc.get("records") or doc.get("requests") or [] if isinstance(r, dict) and r.get("error")]
    summary = doc["summary"]
    assert not summary["errors"], f"{summary['errors']}: {failed[:5]}\n{out}"
    return summary


def test_scale_down_4_to_1_under_load_cuts_no_stream(path_stack, kubectl):
    namespace, url, logs, operator, _ = path_stack
    report = logs / "scale-down.json"
    load = _start_load(url, report, 45)
    t0 = time.monotonic()
    try:
        time.sleep(10)  # sessions on every engine
        kubectl("patch", "dss", SERVING, "-n", namespace, "--type", "merge", "-p", '{"spec": {"replicas": 1}}')
        wait_until(lambda: len(_statefulsets(kubectl, namespace)) == 1, 150, interval=1,
                   what="the three surplus groups drained and deleted")  # fmt: skip
        removed_after = time.monotonic() - t0 - 10
    finally:
        summary = _finish(load, report)
    drains = (_dss(kubectl, namespace).get("status") or {}).get("lastDrains") or []
    print(f"\nscale-down 4 -> 1 under load: {summary['ok']} streams ok, 0 failed; groups gone {removed_after:.0f}s "
          f"after the edit; drains: {[(d.get('group'), d.get('endedBy'), d.get('seconds')) for d in drains]}")
    assert summary["ok"] > 20
    assert {d.get("endedBy") for d in drains} <= {"Idle"}, f"a drain timed out: {drains}"


def test_rollout_of_one_group_under_load_keeps_serving(path_stack, kubectl):
    namespace, url, logs, operator, _ = path_stack
    wait_until(lambda: len(_statefulsets(kubectl, namespace)) == 1 and _ready_groups(kubectl, namespace) == 1, 150,
               interval=1, what="one ready group")  # fmt: skip
    (before,) = _statefulsets(kubectl, namespace).values()
    report = logs / "rollout.json"
    load = _start_load(url, report, 75)
    t0 = time.monotonic()
    try:
        time.sleep(8)
        patch = {"spec": {"engine": {"env": [{"name": "FLASHSERVE_E2E_ROLLOUT", "value": "1"}]}}}
        kubectl("patch", "dss", SERVING, "-n", namespace, "--type", "merge", "-p", json.dumps(patch))
        wait_until(lambda: len(_statefulsets(kubectl, namespace)) == 2, 60, interval=0.5, what="the surge group")

        ready_seen: list[int] = []

        def rolled() -> bool:
            sts = _statefulsets(kubectl, namespace)
            ready_seen.append(_ready_groups(kubectl, namespace))
            return len(sts) == 1 and before not in sts.values() and ready_seen[-1] == 1

        wait_until(rolled, 200, interval=1, what="group 0 on the new template and the surge group gone")
        took = time.monotonic() - t0 - 8
    finally:
        summary = _finish(load, report)
    print(f"\none-group rollout under load (surge): {summary['ok']} streams ok, 0 failed; done {took:.0f}s after "
          f"the edit; readyReplicas seen {sorted(set(ready_seen))}")
    assert summary["ok"] > 20
    assert min(ready_seen) == 1, "the surge group counts for group 0 while it drains and is replaced"


def _engines(status: str) -> list[dict]:
    return json.loads(_get(f"{status}/-/engines"))["engines"]


def test_dedicated_cpus_give_the_router_a_core_no_other_pod_runs_on(path_stack, kubectl, router_url):
    """routing.resources.dedicatedCpus: the operator makes the router pod Guaranteed (the API server's
    status.qosClass says so), and the runtime, playing the kubelet's static CPU manager, runs that pod's
    vllm-router, each of its threads, on a core of its own and every other pod on the rest.
    Deleting the serving gives the core back."""
    host = sorted(os.sched_getaffinity(0))
    if len(host) < 2:
        pytest.skip("the shared pool keeps one core: a core of its own needs two")
    namespace, _, _, _, status = path_stack
    name = "cores"
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": name, "namespace": namespace},
          "spec": {"placement": {"accelerator": "GB200"}, "replicas": 1, "routing": {
              "replicas": 1, "resources": {"cpu": 1, "memory": "1Gi", "dedicatedCpus": True}}}}  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    try:
        url = router_url(namespace, name, timeout=120)
        pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l",
                                  f"flashserve.io/serving={name},app.kubernetes.io/component=router",
                                  "-o", "json").stdout)["items"]  # fmt: skip
        assert [p["status"].get("qosClass") for p in pods] == ["Guaranteed"]
        router = next(e for e in _engines(status) if e["serving"] == name and e["kind"] == "router")
        assert router["cpus"] == host[-1:], router
        others = [e for e in _engines(status) if e["pid"] and e["uid"] != router["uid"]]
        assert others and all(e["cpus"] == host[:-1] for e in others), [(e["pod"], e["cpus"]) for e in others]
        # every thread on that core. Not a count of `tokio-rt-worker` threads: one run here had two, tokio
        # naming its blocking-pool threads as its workers; the router's unit test counts workers unpinned by any
        # API reads (tests/router/test_vllm_router.py)
        threads = list(Path(f"/proc/{router['pid']}/task").iterdir())
        assert {t.name: sorted(os.sched_getaffinity(int(t.name))) for t in threads} == {
            t.name: host[-1:] for t in threads}
        _complete(url, "pinned", "e2e-cores")
    finally:
        kubectl("delete", "dss", name, "-n", namespace, "--wait=false")
    wait_until(lambda: all(e["cpus"] == host for e in _engines(status) if e["pid"] and e["serving"] != name), 90,
               interval=1, what="the core back in the shared pool")  # fmt: skip


def test_a_sticky_serving_gives_its_router_process_the_session_expiry(path_stack, kubectl, router_url):
    """routing.policy sticky_least_loaded: the vllm-router the router pod runs places a session with that policy
    and expires it after the spec's stickyLeastLoaded.sessionIdleSeconds (60 s here, where the binary's own
    default is 2 hours): the same session, back after 61 s idle, has expired and is placed again as a new one.
    What the expiry does to placement is tested on the binary (tests/router/test_vllm_router.py)."""
    namespace, _, logs, _, _ = path_stack
    name = "sticky"
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": name, "namespace": namespace},
          "spec": {"placement": {"accelerator": "GB200"}, "replicas": 1, "routing": {
              "replicas": 1, "policy": "sticky_least_loaded", "logLevel": "debug",
              "stickyLeastLoaded": {"sessionIdleSeconds": 60}}}}  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    try:
        url = router_url(namespace, name, timeout=120)
        router_logs = sorted((logs / "engines").glob(f"{namespace}_{router_name(name)}-*.log"))

        def logged(pattern: str) -> bool:
            return any(re.search(pattern, p.read_text(errors="replace")) for p in router_logs)

        _complete(url, "sticky", "e2e-sticky")
        placed = time.monotonic()
        wait_until(lambda: logged(r"SLL: new session 'e2e-sticky'"), 10, interval=0.5,
                   what="the router pod's log of the session it placed")  # fmt: skip
        time.sleep(max(0.0, placed + 61 - time.monotonic()))
        _complete(url, "sticky", "e2e-sticky")
        # expired by the sweep that request runs (a minute since the last), or on its own lookup
        expired = r"SLL: expired session 'e2e-sticky'|session 'e2e-sticky' on replica '\S+' expired, reassigning"
        wait_until(lambda: logged(expired), 10, interval=0.5,
                   what="the session expired after the spec's 60 s, not the binary's 2 hours")  # fmt: skip
    finally:
        kubectl("delete", "dss", name, "-n", namespace, "--wait=false")
