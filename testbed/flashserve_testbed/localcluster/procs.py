"""Background processes tracked by pid files, and the checks `down` uses to leave none behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def alive(pid: int | None, expect: str | None = None) -> bool:
    """True if `pid` runs; with `expect`, only if its command line mentions it (pids get reused after a reboot)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _zombie(pid):
        return False
    return expect is None or any(expect in arg for arg in cmdline(pid))


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def start(args: list[str], pid_file: Path, log_file: Path, env: dict[str, str] | None = None) -> int:
    """Start a detached process (own session, so it outlives the CLI and a Ctrl-C of it)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    pid_file.write_text(str(proc.pid))
    return proc.pid


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not alive(pid):
                return
            time.sleep(0.1)


def end(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a child started with Popen: SIGTERM, SIGKILL after `timeout`, and reap it either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5.0)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_pid_file(pid_file: Path, expect: str | None = None, timeout: float = 10.0) -> bool:
    pid = read_pid(pid_file)
    stopped = False
    if alive(pid, expect):
        stop(pid, timeout)  # type: ignore[arg-type]
        stopped = True
    pid_file.unlink(missing_ok=True)
    return stopped


def referencing(path: Path, programs: set[str]) -> list[int]:
    """Pids of this user's `programs` whose command line mentions `path`: everything a cluster started
    gets its files from the cluster directory, so this finds leftovers whatever their pid files say.
    Only the named programs, so a shell that merely mentions the directory is never touched."""
    needle, me, uid = str(path), os.getpid(), os.getuid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        pid = int(entry.name)
        args = cmdline(pid)
        if not args or Path(args[0]).name not in programs:
            continue
        if any(needle in arg for arg in args[1:]) and alive(pid):
            found.append(pid)
    return sorted(found)


def wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Until the pids have left the process table: a killed process stays a zombie until its parent (here
    init, as the components run in their own sessions) reaps it, and `pgrep` still lists zombies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.2)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
