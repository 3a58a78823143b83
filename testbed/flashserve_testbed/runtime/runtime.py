"""The runtime's control loop: watch serving pods, run an engine (or, for a router pod, the real vllm-router)
for each one KWOK runs on a simulated node, and publish engines and routers to Prometheus (file_sd). Router
pods discover pods themselves, so they start only behind the loopback guard."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import aiohttp

from flashserve_testbed.localcluster.loopback import NotLoopback, require_loopback
from flashserve_testbed.runtime import cpuset, credentials, filesd
from flashserve_testbed.runtime.cpuset import CpuManager, NotEnoughCpus
from flashserve_testbed.runtime.engine import PodEngine, ProbeSettings, StartRefused
from flashserve_testbed.runtime.kubeapi import ApiError, KubeAPI
from flashserve_testbed.runtime import startup
from flashserve_testbed.runtime.launch import (
    GPU_PRODUCT_LABEL,
    LaunchSettings,
    build_launch,
    build_router_launch,
    choose_profile,
    engine_container,
    is_router_pod,
    mounts_token,
    router_container,
)
from flashserve_testbed.runtime.podenv import EnvError
from flashserve_testbed.startup_model import WEIGHTS_HUB, WEIGHTS_SHARED, Figures, figures_for_cold

log = logging.getLogger("flashserve_testbed.runtime")

SERVING_LABEL = "flashserve.io/serving"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass
class RuntimeSettings:
    launch: LaunchSettings
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    namespace: str | None = None  # None: every namespace
    file_sd: Path | None = None
    log_dir: Path = Path("engine-logs")
    any_node: bool = False  # also pods on real nodes (a kind node has its own kubelet: leave it False there)
    api_gone_seconds: float = 120.0  # give up (and stop every engine) when the API server is gone this long
    credentials_dir: Path | None = None  # router pods' kubeconfigs; None: <log_dir>/../credentials
    # The API server URL written into router pods' kubeconfigs (default: the runtime's own), e.g. a relay in
    # front of it that a test can hold to put the routers' pod watch behind while they keep answering.
    router_api_server: str | None = None
    guard_interval: float = 5.0  # wall seconds between loopback checks while router pods run
    # caches: each engine start pays the phases of the cache state its pod finds (runtime/startup.py); cold:
    # every start is one draw from the profile, as if no cache existed (the runtime's behaviour before).
    # An explicit start-up (--startup-seconds, the pod annotation or variable) overrides both.
    startup_model: str = startup.MODEL_CACHES
    # static: Guaranteed pods asking whole cores get cores of their own (runtime/cpuset.py); none: no pinning.
    cpu_manager_policy: str = "static"


def runnable(pod: dict, node: dict | None, any_node: bool = False) -> bool:
    """A serving pod the simulated kubelet has started: scheduled on a KWOK node, Running, not terminating."""
    meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if not (meta.get("labels") or {}).get(SERVING_LABEL) or meta.get("deletionTimestamp"):
        return False
    if not spec.get("nodeName") or st.get("phase") != "Running":
        return False
    if node is None:
        return False
    return any_node or (node["metadata"].get("annotations") or {}).get(KWOK_NODE_ANNOTATION) == "fake"


class Runtime:
    def __init__(self, api: KubeAPI, settings: RuntimeSettings):
        self.api = api
        self.settings = settings
        self.engines: dict[str, PodEngine] = {}  # by pod uid
        self.nodes: dict[str, dict | None] = {}
        self.skipped: set[str] = set()  # uids that cannot be launched; logged once
        self.stopping: dict[tuple[str, str], asyncio.Task] = {}
        self.status_target: str | None = None  # the runtime's own /metrics, host:port
        self.http: aiohttp.ClientSession | None = None
        self.time_scale = settings.launch.time_scale
        self.log_dir = settings.log_dir
        self._targets_dirty = False
        self._closed = False  # after shutdown the target file stays deleted
        self.cpus = CpuManager(os.sched_getaffinity(0)) if settings.cpu_manager_policy == "static" else None
        self._last_api_ok = time.monotonic()
        if settings.startup_model not in startup.STARTUP_MODELS:
            raise ValueError(f"startup_model {settings.startup_model!r}: choose one of "
                             f"{', '.join(startup.STARTUP_MODELS)}")
        self.caches = startup.ClusterCaches()
        # by engine pod uid: its caches, the weights and the kernel claim's scopes
        self.cache_use: dict[str, tuple[startup.PodCaches, str, str]] = {}
        self.claim_scopes: dict[str, str] = {}  # namespace/claim -> scope, read once per claim
        self.startup_pods: dict[str, asyncio.TimerHandle | None] = {}  # prefetch/pre-pull pod uid -> its fill timer
        self._startup_watch: asyncio.Task | None = None
        # Router pods' tokens: pod uid -> when (time.time()) to request the next (credentials.REFRESH_AT)
        self.token_due: dict[str, float] = {}

    # ------------------------------------------------------------------ hooks for PodEngine
    async def patch(self, namespace: str, name: str, body: dict) -> dict | None:
        try:
            return await self.api.patch_pod_status(namespace, name, body)
        except ApiError as e:
            if e.status != 404:
                log.warning("%s/%s: status patch failed: %s", namespace, name, e)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.warning("%s/%s: status patch failed: %r", namespace, name, e)
        return None

    def changed(self, engine: PodEngine) -> None:
        if engine.healthy and not engine.startup_recorded and engine.uid in self.cache_use \
                and engine.startup.get("model") == startup.MODEL_CACHES:
            engine.startup_recorded = True
            pc, scope, kernel_scope = self.cache_use[engine.uid]
            self.caches.started(pc, scope, [engine.node], kernel_scope)
            log.info("%s/%s: ready; node %s now holds %s", engine.namespace, engine.name, engine.node,
                     ", ".join(filter(None, ["the image", pc.weights_claim and f"the weights ({scope})",
                                             pc.kernel_claim and "its kernels"])))
        self._write_targets_soon()

    # ------------------------------------------------------------------ start-up by cache state
    def _figures(self, profile_name: str) -> tuple[Figures, float]:
        """The model's phases scaled to the profile: its start-up median is a cold start (docs/startup.md)."""
        from flashserve_testbed.engine import profile

        try:
            p = profile.load(profile_name or None)
        except (OSError, ValueError, KeyError) as e:
            log.warning("profile %r: %s; using the default profile's start-up", profile_name, e)
            p = profile.load(None)
        return figures_for_cold(p.startup.median), p.startup.sigma

    async def _claim_scope(self, namespace: str, claim: str) -> str:
        key = f"{namespace}/{claim}"
        if key not in self.claim_scopes:
            try:
                pvc = await self.api.get(f"/api/v1/namespaces/{quote(namespace)}/persistentvolumeclaims/{quote(claim)}")
            except ApiError as e:
                if e.status != 404:
                    log.warning("claim %s: %s; counting it as NodeLocal", key, e)
                    return startup.claim_scope(None)
                pvc = None
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                log.warning("claim %s: %r; counting it as NodeLocal", key, e)
                return startup.claim_scope(None)
            self.claim_scopes[key] = startup.claim_scope(pvc)
        return self.claim_scopes[key]

    def _group_nodes(self, engine: PodEngine) -> list[str]:
        """The nodes of the engine's replica group the runtime runs so far: a group is as slow as its slowest."""
        nodes = {engine.node}
        if engine.group_name:
            nodes |= {e.node for e in self.engines.values() if e.namespace == engine.namespace
                      and e.group_name == engine.group_name and e.launch.kind == "engine"}
        return sorted(n for n in nodes if n)

    async def _plan_startup(self, engine: PodEngine) -> dict[str, str]:
        pc = self.cache_use[engine.uid][0]
        scope = await self._claim_scope(pc.namespace, pc.weights_claim) if pc.weights_claim else WEIGHTS_HUB
        kernel_scope = await self._claim_scope(pc.namespace, pc.kernel_claim) if pc.kernel_claim else WEIGHTS_SHARED
        self.cache_use[engine.uid] = (pc, scope, kernel_scope)
        nodes = self._group_nodes(engine)
        figures, sigma = self._figures(engine.launch.profile)
        rng = random.Random(f"{engine.launch.env.get('FLASHSERVE_MOCK_SEED', '')}|{engine.restarts}|{engine.uid}")
        plan = startup.plan(self.caches.state(pc, scope, nodes, kernel_scope), figures, rng, sigma, tuple(nodes))
        engine.startup = plan.as_dict()
        log.info("%s/%s: start-up %s on %s: %s = %.1f engine-s", engine.namespace, engine.name, plan.cache_state,
                 ",".join(nodes), " + ".join(f"{p} {plan.phases[p]:.1f}" for p in plan.paid) or "nothing",
                 plan.seconds)
        return {startup.ENV_PHASES: plan.env_value()}

    def _ensure_startup_watch(self) -> None:
        if self._startup_watch is None and not self._closed:
            self._startup_watch = asyncio.get_running_loop().create_task(self.watch_startup_pods())

    async def watch_startup_pods(self) -> None:
        """The operator's prefetch and pre-pull pods (flashserve.io/startup-of). KWOK runs them as Running at
        once, without their init containers: each fills its node (or, a Job's, the shared claim) once it has
        been running for the download (or pull) time of its node's profile, counted from status.startTime."""
        params = {"labelSelector": startup.OWNER_LABEL}
        delay = 1.0
        while True:
            try:
                listing = await self.api.get(self._pods_path(), params)
                for pod in listing.get("items") or []:
                    await self._on_startup_pod(pod)
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    async for event in self.api.watch(self._pods_path(), {**params, "resourceVersion": rv}):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            await self._on_startup_pod(obj, deleted=kind == "DELETED")
                    delay = 1.0
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError) as e:
                if not (isinstance(e, ApiError) and e.status == 410):
                    log.warning("start-up pod watch: %s; relisting in %.0fs", e, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)

    async def _on_startup_pod(self, pod: dict, deleted: bool = False) -> None:
        meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        uid, role = meta.get("uid", ""), startup.startup_pod_role(pod)
        if deleted:
            handle = self.startup_pods.pop(uid, None)
            if handle is not None:
                handle.cancel()  # gone before its copy was complete; a finished copy stays on the disk
            return
        node_name = spec.get("nodeName")
        if role is None or uid in self.startup_pods or not node_name or st.get("phase") not in ("Running", "Succeeded"):
            return
        node = await self._node(node_name)
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        figures, _ = self._figures(self.settings.launch.profile or choose_profile(labels.get(GPU_PRODUCT_LABEL), 1))
        seconds = figures.download if role == startup.PREFETCH_COMPONENT else figures.pull
        began = _epoch(st.get("startTime")) or time.time()
        wait = max(0.0, began + seconds / self.time_scale - time.time())
        self.startup_pods[uid] = asyncio.get_running_loop().call_later(wait, self._startup_pod_done, pod, role)

    def _startup_pod_done(self, pod: dict, role: str) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        self.startup_pods[meta["uid"]] = None
        if role == startup.PREFETCH_COMPONENT:
            claim = startup.claim_of(pod, startup.WEIGHTS_VOLUME)
            if claim:
                node = startup.prefetch_node(pod)
                self.caches.prefetched(meta.get("namespace", "default"), claim, node)
                log.info("%s/%s: prefetch done: claim %s filled %s", meta.get("namespace"), meta["name"], claim,
                         f"on node {node}" if node else "(shared)")
        else:
            pulls = ([c for c in spec.get("initContainers") or [] if c.get("name") == "pull"]
                     or spec.get("containers") or [])
            if pulls:
                self.caches.pulled(str(pulls[0].get("image", "")), spec["nodeName"])
                log.info("%s/%s: pre-pull done: %s on node %s", meta.get("namespace"), meta["name"],
                         pulls[0].get("image"), spec["nodeName"])

    # ------------------------------------------------------------------ Prometheus targets
    def _write_targets_soon(self) -> None:
        if not self._targets_dirty and not self._closed:
            self._targets_dirty = True
            asyncio.get_running_loop().call_later(0.05, self._write_targets)

    def _write_targets(self) -> None:
        self._targets_dirty = False
        if self.settings.file_sd is None or self._closed:
            return
        targets = [filesd.EngineTarget(e.launch.address, e.launch.port, e.namespace, e.name, e.serving, e.group,
                                       e.node)
                   for e in self.engines.values() if e.pid is not None and e.launch.kind == "engine"]
        targets += [filesd.EngineTarget(e.launch.address, e.launch.metrics_port, e.namespace, e.name, e.serving, "",
                                        e.node, job=filesd.ROUTER_POD_JOB)
                    for e in self.engines.values()
                    if e.pid is not None and e.launch.kind == "router" and e.launch.metrics_port]
        try:
            filesd.write_targets(self.settings.file_sd, targets, self.status_target)
        except OSError as e:
            log.warning("cannot write %s: %s", self.settings.file_sd, e)

    # ------------------------------------------------------------------ pods
    async def _node(self, name: str) -> dict | None:
        if name not in self.nodes:
            try:
                self.nodes[name] = await self.api.get(f"/api/v1/nodes/{quote(name)}")
            except ApiError as e:
                if e.status != 404:
                    raise
                self.nodes[name] = None
        return self.nodes[name]

    async def on_pod(self, pod: dict, deleted: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        engine = self.engines.get(uid)
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = await self._node(node_name) if node_name and not deleted else None
        if not deleted and runnable(pod, node, self.settings.any_node):
            if engine is None:
                self._start(pod, node)
            else:
                engine.update_pod(pod)
            return
        if engine is not None:
            log.info("%s/%s: pod %s, stopping its engine", engine.namespace, engine.name,
                     "deleted" if deleted else "terminating or no longer running")
            self._stop(engine)
        if deleted:
            self.skipped.discard(uid)

    def _stop(self, engine: PodEngine) -> None:
        """Stop in the background, so one slow engine does not hold up the watch; a pod recreated under the
        same name waits for it, since it may be given the same address. Its own cores return to the shared
        pool once its process is gone."""
        self.engines.pop(engine.key, None)
        self.cache_use.pop(engine.key, None)
        name = (engine.namespace, engine.name)
        task = asyncio.get_running_loop().create_task(engine.stop())
        self.stopping[name] = task
        task.add_done_callback(lambda t: self.stopping.pop(name, None) if self.stopping.get(name) is t else None)
        task.add_done_callback(lambda t: self._release_cpus(engine))

    # ------------------------------------------------------------------ cores (the static CPU manager)
    def cpus_for(self, engine: PodEngine) -> frozenset[int] | None:
        return None if self.cpus is None else self.cpus.cpus_for(engine.key)

    def _cpu_prepare(self, pod: dict, n: int, then):
        """Before each start of a container the static policy pins: its cores (the same on a restart), and the
        other pods' processes off them; a start whose cores are not free is refused, as the kubelet refuses
        the pod's admission, and retried with the container's back-off."""
        meta = pod["metadata"]

        async def prepare() -> None:
            assert self.cpus is not None
            try:
                held = self.cpus.allocate(meta["uid"], n)
            except NotEnoughCpus as e:
                raise StartRefused(str(e), reason="UnexpectedAdmissionError") from None
            log.info("%s/%s: cores %s of its own", meta["namespace"], meta["name"], ",".join(map(str, sorted(held))))
            self._repin_shared()
            if then is not None:
                await then()

        return prepare

    def _release_cpus(self, engine: PodEngine) -> None:
        if self.cpus is not None and self.cpus.release(engine.key):
            self._repin_shared()

    def _repin_shared(self) -> None:
        """The pods that hold no cores of their own onto the shared pool as it now is."""
        assert self.cpus is not None
        cpuset.pin_groups({e.pid for e in self.engines.values() if e.pid is not None and e.key not in self.cpus.held},
                          self.cpus.shared)

    def _credentials_path(self, pod: dict) -> Path:
        base = self.settings.credentials_dir or self.log_dir.parent / "credentials"
        meta = pod["metadata"]
        return base / f"{meta['namespace']}_{meta['name']}_{meta['uid']}.kubeconfig"

    async def check_loopback(self, component: str) -> None:
        """Refuse (NotLoopback) while any pod or node address in the cluster is outside 127.0.0.0/8."""
        pods = (await self.api.get("/api/v1/pods")).get("items") or []
        nodes = (await self.api.get("/api/v1/nodes")).get("items") or []
        require_loopback(pods, nodes, component)

    def _router_prepare(self, pod: dict, path: Path | None):
        meta = pod["metadata"]
        who = f"router pod {meta['namespace']}/{meta['name']}"

        async def prepare() -> None:
            try:
                await self.check_loopback(who)
            except NotLoopback as e:
                raise StartRefused(str(e), reason="NotLoopback") from None
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise StartRefused(f"cannot check the cluster's addresses: {e}") from None
            if path is None:  # automountServiceAccountToken: false
                return
            try:
                self.token_due[meta["uid"]] = await credentials.write_pod_kubeconfig(self.api, pod, path,
                                                                                 self.settings.router_api_server)
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, RuntimeError) as e:
                raise StartRefused(f"no token for ServiceAccount "
                                   f"{(pod.get('spec') or {}).get('serviceAccountName') or 'default'}: {e}") from None
        return prepare

    async def guard_loop(self) -> None:
        """While router pods run, re-check the addresses; on a violation stop their processes (each start then
        refuses until the cluster is loopback again), since a running router connects to what it discovers."""
        while True:
            await asyncio.sleep(self.settings.guard_interval)
            routers = [e for e in self.engines.values() if e.launch.kind == "router" and e.pid is not None]
            if not routers:
                continue
            try:
                await self.check_loopback("router pods")
            except NotLoopback as e:
                log.error("%s; stopping %d router process(es)", e, len(routers))
                for engine in routers:
                    pid = engine.pid
                    if pid is not None:
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                log.warning("loopback guard: %s", e)

    async def refresh_tokens(self, now: float | None = None) -> None:
        """Request a new token for each running router pod whose token is due, and rewrite its token file: the
        router reads it again within a minute (credentials). A failed request is retried at the next call; the
        old token serves until it expires."""
        now = time.time() if now is None else now
        routers = {e.key: e for e in self.engines.values() if e.launch.kind == "router" and e.launch.kubeconfig}
        for uid in [u for u in self.token_due if u not in routers]:
            del self.token_due[uid]
        for uid, engine in routers.items():
            due = self.token_due.get(uid)
            if due is None or now < due:
                continue
            try:
                self.token_due[uid] = await credentials.write_pod_token(self.api, engine.pod,
                                                                        Path(engine.launch.kubeconfig))  # fmt: skip
                log.info("%s/%s: service account token refreshed", engine.namespace, engine.name)
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, RuntimeError) as e:
                log.warning("%s/%s: refreshing the service account token failed (retried): %s", engine.namespace,
                            engine.name, e)  # fmt: skip

    async def token_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.guard_interval)
            await self.refresh_tokens()

    def _start(self, pod: dict, node: dict) -> None:
        meta = pod["metadata"]
        prepare = None
        try:
            if is_router_pod(pod):
                path = self._credentials_path(pod) if mounts_token(pod) else None
                launch = build_router_launch(pod, self.settings.launch, None if path is None else str(path))
                prepare = self._router_prepare(pod, path)
                container = router_container(pod)
            else:
                launch = build_launch(pod, node, self.settings.launch)
                container = engine_container(pod)
            cores = cpuset.whole_cpus(pod, container) if self.cpus is not None else 0
            if cores:
                prepare = self._cpu_prepare(pod, cores, prepare)
        except (EnvError, ValueError) as e:
            if meta["uid"] not in self.skipped:
                self.skipped.add(meta["uid"])
                log.error("%s/%s: cannot start an engine: %s", meta["namespace"], meta["name"], e)
            return
        for note in launch.notes:
            log.warning("%s/%s: %s", meta["namespace"], meta["name"], note)
        plan_startup = None
        if launch.kind == "engine":
            override = launch.env.get("FLASHSERVE_MOCK_STARTUP_SECONDS")
            if override is None and self.settings.startup_model == startup.MODEL_CACHES:
                self.cache_use[meta["uid"]] = (startup.pod_caches(pod, container, launch.env), WEIGHTS_HUB,
                                               WEIGHTS_SHARED)
                plan_startup = self._plan_startup
                self._ensure_startup_watch()
        engine = PodEngine(pod, launch, self, self.settings.probe, node=node["metadata"]["name"], prepare=prepare,
                           plan_startup=plan_startup)
        if launch.kind == "engine" and plan_startup is None:
            override = launch.env.get("FLASHSERVE_MOCK_STARTUP_SECONDS")
            engine.startup = ({"model": "override", "seconds": float(override)} if override is not None
                              else {"model": startup.MODEL_COLD})
        self.engines[engine.key] = engine
        engine.start(after=self.stopping.get((engine.namespace, engine.name)))

    async def _sync(self, items: list[dict]) -> None:
        """After a (re)list: stop engines whose pods are gone, then treat every listed pod as an update."""
        alive = {p["metadata"]["uid"] for p in items}
        for uid in [u for u in self.engines if u not in alive]:
            engine = self.engines[uid]
            log.info("%s/%s: pod gone, stopping its engine", engine.namespace, engine.name)
            self._stop(engine)
        for pod in items:
            await self.on_pod(pod)

    def _pods_path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{quote(ns)}/pods" if ns else "/api/v1/pods"

    async def watch_pods(self) -> None:
        params = {"labelSelector": SERVING_LABEL}
        delay = 1.0
        while True:
            try:
                listing = await self.api.get(self._pods_path(), params)
                self._last_api_ok = time.monotonic()
                await self._sync(listing.get("items") or [])
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    async for event in self.api.watch(self._pods_path(), {**params, "resourceVersion": rv}):
                        self._last_api_ok = time.monotonic()
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            await self.on_pod(obj, deleted=kind == "DELETED")
                    self._last_api_ok = time.monotonic()  # a quiet watch that ended normally is contact too
                    delay = 1.0
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                gone = time.monotonic() - self._last_api_ok
                if gone > self.settings.api_gone_seconds:
                    raise RuntimeError(f"the API server has been unreachable for {gone:.0f}s ({e})") from None
                if not (isinstance(e, ApiError) and e.status == 410):
                    log.warning("pod watch: %s; relisting in %.0fs", e, delay)
                    await asyncio.sleep(delay)
                    delay = min(10.0, delay * 2)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            self.http = http
            self._write_targets()
            guard = asyncio.ensure_future(self.guard_loop())
            if self.settings.startup_model == startup.MODEL_CACHES and self.settings.launch.startup_seconds is None:
                # from the start: a pool is often pre-warmed (prefetch, pre-pull) before any replica is placed
                self._ensure_startup_watch()
            tokens = asyncio.ensure_future(self.token_loop())
            try:
                await self.watch_pods()
            finally:
                guard.cancel()
                if self._startup_watch is not None:
                    self._startup_watch.cancel()
                for handle in self.startup_pods.values():
                    if handle is not None:
                        handle.cancel()
                tokens.cancel()
                await self.shutdown()

    async def shutdown(self) -> None:
        """Stop every engine and say so in its pod: without its engine a pod is not ready, and the next runtime
        counts a restart."""
        engines = list(self.engines.values())
        self.engines.clear()
        await asyncio.gather(*(e.stop(report=True) for e in engines), *self.stopping.values(),
                             return_exceptions=True)
        self._closed = True
        if self.settings.file_sd is not None:
            try:
                self.settings.file_sd.unlink()
            except OSError:
                pass


def _epoch(stamp: str | None) -> float | None:
    """RFC 3339 time of the API server as epoch seconds; None when absent or unreadable."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
