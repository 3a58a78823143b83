"""vLLM's own router (`vllm-router`, PyPI 0.1.17) as a local process: where its executable is, its command line
from typed options, and a launcher that keeps it on 127.0.0.1 (docs/vllm-router.md).

The wheel holds a Rust extension (`vllm_router_rs.abi3.so`) and a console script `vllm-router` that calls it;
the router serves the OpenAI API on --port and Prometheus metrics on --prometheus-port.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Literal
from urllib.parse import urlsplit

from flashserve.facts import router as router_facts
from flashserve_testbed.localcluster.procs import end

VERSION = "0.1.17"
SCRIPT = "vllm-router"
HOST = "127.0.0.1"
# `vllm-router --help` (0.1.17) lists these for --policy.
POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
            "sticky_least_loaded")
Policy = Literal["random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"]
LogLevel = Literal[router_facts.LOG_LEVELS]  # type: ignore[valid-type]  # set through RUST_LOG
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # its tracing output colours even when written to a file


class RouterNotInstalled(FileNotFoundError):
    """The vllm-router wheel is not in this Python environment."""


class RouterOptionsError(ValueError):
    """Options the launcher refuses; the message names the field and the fix."""


def binary() -> Path:
    """The `vllm-router` console script of this environment's vllm-router distribution."""
    try:
        dist = metadata.distribution("vllm-router")
    except metadata.PackageNotFoundError:
        raise RouterNotInstalled(
            f"vllm-router is not installed in this Python environment: pip install vllm-router=={VERSION}"
        ) from None
    for f in dist.files or ():
        if f.name == SCRIPT and f.parent.name in ("bin", "Scripts"):
            path = Path(dist.locate_file(f)).resolve()
            if path.is_file():
                return path
    # a distribution installed without its RECORD listing the script: the scheme's scripts directory
    path = Path(sysconfig.get_path("scripts")) / SCRIPT
    if path.is_file():
        return path
    raise RouterNotInstalled(f"vllm-router {dist.version} is installed but its `{SCRIPT}` script is missing: "
                             f"reinstall it (pip install --force-reinstall vllm-router=={VERSION})")


def installed_version() -> str | None:
    try:
        return metadata.version("vllm-router")
    except metadata.PackageNotFoundError:
        return None


def loopback_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise RouterOptionsError(f"{where}: {url!r} is not an http://HOST:PORT URL: write e.g. http://127.0.0.1:8000")
    try:
        loopback = ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if not loopback:
        raise RouterOptionsError(
            f"{where}: {parts.hostname} is not a loopback address: the test bed sends traffic to 127.0.0.0/8 "
            "only; give the engine's 127.x address"
        )
    return url.rstrip("/")


@dataclass(frozen=True)
class RouterOptions:
    """What the launcher passes to `vllm-router`; defaults are the router's own (0.1.17) unless noted."""

    worker_urls: tuple[str, ...]
    """Engines to route to (http://127.x:PORT), given statically: no Kubernetes discovery here."""
    port: int
    """Where the router serves the OpenAI API (on 127.0.0.1)."""
    prometheus_port: int
    """Where it serves its metrics (on 127.0.0.1); always set, since its default (29000) is shared by every
    router on the machine."""
    policy: Policy = "cache_aware"
    """How a worker is chosen for a request."""
    cache_threshold: float | None = None
    """cache_aware: the matched prefix share above which the request goes to the worker holding it [0.3]."""
    balance_abs_threshold: int | None = None
    """cache_aware: load balancing overrides the cache when max_load - min_load exceeds this [64] ..."""
    balance_rel_threshold: float | None = None
    """... and max_load exceeds min_load times this [1.5]."""
    eviction_interval_secs: int | None = None
    """cache_aware: seconds between evictions of its prefix tree [120]."""
    max_tree_size: int | None = None
    """cache_aware: characters of prefix tree per worker [2^25]."""
    health_check_interval_secs: int | None = None
    """Seconds between the router's worker health checks [60]."""
    worker_startup_timeout_secs: int | None = None
    """How long it waits for the workers' /health at start [600]."""
    request_timeout_secs: int | None = None
    """Request timeout [1800]."""
    max_concurrent_requests: int | None = None
    """Requests in flight before it queues [32768]."""
    log_level: LogLevel = "info"
    """Its log level, set in RUST_LOG (router_facts.LOG_ENV: its --log-level ignores `warning`); `info` logs
    each consistent_hash routing decision with its session key, `debug` more."""
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    """Further flags, passed as given (any of `vllm-router --help`); --host, --prometheus-host,
    --service-discovery and --log-level are refused."""

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise RouterOptionsError("worker_urls: empty: give at least one engine URL (http://127.0.0.1:PORT)")
        for i, url in enumerate(self.worker_urls):
            loopback_url(url, f"worker_urls[{i}]")
        for name in ("port", "prometheus_port"):
            value = getattr(self, name)
            if not 0 < value < 65536:
                raise RouterOptionsError(f"{name}: {value} is not a TCP port: give 1-65535 (free_port() finds one)")
        if self.port == self.prometheus_port:
            raise RouterOptionsError("prometheus_port: equals port: give the metrics their own port")
        if self.log_level not in router_facts.LOG_LEVELS:
            raise RouterOptionsError(
                f"log_level: {self.log_level!r} is not one of {', '.join(router_facts.LOG_LEVELS)}")
        if self.policy not in POLICIES:
            raise RouterOptionsError(f"policy: {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.cache_threshold is not None and not 0.0 <= self.cache_threshold <= 1.0:
            raise RouterOptionsError(f"cache_threshold: {self.cache_threshold} is outside 0-1: give a share, e.g. 0.3")
        if self.balance_rel_threshold is not None and self.balance_rel_threshold < 1.0:
            raise RouterOptionsError(
                f"balance_rel_threshold: {self.balance_rel_threshold} < 1 would rebalance on any load: give >= 1"
            )
        for name in ("balance_abs_threshold", "eviction_interval_secs", "max_tree_size",
                     "health_check_interval_secs", "worker_startup_timeout_secs", "request_timeout_secs",
                     "max_concurrent_requests"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "balance_abs_threshold" else 1):
                raise RouterOptionsError(f"{name}: {value} must be positive")
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in ("--host", "--prometheus-host", "--service-discovery", "--log-level"):
                raise RouterOptionsError(
                    f"extra_args: {flag} is set by the launcher (127.0.0.1, static worker URLs, log_level): leave "
                    "it out"
                )


def argv(opts: RouterOptions, executable: Path | str | None = None) -> list[str]:
    """The router's command line for `opts`."""
    cmd = [str(executable or binary()), "--host", HOST, "--port", str(opts.port),
           "--prometheus-host", HOST, "--prometheus-port", str(opts.prometheus_port),
           "--policy", opts.policy,
           "--worker-urls", *(u.rstrip("/") for u in opts.worker_urls)]
    for name in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "eviction_interval_secs",
                 "max_tree_size", "health_check_interval_secs", "worker_startup_timeout_secs",
                 "request_timeout_secs", "max_concurrent_requests"):
        value = getattr(opts, name)
        if value is not None:
            cmd += ["--" + name.replace("_", "-"), str(value)]
    return cmd + list(opts.extra_args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def direct_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without proxy settings: the router's traffic to its workers stays direct."""
    return {k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}


def wait_serving(base: str, proc: subprocess.Popen | None, timeout: float,
                 log_text: Callable[[], str] = lambda: "", path: str = "/v1/models") -> None:
    """Until the router at `base` answers `path` (/v1/models: once its workers passed their health check;
    /health: once it listens, as an IGW router with no worker does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"vllm-router exited {proc.returncode}:\n{log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + path, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"vllm-router not ready on {base} after {timeout:g}s:\n{log_text()[-3000:]}")


class VllmRouter:
    """One `vllm-router` process; its output goes to `log` (a path) so tests can read what it logged."""

    def __init__(self, opts: RouterOptions, log: Path, env: dict[str, str] | None = None,
                 cpus: frozenset[int] | None = None) -> None:
        """`cpus`: the CPUs its process may run on (its threads inherit them; tokio sizes its worker pool from
        them); None leaves the parent's."""
        self.opts = opts
        self.cpus = cpus
        self.log_path = Path(log)
        self.base = f"http://{HOST}:{opts.port}"
        self.metrics_url = f"http://{HOST}:{opts.prometheus_port}/metrics"
        self._env = env
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> VllmRouter:
        self._log = open(self.log_path, "ab")
        env = direct_env(os.environ if self._env is None else self._env)
        env["NO_COLOR"] = "1"
        env[router_facts.LOG_ENV] = self.opts.log_level
        cpus = self.cpus
        self.proc = subprocess.Popen(argv(self.opts), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        wait_serving(self.base, self.proc, timeout, self.log_text)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return r.read().decode()

    def log_text(self) -> str:
        try:
            return _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            end(self.proc)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmRouter:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
