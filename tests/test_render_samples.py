"""Golden files and Kubernetes-schema validity for every sample in manifests/samples."""

from __future__ import annotations

import os

import yaml
from flashserve.render.renderer import render

from tests.conftest import ROOT, load_sample
from tests.k8s_schema import validate

GOLDEN = ROOT / "tests" / "golden"


def test_sample_matches_golden(sample_path):
    objs = render(load_sample(sample_path))
    text = yaml.safe_dump_all(objs, sort_keys=False, width=120)
    golden = GOLDEN / sample_path.name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file for {sample_path.name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(), f"{sample_path.name} renders differently: review, then UPDATE_GOLDEN=1"


def test_sample_objects_are_schema_valid(sample_path):
    objs = render(load_sample(sample_path))
    assert objs, "a sample renders at least one object"
    for obj in objs:
        validate(obj)


def test_every_sample_kind_is_expected(sample_path):
    cr = load_sample(sample_path)
    kinds = [o["kind"] for o in render(cr)]
    replicas = cr["spec"].get("replicas", 1)
    assert kinds.count("StatefulSet") == replicas
    assert kinds.count("Service") == replicas + 1
    routing = cr["spec"].get("routing") or {}
    routed = routing.get("enabled", True)
    budgets = 1 + (routed and routing.get("replicas", 2) >= 2)  # the engines', and the router's
    assert kinds.count("PodDisruptionBudget") == budgets
    assert kinds.count("Deployment") == kinds.count("Role") == kinds.count("RoleBinding") == int(routed)
    assert kinds.count("InferencePool") == int((routing.get("inferencePool") or {}).get("enabled", False))
