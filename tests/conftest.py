from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))


def load_sample(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(params=SAMPLES, ids=[p.stem for p in SAMPLES])
def sample_path(request) -> Path:
    return request.param
