"""The product and the test bed apart: the layering contracts of pyproject.toml hold, they catch a violation,
and the product's wheel (what the operator image installs) carries no test-bed module and no `vllm` script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, *pythonpath: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(map(str, pythonpath))}
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_layering_contracts_hold():
    res = lint(ROOT, ROOT / "operator", ROOT / "testbed")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "BROKEN" not in res.stdout and res.stdout.count("KEPT") >= 5


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("api/v1alpha1.py", "import flashserve_testbed.engine.profile", "the product never imports the test bed"),
        ("api/validation.py", "import flashserve.render.naming", "the API imports only the facts"),
        ("facts/accelerators.py", "import flashserve.api.v1alpha1", "the facts import nothing else of flashserve"),
        ("autoscaling/policy.py", "import flashserve.controller.status", "the autoscaling policy knows no controller"),
    ],
)
def test_layering_check_catches_a_violation(tmp_path, module, line, contract):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "operator" / "flashserve", tmp_path / "operator" / "flashserve",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(ROOT / "testbed" / "flashserve_testbed", tmp_path / "testbed" / "flashserve_testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    target = tmp_path / "operator" / "flashserve" / module
    target.write_text(target.read_text() + f"\n{line}  # injected by the test\n")
    res = lint(tmp_path, tmp_path / "operator", tmp_path / "testbed")
    assert res.returncode != 0, res.stdout[-3000:]
    broken = res.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and "injected" not in res.stderr, res.stdout[-3000:]


def test_product_wheel_has_no_test_bed(tmp_path):
    """Builds the wheel from what the image's build context holds (pyproject.toml, README.md, operator/)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "operator", src / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                          str(src)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("flashserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.startswith("flashserve-")}
    assert packages == {"flashserve"}, packages
    mock_parts = ("engine/", "runtime/", "router/", "loadgen/", "bench/", "localcluster/", "demo.py")
    assert not [n for n in names if n.startswith("flashserve/") and n[len("flashserve/"):].startswith(mock_parts)]
    # what the product needs at run time is in it
    for needed in ("flashserve/render/templates/statefulset.yaml.j2", "flashserve/facts/vllm_flags.json",
                   "flashserve/controller/main.py", "flashserve/autoscaling/policy.py", "flashserve/api/v1alpha1.py"):
        assert needed in names, needed
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    scripts = entry_points.split("[console_scripts]", 1)[1].split("\n[", 1)[0].split()
    assert scripts == ["flashserve", "=", "flashserve.cli:main"], entry_points
