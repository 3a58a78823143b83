"""`flashserve render` and `flashserve validate` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
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


GOOD = ("apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\nmetadata: {name: flash}\nspec: {replicas: 1}\n")


def _refused(*args: str, stdin: str | None = None) -> str:
    out = run(*args, stdin=stdin)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    return out.stderr


@pytest.mark.parametrize("command", ["render", "validate"])
def test_hostile_files_get_a_clear_error(tmp_path, command):
    def check(name: str, data: bytes, words: str) -> None:
        path = tmp_path / name
        path.write_bytes(data)
        err = _refused(command, *(["-f"] if command == "render" else []), str(path))
        assert words in err, err

    check("latin1.yaml", GOOD.replace("flash", "fl\xe4sh").encode("latin-1"), "not UTF-8")
    check("binary.yaml", bytes(range(256)) * 4, "binary")
    check("deep.yaml", ("[" * 100_000 + "]" * 100_000).encode(), "nested deeper")
    check("deep-map.yaml", "".join(f"{' ' * i}a:\n" for i in range(200)).encode(), "nested deeper")
    check("name.yaml", GOOD.replace("{name: flash}", "{name: 12345}").encode(), "metadata.name")
    check("name-list.yaml", GOOD.replace("{name: flash}", "{name: [a]}").encode(), "metadata.name")
    check("ns.yaml", GOOD.replace("{name: flash}", "{name: flash, namespace: {x: 1}}").encode(), "metadata.namespace")
    check("meta.yaml", GOOD.replace("metadata: {name: flash}", "metadata: [flash]").encode(), "metadata")
    # What kubectl refuses (strict decoding, string maps) is refused offline too, naming the field.
    check("int-annotation.yaml", GOOD.replace("{name: flash}", "{name: flash, annotations: {team: 1}}").encode(),
          "metadata.annotations['team']: must be a string")
    check("bool-label.yaml", GOOD.replace("{name: flash}", "{name: flash, labels: {canary: true}}").encode(),
          "metadata.labels['canary']: must be a string")
    check("label-value.yaml", GOOD.replace("{name: flash}", '{name: flash, labels: {team: "a b"}}').encode(),
          "not a Kubernetes label value")
    check("label-key.yaml", GOOD.replace("{name: flash}", '{name: flash, labels: {"a b": x}}').encode(),
          "the key is not a Kubernetes qualified name")
    check("dup.yaml", (GOOD + "spec: {replicas: 2}\n").encode(), "duplicate key 'spec'")
    check("dup-nested.yaml", GOOD.replace("{replicas: 1}", "{replicas: 1, replicas: 2}").encode(),
          "duplicate key 'replicas'")
    check("image.yaml", GOOD.replace("{replicas: 1}", '{engine: {image: "vllm/vllm-openai\\x01:v0.33.0"}}').encode(),
          "spec.engine.image: 'vllm/vllm-openai\\x01:v0.33.0' is not an image reference")


def test_billion_laughs_is_refused_at_once():
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    bomb = "\n".join(lines) + "\n"
    t0 = time.monotonic()
    err = _refused("render", "-f", "-", stdin=bomb)
    assert "aliases" in err and time.monotonic() - t0 < 10


def test_validate_and_render_agree(tmp_path, monkeypatch, capsys):
    """A file validate calls valid is one render renders: validate runs the renderer too."""
    from flashserve.api.validation import FieldError, SpecError
    from flashserve.commands import render as cmd

    path = tmp_path / "ok.yaml"
    path.write_text(GOOD)
    assert cmd.validate_main([str(path)]) == 0

    def refuse(obj):
        raise SpecError([FieldError("spec", "the renderer refuses this")])

    monkeypatch.setattr(cmd, "render_serving", refuse)
    assert cmd.main(["-f", str(path)]) == 2
    assert cmd.validate_main([str(path)]) == 2
    assert "the renderer refuses this" in capsys.readouterr().err
