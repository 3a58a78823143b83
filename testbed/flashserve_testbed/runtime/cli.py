"""`flashserve mock-runtime`: run mock engines for the serving pods of the local cluster (docs/mock-runtime.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from flashserve_testbed.runtime import cpuset

log = logging.getLogger("flashserve_testbed.runtime")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashserve mock-runtime",
        description="Run the mock `vllm serve` for every DeepSeekServing pod that KWOK runs on a simulated GPU node, "
                    "run each serving's router pods as the real vllm-router on their pod IPs, keep pod readiness "
                    "honest, and publish engines and routers to Prometheus (file_sd).")
    p.add_argument("--kubeconfig", help="default: the local cluster's, else KUBECONFIG or in-cluster")
    p.add_argument("--cluster-dir", type=Path,
                   help="the local cluster (default: FLASHSERVE_CLUSTER_DIR or its default)")
    p.add_argument("-n", "--namespace", help="only pods of this namespace (default: all)")
    p.add_argument("--time-scale", type=float, default=1.0, help="engine seconds per wall second (default 1)")
    p.add_argument("--startup-seconds", type=float,
                   help="engine seconds until an engine is loaded, whatever the caches (default: by phase and cache "
                        "state, see --startup-model); the pod annotation flashserve.io/startup-delay overrides it")
    p.add_argument("--startup-model", choices=["caches", "cold"], default="caches",
                   help="caches (default): each start pays the phases (pull, download, load, compile, warm-up) its "
                        "pod's caches do not remove, as earlier start-ups, prefetch and pre-pull pods filled them; "
                        "cold: every start is one draw from the profile, as if there were no cache")
    p.add_argument("--cpu-manager-policy", choices=cpuset.POLICIES, default="static",
                   help="static (default), as the kubelets of a pool for dedicated router cores run: a Guaranteed "
                        "pod asking whole cores gets that many of the host's cores to itself, the other pods share the "
                        "rest; none: no pinning")
    p.add_argument("--profile", help="engine profile for every pod (default: by the node's GPU and the group size); "
                                      "a pod's own FLASHSERVE_MOCK_PROFILE still wins")
    p.add_argument("--seed", type=int, default=0, help="mixed with each pod's name into FLASHSERVE_MOCK_SEED")
    p.add_argument("--status-port", type=int,
                   help="serve /-/engines (what runs, with each start-up's phases), /-/caches (what the modelled "
                        "caches hold) and /metrics (the runtime's own) on 127.0.0.1:PORT (0: free)")
    p.add_argument("--probe-interval", type=float, default=1.0, help="wall seconds between /health probes")
    p.add_argument("--failure-threshold", type=int,
                   help="failed probes before a ready pod turns not ready (default: its readinessProbe's, else 3)")
    p.add_argument("--restart-backoff", type=float, default=10.0,
                   help="first restart delay of a dead engine in engine seconds, doubling to 300 (kubelet: 10)")
    p.add_argument("--file-sd", type=Path,
                   help="Prometheus target file (default: none when the local cluster's Prometheus discovers pods "
                        "itself, else one in its file_sd dir)")
    p.add_argument("--no-file-sd", action="store_true", help="write no Prometheus target file")
    p.add_argument("--log-dir", type=Path, help="engine logs (default: <cluster dir>/logs/engines)")
    p.add_argument("--engine-bin", help="directory whose `vllm` is the mock engine (default: this interpreter's)")
    p.add_argument("--any-node", action="store_true", help="also run pods on nodes that are not KWOK's")
    p.add_argument("--exit-after-api-gone", type=float, default=120.0,
                   help="stop every engine and exit when the API server is unreachable this long (seconds)")
    p.add_argument("--router-api-server", metavar="URL",
                   help="the API server URL in router pods' kubeconfigs (default: the runtime's own), e.g. a relay "
                        "in front of it; a loopback address, with a host the server's certificate names")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def loopback_url(url: str) -> str:
    """`url` if it is http(s)://<address in 127.0.0.0/8 or localhost>:<port>, else ValueError naming the fix."""
    try:
        parts = urlsplit(url)
        ok = (parts.scheme in ("http", "https") and parts.port is not None
              and (parts.hostname == "localhost" or ipaddress.ip_address(parts.hostname or "").is_loopback))
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"--router-api-server {url!r}: expected http(s)://<loopback address>:<port>; the "
                         "router pods connect to it, and the local stack reaches nothing off this machine")
    return url


def _resolve(args) -> tuple[str | None, Path | None, Path, Path | None]:
    """kubeconfig, file_sd path, engine log dir, and the local cluster directory when there is one."""
    from flashserve_testbed.localcluster import Layout, load_info
    from flashserve_testbed.runtime.filesd import FILE_NAME

    layout = Layout(args.cluster_dir) if args.cluster_dir else Layout()
    info = load_info(layout)
    kubeconfig = args.kubeconfig or (str(info.kubeconfig) if info else None)
    file_sd = None
    # A cluster whose Prometheus discovers the pods itself (kubernetes_sd) needs no target file, unless asked.
    discovers = info is not None and info.prometheus_discovery == "kubernetes_sd"
    if not args.no_file_sd:
        file_sd = args.file_sd or (Path(info.file_sd_dir) / FILE_NAME if info and not discovers else None)
    log_dir = args.log_dir or (layout.logs / "engines" if info else Path(tempfile.gettempdir()) / "flashserve-engines")
    return kubeconfig, file_sd, log_dir, (layout.root if info else None)


async def _watch_dir(path: Path) -> None:
    """Return when the cluster directory is deleted (`flashserve cluster down`)."""
    while path.exists():
        await asyncio.sleep(2.0)


async def amain(args) -> int:
    from flashserve_testbed.runtime.engine import ProbeSettings
    from flashserve_testbed.runtime.kubeapi import KubeAPI
    from flashserve_testbed.runtime.launch import (
        LaunchSettings,
        default_engine_bin,
    )
    from flashserve_testbed.runtime.runtime import Runtime, RuntimeSettings

    kubeconfig, file_sd, log_dir, cluster_root = _resolve(args)
    api = KubeAPI.from_kubeconfig(kubeconfig)
    settings = RuntimeSettings(
        launch=LaunchSettings(engine_bin=args.engine_bin or default_engine_bin(), time_scale=args.time_scale,
                              startup_seconds=args.startup_seconds, seed=args.seed,
                              profile=args.profile, python_path=os.environ.get("PYTHONPATH") or None),
        probe=ProbeSettings(interval=args.probe_interval, failure_threshold=args.failure_threshold,
                            backoff_base=args.restart_backoff),
        namespace=args.namespace, file_sd=file_sd, log_dir=log_dir, any_node=args.any_node,
        api_gone_seconds=args.exit_after_api_gone, startup_model=args.startup_model,
        cpu_manager_policy=args.cpu_manager_policy, router_api_server=args.router_api_server,
    )
    runtime = Runtime(api, settings)
    status_server = None
    if args.status_port is not None:
        from flashserve_testbed.runtime.statusserver import StatusServer

        status_server = StatusServer(runtime)
        url = await status_server.start("127.0.0.1", args.status_port)
        runtime.status_target = url.removeprefix("http://")
        log.info("status: %s/-/engines, metrics on %s/metrics", url, url)
    log.info("mock runtime: engines from %s on their (loopback) pod IPs, time scale %g, start-up %s, Prometheus targets "
             "%s, engine logs in %s", settings.launch.engine_bin, args.time_scale,
             f"{args.startup_seconds:g} engine-s" if args.startup_seconds is not None
             else f"{args.startup_model} model",
             file_sd or "off", log_dir)
    main = asyncio.ensure_future(runtime.run())
    waiters = [main]
    if cluster_root is not None:
        waiters.append(asyncio.ensure_future(_watch_dir(cluster_root)))
    code = 0
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if main in done and main.exception() is not None:
            log.error("mock runtime stopping: %s", main.exception())
            code = 1
        elif main not in done:
            log.info("the cluster directory is gone; stopping")
    except asyncio.CancelledError:
        log.info("stopping: terminating every engine")
    finally:
        for w in waiters:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await main
        if status_server is not None:
            await status_server.stop()
        await api.close()
    return code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.time_scale <= 0:
        parser().error("--time-scale must be positive")
    if args.router_api_server is not None:
        try:
            loopback_url(args.router_api_server)
        except ValueError as e:
            parser().error(str(e))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    loop = asyncio.new_event_loop()
    task = loop.create_task(amain(args))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        return 0
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
