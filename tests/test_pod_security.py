"""Which Pod Security Standard level the engine pods need, per topology (docs/install.md#pod-security has the table),
checked with the rules in tests/pod_security.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from flashserve.render.renderer import render

from tests.builders import cr, pod
from tests.pod_security import strictest_level, violations

SAMPLES = sorted((Path(__file__).resolve().parents[1] / "manifests" / "samples").glob("*.yaml"))

TOPOLOGIES = {
    "GB200 single node": {"placement": {"accelerator": "GB200"}},
    "B200 single node": {"placement": {"accelerator": "B200"}},
    "GB200 multi-node NVLink": {"parallelism": {"nodesPerReplica": 2}},
    "GB200 multi-node, ComputeDomain": {"parallelism": {"nodesPerReplica": 4},
                                        "placement": {"computeDomain": {"enabled": True}}},
    "B200 multi-node": {"parallelism": {"nodesPerReplica": 2}, "placement": {"accelerator": "B200"}},
    "weights from a PVC": {"model": {"source": {"pvc": {"claimName": "weights"}}}},
    "Hugging Face cache PVC": {"model": {"source": {"huggingFace": {"cachePvcName": "hf"}}}},
}  # fmt: skip


def _pods(spec: dict) -> list[dict]:
    objs = render(cr(spec))
    return [pod(objs, i) for i in range(sum(o["kind"] == "StatefulSet" for o in objs))]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_topology_is_restricted_by_default(topology):
    for p in _pods(TOPOLOGIES[topology]):
        assert violations(p, "restricted") == [], topology


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_samples_are_restricted(sample):
    objs = render(yaml.safe_load(sample.read_text()))
    for o in objs:
        if o["kind"] == "StatefulSet":
            assert strictest_level(o["spec"]["template"]["spec"]) == "restricted", sample.name


@pytest.mark.parametrize("nodes", [1, 2])
def test_ipc_lock_is_opt_in_and_needs_privileged(nodes):
    plain = _pods({"parallelism": {"nodesPerReplica": nodes}})[0]
    assert "add" not in plain["containers"][0]["securityContext"]["capabilities"]
    assert _pods({"parallelism": {"nodesPerReplica": nodes}, "engine": {"ipcLock": False}}) == _pods(
        {"parallelism": {"nodesPerReplica": nodes}}
    )
    locked = _pods({"parallelism": {"nodesPerReplica": nodes}, "engine": {"ipcLock": True}})[0]
    assert locked["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert strictest_level(locked) == "privileged"
    assert any("IPC_LOCK" in v for v in violations(locked, "baseline"))


def test_ipc_lock_unset_keeps_the_template_hash():
    """Servings that never set ipcLock are not restarted by the operator upgrade that added it."""
    from flashserve.api.validation import parse_serving
    from flashserve.render.renderer import template_hash

    h = lambda spec: template_hash(parse_serving(cr(spec)).spec)  # noqa: E731
    assert h({}) != h({"engine": {"ipcLock": True}})
    assert "ipcLock" not in parse_serving(cr({})).spec.dump()["engine"]


# ------------------------------------------------------------------------------------------ the checker


def _restricted_pod(**changes) -> dict:
    p = _pods({})[0]
    p = yaml.safe_load(yaml.safe_dump(p))
    for key, value in changes.items():
        p[key] = value
    return p


def test_checker_levels():
    p = _restricted_pod()
    assert strictest_level(p) == "restricted"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert strictest_level(_restricted_pod(**{key: True})) == "privileged"
    assert strictest_level(_restricted_pod(volumes=[{"name": "h", "hostPath": {"path": "/dev"}}])) == "privileged"
    # A volume type baseline allows but restricted does not.
    assert strictest_level(_restricted_pod(volumes=[{"name": "n", "nfs": {"server": "x", "path": "/"}}])) == "baseline"


def test_checker_container_rules():
    def with_sc(**sc) -> dict:
        p = _restricted_pod()
        p["containers"][0]["securityContext"].update(sc)
        return p

    assert strictest_level(with_sc(privileged=True)) == "privileged"
    assert strictest_level(with_sc(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]})) == "restricted"
    assert strictest_level(with_sc(capabilities={"drop": ["ALL"], "add": ["CHOWN"]})) == "baseline"
    assert strictest_level(with_sc(capabilities={"add": ["CAP_SYS_ADMIN"]})) == "privileged"
    assert strictest_level(with_sc(capabilities={})) == "baseline"  # not dropping ALL
    assert strictest_level(with_sc(allowPrivilegeEscalation=True)) == "baseline"
    assert strictest_level(with_sc(runAsNonRoot=False)) == "baseline"
    assert strictest_level(with_sc(seccompProfile={"type": "Unconfined"})) == "privileged"
    p = with_sc()
    p["containers"][0]["ports"][0]["hostPort"] = 8000
    assert strictest_level(p) == "privileged"
    p = with_sc()
    del p["securityContext"]["seccompProfile"]
    assert strictest_level(p) == "baseline"
