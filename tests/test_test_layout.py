"""No test module imports another test module: shared fakes live in tests/fakes.py, builders in
tests/builders.py and fixtures in conftest.py, so renaming or deleting one test module never breaks another
(and pytest never collects a module's tests twice under two names)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def imported_test_modules(source: str) -> list[str]:
    """The `test_*` modules that `source` imports, as written (`tests.test_x`, `.test_x`, `tests.test_x.f`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if _is_test_module(base):
                found.append(base)
            else:  # `from tests import test_x`, `from . import test_x`
                sep = "" if base.endswith(".") else "."
                found += [f"{base}{sep}{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def test_the_check_sees_every_spelling_of_such_an_import():
    source = """
import tests.test_plan
import tests.autoscaling.test_metrics as m
from tests.test_render import cr
from tests.autoscaling.test_metrics import CANNED
from tests import test_vllm_flags
from . import test_plan
from .test_plan import observe
def f():
    from tests.test_controller_isolation import body
"""
    assert sorted(imported_test_modules(source)) == sorted([
        "tests.test_plan", "tests.autoscaling.test_metrics", "tests.test_render", "tests.autoscaling.test_metrics",
        "tests.test_vllm_flags", ".test_plan", ".test_plan", "tests.test_controller_isolation",
    ])  # fmt: skip
    allowed = """
from tests.fakes import FakeKube
from tests.builders import cr
from tests.conftest import ROOT
from tests.contract.conftest import run_in_vllm
import pytest
from flashserve.controller.reconciler import Controller
"""
    assert imported_test_modules(allowed) == []


def test_no_test_module_imports_another():
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("*.py"))
        if (found := imported_test_modules(path.read_text()))
    }
    assert offenders == {}, (
        "test modules import other test modules; move what they share into tests/fakes.py (fakes), "
        f"tests/builders.py (builders) or a conftest.py (fixtures): {offenders}"
    )
