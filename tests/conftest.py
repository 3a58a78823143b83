from __future__ import annotations

import os
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import kopf
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
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


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
