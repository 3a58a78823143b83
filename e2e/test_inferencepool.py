"""InferencePools against the real API server: the project's own InferencePool v1 CRD
(e2e/crds/inferencepool-v1.yaml) is installed with server-side apply, and the pool rendered for every sample
(spec.routing.inferencePool.enabled) is admitted by a server-side dry-run, with the defaults the v1 API sets;
pools broken the ways the API forbids are refused, so the CRD's CEL rules compile and bite."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from flashserve.render.renderer import render

from e2e.conftest import REPO, KubectlRun
from e2e.support import wait_established
from tests.conftest import SAMPLES

POOL_CRD = REPO / "e2e" / "crds" / "inferencepool-v1.yaml"
POOL_CRD_NAME = "inferencepools.inference.networking.k8s.io"


@pytest.fixture(scope="module")
def inferencepool_crd(kubectl: KubectlRun) -> str:
    """The project's InferencePool CRD, applied and Established; removed after if this module installed it."""
    existed = kubectl("get", "crd", POOL_CRD_NAME, check=False).returncode == 0
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=flashserve-e2e", "-f", str(POOL_CRD))
    wait_established(kubectl, POOL_CRD_NAME)
    deadline = time.monotonic() + 30
    while kubectl("get", "inferencepools", "-A", check=False).returncode != 0:  # discovery lags Established
        assert time.monotonic() < deadline, "InferencePool resource not served after 30s"
        time.sleep(0.5)
    yield POOL_CRD_NAME
    if not existed:
        kubectl("delete", "crd", POOL_CRD_NAME, "--wait=false", check=False)


def _pool_of(sample: dict, namespace: str) -> dict:
    sample["metadata"]["namespace"] = namespace
    sample["spec"].setdefault("routing", {}).setdefault("inferencePool", {})["enabled"] = True
    (pool,) = [o for o in render(sample) if o["kind"] == "InferencePool"]
    return pool


def _dry_run(kubectl: KubectlRun, obj: dict):
    return kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=flashserve-e2e", "-o", "json",
                   "-f", "-", input=json.dumps(obj), check=False)  # fmt: skip


@pytest.mark.parametrize("sample_file", SAMPLES, ids=lambda p: p.name)
def test_the_pool_of_every_sample_is_admitted(kubectl, inferencepool_crd, namespace, sample_file):
    pool = _pool_of(yaml.safe_load(sample_file.read_text()), namespace)
    proc = _dry_run(kubectl, pool)
    assert proc.returncode == 0, proc.stderr
    stored = json.loads(proc.stdout)
    assert stored["spec"]["selector"] == pool["spec"]["selector"]
    assert stored["spec"]["targetPorts"] == pool["spec"]["targetPorts"]
    assert stored["spec"]["appProtocol"] == "http", "the v1 default"


def test_a_pool_with_its_endpoint_picker_gets_the_v1_defaults(kubectl, inferencepool_crd, namespace):
    sample = yaml.safe_load(SAMPLES[0].read_text())
    sample["spec"]["routing"] = {"inferencePool": {"enabled": True, "endpointPickerRef": {
        "name": "flash-epp", "port": {"number": 9002}}}}  # fmt: skip
    proc = _dry_run(kubectl, _pool_of(sample, namespace))
    assert proc.returncode == 0, proc.stderr
    picker = json.loads(proc.stdout)["spec"]["endpointPickerRef"]
    assert picker == {"group": "", "kind": "Service", "name": "flash-epp", "port": {"number": 9002},
                      "failureMode": "FailClose"}  # fmt: skip


def test_the_crd_refuses_what_the_v1_api_refuses(kubectl, inferencepool_crd, namespace):
    good = _pool_of(yaml.safe_load(SAMPLES[0].read_text()), namespace)
    broken = {
        "port is required": {"endpointPickerRef": {"name": "epp"}},
        "must be unique": {"targetPorts": [{"number": 8000}, {"number": 8000}]},
        "targetPorts": {"targetPorts": [{"number": 8000 + i} for i in range(9)]},
    }
    for words, change in broken.items():
        pool = {**good, "spec": {**good["spec"], **change}}
        proc = _dry_run(kubectl, pool)
        assert proc.returncode != 0 and words in proc.stderr, (words, proc.stderr)
