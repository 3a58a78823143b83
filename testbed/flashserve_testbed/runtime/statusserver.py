"""The runtime's own HTTP endpoint on loopback: what it runs (`/-/engines`) and its metrics (`/metrics`), for
tests, the demo and Prometheus. It routes nothing: clients reach a serving through its router pods."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from flashserve_testbed.runtime import cpuset
from flashserve_testbed.runtime.metrics import RuntimeCollector


def engines_state(runtime) -> list[dict]:
    return [{"namespace": e.namespace, "pod": e.name, "uid": e.uid, "serving": e.serving, "group": e.group,
             "kind": e.launch.kind, "node": e.node, "url": e.launch.url, "profile": e.launch.profile, "pid": e.pid,
             "state": e.state, "ready": e.healthy, "restarts": e.restarts, "ready_after_s": e.ready_after,
             "log": str(e.log_path), "startup": e.startup, "cpus": _cpus(e.pid)}
            for e in runtime.engines.values()]


def _cpus(pid: int | None) -> list[int] | None:
    """The cores the pod's process may run on (its CPU manager's choice), None while none runs."""
    try:
        return cpuset.allowed_cpus(pid) if pid is not None else None
    except OSError:
        return None  # exited meanwhile


class StatusServer:
    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.registry = CollectorRegistry()
        self.registry.register(RuntimeCollector(runtime))
        self.app = web.Application()
        self.app.router.add_get("/-/engines", self._engines)
        self.app.router.add_get("/-/caches", self._caches)
        self.app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    async def _engines(self, request: web.Request) -> web.Response:
        return web.json_response({"engines": engines_state(self.runtime)})

    async def _caches(self, request: web.Request) -> web.Response:
        """What the modelled caches hold: weights per claim and node, warm kernel directories, images per node."""
        return web.json_response(self.runtime.caches.as_dict())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        return f"http://{bound[0]}:{bound[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
