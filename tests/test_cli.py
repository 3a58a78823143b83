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


def test_crd_to_a_file_it_cannot_write_exits_2_naming_the_option(tmp_path):
    out = run("crd", "-o", str(tmp_path / "missing" / "crd.yaml"))
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert "--output" in out.stderr and "No such file or directory" in out.stderr
    ok = run("crd", "-o", str(tmp_path / "crd.yaml"))
    assert ok.returncode == 0
    assert yaml.safe_load((tmp_path / "crd.yaml").read_text())["kind"] == "CustomResourceDefinition"


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


def _errors_of(tmp_path, capsys, text: str, *args: str) -> str:
    """`flashserve validate` (or render with `args`) in process: its stderr, after checking it refused the file."""
    from flashserve.commands import render as cmd

    path = tmp_path / "cr.yaml"
    path.write_text(text)
    code = cmd.main(["-f", str(path), *args]) if args else cmd.validate_main([str(path)])
    out = capsys.readouterr()
    assert code == 2 and "Traceback" not in out.err, out
    return out.err


@pytest.mark.parametrize("spec, words", [
    ("[]", "spec: must be a mapping of the serving's settings, not a list"),
    ("false", "spec: must be a mapping of the serving's settings, not a boolean"),
    ("0", "spec: must be a mapping of the serving's settings, not a number"),
    ('""', "spec: must be a mapping of the serving's settings, not a string"),
    # JSON has no infinity: kubectl could not send it, so it must not reach a rendered flag either
    ("{autoscaling: {enabled: true, sla: {ttftSeconds: .inf}}}", "spec.autoscaling.sla.ttftSeconds: Input should be a finite number"),
    ("{autoscaling: {enabled: true, gpuHourlyCost: .nan}}", "spec.autoscaling.gpuHourlyCost: Input should be a finite number"),
    ("{placement: {accelerator: GB200, int: 5}}", "spec.placement.int: unknown field"),
])  # fmt: skip
def test_what_the_api_server_would_refuse_is_refused_naming_the_field(tmp_path, capsys, spec, words):
    assert words in _errors_of(tmp_path, capsys, GOOD.replace("spec: {replicas: 1}", f"spec: {spec}"))


def test_every_document_is_checked_and_each_error_names_its_document(tmp_path, capsys):
    second = GOOD.replace("{name: flash}", "{name: flash-b}").replace("{replicas: 1}", "{replicas: -1}")
    third = GOOD.replace("{replicas: 1}", "{replicas: 2}")  # flash again
    err = _errors_of(tmp_path, capsys, "\n---\n".join([GOOD.replace("{replicas: 1}", "{replicas: x}"), second, third]))
    assert "document 1 (flash): spec.replicas" in err and "document 2 (flash-b): spec.replicas" in err, err
    assert "document 3 (flash): metadata.name: 'flash' is also document 1's" in err, err
    # one document: paths as before, without a document's name
    err = _errors_of(tmp_path, capsys, GOOD.replace("{replicas: 1}", "{replicas: x}"))
    assert "\nerror: spec.replicas: " in err and "document 1" not in err, err


def test_numbers_are_read_as_kubectl_reads_them(tmp_path, capsys):
    """kubectl's YAML reader (go-yaml v2) has no base-60 numbers and takes exponents without a dot, and it sends
    JSON, where 6.0 is 6: a file means to `validate` what it means to `kubectl apply`."""
    from flashserve.commands.kubectl_yaml import Loader

    doc = Loader(GOOD.replace("{replicas: 1}", "{a: 15:00, b: 1e3, c: 1.5e3, d: 6.0, e: 0x1f, f: 1_000, g: 2.5, "
                                                    "h: 2024-01-01, i: .inf, j: y, k: N, l: yes, m: no_}"))  # fmt: skip
    spec = doc.get_single_data()["spec"]
    assert spec == {"a": "15:00", "b": 1000, "c": 1500, "d": 6, "e": 31, "f": 1000, "g": 2.5, "h": "2024-01-01",
                    "i": float("inf"), "j": True, "k": False, "l": True, "m": "no_"}  # fmt: skip
    err = _errors_of(tmp_path, capsys, GOOD.replace("{replicas: 1}", "{autoscaling: {replicaStartupSeconds: 15:00}}"))
    assert "spec.autoscaling.replicaStartupSeconds: Input should be a valid integer" in err, err


def test_keys_are_read_as_kubectl_writes_them_into_json(tmp_path, capsys):
    """sigs.k8s.io/yaml writes a boolean or number key as text (strconv): `on:` is the key "true", `1:` is "1",
    `1.5:` "1.5", `1e6:` "1e+06". Python's True == 1 must not make two such keys one, and a label key YAML reads
    as a boolean is the label the API server stores, not an error."""
    from flashserve.commands.kubectl_yaml import Loader

    doc = Loader(GOOD.replace("{replicas: 1}", "{a: {on: 1, 1: 2, 1.5: 3, 2.0: 4, 1e6: 5, no: 6, 0.00001: 7, "
                                                    "-2.5: 8, .inf: 9, 0x1f: 10}}"))  # fmt: skip
    assert doc.get_single_data()["spec"]["a"] == {"true": 1, "1": 2, "1.5": 3, "2": 4, "1e+06": 5, "false": 6,
                                                  "1e-05": 7, "-2.5": 8, ".inf": 9, "31": 10}  # fmt: skip
    labelled = GOOD.replace("{name: flash}", "{name: flash, labels: {on: x, 1: w}}")
    (tmp_path / "keys.yaml").write_text(labelled.replace("{replicas: 1}", "{placement: {nodeSelector: {yes: z}}}"))
    out = run("render", "-f", str(tmp_path / "keys.yaml"), "-o", "json")
    assert out.returncode == 0, out.stderr
    sets = [o for o in json.loads(out.stdout)["items"] if o["kind"] == "StatefulSet"]
    assert sets and all(s["spec"]["template"]["spec"]["nodeSelector"]["true"] == "z" for s in sets)
    assert "duplicate key 'true'" in _refused("validate", _write(tmp_path, "d.yaml", GOOD.replace(
        "{name: flash}", "{name: flash, labels: {on: x, true: y}}")))  # fmt: skip
    list_key = _write(tmp_path, "l.yaml", GOOD.replace("{name: flash}", "{name: flash, labels: {[a]: x}}"))
    assert "a map key must be a string, number or boolean" in _refused("validate", list_key)


def _write(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


@pytest.mark.parametrize("namespace", ["", "Bad NS", "x" * 64])
def test_a_bad_namespace_option_is_refused_as_the_option(tmp_path, capsys, namespace):
    err = _errors_of(tmp_path, capsys, GOOD, "-n", namespace)
    assert "error: -n/--namespace: " in err and "is not a namespace name" in err, err


def test_names_and_labels_that_yaml_did_not_read_as_strings_say_how_to_quote_them(tmp_path, capsys):
    err = _errors_of(tmp_path, capsys, GOOD.replace("{name: flash}", "{name: 1e3, labels: {canary: yes}}"))
    assert "metadata.name: must be a string, not a number: quote it" in err, err
    assert "metadata.labels['canary']: must be a string, not a boolean (YAML reads yes" in err, err


def test_output_that_cannot_be_written_is_one_line_and_exit_2():
    for argv in (["crd"], ["render", "-f", str(ROOT / "manifests" / "samples" / "gb200-minimal.yaml")]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "flashserve.cli", *argv], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == "error: cannot write the output: No space left on device"
    reader = subprocess.Popen([sys.executable, "-m", "flashserve.cli", "crd"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert reader.stdout.readline().startswith("apiVersion:")
    reader.stdout.close()  # `| head -1`
    assert reader.wait(timeout=60) == 0 and "Traceback" not in reader.stderr.read()
