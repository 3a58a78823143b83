"""The CRD is generated from the models, is structural, and matches the committed file."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from flashserve.api.crd import CRD_FILE, crd_yaml, generate_crd

from tests.conftest import ROOT


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_committed_crd_has_no_drift():
    committed = (ROOT / "crds" / CRD_FILE).read_text()
    assert committed == crd_yaml(), "crds/ is stale: run `make crds`"


def test_flashserve_crd_command_prints_the_crd():
    out = subprocess.run([sys.executable, "-m", "flashserve.cli", "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == (ROOT / "crds" / CRD_FILE).read_text()


def test_schema_is_structural():
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if not isinstance(node, dict):
            continue
        assert "$ref" not in node, path
        assert "anyOf" not in node and "oneOf" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "title" not in node, path
        if "properties" in node:
            assert node.get("type") == "object", path
        if path.endswith(".properties") or path.endswith(".x-kubernetes-validations"):
            continue
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
            raise AssertionError(f"{path}: numeric exclusiveMinimum is not OpenAPI v3.0")


def test_int_or_string_fields():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    eng = spec["properties"]["engine"]["properties"]
    assert eng["maxModelLen"].get("x-kubernetes-int-or-string") is True
    assert "type" not in eng["maxModelLen"]
    assert eng["resources"]["properties"]["memory"].get("x-kubernetes-int-or-string") is True


def test_nullable_instead_of_null_union():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    backend = spec["properties"]["engine"]["properties"]["attentionBackend"]
    assert backend["nullable"] is True and backend["type"] == "string" and "FLASHINFER_MLA" in backend["enum"]


def test_every_spec_field_has_a_description():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = []
    for path, node in _walk(spec):
        if isinstance(node, dict) and "properties" in node:
            for key, sub in node["properties"].items():
                if "description" not in sub and not path.startswith("$.properties.engine.properties.env"):
                    missing.append(f"{path}.{key}")
    allowed = {"tolerations", "minReplicas", "maxReplicas", "evaluationIntervalSeconds", "scaleUp",
               "scaleDown", "sla", "image", "imagePullPolicy", "port"}  # fmt: skip
    missing = [m for m in missing if m.rsplit(".", 1)[-1] not in allowed and ".tolerations." not in m]
    assert not missing, missing


def test_subresources_and_printer_columns():
    version = generate_crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Ready", "Desired", "Tok/s/User", "SLA", "Age"):
        assert wanted in names


def test_names_and_scope():
    crd = generate_crd()
    assert crd["metadata"]["name"] == "deepseekservings.flashserve.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("DeepSeekServing", "deepseekservings", ["dss"])
    assert crd["spec"]["scope"] == "Namespaced"


def test_cel_rules_present_for_key_cross_field_rules():
    text = json.dumps(generate_crd())
    for fragment in ("self.minReplicas <= self.maxReplicas", "self.eplb.enabled", "self.parallelism.dbo.enabled",
                     "nvlinkDomain.enabled", "extraArgs.all"):  # fmt: skip
        assert fragment in text


def test_nested_objects_default_to_empty_so_defaults_apply():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    from flashserve.api.v1alpha1 import DeepSeekServingSpec

    defaults = DeepSeekServingSpec().dump()
    for key in ("model", "engine", "parallelism", "placement", "autoscaling", "rollout"):
        assert spec["properties"][key]["default"] == defaults[key], key
    tol = spec["properties"]["placement"]["properties"]["tolerations"]["default"]
    assert tol == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_crd_yaml_round_trips():
    assert yaml.safe_load(crd_yaml()) == generate_crd()


def _unbounded_strings(node: dict, path: str = "") -> list[str]:
    out = []
    if node.get("type") == "string" and "maxLength" not in node and "enum" not in node:
        out.append(path or ".")
    for key, sub in (node.get("properties") or {}).items():
        out += _unbounded_strings(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += _unbounded_strings(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _unbounded_strings(node["additionalProperties"], f"{path}{{}}")
    return out


def test_every_free_string_has_a_max_length():
    """Unbounded strings let one object carry megabytes (etcd's limit is 1.5 MiB) and make CEL rule costs
    unbounded; a status message over the schema's limit makes the whole status patch invalid."""
    from flashserve.api.crd import generate_crd

    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _unbounded_strings(schema["properties"]["spec"], "spec") == []
    assert _unbounded_strings(schema["properties"]["status"], "status") == []


def test_the_api_server_holds_servings_to_the_group_ceiling():
    from flashserve.api.v1alpha1 import MAX_GROUPS

    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    autoscaling = spec["properties"]["autoscaling"]
    assert spec["properties"]["replicas"]["maximum"] == MAX_GROUPS
    assert autoscaling["properties"]["maxReplicas"]["maximum"] == MAX_GROUPS
    by_path = {r["fieldPath"]: r["rule"] for r in spec["x-kubernetes-validations"]}
    assert by_path[".replicas"] == f"self.replicas <= {MAX_GROUPS}"
    by_path = {r["fieldPath"]: r["rule"] for r in autoscaling["x-kubernetes-validations"]}
    assert by_path[".maxReplicas"] == f"self.maxReplicas <= {MAX_GROUPS}"


def test_every_object_in_the_schema_has_fields_or_a_value_schema():
    """A map whose value schema is lost becomes an object with no fields: the API server prunes its keys and its
    CEL rules do not compile (pydantic writes maps with patterned keys as patternProperties, which CRDs lack)."""
    from flashserve.api.crd import generate_crd

    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    bare = []

    def walk(node, path):
        if not isinstance(node, dict):
            return
        if node.get("type") == "object" and not ({"properties", "additionalProperties",
                                                   "x-kubernetes-preserve-unknown-fields"} & node.keys()):  # fmt: skip
            bare.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        walk(node.get("items"), f"{path}[]")
        walk(node.get("additionalProperties"), f"{path}{{}}")

    walk(schema, "")
    assert bare == [] or bare == [".metadata"], bare
