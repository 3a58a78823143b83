"""The exact `vllm serve` argv and environment each engine pod of a rendered serving gets.

A multi-node group's container runs the operator's start-rank wrapper (`/bin/sh -c SCRIPT vllm ARGS...`), which
appends the pod's own `--data-parallel-start-rank`. Rather than re-implement it, the wrapper runs for real here
under /bin/sh, with a `vllm` on PATH that records its arguments, and the pod's environment as the kubelet would
set it (the pod-index label resolved for pod k).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from flashserve.render.renderer import render

_RECORDER = '#!/bin/sh\nexec "$PYTHON" -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@"\n'


def _pod_env(container: dict, pod_index: int) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item.get("valueFrom", {})
        field = ref.get("fieldRef", {}).get("fieldPath", "")
        if field == "metadata.labels['apps.kubernetes.io/pod-index']":
            env[item["name"]] = str(pod_index)
        elif "secretKeyRef" in ref or "configMapKeyRef" in ref:
            env[item["name"]] = "value-from-" + item["name"].lower()
        else:
            raise AssertionError(f"pods.py does not know how the kubelet resolves {item}")
    return env


def _run_command(command: list[str], args: list[str], env: dict[str, str]) -> list[str]:
    """What `vllm` is exec'd with when the container starts, minus the leading `serve`."""
    if command[:2] == ["vllm", "serve"]:
        return list(command[2:]) + list(args)
    with tempfile.TemporaryDirectory() as tmp:
        recorder = Path(tmp) / "vllm"
        recorder.write_text(_RECORDER)
        recorder.chmod(recorder.stat().st_mode | stat.S_IXUSR)
        run_env = {"PATH": f"{tmp}:/usr/bin:/bin", "PYTHON": os.environ.get("PYTHON_FOR_PODS", "python3"), **env}
        out = subprocess.run([*command, *args], env=run_env, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise AssertionError(f"the container command failed ({out.returncode}): {out.stderr}")
        argv = json.loads(out.stdout)
    if argv[:1] != ["serve"]:
        raise AssertionError(f"the container does not run `vllm serve`: {argv[:3]}")
    return argv[1:]


def engine_pods(cr: dict) -> list[dict]:
    """One entry per engine pod of the serving's first group: its argv after `vllm serve`, its environment,
    its accelerator. Every group renders the same pod template, so group 0 stands for all."""
    accelerator = ((cr.get("spec") or {}).get("placement") or {}).get("accelerator", "GB200")
    pods = []
    for obj in render(cr):
        if obj["kind"] != "StatefulSet":
            continue
        container = next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
        for k in range(obj["spec"]["replicas"]):
            env = _pod_env(container, k)
            argv = _run_command(container["command"], container.get("args", []), env)
            pods.append({"statefulset": obj["metadata"]["name"], "pod": k, "argv": argv, "env": env,
                         "accelerator": accelerator})
        break
    return pods
