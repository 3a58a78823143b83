from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

# CI draws the same examples every run, so a red build is reproducible; locally each run explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))


def load_sample(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(params=SAMPLES, ids=[p.stem for p in SAMPLES])
def sample_path(request) -> Path:
    return request.param
