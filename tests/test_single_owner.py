"""One owner per fact: every copy of a fact is generated from its owner, and each test here fails when a copy
drifts from it (the managed vLLM flags have theirs in test_vllm_flags.py)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import yaml
from flashserve.api import crd
from flashserve.api import v1alpha1 as api
from flashserve.api.crd import CRD_FILE, generate_crd
from flashserve.autoscaling import policy
from flashserve.controller import status
from flashserve.facts import engine_choices, vllm_flags, vllm_rules
from flashserve.facts.accelerators import ACCELERATORS, Accelerator, AcceleratorName
from flashserve.render.renderer import TEMPLATE_HASH_ANNOTATION, render

from tests.conftest import ROOT

OPERATOR = ROOT / "operator" / "flashserve"


def _schema() -> dict:
    return generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _committed_spec() -> dict:
    doc = yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _cel_gpus(expr: str, name: str) -> int:
    """Evaluates the generated `accelerator in [...] ? n : ...` chain for one accelerator name."""
    expr = expr.strip("()")
    while m := re.fullmatch(r"self\.placement\.accelerator in \[([^\]]*)\] \? (\d+) : (.*)", expr):
        if f"'{name}'" in m.group(1).split(", "):
            return int(m.group(2))
        expr = m.group(3)
    return int(expr)


def test_gpus_per_node_in_the_crd_are_the_accelerator_table():
    expr = crd.cel_gpus_per_node()
    assert {n: _cel_gpus(expr, n) for n in ACCELERATORS} == {n: a.gpus_per_node for n, a in ACCELERATORS.items()}
    rule = _committed_spec()["x-kubernetes-validations"][0]["rule"]
    assert expr in rule  # the committed CRD carries the generated expression
    source = (OPERATOR / "api" / "crd.py").read_text()
    assert not re.search(r"'(%s)'" % "|".join(ACCELERATORS), source), "accelerator names written by hand in crd.py"


def test_gpus_per_node_follow_a_change_of_the_table(monkeypatch):
    grown = {**ACCELERATORS, "X1": Accelerator("X1", 2, ("NVIDIA-X1",), False, 1, 80)}
    monkeypatch.setattr(crd, "ACCELERATORS", grown)
    expr = crd.cel_gpus_per_node()
    assert {n: _cel_gpus(expr, n) for n in grown} == {n: a.gpus_per_node for n, a in grown.items()}


def test_nvlink_domain_rules_are_the_accelerator_table():
    expr = crd.cel_nvlink_domain_nodes()
    for a in ACCELERATORS.values():
        if a.nodes_per_nvlink_domain != 1:
            assert f"self.placement.accelerator == '{a.name}' ? {a.nodes_per_nvlink_domain}" in expr
    nvlink = sorted(a.name for a in ACCELERATORS.values() if a.multi_node_nvlink)
    rules = " ".join(r["rule"] for r in _committed_spec()["x-kubernetes-validations"])
    assert f"in {crd.cel_list(nvlink)}" in rules


def test_accelerator_enum_is_the_table():
    assert typing.get_args(AcceleratorName) == tuple(ACCELERATORS)
    acc = _committed_spec()["properties"]["placement"]["properties"]["accelerator"]
    assert acc["enum"] == list(ACCELERATORS)


@pytest.mark.parametrize(
    "model, field, choices, known",
    [
        (api.EngineSpec, "kvCacheDtype", engine_choices.KV_CACHE_DTYPE_CHOICES, vllm_flags.KV_CACHE_DTYPES),
        (api.EngineSpec, "attentionBackend", engine_choices.ATTENTION_BACKEND_CHOICES, vllm_flags.MLA_ATTENTION_BACKENDS),
        (api.EngineSpec, "cudaGraphMode", engine_choices.CUDA_GRAPH_MODE_CHOICES, vllm_flags.CUDAGRAPH_MODES),
        (api.ParallelismSpec, "all2allBackend", engine_choices.ALL2ALL_BACKEND_CHOICES, vllm_flags.ALL2ALL_BACKENDS),
    ],
)
def test_vllm_enums_are_one_list(model, field, choices, known):
    section = {api.EngineSpec: "engine", api.ParallelismSpec: "parallelism"}[model]
    assert _committed_spec()["properties"][section]["properties"][field]["enum"] == list(choices)
    assert set(choices) <= set(known), "the API admits a value vLLM 0.33 does not know"


def test_backend_rules_name_backends_the_api_admits():
    assert set(vllm_rules.DBO_ALL2ALL_BACKENDS) <= set(engine_choices.ALL2ALL_BACKEND_CHOICES)
    assert set(vllm_rules.NO_EPLB_ALL2ALL_BACKENDS) <= set(engine_choices.ALL2ALL_BACKEND_CHOICES)


def test_template_hash_key_has_one_owner():
    sts = next(o for o in render({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x", "namespace": "ns"}}) if o["kind"] == "StatefulSet")
    assert TEMPLATE_HASH_ANNOTATION in sts["metadata"]["annotations"]
    assert TEMPLATE_HASH_ANNOTATION in sts["spec"]["template"]["metadata"]["annotations"]
    templates = (OPERATOR / "render" / "templates").glob("*.j2")
    assert [p.name for p in templates if TEMPLATE_HASH_ANNOTATION in p.read_text()] == []


def test_one_condition_type_and_one_list_of_condition_types():
    assert status.Cond is policy.ConditionHint
    assert {policy.METRICS_AVAILABLE, policy.SCALING_LIMITED} <= set(api.CONDITION_TYPES)
    assert status.CONDITION_TYPES is api.CONDITION_TYPES
    described = _schema()["properties"]["status"]["properties"]["conditions"]["description"]
    assert all(t in described for t in api.CONDITION_TYPES)
    conditions = {c.type for c in status.group_conditions([], 0, 0) + status.invalid_spec_conditions(["x"])}
    assert conditions <= set(api.CONDITION_TYPES)


def test_autoscaling_modes_are_the_apis():
    modes = typing.get_args(api.AutoscalingSpec.model_fields["mode"].annotation)
    assert {policy.ACTIVE, policy.ADVISORY} == set(modes)


def test_one_clock():
    sources = [*OPERATOR.rglob("*.py"), *(ROOT / "testbed").rglob("*.py")]
    owners = [str(p.relative_to(ROOT)) for p in sources if re.search(r"^def _?now_iso\b", p.read_text(), re.M)]
    assert owners == ["operator/flashserve/clock.py"]
    from flashserve.clock import now_iso

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now_iso())


def _walk(node: dict, path: str):
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_every_list_and_map_is_bounded():
    """The CEL cost estimate of a rule over a list or map grows with its bound; unbounded, the API server
    assumes the largest object and may refuse the CRD."""
    schema = _schema()
    unbounded = [p for part in ("spec", "status") for p, n in _walk(schema["properties"][part], part)
                 if (n.get("type") == "array" and "maxItems" not in n)
                 or (isinstance(n.get("additionalProperties"), dict) and "maxProperties" not in n)]  # fmt: skip
    assert unbounded == []


def test_the_moved_benchmark_figures_are_not_in_the_api():
    text = (OPERATOR / "api" / "v1alpha1.py").read_text()
    for phrase in ("attainment of", "measured", "50 per GPU", "buy twice", "s of CPU"):
        assert phrase not in text, phrase
    assert Path(ROOT / "docs" / "api-validation.md").exists()
