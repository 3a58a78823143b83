"""The runtime's own endpoint: what it runs and its metrics, without routing anything."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from flashserve_testbed.runtime.statusserver import StatusServer


def _engine(name: str, kind: str, state: str):
    launch = SimpleNamespace(kind=kind, url=f"http://127.4.1.1:8000", profile="gb200-4gpu" if kind == "engine" else "")
    return SimpleNamespace(namespace="demo", name=name, uid=f"u-{name}", serving="flash", group="0", node="cpu-0",
                           launch=launch, pid=123, state=state, healthy=state == "ready", restarts=1,
                           ready_after=2.5, log_path=Path(f"/logs/{name}.log"),
                           startup={"model": "caches", "cacheState": "warm", "paid": ["load", "warmup"]}
                           if kind == "engine" else {})


def test_engines_and_metrics_are_served_on_loopback():
    from flashserve_testbed.runtime.startup import ClusterCaches, PodCaches

    caches = ClusterCaches()
    caches.started(PodCaches("demo", weights_claim="w"), "node", ["gb200-r0-n0"])
    runtime = SimpleNamespace(engines={"a": _engine("flash-g0-0", "engine", "ready"),
                                       "b": _engine("flash-router-x", "router", "starting")}, caches=caches)

    async def scenario():
        server = StatusServer(runtime)
        url = await server.start()
        try:
            assert url.startswith("http://127.0.0.1:")
            loop = asyncio.get_running_loop()
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            read = lambda path: opener.open(url + path, timeout=5).read().decode()  # noqa: E731
            engines = json.loads(await loop.run_in_executor(None, read, "/-/engines"))["engines"]
            metrics = await loop.run_in_executor(None, read, "/metrics")
            held = json.loads(await loop.run_in_executor(None, read, "/-/caches"))
        finally:
            await server.stop()
        return engines, metrics, held

    engines, metrics, held = asyncio.run(scenario())
    assert engines[0]["startup"]["paid"] == ["load", "warmup"]  # which phases the engine's start-up paid
    assert held["weights"] == {"demo/w": {"scope": "node", "nodes": ["gb200-r0-n0"], "filled": False}}
    assert [(e["pod"], e["kind"], e["ready"]) for e in engines] == [("flash-g0-0", "engine", True),
                                                                   ("flash-router-x", "router", False)]
    assert 'flashserve_runtime_engines{state="ready"} 1.0' in metrics
    assert 'flashserve_runtime_engines{state="starting"} 1.0' in metrics
