"""The InferencePools the operator renders against the project's own InferencePool v1 CRD
(e2e/crds/inferencepool-v1.yaml): the openAPI schema with jsonschema, and its CEL rules (three, written here
in Python, since no CEL evaluator is installed; e2e/test_inferencepool.py has the API server judge them)."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml
from flashserve.render.renderer import render

from tests.builders import by_kind, cr
from tests.conftest import ROOT, load_sample

CRD = ROOT / "e2e" / "crds" / "inferencepool-v1.yaml"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"]) == (
        "inference.networking.k8s.io", "v1", "InferencePool")
    return version["schema"]["openAPIV3Schema"]


def _cel_errors(pool: dict) -> list[str]:
    """The CRD's x-kubernetes-validations, as the API server would evaluate them (after defaulting)."""
    spec, errs = pool["spec"], []
    if not all(len(k) <= 253 and _LABEL_KEY.match(k) for k in spec["selector"]["matchLabels"]):
        errs.append("selector.matchLabels: a key is not a label key")
    numbers = [p["number"] for p in spec["targetPorts"]]
    if len(set(numbers)) != len(numbers):
        errs.append("targetPorts: port number must be unique")
    picker = spec.get("endpointPickerRef")
    if picker is not None and picker.get("kind", "Service") == "Service" and "port" not in picker:
        errs.append("endpointPickerRef: port is required when kind is 'Service'")
    return errs


def _check(pool: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(_schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(pool)] + _cel_errors(pool)


def _pool(spec: dict) -> dict:
    (pool,) = by_kind(render(cr(spec)), "InferencePool")
    return pool


POOL_SPECS = {
    "defaults": {"routing": {"inferencePool": {"enabled": True}}},
    "routing-off": {"routing": {"enabled": False, "inferencePool": {"enabled": True}}},
    "engine-port": {"engine": {"port": 9100}, "routing": {"inferencePool": {"enabled": True}}},
    "multi-node": {"parallelism": {"nodesPerReplica": 2}, "routing": {"inferencePool": {"enabled": True}}},
    "picker-service": {"routing": {"inferencePool": {"enabled": True, "endpointPickerRef": {
        "name": "flash-epp", "port": {"number": 9002}}}}},
    "picker-other-kind": {"routing": {"inferencePool": {"enabled": True, "endpointPickerRef": {
        "group": "epp.example.com", "kind": "EndpointPicker", "name": "flash", "failureMode": "FailOpen"}}}},
    "long-name": {"routing": {"inferencePool": {"enabled": True}}},
}  # fmt: skip


@pytest.mark.parametrize("case", POOL_SPECS)
def test_rendered_pools_are_valid_against_the_crd(case):
    pool = _pool(POOL_SPECS[case]) if case != "long-name" else by_kind(
        render(cr(POOL_SPECS[case], name="a" * 70 + ".b")), "InferencePool")[0]  # a hashed serving label value
    assert _check(pool) == [], case


def test_every_sample_with_its_pool_on_is_valid(sample_path):
    sample = load_sample(sample_path)
    sample["spec"].setdefault("routing", {}).setdefault("inferencePool", {})["enabled"] = True
    (pool,) = by_kind(render(sample), "InferencePool")
    assert _check(pool) == [], sample_path.name


def test_the_schema_refuses_what_the_api_refuses():
    """The checks above can fail: pools broken one way each are refused."""
    good = _pool(POOL_SPECS["picker-service"])
    assert _check(good) == []
    broken = {
        "no selector labels": lambda p: p["spec"]["selector"].update(matchLabels={}),
        "nine target ports": lambda p: p["spec"].update(targetPorts=[{"number": 8000 + i} for i in range(9)]),
        "duplicate ports": lambda p: p["spec"].update(targetPorts=[{"number": 8000}, {"number": 8000}]),
        "port 0": lambda p: p["spec"].update(targetPorts=[{"number": 0}]),
        "picker Service without port": lambda p: p["spec"]["endpointPickerRef"].pop("port"),
        "unknown failure mode": lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Sometimes"),
        "bad label key": lambda p: p["spec"]["selector"]["matchLabels"].update({"bad key": "x"}),
        "h3": lambda p: p["spec"].update(appProtocol="h3"),
    }
    for what, breaks in broken.items():
        pool = copy.deepcopy(good)
        breaks(pool)
        assert _check(pool), f"{what} passed"
