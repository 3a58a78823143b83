"""The contract tier: the real vLLM 0.33.0 wheel, in its own venv (tools/vllm-contract/install.sh), judges what
the operator renders. Without that venv the tier skips with the command that builds it; under CI (the CI
environment variable set) a missing venv is a failure, since a skipped contract proves nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "tools" / "vllm-contract" / "install.sh"
HARNESS = ROOT / "tools" / "vllm-contract" / "harness"


def vllm_venv() -> Path | None:
    out = subprocess.run([str(INSTALL), "--print"], capture_output=True, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    venv = vllm_venv()
    if venv is None:
        msg = f"the vLLM contract venv is not built: run {INSTALL.relative_to(ROOT)}"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must build it: .ci/run calls make deps)")
        pytest.skip(msg)
    return venv / "bin" / "python"


def run_in_vllm(python: Path, script: str, *args: str, input: str | None = None, timeout: float = 900) -> str:
    """Run a harness script (a file name under tools/vllm-contract/harness/) in the contract venv; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update({"HF_HUB_OFFLINE": "1", "NO_PROXY": "*", "PYTHONWARNINGS": "ignore"})
    proc = subprocess.run(
        [str(python), str(HARNESS / script), *args],
        input=input, capture_output=True, text=True, timeout=timeout, env=env,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def check_engines(python: Path, cases: list[dict]) -> dict[str, dict]:
    """Verdicts of tools/vllm-contract/harness/engine_check.py, by case id."""
    out = run_in_vllm(python, "engine_check.py", input=json.dumps(cases))
    verdicts = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {v["id"]: v for v in verdicts}


