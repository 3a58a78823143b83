"""One pod's engine process: started with the pod's command line, probed on /health, restarted with the
kubelet's back-off when it dies, and reported in the pod's status (docs/mock-runtime.md)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Protocol

import aiohttp

from flashserve_testbed.runtime import credentials, status
from flashserve_testbed.runtime.launch import Launch

log = logging.getLogger("flashserve_testbed.runtime")

PR_SET_PDEATHSIG = 1
CONTAINER_ID_SCHEME = "flashserve-mock://"


@dataclass(frozen=True)
class ProbeSettings:
    interval: float = 1.0  # wall seconds between /health probes
    failure_threshold: int | None = None  # None: the pod's readinessProbe.failureThreshold (default 3)
    backoff_base: float = 10.0  # kubelet restart back-off, engine seconds: 10, 20, 40 ... capped at 300
    backoff_cap: float = 300.0
    stop_grace: float = 5.0  # wall seconds between SIGTERM and SIGKILL


class Hooks(Protocol):
    """What an engine needs from the runtime: the API for status patches, an HTTP session for probes, and a
    callback when what it serves changes (Prometheus targets), and the cores a start may run on (None: any)."""

    patch: Callable[[str, str, dict], Awaitable[dict | None]]
    http: aiohttp.ClientSession
    changed: Callable[["PodEngine"], None]
    cpus_for: Callable[["PodEngine"], frozenset[int] | None]
    time_scale: float
    log_dir: Path


def _die_with_parent() -> None:
    # An engine must not outlive a runtime killed with SIGKILL; exec keeps this setting (no set-uid binaries).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _in_child(cpus: frozenset[int] | None) -> None:
    _die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)  # the threads the process starts inherit it


def address_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def backoff_seconds(failures: int, base: float, cap: float) -> float:
    """Kubelet's CrashLoopBackOff: nothing before the first restart, then base, 2*base, ... up to cap."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2 ** (failures - 1))


class StartRefused(RuntimeError):
    """A start the runtime will not make (yet): the pod's container fails with this reason and message."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError"):
        super().__init__(message)
        self.reason = reason


class PodEngine:
    def __init__(self, pod: dict, launch: Launch, hooks: Hooks, probe: ProbeSettings, node: str = "",
                 prepare: Callable[[], Awaitable[None]] | None = None,
                 plan_startup: Callable[["PodEngine"], Awaitable[dict[str, str]]] | None = None):
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        labels = meta.get("labels") or {}
        self.serving = labels.get("flashserve.io/serving", "")
        self.group = labels.get("flashserve.io/group", "")
        self.node = node
        self.pod = pod
        self.launch = launch
        self.hooks = hooks
        self.probe = probe
        rp = next((c.get("readinessProbe") or {} for c in pod["spec"].get("containers", [])
                   if c.get("name") == launch.container), {})
        self.failure_threshold = probe.failure_threshold or int(rp.get("failureThreshold") or 3)
        self.proc: asyncio.subprocess.Process | None = None
        self.healthy = False
        self.restarts = 0
        self.state = "pending"  # pending, starting, ready, unready, exited, stopped
        self.seen_running = time.monotonic()
        self.ready_after: float | None = None  # wall seconds from the pod seen Running to Ready patched
        self.log_path = hooks.log_dir / f"{self.namespace}_{self.name}.log"
        self._task: asyncio.Task | None = None
        self.started = time.monotonic()
        self.started_at = status.now_iso()
        self.container_id = ""
        # Run before every start (a router's guard and credentials); StartRefused fails that start.
        self.prepare = prepare
        # Before every start of an engine whose start-up the runtime models from the caches: the variables that
        # tell the engine its phases (what the caches hold changes between starts, so each start asks again).
        self.plan_startup = plan_startup
        self.startup: dict = {}  # what this start's start-up is made of, for the status server
        self.startup_recorded = False  # this start's readiness has been reported to the caches
        self.group_name = labels.get("flashserve.io/group-name", "")

    @property
    def key(self) -> str:
        return self.uid

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.returncode is None else None

    def start(self, after: Awaitable | None = None) -> None:
        """Run the engine, once `after` (the stop of a previous pod of this name) is done."""
        name = f"engine {self.namespace}/{self.name}"
        self._task = asyncio.get_running_loop().create_task(self._run(after), name=name)

    def update_pod(self, pod: dict) -> None:
        if _rv(pod) >= _rv(self.pod):
            self.pod = pod

    async def stop(self, report: bool = False) -> None:
        """Stop the engine; `report`: also mark the container terminated (the pod stays, the runtime goes)."""
        # Out of the targets first, as a terminating pod leaves its Service's endpoints at once.
        self.healthy = False
        self.state = "stopping"
        self.hooks.changed(self)
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        code = await self._kill()
        if report and code is not None:
            await self._patch(status.terminated(self.pod, self.launch.container, self.container_id, code,
                                                self.started_at, "stopped with the mock runtime",
                                                reason="RuntimeStopped"))
        self.state = "stopped"
        if self.launch.kubeconfig:
            Path(self.launch.kubeconfig).unlink(missing_ok=True)  # a token of a pod that is gone
            credentials.token_path(Path(self.launch.kubeconfig)).unlink(missing_ok=True)
        self.hooks.changed(self)

    # ------------------------------------------------------------------ the loop
    async def _run(self, after: Awaitable | None) -> None:
        if after is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(after)
        failures = 0
        while True:
            delay = backoff_seconds(failures, self.probe.backoff_base, self.probe.backoff_cap) / self.hooks.time_scale
            if delay:
                log.info("%s/%s: restarting the engine in %.1fs (back-off)", self.namespace, self.name, delay)
                await asyncio.sleep(delay)
            started_at = self.started_at = status.now_iso()
            if self.prepare is not None:
                try:
                    await self.prepare()
                except StartRefused as e:
                    log.error("%s/%s: not starting: %s", self.namespace, self.name, e)
                    await self._patch(status.terminated(self.pod, self.launch.container, "", 1, started_at, str(e),
                                                        reason=e.reason))
                    failures += 1
                    continue
            if not address_free(self.launch.address, self.launch.port):
                # Another cluster's runtime (or anything else) owns the address: probing it would read someone
                # else's engine, so this pod fails like a container whose port is taken.
                msg = (f"{self.launch.address}:{self.launch.port} is already in use (another local cluster with the "
                       "same loopback slot? set FLASHSERVE_CLUSTER_LOOPBACK_SLOT for one of them)")
                log.error("%s/%s: %s", self.namespace, self.name, msg)
                await self._patch(status.terminated(self.pod, self.launch.container, "", 1, started_at, msg))
                failures += 1
                continue
            env = dict(self.launch.env)
            if self.plan_startup is not None:
                env.update(await self.plan_startup(self))
            self.startup_recorded = False
            await self._spawn(restarted=failures > 0 or self._ran_before(), env=env)
            code = await self._probe_until_exit()
            failures += 1
            self.healthy = False
            self.state = "exited"
            self.hooks.changed(self)
            tail = _tail(self.log_path)
            log.warning("%s/%s: engine exited with %s%s", self.namespace, self.name, code,
                        f": {tail.splitlines()[-1]}" if tail else "")
            await self._patch(status.terminated(self.pod, self.launch.container, self.container_id, code,
                                                started_at, tail))

    def _ran_before(self) -> bool:
        """Whether an earlier runtime already ran this container (then this start counts as a restart)."""
        cs = status.container_status(self.pod, self.launch.container)
        return str(cs.get("containerID", "")).startswith(CONTAINER_ID_SCHEME) or "terminated" in (cs.get("state") or {})

    async def _spawn(self, restarted: bool, env: dict[str, str] | None = None) -> None:
        self.hooks.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"--- {status.now_iso()} flashserve mock-runtime: {' '.join(self.launch.argv)}\n".encode())
            out.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.launch.argv, env=self.launch.env if env is None else env, stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT, cwd="/", start_new_session=True,
                preexec_fn=functools.partial(_in_child, self.hooks.cpus_for(self)))
        self.started = time.monotonic()
        self.container_id = f"{CONTAINER_ID_SCHEME}{self.proc.pid}"
        if restarted:
            self.restarts += 1
        self.state = "starting"
        log.info("%s/%s: engine pid %d on %s (profile %s)%s", self.namespace, self.name, self.proc.pid,
                 self.launch.url, self.launch.profile, f", restart {self.restarts}" if restarted else "")
        await self._patch(status.started(self.pod, self.launch.container, self.container_id, status.now_iso(),
                                         restarted))
        self.hooks.changed(self)

    async def _probe_until_exit(self) -> int:
        assert self.proc is not None
        exited = asyncio.ensure_future(self.proc.wait())
        fails = 0
        try:
            while True:
                done, _ = await asyncio.wait({exited}, timeout=self.probe.interval)
                if done:
                    return exited.result()
                ok = await self._health()
                fails = 0 if ok else fails + 1
                if ok and not self.healthy:
                    self.healthy = True
                    self.state = "ready"
                    log.info("%s/%s: /health 200 after %.1fs", self.namespace, self.name,
                             time.monotonic() - self.started)
                    self.hooks.changed(self)
                elif self.healthy and fails >= self.failure_threshold:
                    self.healthy = False
                    self.state = "unready"
                    log.warning("%s/%s: /health failed %d times, not ready", self.namespace, self.name, fails)
                    self.hooks.changed(self)
                await self._reconcile_readiness()
        finally:
            if not exited.done():
                exited.cancel()

    async def _health(self) -> bool:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.probe.interval))
        try:
            async with self.hooks.http.get(self.launch.probe_url, timeout=timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _reconcile_readiness(self) -> None:
        """Patch only when the pod says otherwise, so a lost patch is retried and a steady pod costs nothing."""
        cs = status.container_status(self.pod, self.launch.container)
        if status.is_ready(self.pod) == self.healthy and bool(cs.get("ready")) == self.healthy:
            return
        if await self._patch(status.readiness(self.pod, self.launch.container, self.healthy)) and self.healthy \
                and self.ready_after is None:
            self.ready_after = time.monotonic() - self.seen_running
            log.info("%s/%s: Ready %.1fs after the pod was seen Running", self.namespace, self.name,
                     self.ready_after)

    async def _patch(self, body: dict) -> bool:
        pod = await self.hooks.patch(self.namespace, self.name, body)
        if pod is not None:
            self.update_pod(pod)
        return pod is not None

    async def _kill(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace period; the exit status if a running engine was stopped."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None
        for sig, wait in ((signal.SIGTERM, self.probe.stop_grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                return await asyncio.wait_for(proc.wait(), wait)
            except asyncio.TimeoutError:
                continue
        return None


def _rv(pod: dict) -> int:
    try:
        return int(pod["metadata"].get("resourceVersion") or 0)
    except (ValueError, KeyError):
        return 0


def _tail(path: Path, size: int = 2048) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("--- ")]
    return "\n".join(lines[-5:])
