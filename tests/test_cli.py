"""`flashserve render` and `flashserve validate` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.conftest import ROOT


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashserve.cli", *args], input=stdin, capture_output=True, text=True)


def test_render_prints_objects(sample_path):
    out = run("render", "-f", str(sample_path))
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout)]
    assert "StatefulSet" in kinds and "Service" in kinds


def test_render_json_is_a_list():
    out = run("render", "-f", str(ROOT / "manifests/samples/gb200-minimal.yaml"), "-o", "json", "-n", "prod")
    doc = json.loads(out.stdout)
    assert doc["kind"] == "List" and {o["metadata"]["namespace"] for o in doc["items"]} == {"prod"}


def test_invalid_input_exits_2_with_field_and_no_stdout():
    bad = yaml.safe_dump({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                          "metadata": {"name": "x"}, "spec": {"autoscaling": {"minReplicas": 4, "maxReplicas": 1}}})  # fmt: skip
    out = run("render", "-f", "-", stdin=bad)
    assert out.returncode == 2
    assert out.stdout == ""
    assert "spec.autoscaling.minReplicas" in out.stderr and "maxReplicas" in out.stderr


def test_unreadable_and_malformed_files(tmp_path):
    out = run("render", "-f", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and out.stdout == "" and "cannot read" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    out = run("render", "-f", str(bad))
    assert out.returncode == 2 and out.stdout == "" and "not valid YAML" in out.stderr


def test_validate_command():
    ok = run("validate", *[str(p) for p in sorted((ROOT / "manifests/samples").glob("*.yaml"))])
    assert ok.returncode == 0, ok.stderr
    bad = run("validate", "-", stdin="apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\nmetadata: {name: a}\nspec: {replicas: -2}\n")
    assert bad.returncode == 2 and "spec.replicas" in bad.stderr


def test_unknown_command_exits_2():
    out = run("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr
