"""The real vllm-router binary and the vLLM contract venv for tests/router. Without them the tests that need
them skip, naming the install command; under CI (the CI environment variable set) a missing one fails, since a
skipped check proves nothing (as tests/contract/conftest.py does for the contract venv)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flashserve_testbed.router.vllm_router import VERSION, RouterNotInstalled, binary

from tests.contract.conftest import vllm_venv


def _missing(msg: str):
    if os.environ.get("CI"):
        pytest.fail(msg + " (CI must install it: make deps)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def vllm_router_bin() -> Path:
    try:
        return binary()
    except RouterNotInstalled as e:
        _missing(f"{e} (testbed/pyproject.toml pins vllm-router=={VERSION})")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    venv = vllm_venv()
    if venv is None:
        _missing("the vLLM contract venv is not built: run tools/vllm-contract/install.sh")
    return venv / "bin" / "python"
