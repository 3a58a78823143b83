from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import kopf
import pytest
import yaml
from hypothesis import settings

from tests.http_stub import serving

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


@pytest.fixture
def events(monkeypatch) -> list[dict]:
    """The events the operator emits (type, reason, message each), recorded instead of posted."""
    seen: list[dict] = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: seen.append(kw))
    return seen


@pytest.fixture
def prometheus():
    """A FakePrometheus on 127.0.0.1 answering CANNED: (its URL, the handler class whose `values`, `mode` and
    `seen` are this test's own, so what one test changes never reaches another)."""
    from tests.fakes import CANNED, FakePrometheus  # the controller's imports, only for tests that use it

    handler = type("Handler", (FakePrometheus,), {"mode": "ok", "values": dict(CANNED), "seen": []})
    with serving(handler) as (url, _):
        yield url, handler


@pytest.fixture
def serve_http():
    """Serves a handler class on 127.0.0.1 for the rest of the test (tests.http_stub.serving): `serve_http(H)`
    returns (base URL, server)."""
    with ExitStack() as stack:
        yield lambda handler: stack.enter_context(serving(handler))


@pytest.fixture
def clock(monkeypatch):
    """The reconciler reads this clock (tests.fakes.Clock) instead of the machine's."""
    import types

    from flashserve.controller import reconciler as reconciler_mod

    from tests.fakes import Clock

    c = Clock()
    monkeypatch.setattr(reconciler_mod, "time", types.SimpleNamespace(monotonic=c.monotonic, time=c.time))
    monkeypatch.setattr(reconciler_mod, "now_iso", c.iso)
    return c
