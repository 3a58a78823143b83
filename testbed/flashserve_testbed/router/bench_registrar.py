"""How long the operator takes to keep an IGW router's workers (`routing.policy: rendezvous_hash`,
controller/router_workers.py) as the fleet grows: the real vllm-router with `--enable-igw`, the operator's own
client, one sync from an empty router (a router pod's first reconcile), one that finds nothing to do (steady
state, every reconcile), and one that removes a quarter (a scale-down).

`python -m flashserve_testbed.router.bench_registrar [--workers 64 512 2048] [--runs 5]`

The worker URLs are loopback addresses nothing listens on: the router adds a worker without asking it
(docs/vllm-router.md), so only the router's worker API and the client are timed. The reconciler waits 10 s
(ROUTER_SYNC_WAIT_S) for a sync; the figures say how far below that a fleet stays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from flashserve.controller.reconciler import ROUTER_SYNC_WAIT_S
from flashserve.controller.router_workers import RouterWorkersClient, Worker
from flashserve.facts import router as router_facts

from flashserve_testbed.localcluster.procs import end
from flashserve_testbed.router.vllm_router import HOST, binary, direct_env, free_port, wait_serving

RANKS = 4  # a GB200 node's data-parallel ranks: one worker each


def start_igw(log: Path, *args: str, log_level: str = "info", executable: Path | None = None,
              ) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """vllm-router as rendered for rendezvous_hash (`--policy consistent_hash --enable-igw`, then `args`), with
    no worker, on loopback, its output in `log`; (process, base URL) once it answers /health."""
    port = free_port()
    cmd = [str(executable or binary()), "--host", HOST, "--port", str(port), "--prometheus-host", HOST,
           "--prometheus-port", str(free_port()), "--policy", "consistent_hash", "--enable-igw", *args]  # fmt: skip
    env = {**direct_env(os.environ), "NO_COLOR": "1", router_facts.LOG_ENV: log_level}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    base = f"http://{HOST}:{port}"
    try:
        wait_serving(base, proc, 60, log.read_text, path="/health")
    except BaseException:
        end(proc)
        raise
    return proc, base


def workers(n: int) -> set[Worker]:
    """`n` ranks of n / RANKS engine pods at loopback addresses (127.1.0.1, ...)."""
    return {Worker(f"http://127.1.{i // RANKS // 250}.{i // RANKS % 250 + 1}:8000@{i % RANKS}", "deepseek-flash")
            for i in range(n)}  # fmt: skip


def one_run(n: int) -> tuple[float, float, float]:
    """Seconds of (first sync, steady sync, removing a quarter) against a fresh router."""
    client = RouterWorkersClient()
    desired = workers(n)
    fewer = set(sorted(desired, key=lambda w: w.url)[: n - n // 4])
    with tempfile.TemporaryDirectory() as d:
        proc, base = start_igw(Path(d) / "router.log", "--intra-node-data-parallel-size", str(RANKS),
                               log_level="warn")  # fmt: skip
        try:
            out = []
            for want in (desired, desired, fewer):
                t = time.monotonic()
                client.sync(base, want, "rendezvous_hash")
                out.append(time.monotonic() - t)
            listed = urllib.request.urlopen(base + router_facts.WORKERS_PATH, timeout=10).read()
            assert listed.count(b'"url"') == len(fewer), "the router lists what the last sync left"
        finally:
            end(proc)
    return out[0], out[1], out[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[64, 512, 2048],
                    help="fleet sizes in workers (ranks); 512 = 128 GB200 nodes")  # fmt: skip
    ap.add_argument("--runs", type=int, default=5, help="runs per size (a fresh router each); medians are printed")
    args = ap.parse_args(argv)
    if any(n < RANKS for n in args.workers) or args.runs < 1:
        ap.error(f"--workers: each at least {RANKS}; --runs: at least 1")
    print(f"vllm-router {router_facts.VLLM_ROUTER_VERSION} --enable-igw; the reconciler waits {ROUTER_SYNC_WAIT_S:g} s")
    print("| workers | first sync (ms) | steady sync (ms) | remove a quarter (ms) |")
    print("|---:|---:|---:|---:|")
    for n in args.workers:
        runs = []
        for i in range(args.runs):
            runs.append(one_run(n))
            print(f"  {n} workers: run {i + 1}/{args.runs}: first sync {runs[-1][0] * 1000:.1f} ms", flush=True)
        first, steady, remove = (statistics.median(r[k] for r in runs) * 1000 for k in range(3))
        print(f"| {n} | {first:.1f} | {steady:.1f} | {remove:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
