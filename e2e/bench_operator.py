"""Operator scale benchmark: N DeepSeekServings on a cluster of simulated GB200 nodes.

Prints: time until all are Ready, API requests per reconcile, operator CPU seconds and peak RSS, and writes
per idle minute (which must be 0). Runs on its own local cluster directory so it never disturbs another one.

    .venv/bin/python -m e2e.bench_operator --servings 200 [--idle-seconds 60] [--json out.json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml
from flashserve_testbed.localcluster import Layout, down, ensure_up

from e2e.support import OperatorProcess, wait_established, wait_until

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "flashserve.io_deepseekservings.yaml"


def _proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of a process."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servings", type=int, default=200)
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--resync-seconds", type=float, default=30)
    ap.add_argument("--cluster-dir", default=None, help="default: a cluster directory of its own under the cache")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--keep", action="store_true", help="leave the benchmark cluster running")
    args = ap.parse_args(argv)

    racks = max(2, -(-args.servings // 18))
    root = Path(args.cluster_dir) if args.cluster_dir else Path.home() / ".cache" / "flashserve" / "bench-cluster"
    layout = Layout(root)
    print(f"[bench] cluster with {racks} GB200 racks ({racks * 18} nodes) in {root}", flush=True)
    info = ensure_up(layout=layout, pool_overrides=[f"gb200.racks={racks}", "b200.nodes=0"],
                     prometheus_enabled=False, pod_startup_seconds=5)  # fmt: skip
    kubectl_bin = str(info.kubectl)

    import subprocess

    def kubectl(*a: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([kubectl_bin, "--kubeconfig", str(info.kubeconfig), *a], input=input,
                              capture_output=True, text=True, check=check)  # fmt: skip

    ns = "flashserve-bench"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kubectl, "deepseekservings.flashserve.io")
    subprocess.run([kubectl_bin, "--kubeconfig", str(info.kubeconfig), "delete", "ns", ns, "--wait=true"],
                   capture_output=True)  # fmt: skip
    kubectl("create", "ns", ns)
    wait_until(lambda: kubectl("-n", ns, "get", "sa", "default").returncode == 0, 30)

    op = OperatorProcess(info.kubeconfig, ns, Path(tempfile.mkdtemp()), resync=args.resync_seconds).start()
    op.wait_serving(60)
    docs = [{"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": f"s{i:04d}"},
             "spec": {"placement": {"accelerator": "GB200"}}} for i in range(args.servings)]  # fmt: skip
    t0 = time.monotonic()
    kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def ready_count() -> int:
        items = json.loads(kubectl("-n", ns, "get", "dss", "-o", "json").stdout)["items"]
        return sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (d.get("status") or {}).get("conditions", []))
            for d in items
        )

    last = -1
    while True:
        n = ready_count()
        if n != last:
            print(f"[bench] {time.monotonic() - t0:6.1f}s  {n}/{args.servings} Ready", flush=True)
            last = n
        if n == args.servings:
            break
        if time.monotonic() - t0 > 1800:
            print("[bench] gave up after 30 minutes", file=sys.stderr)
            return 1
        time.sleep(2)
    all_ready = time.monotonic() - t0
    m1 = op.metrics()
    cpu1, _ = _proc_stats(op.proc.pid)
    print(f"[bench] idle for {args.idle_seconds:.0f}s ...", flush=True)
    time.sleep(args.idle_seconds)
    m2 = op.metrics()
    cpu2, rss = _proc_stats(op.proc.pid)
    op.stop()
    idle_writes = [line for line in op.log_path.read_text().splitlines()[-2000:] if ": status [" in line or ": apply [" in line]
    if idle_writes:
        print("[bench] last writes logged by the operator:\n  " + "\n  ".join(idle_writes[-8:]))

    writes = lambda m: m["flashserve_child_writes_total"] + m["flashserve_status_writes_total"]  # noqa: E731
    results = {
        "servings": args.servings,
        "seconds_until_all_ready": round(all_ready, 1),
        "reconciles_until_ready": int(m1["flashserve_reconciles_total"]),
        "api_requests_per_reconcile": round(m1["flashserve_api_requests_total"] / m1["flashserve_reconciles_total"], 2),
        "api_requests_per_serving": round(m1["flashserve_api_requests_total"] / args.servings, 2),
        "operator_cpu_seconds_until_ready": round(cpu1, 1),
        "operator_peak_rss_mib": round(rss, 1),
        "idle_reconciles": int(m2["flashserve_reconciles_total"] - m1["flashserve_reconciles_total"]),
        "writes_per_idle_minute": round((writes(m2) - writes(m1)) * 60 / args.idle_seconds, 2),
        "idle_cpu_percent": round((cpu2 - cpu1) / args.idle_seconds * 100, 1),
    }
    width = max(map(len, results))
    for k, v in results.items():
        print(f"{k:<{width}}  {v}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    subprocess.run([kubectl_bin, "--kubeconfig", str(info.kubeconfig), "delete", "ns", ns, "--wait=false"],
                   capture_output=True)  # fmt: skip
    if not args.keep:
        down(layout)
    return 0 if results["writes_per_idle_minute"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
