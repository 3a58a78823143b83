"""`flashserve cluster up|down|status|kubeconfig`: the local control plane with KWOK Blackwell node pools."""

from __future__ import annotations

import argparse
import sys

from .cluster import DEFAULT_PROMETHEUS_PORT, down, ensure_up, load_info
from .paths import Layout
from .stages import READINESS_MODES
from .status import status


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashserve cluster", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="bring the cluster up, or reuse/repair the running one (idempotent)")
    up.add_argument("--pod-readiness", choices=READINESS_MODES,
                    help="who makes flashserve.io/serving pods Ready: KWOK after the start-up delay, or an external "
                         "process such as the mock runtime (default kwok; env FLASHSERVE_POD_READINESS)")
    up.add_argument("--pod-startup-seconds", type=float,
                    help="start-up delay of serving pods in kwok readiness mode, standing for model loading "
                         "(default 5; env FLASHSERVE_POD_STARTUP_SECONDS)")
    up.add_argument("--pool", action="append", default=[], metavar="POOL.FIELD=VALUE",
                    help="resize or tweak a node pool, e.g. gb200.racks=4 or b200.nodes=8 (repeatable; "
                         "env FLASHSERVE_CLUSTER_POOLS, comma-separated)")
    up.add_argument("--pools-file", help="node pool definitions replacing the built-in nodepools.yaml")
    up.add_argument("--prometheus-port", type=int,
                    help=f"Prometheus port on 127.0.0.1 (default {DEFAULT_PROMETHEUS_PORT}; 0 picks a free one; "
                         "env FLASHSERVE_PROMETHEUS_PORT)")
    up.add_argument("--prometheus", action=argparse.BooleanOptionalAction, default=None,
                    help="run Prometheus (default); --no-prometheus stops the cluster's one if running")
    up.add_argument("--reset", action="store_true",
                    help="forget the settings the cluster was brought up with; use defaults plus the given flags")
    up.add_argument("--recreate", action="store_true", help="delete and recreate the control plane")
    up.add_argument("-q", "--quiet", action="store_true", help="no progress lines")

    sub.add_parser("down", help="stop every process of the cluster and delete its files")
    sub.add_parser("status", help="health of each component (exit 0 when all are healthy)")
    kc = sub.add_parser("kubeconfig", help="print the kubeconfig path")
    kc.add_argument("--export", action="store_true", help="print `export KUBECONFIG=...` instead")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "up":
            info = ensure_up(
                pod_readiness=args.pod_readiness, pod_startup_seconds=args.pod_startup_seconds,
                pool_overrides=args.pool, pools_file=args.pools_file, prometheus_enabled=args.prometheus,
                prometheus_port=args.prometheus_port, recreate=args.recreate, reset=args.reset, quiet=args.quiet,
            )
            for key, value in info.env().items():
                print(f"export {key}={value}")
            return 0
        if args.cmd == "down":
            return 1 if down() else 0
        if args.cmd == "status":
            st = status()
            print("\n".join(st.lines))
            return 0 if st.healthy else (1 if st.exists else 3)
        if args.cmd == "kubeconfig":
            info = load_info()
            path = info.kubeconfig if info else Layout().kubeconfig
            if not path.exists():
                print(f"no cluster kubeconfig at {path} (run `flashserve cluster up`)", file=sys.stderr)
                return 3
            print(f"export KUBECONFIG={path}" if args.export else path)
            return 0
    except (RuntimeError, ValueError, TimeoutError, OSError) as e:
        print(f"flashserve cluster {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 2
