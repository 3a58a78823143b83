"""Helpers for e2e tests: the operator as a separate process, polling, reading objects, and a relay a test can hold."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(fn: Callable[[], T], timeout: float = 60, interval: float = 0.5, what: str = "condition") -> T:
    """Poll `fn` until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


class OperatorProcess:
    """`flashserve run` watching one namespace, with its log in a file and its metrics on a loopback port."""

    def __init__(self, kubeconfig: Path, namespace: str, log_dir: Path, resync: float = 5.0, extra: list[str] | None = None):
        self.kubeconfig, self.namespace, self.resync = kubeconfig, namespace, resync
        self.metrics_port = free_port()
        self.log_path = log_dir / f"operator-{namespace}-{self.metrics_port}.log"
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        cmd = [sys.executable, "-m", "flashserve.cli", "run", "--kubeconfig", str(self.kubeconfig),
               "--namespace", self.namespace, "--lease-namespace", self.namespace, "--liveness", "",
               "--metrics-address", f"127.0.0.1:{self.metrics_port}", "--resync-seconds", str(self.resync),
               "--engine-networks", "127.0.0.0/8", *self.extra]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def metrics(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("flashserve_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_serving(self, timeout: float = 30) -> None:
        """Wait until this process holds the lease and runs the controller (its metrics endpoint is up)."""
        wait_until(lambda: self.metrics() or self.exited(), timeout, what="operator metrics endpoint")
        assert not self.exited(), self.logs()

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        if getattr(self, "log", None):
            self.log.close()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def get_json(kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def condition(obj: dict, ctype: str) -> dict:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return {}


def restart_process(pid: int, down_seconds: float = 3.0) -> int:
    """Kill a process and start it again with the same command line, working directory and environment
    (how a crashed control-plane component comes back under a supervisor). Returns the new pid."""
    proc = Path(f"/proc/{pid}")
    argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    env = dict(kv.split("=", 1) for kv in (proc / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in kv)
    cwd = os.readlink(proc / "cwd")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while proc.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(down_seconds)
    new = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    return new.pid


def fresh_namespace(kube, prefix: str) -> str:
    """A fresh namespace `<prefix>-<5 hex>` labelled for the e2e sweep, its default ServiceAccount ready."""
    import uuid

    from flashserve_testbed.localcluster.kube import wait_default_service_account
    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    client.CoreV1Api(kube).create_namespace({"metadata": {"name": name, "labels": {"flashserve.io/e2e": "true"}}})
    wait_default_service_account(kube, name)
    return name


def start_runtime(info, namespace: str, log_dir: Path, *args: str) -> subprocess.Popen:
    """`flashserve mock-runtime` for one namespace of the local cluster `info`, its output in log_dir/runtime.log;
    `args` add to the runtime's flags (start-up seconds, status port, ...)."""
    cmd = [sys.executable, "-m", "flashserve.cli", "mock-runtime", "--kubeconfig", str(info.kubeconfig),
           "--cluster-dir", str(info.dir), "--namespace", namespace, "--log-dir", str(log_dir / "engines"), *args]
    with open(log_dir / "runtime.log", "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop_runtime(runtime: subprocess.Popen) -> None:
    """SIGTERM (it stops its engines and router pods), SIGKILL to its process group after 30 s."""
    runtime.send_signal(signal.SIGTERM)
    try:
        runtime.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(runtime.pid, signal.SIGKILL)
        runtime.wait(timeout=10)


class HoldableRelay:
    """A TCP relay from 127.0.0.1:<port> to one upstream address whose traffic a test can hold: while held it
    moves no byte either way, so a client's long-lived stream (an API watch) stands still while the client
    process itself runs and answers. Released, the bytes held flow on in order."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._flowing = threading.Event()
        self._flowing.set()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        for sock in [self._server, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def wait_established(kubectl, crd: str, timeout: float = 60) -> None:
    """Wait until a CRD is Established. Polled rather than `kubectl wait`: on a fresh API server a CRD applied a
    moment ago can have no conditions yet, and `kubectl wait` then fails at once instead of waiting."""
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    wait_until(lambda: kubectl("get", "crd", crd, "-o", f"jsonpath={jsonpath}", check=False).stdout.strip() == "True",
               timeout, what=f"CRD {crd} Established")

