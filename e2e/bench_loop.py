"""How long the operator's event loop stalls, and how long other servings wait, while one serving at the group
ceiling reconciles beside many small ones. No cluster: the controller, its per-serving workers
(handlers._worker), the Lease elector and a liveness endpoint run on one asyncio loop against the in-memory
API server of the unit tests (tests/fakes.py), with watch indexes kept as kopf keeps them.

Phases of each run, each started by one event that wakes every serving at once:
  create  the large serving is created (every group rendered for the first time)
  resync  every serving is reconciled again, nothing changed
  edit    the large serving's engine image changes (every group rendered anew, one group rolls)

Reported per phase: the loop's worst stall (a heartbeat task's lateness), the time from the event to the
start of each small serving's reconcile (median, max), the large serving's reconcile time, the longest gap
between Lease renewals (and whether the lease was lost: no renewal for 10 s) and the slowest answer of the
liveness endpoint, probed from another thread. Median over --runs runs.

    PYTHONPATH=operator:. python e2e/bench_loop.py [--groups 256] [--small 200] [--runs 3] [--json OUT]
    PYTHONPATH=operator:. python e2e/bench_loop.py --combine a.json b.json c.json   # median of saved runs

Not part of `make test`: it is a measurement, and a run takes tens of seconds of CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import gc
import json
import logging
import socket
import statistics
import threading
import time
import urllib.request

from aiohttp import web
from flashserve.api.v1alpha1 import DEFAULT_IMAGE
from flashserve.controller import handlers
from flashserve.controller import reconciler as reconciler_mod
from flashserve.controller.leader import LeaseElector
from flashserve.controller.observe import PodView, slim
from flashserve.controller.reconciler import Controller
from flashserve.render.naming import (
    GROUP_LABEL,
    SERVING_LABEL,
    legacy_serving_label_value,
    serving_label_value,
)
from flashserve.render.renderer import TEMPLATE_HASH_ANNOTATION
from kubernetes import client

from tests.fakes import WATCHED, FakeKube

HEARTBEAT_S = 0.01
PROBE_EVERY_S = 0.05
PHASES = ("create", "resync", "edit")
LEASE_DURATION_S, RENEW_DEADLINE_S = 15.0, 10.0  # LeaseElector's defaults, as the operator runs it
log = logging.getLogger("bench_loop")


class Index(dict):
    """One kopf index as the handlers read it: (namespace, label value) -> the items of that key."""

    def get(self, key, default=()):  # noqa: D102 - kopf.Index.get returns the key's items
        items = dict.get(self, key)
        return list(items.values()) if items else list(default)

    def put(self, key, name, item) -> None:
        self.setdefault(key, {})[name] = item

    def drop(self, key, name) -> None:
        dict.get(self, key, {}).pop(name, None)


class IndexedKube(FakeKube):
    """The fake API server, with the watch indexes updated on every write (kopf updates them from watch
    events) instead of being rebuilt from all objects for each reconcile."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()  # writes come from several executor threads
        self.indexes = {table: Index() for table in (*WATCHED.values(), "pods")}

    def _key(self, obj: dict) -> tuple[str, str] | None:
        meta = obj["metadata"]
        label = (meta.get("labels") or {}).get(SERVING_LABEL)
        return (meta["namespace"], label) if label else None

    def apply(self, obj: dict) -> None:
        with self._lock:
            super().apply(obj)
            kind, meta = obj["kind"], obj["metadata"]
            key = self._key(obj)
            if kind not in WATCHED or key is None:
                return
            stored = self.objects[(kind, meta["namespace"], meta["name"])]
            self.indexes[WATCHED[kind]].put(key, meta["name"], slim(stored))
            if kind == "StatefulSet":
                h = stored["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "")
                group = int(stored["metadata"]["labels"].get(GROUP_LABEL, "-1"))
                for k in range(stored["spec"]["replicas"]):
                    pod = f"{meta['name']}-{k}"
                    self.indexes["pods"].put(key, pod, PodView(pod, group, h, True, False, "Running", False, 0, "n"))

    def delete(self, namespace: str, kind: str, name: str, uid: str | None = None) -> None:
        with self._lock:
            obj = self.objects.get((kind, namespace, name))
            super().delete(namespace, kind, name, uid)
            key = self._key(obj) if obj is not None else None
            if key is not None and kind in WATCHED:
                self.indexes[WATCHED[kind]].drop(key, name)
            if key is not None and kind == "Pod":
                self.indexes["pods"].drop(key, name)

    def handler_indexes(self) -> dict:
        """What kopf would pass the serving's worker: one index per Observed field."""
        return dict(self.indexes)


class FakeLeases:
    """coordination.k8s.io Leases in memory; records when each renewal landed."""

    def __init__(self):
        self.lease: client.V1Lease | None = None
        self.renewals: list[float] = []

    def read_namespaced_lease(self, name, namespace, **_):
        if self.lease is None:
            raise client.ApiException(status=404)
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace, body, **_):
        self.lease = copy.deepcopy(body)
        self.renewals.append(time.perf_counter())

    def replace_namespaced_lease(self, name, namespace, body, **_):
        self.lease = copy.deepcopy(body)
        self.renewals.append(time.perf_counter())


class Window:
    """Worst figures seen since the last reset, with the longest garbage collection (it stops every thread,
    the loop's too, so it is a stall no thread or process split removes)."""

    def __init__(self):
        self.stall = self.probe = self.gc = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc = max(self.gc, time.perf_counter() - self._gc_start)

    def reset(self) -> None:
        self.stall = self.probe = self.gc = 0.0

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


async def heartbeat(w: Window) -> None:
    while True:
        t = time.perf_counter()
        await asyncio.sleep(HEARTBEAT_S)
        w.stall = max(w.stall, time.perf_counter() - t - HEARTBEAT_S)


def prober(url: str, w: Window, stop: threading.Event) -> None:
    """Probe the liveness endpoint the way the kubelet does: from outside the operator's loop."""
    while not stop.is_set():
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=120) as resp:
                resp.read()
        except OSError:
            pass  # a refused or timed-out probe counts by the time it took
        w.probe = max(w.probe, time.perf_counter() - t)
        stop.wait(PROBE_EVERY_S)


async def liveness_server() -> tuple[web.AppRunner, str]:
    """An aiohttp endpoint on the loop, as kopf serves its liveness probe."""
    app = web.Application()
    app.router.add_get("/healthz", lambda _: web.json_response({"ok": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/healthz"


def serving(name: str, namespace: str, uid: str, replicas: int, image: str = DEFAULT_IMAGE) -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
            "spec": {"replicas": replicas, "engine": {"image": image}}}  # fmt: skip


def _key(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, serving_label_value(name))


async def one_run(run: int, groups: int, small: int, phases: list[str]) -> dict:
    ns = f"bench-{run}-{time.monotonic_ns()}"  # fresh uids: nothing cached from an earlier run
    kube = IndexedKube()
    controller = Controller(api=None, resync_seconds=3600.0, debounce_seconds=0.0)  # type: ignore[arg-type]
    controller.kube = kube
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    reconcile = controller.reconcile

    async def timed(body, observed, logger):
        name = body["metadata"]["name"]
        starts.setdefault(name, []).append(time.perf_counter())
        try:
            await reconcile(body, observed, logger)
        finally:
            ends.setdefault(name, []).append(time.perf_counter())

    controller.reconcile = timed  # type: ignore[method-assign]
    indexes = kube.handler_indexes()
    tasks: list[asyncio.Task] = []

    def start(body: dict) -> None:
        name = body["metadata"]["name"]
        key = _key(ns, name)
        handlers._bodies[key] = body
        keys = [key, (ns, legacy_serving_label_value(name))]
        tasks.append(asyncio.create_task(handlers._worker(key, keys, controller, indexes, log)))

    async def settle(names: list[str], after: float, timeout: float = 600.0) -> None:
        deadline = time.perf_counter() + timeout
        while any(not [e for e in ends.get(n, []) if e > after] for n in names):
            if time.perf_counter() > deadline:
                raise TimeoutError("servings did not reconcile")
            await asyncio.sleep(0.05)

    w = Window()
    beat = asyncio.create_task(heartbeat(w))
    runner, url = await liveness_server()
    stop = threading.Event()
    probe = threading.Thread(target=prober, args=(url, w, stop), daemon=True)
    probe.start()
    leases = FakeLeases()
    elector = LeaseElector(client.ApiClient(), ns, "op", identity="bench", lease_duration=LEASE_DURATION_S,
                           renew_deadline=RENEW_DEADLINE_S)
    elector.coord = leases  # type: ignore[assignment]
    await elector.acquire()
    held = asyncio.create_task(elector.hold())

    small_names = [f"small-{i}" for i in range(small)]
    t = time.perf_counter()
    for i, n in enumerate(small_names):
        start(serving(n, ns, f"uid-{ns}-{i}", 1))
    await settle(small_names, t)

    out: dict = {"groups": groups, "small": small, "phases": {}}
    big = "large"
    for phase in phases:
        await asyncio.sleep(2 * elector.retry_period)  # the lease renewed, the loop quiet
        w.reset()
        renewals_before = len(leases.renewals)
        t0 = time.perf_counter()
        if phase == "create":
            start(serving(big, ns, f"uid-{ns}-large", groups))
        elif phase == "edit":
            handlers._bodies[_key(ns, big)] = serving(big, ns, f"uid-{ns}-large", groups, DEFAULT_IMAGE + "-edit")
        for n in [big, *small_names]:
            handlers._wake(_key(ns, n))
        await settle([big, *small_names], t0)
        t1 = time.perf_counter()
        await asyncio.sleep(elector.retry_period + 0.5)  # a renewal due at the end of the phase lands
        marks = leases.renewals[max(0, renewals_before - 1):]  # from the last renewal before the event
        waits = [min(s for s in starts[n] if s >= t0) - t0 for n in small_names]
        big_start = min(s for s in starts[big] if s >= t0)
        big_end = min(e for e in ends[big] if e > big_start)
        out["phases"][phase] = {
            "loop_stall_max_s": w.stall,
            "small_wait_median_s": statistics.median(waits),
            "small_wait_max_s": max(waits),
            "large_reconcile_s": big_end - big_start,
            "phase_s": t1 - t0,
            "lease_gap_max_s": max(b - a for a, b in zip(marks, marks[1:])) if len(marks) > 1 else float("inf"),
            "hold_returned": held.done(),  # the elector itself gave up (renewals failing past the deadline)
            "liveness_max_s": w.probe,
            "gc_max_s": w.gc,
        }
        if held.done():  # gave up: stand for the next leader so the later phases still measure
            held = asyncio.create_task(elector.hold())

    stop.set()
    probe.join(timeout=130)
    for task in [*tasks, beat, held]:
        task.cancel()
    await asyncio.gather(*tasks, beat, held, return_exceptions=True)
    handlers._bodies.clear()
    w.close()
    await runner.cleanup()
    return out


def median_of(runs: list[dict]) -> dict:
    out = {"groups": runs[0]["groups"], "small": runs[0]["small"], "runs": len(runs), "phases": {}}
    for phase in runs[0]["phases"]:
        per = [r["phases"][phase] for r in runs]
        out["phases"][phase] = {k: (any(p[k] for p in per) if isinstance(per[0][k], bool)
                                    else statistics.median(p[k] for p in per)) for k in per[0]}  # fmt: skip
    return out


def table(result: dict) -> str:
    cols = [("loop_stall_max_s", "loop stall"), ("small_wait_median_s", "wait p50"), ("small_wait_max_s", "wait max"),
            ("large_reconcile_s", "large rec."), ("lease_gap_max_s", "lease gap"), ("liveness_max_s", "liveness"),
            ("gc_max_s", "gc max")]  # fmt: skip
    lines = [f"one serving of {result['groups']} groups + {result['small']} of one group; median of "
             f"{result.get('runs', 1)} run(s); seconds; lease: ok, late (not renewed within the "
             f"{RENEW_DEADLINE_S:.0f} s renew deadline) or lost (unchanged for the {LEASE_DURATION_S:.0f} s lease "
             "duration: a standby takes it)",
             "phase   " + "".join(f"{h:>12}" for _, h in cols) + f"{'lease':>12}"]  # fmt: skip
    for phase, f in result["phases"].items():
        gap = f["lease_gap_max_s"]
        lease = "lost" if gap > LEASE_DURATION_S else "late" if gap > RENEW_DEADLINE_S else "ok"
        lines.append(f"{phase:<8}" + "".join(f"{f[k]:>12.3f}" for k, _ in cols) + f"{lease:>12}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=256, help="groups of the large serving (default 256, the ceiling)")
    p.add_argument("--small", type=int, default=200, help="servings of one group beside it (default 200)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--json", help="write the runs and their median here")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="print the median of runs saved with --json")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    reconciler_mod.kopf.event = lambda *a, **k: None  # no API server for Events

    if args.combine:
        runs = [r for path in args.combine for r in json.load(open(path))["runs"]]
        print(table(median_of(runs)))
        return
    runs = []
    for i in range(args.runs):
        runs.append(asyncio.run(one_run(i, args.groups, args.small, args.phases)))
        print(f"run {i + 1}: " + json.dumps(runs[-1]["phases"]), flush=True)
    result = median_of(runs)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "median": result, "at": dt.datetime.now(dt.timezone.utc).isoformat()}, f)


if __name__ == "__main__":
    main()
