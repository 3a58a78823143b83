"""Faults, bad input and secrets, against the real API server with the operator as a separate process."""

from __future__ import annotations

import json
import string
import time
from collections import Counter

import pytest
import yaml
from flashserve.render.naming import group_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e.support import (
    OperatorProcess,
    condition,
    get_json,
    restart_process,
    wait_until,
)
from e2e.tcp_proxy import SilenceableProxy
from e2e.test_operator import (  # noqa: F401
    apply_serving,
    operator,
    pods,
    ready,
    serving,
    statefulsets,
)


def test_hand_scaled_statefulset_is_restored_with_an_event(operator, kubectl, namespace):  # noqa: F811
    apply_serving(kubectl, namespace, {"replicas": 1, "parallelism": {"nodesPerReplica": 2}})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready")
    kubectl("-n", namespace, "scale", f"sts/{group_name('flash', 0)}", "--replicas=5")
    wait_until(lambda: get_json(kubectl, "-n", namespace, "sts", group_name("flash", 0))["spec"]["replicas"] == 2, 20,
               what="StatefulSet size restored")  # fmt: skip
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.kind=DeepSeekServing")
    assert any(e["reason"] == "DriftCorrected" and group_name("flash", 0) in e["message"] for e in events["items"])
    wait_until(lambda: ready(kubectl, namespace) and len(pods(kubectl, namespace)) == 2, 60, what="back to 2 pods")


def test_silent_watch_is_detected_and_recovered(cluster, namespace, crd_installed, kubectl, tmp_path):
    """Behind a proxy that freezes every open connection, the operator's watches go silent. The client-side
    watch timeout must notice, reconnect, and see a StatefulSet deleted meanwhile; the leader's Lease renewals,
    frozen too, must not cost it the leadership."""
    cluster.require_pools()
    kc = yaml.safe_load(cluster.kubeconfig.read_text())
    server = kc["clusters"][0]["cluster"]["server"]
    host, port = server.rsplit("//", 1)[1].rsplit(":", 1)
    proxy = SilenceableProxy(host, int(port)).start()
    kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(kc))
    op = OperatorProcess(proxied, namespace, tmp_path, resync=3,
                         extra=["--watch-timeout", "8", "--watch-client-timeout", "12"]).start()  # fmt: skip
    try:
        op.wait_serving()
        apply_serving(kubectl, namespace, {"replicas": 1})
        wait_until(lambda: ready(kubectl, namespace), 60, what="Ready")
        uid = get_json(kubectl, "-n", namespace, "sts", group_name("flash", 0))["metadata"]["uid"]
        frozen = proxy.silence_existing()
        assert frozen >= 5, "the operator's watches run through the proxy"
        kubectl("-n", namespace, "delete", "sts", group_name("flash", 0), "--wait=false")
        t0 = time.monotonic()
        # Client watch timeout (12 s), re-list, then writes that first fail on the frozen pooled connections
        # (15 s request timeout) and are retried on fresh ones: well under two minutes on a loaded machine.
        wait_until(lambda: get_json(kubectl, "-n", namespace, "sts", group_name("flash", 0))["metadata"]["uid"] != uid, 150,
                   what="StatefulSet restored after the silent watch was replaced")  # fmt: skip
        recovered = time.monotonic() - t0
        assert recovered > 3, "restored too fast for the watch to have been silent: the test proves nothing"
        # The Lease renewals went through the same frozen proxy: they must have moved to fresh connections.
        assert not op.exited() and "lease lost" not in op.log_path.read_text(errors="replace"), "kept the lead"
        print(f"silent watch recovered in {recovered:.1f}s")
    finally:
        proxy.release()
        op.stop()
        proxy.stop()


def test_api_server_restart_mid_reconcile_recovers(operator, kubectl, namespace, cluster):  # noqa: F811
    from flashserve_testbed.localcluster.controlplane import ControlPlane
    from flashserve_testbed.localcluster.paths import Layout, toolchain_bin

    cluster.require_pools()
    apply_serving(kubectl, namespace, {"replicas": 1})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready")
    kubectl("-n", namespace, "scale", "dss/flash", "--replicas=5")
    time.sleep(0.3)  # mid-reconcile: some groups written, others not yet
    pid = ControlPlane(Layout(), toolchain_bin()).pid("kube-apiserver")
    assert pid, "local cluster's API server pid"
    new_pid = restart_process(pid, down_seconds=5)
    pid_file = Layout().kwok_cluster / "pids" / "kube-apiserver.pid"
    if pid_file.exists():
        pid_file.write_text(str(new_pid))  # keep the cluster tooling able to find (and stop) it
    wait_until(lambda: kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60, what="API server back")
    wait_until(lambda: ready(kubectl, namespace, replicas=5), 120, what="converged after the API server restart")
    assert not operator.exited(), "the operator survived the outage"
    names = sorted(s["metadata"]["name"] for s in statefulsets(kubectl, namespace))
    assert names == [group_name("flash", i) for i in range(5)]


def test_lost_node_pods_are_rescheduled(operator, kubectl, namespace, cluster):  # noqa: F811
    from flashserve_testbed.localcluster import ensure_up

    apply_serving(kubectl, namespace, {"replicas": 1})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready")
    node = pods(kubectl, namespace)[0]["spec"]["nodeName"]
    node_obj = get_json(kubectl, "node", node)
    kubectl("delete", "node", node, "--wait=false")
    try:
        wait_until(lambda: any(p["spec"].get("nodeName") not in (None, node) for p in pods(kubectl, namespace)), 90,
                   what="pod rescheduled on another node")  # fmt: skip
        wait_until(lambda: ready(kubectl, namespace), 90, what="Ready again")
        assert node_obj["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    finally:
        ensure_up(quiet=True)  # recreates the missing node


def test_secrets_never_leak(operator, kubectl, namespace):  # noqa: F811
    secret_value = "hf_SuperSecretToken_do_not_leak_42"
    kubectl("-n", namespace, "create", "secret", "generic", "hf", f"--from-literal=HF_TOKEN={secret_value}")
    apply_serving(kubectl, namespace, {"model": {"source": {"huggingFace": {"tokenSecretRef": {"name": "hf"}}}}})
    wait_until(lambda: ready(kubectl, namespace), 60, what="Ready")
    everything = "".join(
        kubectl("-n", namespace, "get", kind, "-o", "yaml").stdout
        for kind in ("dss", "statefulsets", "pods", "services", "events")
    )
    assert "hf" in everything and secret_value not in everything
    env = get_json(kubectl, "-n", namespace, "sts", group_name("flash", 0))["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}} in env
    assert secret_value not in operator.logs()


def test_names_near_the_length_limits_yield_valid_children(operator, kubectl, namespace):  # noqa: F811
    long_name = "flash-" + "a" * 240 + "-tail"  # 251 characters: a valid object name, too long for most children
    apply_serving(kubectl, namespace, {"replicas": 2}, name=long_name)
    wait_until(lambda: ready(kubectl, namespace, name=long_name), 90, what="Ready with a long name")
    for sts in statefulsets(kubectl, namespace):
        assert len(sts["metadata"]["name"]) <= 52
    for svc in get_json(kubectl, "-n", namespace, "services")["items"]:
        assert len(svc["metadata"]["name"]) <= 63


# A grammar of CR specs: real field names with values drawn from the right type, the wrong type, or edges.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 300000), st.floats(-1e3, 1e6, allow_nan=False),
                     st.text(string.ascii_letters + string.digits + "-_=./ :$`'\";", max_size=24))  # fmt: skip
_FIELDS = {
    "replicas": _scalars, "rollout": st.fixed_dictionaries({"maxUnavailable": _scalars}),
    "parallelism": st.fixed_dictionaries({}, optional={"tensorParallelSize": _scalars, "dataParallelSizeLocal": _scalars,
                                                      "nodesPerReplica": _scalars, "expertParallel": _scalars,
                                                      "all2allBackend": _scalars,
                                                      "dbo": st.fixed_dictionaries({"enabled": _scalars}),
                                                      "eplb": st.fixed_dictionaries({"enabled": _scalars})}),
    "engine": st.fixed_dictionaries({}, optional={"image": _scalars, "maxModelLen": _scalars, "kvCacheDtype": _scalars,
                                                 "maxNumSeqs": _scalars, "maxNumBatchedTokens": _scalars,
                                                 "gpuMemoryUtilization": _scalars,
                                                 "extraArgs": st.lists(_scalars, max_size=3),
                                                 "env": st.lists(st.fixed_dictionaries({"name": _scalars, "value": _scalars}), max_size=2)}),
    "placement": st.fixed_dictionaries({}, optional={"accelerator": st.one_of(_scalars, st.sampled_from(["GB200", "B200", "GB300", "B300"]))}),
    "autoscaling": st.fixed_dictionaries({}, optional={"enabled": _scalars, "minReplicas": _scalars, "maxReplicas": _scalars,
                                                      "sla": st.fixed_dictionaries({"perUserTokensPerSecond": _scalars})}),
    "bogusField": _scalars,
}  # fmt: skip
specs = st.fixed_dictionaries({}, optional=_FIELDS)


@pytest.fixture(scope="module")
def fuzz_log() -> dict:
    return {"rejected": 0, "accepted": [], "n": 0}


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(spec=specs)
def test_fuzzed_crs_are_rejected_with_a_field_or_accepted(kubectl, namespace, crd_installed, fuzz_log, spec):
    fuzz_log["n"] += 1
    name = f"fz{fuzz_log['n']:03d}"
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name}, "spec": spec}
    out = kubectl("-n", namespace, "create", "-o", "json", "-f", "-", input=json.dumps(cr), check=False)
    if out.returncode != 0:
        fuzz_log["rejected"] += 1
        assert "spec." in out.stderr or "unknown field" in out.stderr, out.stderr
    else:
        fuzz_log["accepted"].append(json.loads(out.stdout)["spec"])  # as stored: pruned and defaulted


def test_fuzzed_crs_that_passed_admission_are_served_or_reported(operator, kubectl, namespace, fuzz_log):  # noqa: F811
    """Replays the accepted fuzz cases into this test's namespace, with the operator running: each one ends
    Ready or InvalidSpec (never silently ignored), and the operator neither crashes nor loops hot."""
    assert fuzz_log["n"] >= 100, "run with the fuzz test before it"
    cases = [
        {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": f"fz{i:03d}"},
         "spec": {**spec, "replicas": min(int(spec.get("replicas", 1)), 1)}}
        for i, spec in enumerate(fuzz_log["accepted"][:25])
    ]  # fmt: skip
    print(f"fuzzed {fuzz_log['n']} CRs: {fuzz_log['rejected']} rejected at admission, {len(fuzz_log['accepted'])} accepted")
    for cr in cases:
        kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(cr))

    def settled() -> bool:
        for cr in cases:
            obj = serving(kubectl, namespace, cr["metadata"]["name"])
            if condition(obj, "Ready").get("observedGeneration") != obj["metadata"]["generation"]:
                return False
        return True

    wait_until(settled, 120, what="every accepted CR observed")
    outcomes = Counter(condition(serving(kubectl, namespace, cr["metadata"]["name"]), "Ready").get("reason")
                       for cr in cases)  # fmt: skip
    print(f"replayed {len(cases)} accepted CRs with the operator running: {dict(outcomes)}")
    before = operator.metrics()["flashserve_reconciles_total"]
    time.sleep(10)
    after = operator.metrics()["flashserve_reconciles_total"]
    assert not operator.exited()
    assert after - before <= 6 * len(cases) + 10, f"reconciling hot: {after - before} reconciles in 10 s"
