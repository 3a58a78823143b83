"""`flashserve demo`: the whole product on one machine, end to end.

Brings up the local cluster (upstream control plane, KWOK Blackwell nodes, Prometheus), installs the CRD, runs
the operator and the mock GPU runtime (which runs the serving's router pods as vllm-router), applies an autoscaled
DeepSeekServing, drives agentic load through a router pod that ramps, bursts and drops, prints live progress,
then writes a chart (PNG) and a summary and cleans up.

The engines use the demo-scale profile (gb200-4gpu-demo): the same engine model with 100x the decode cost, so
a replica meets 100 tok/s per user at ~8 concurrent requests and a 2-core machine can serve the load for real.
`Stack` is also what the closed-loop autoscaling e2e tests run on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO_CRD = Path(__file__).resolve().parents[2] / "crds" / "flashserve.io_deepseekservings.yaml"
DEMO_SCHEDULE = "ramp 4 24 60s; hold 24 40s; ramp 24 48 5s; hold 48 60s; step 6 100s"
# `--quick`: the same story in about a third of the time (a ramp, a burst, a drop), for `make test`.
QUICK_SCHEDULE = "ramp 4 24 20s; ramp 24 40 5s; hold 40 75s; step 4 20s"
GPU_HOURLY_COST = 6.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _crd_file() -> Path:
    if REPO_CRD.exists():
        return REPO_CRD
    from flashserve.api.crd import (
        crd_yaml,  # installed without the repository: generate it
    )

    path = Path(os.environ.get("TMPDIR", "/tmp")) / "flashserve-crd.yaml"
    path.write_text(crd_yaml())
    return path


def demo_serving(name: str = "flash", **autoscaling: object) -> dict:
    auto = {
        "enabled": True, "minReplicas": 1, "maxReplicas": 8, "metricsWindowSeconds": 30,
        "sla": {"perUserTokensPerSecond": 100, "percentile": 90},
        "evaluationIntervalSeconds": 5, "replicaStartupSeconds": 30,
        "scaleDown": {"delaySeconds": 45, "peakWindowSeconds": 60},
        "initialCapacity": 8, "gpuHourlyCost": GPU_HOURLY_COST,
    }  # fmt: skip
    auto.update(autoscaling)
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name},
            "spec": {"placement": {"accelerator": "GB200"}, "autoscaling": auto}}  # fmt: skip


@dataclass
class Stack:
    """Local cluster + operator + mock runtime in one namespace; `stop()` ends every process."""

    cluster_dir: Path | None = None
    namespace: str = "demo"
    startup_seconds: float = 20.0
    profile: str = "gb200-4gpu-demo"
    log_dir: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")) / "flashserve-demo-logs")
    procs: list[subprocess.Popen] = field(default_factory=list)
    status_port: int | None = None  # the mock runtime's /-/engines (what runs where, on which cores); None: off

    def start(self, log=print) -> "Stack":
        from flashserve_testbed.localcluster import Layout

        self.layout = Layout(self.cluster_dir) if self.cluster_dir else Layout()
        try:
            return self._start(log)
        except BaseException:
            # A half-started stack would outlive the caller (its processes run in their own sessions).
            self.stop(down=True, log=log)
            raise

    def _start(self, log) -> "Stack":
        from kubernetes import client, config

        from flashserve_testbed.localcluster import ensure_up
        from flashserve_testbed.localcluster.kube import wait_for_crd

        log("[demo] local cluster: control plane, KWOK Blackwell node pools, Prometheus (first run builds nothing "
            "here; `make deps` built the toolchain)")  # fmt: skip
        self.info = ensure_up(layout=self.layout, pod_readiness="external", prometheus_port=0)
        self.api = config.new_client_from_config(config_file=str(self.info.kubeconfig))
        self.kubectl([ "apply", "--server-side", "--force-conflicts", "-f", str(_crd_file())])
        # Polled: on a fresh API server the CRD can have no conditions yet, and `kubectl wait` fails at once.
        wait_for_crd(self.api, "deepseekservings.flashserve.io")
        core = client.CoreV1Api(self.api)
        try:
            core.create_namespace({"metadata": {"name": self.namespace}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        from flashserve_testbed.localcluster.kube import wait_default_service_account

        wait_default_service_account(self.api, self.namespace)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_port = _free_port()
        exe = [sys.executable, "-m", "flashserve.cli"]
        log(f"[demo] mock GPU runtime (profile {self.profile}, engines load in ~{self.startup_seconds:g}s; the "
            f"serving's router pods run vllm-router)")  # fmt: skip
        self._spawn("runtime", [*exe, "mock-runtime", "--cluster-dir", str(self.layout.root), "-n", self.namespace,
                                "--profile", self.profile, "--startup-seconds", str(self.startup_seconds),
                                *([] if self.status_port is None else ["--status-port", str(self.status_port)])])
        log(f"[demo] operator (metrics on 127.0.0.1:{self.metrics_port})")
        self._spawn("operator", [*exe, "run", "--kubeconfig", str(self.info.kubeconfig), "-n", self.namespace,
                                 "--lease-namespace", self.namespace, "--liveness", "",
                                 "--metrics-address", f"127.0.0.1:{self.metrics_port}", "--resync-seconds", "10",
                                 "--engine-networks", "127.0.0.0/8",
                                 "--prometheus-url", self.info.prometheus_url or ""])  # fmt: skip
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.log_dir / f"{name}.log", "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "KUBECONFIG": str(self.info.kubeconfig)}
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def kubectl(self, args: list[str], input: str | None = None) -> str:
        cmd = [str(self.info.kubectl), "--kubeconfig", str(self.info.kubeconfig), *args]
        return subprocess.run(cmd, input=input, capture_output=True, text=True, check=True).stdout

    def apply(self, obj: dict) -> None:
        self.kubectl(["-n", self.namespace, "apply", "-f", "-"], input=yaml.safe_dump(obj))

    def serving(self, name: str = "flash") -> dict:
        from kubernetes import client

        return client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "flashserve.io", "v1alpha1", self.namespace, "deepseekservings", name
        )

    def base_url(self, name: str = "flash", timeout: float = 300) -> str:
        """The serving's OpenAI endpoint at one of its router pods (the operator's router Deployment): loopback
        pod IPs have no Service endpoints, so the demo finds a Ready router pod by its labels."""
        from kubernetes import client

        from flashserve_testbed.runtime.routerpods import wait_router_url

        core = client.CoreV1Api(self.api)

        def pods(selector: str) -> list[dict]:
            return [self.api.sanitize_for_serialization(p)
                    for p in core.list_namespaced_pod(self.namespace, label_selector=selector).items]

        return wait_router_url(pods, name, timeout) + "/v1"

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self, down: bool = True, log=print) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 15)
                    p.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(p.pid, 9)
        self.procs.clear()
        if down:
            from flashserve_testbed.localcluster import down as cluster_down

            left = cluster_down(self.layout, quiet=True)
            log(f"[demo] cleaned up: cluster down{', processes left: ' + str(left) if left else ', no process left'}")


class Timeline:
    """Samples the serving's status every `every` seconds in a thread, for the live line and the chart."""

    def __init__(self, stack: Stack, name: str = "flash", every: float = 2.0):
        self.stack, self.name, self.every = stack, name, every
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> "Timeline":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                obj = self.stack.serving(self.name)
            except Exception:  # noqa: BLE001 - a missed sample is fine
                obj = None
            if obj:
                st = obj.get("status") or {}
                conds = {c["type"]: c for c in st.get("conditions") or []}
                self.rows.append({
                    "t": time.monotonic() - self.t0,
                    "desired": obj["spec"].get("replicas"),
                    "groups": st.get("replicas") or 0,
                    "ready": st.get("readyReplicas") or 0,
                    "p90": (st.get("sla") or {}).get("perUserTokensPerSecondP90"),
                    "sla": st.get("slaState"),
                    "metrics": conds.get("MetricsAvailable", {}).get("status"),
                    "limited": conds.get("ScalingLimited", {}).get("status"),
                    "limited_reason": conds.get("ScalingLimited", {}).get("reason"),
                    "capacity": st.get("learnedCapacity"),
                })  # fmt: skip
            self._stop.wait(self.every)

    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def gpu_hours(self, gpus_per_replica: int = 4) -> float:
        total = 0.0
        for a, b in zip(self.rows, self.rows[1:]):
            total += a["groups"] * gpus_per_replica * (b["t"] - a["t"])
        return total / 3600.0


def plot(timeline: Timeline, report, sla: float, path: Path, offset: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = report.timeseries(5.0)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    t = [r["t"] - offset for r in timeline.rows]
    ax1.step(t, [r["desired"] for r in timeline.rows], where="post", label="desired replicas", color="tab:blue")
    ax1.step(t, [r["ready"] for r in timeline.rows], where="post", label="ready replicas", color="tab:green")
    ax1.set_ylabel("replica groups (4 GPUs each)")
    ax1b = ax1.twinx()
    ax1b.plot([r["t"] for r in ts], [r["target_sessions"] for r in ts], color="tab:gray", ls="--", label="sessions (demand)")
    ax1b.set_ylabel("agentic sessions")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="upper left")
    ax1.set_title("FlashServe demo: per-user-speed autoscaling of DeepSeek-V4.1-Flash (mock GB200 engines)")
    ax2.plot([r["t"] for r in ts], [r["per_user_p10"] for r in ts], label="per-user tok/s, p10 of requests (client)",
             color="tab:red")  # fmt: skip
    ax2.plot([r["t"] for r in ts], [r["per_user_p50"] for r in ts], label="per-user tok/s, p50 (client)", color="tab:orange")
    ax2.plot(t, [r["p90"] for r in timeline.rows], label="speed 90% of users get, as the operator sees it (Prometheus)",
             color="tab:purple", alpha=0.7)  # fmt: skip
    ax2.axhline(sla, color="black", ls=":", label=f"SLA {sla:g} tok/s")
    ax2.set_ylabel("tokens/s per user")
    ax2.set_xlabel("seconds since load started")
    ax2.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def _drive(stack: Stack, schedule: str, sla: float, timeline: Timeline, log=print):
    from flashserve_testbed.loadgen import Workload, run_load

    stop = asyncio.Event()

    async def progress() -> None:
        while not stop.is_set():
            r = timeline.last()
            if r:
                p90 = f"{r['p90']:.0f}" if r.get("p90") is not None else "-"
                log(f"[demo] t={r['t']:5.0f}s replicas desired={r['desired']} ready={r['ready']} "
                    f"p90-user tok/s={p90} (SLA {sla:g}) state={r.get('sla') or '-'}")  # fmt: skip
            try:
                await asyncio.wait_for(stop.wait(), 10)
            except asyncio.TimeoutError:
                pass

    task = asyncio.create_task(progress())
    try:
        base_url = await asyncio.to_thread(stack.base_url)  # waits for a Ready router pod without blocking the loop
        return await run_load(base_url, schedule=schedule, workload=Workload.from_profile(stack.profile),
                              sla=sla, seed=1, drain_seconds=20)  # fmt: skip
    finally:
        stop.set()
        await task


def verdict(result: dict, min_replicas: int = 1) -> list[str]:
    """What the demo promises and did not do: scale out under the load, back in after it, serve every request
    through the router. Empty when the run showed all of it."""
    failed = []
    if result["requests"] == 0:
        failed.append("no request was served")
    if result["errors"]:
        failed.append(f"{result['errors']} of {result['requests']} requests failed")
    if result["max_replicas"] <= min_replicas:
        failed.append(f"the serving never scaled out (max {result['max_replicas']} replicas)")
    if result["final_replicas"] != min_replicas:
        failed.append(f"the serving did not scale back in to {min_replicas} (ended at {result['final_replicas']})")
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flashserve demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", default="out/demo", help="directory for demo.png and summary.json (default out/demo)")
    ap.add_argument("--schedule", help=f"load schedule (default: {DEMO_SCHEDULE!r})")
    ap.add_argument("--quick", action="store_true",
                    help=f"a short run (about 4 minutes once the cluster is up): schedule {QUICK_SCHEDULE!r}")
    ap.add_argument("--keep", action="store_true", help="leave the cluster and processes running")
    ap.add_argument("--cluster-dir", help="local cluster directory (default: the demo's own)")
    args = ap.parse_args(argv)
    schedule = args.schedule or (QUICK_SCHEDULE if args.quick else DEMO_SCHEDULE)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster_dir = Path(args.cluster_dir) if args.cluster_dir else Path.home() / ".cache" / "flashserve" / "demo-cluster"
    stack = Stack(cluster_dir=cluster_dir)
    sla = 100.0
    t_start = time.monotonic()
    try:
        stack.start()
        stack.apply(demo_serving())
        timeline = Timeline(stack).start()
        print("[demo] waiting for the first replica to load ...", flush=True)
        deadline = time.monotonic() + 180
        while (timeline.last().get("ready") or 0) < 1:
            if time.monotonic() > deadline or not stack.alive():
                print(f"[demo] the serving did not become ready; logs in {stack.log_dir}", file=sys.stderr)
                return 1
            time.sleep(1)
        offset = timeline.last()["t"]
        print(f"[demo] Ready. Driving agentic load: {schedule}", flush=True)
        report = asyncio.run(_drive(stack, schedule, sla, timeline))
        print("[demo] load finished; watching the scale-down (surplus released after its delay) ...", flush=True)
        deadline = time.monotonic() + 300
        shown = None
        while time.monotonic() < deadline and (timeline.last().get("desired") or 0) > 1:
            r = timeline.last()
            if (r.get("desired"), r.get("ready")) != shown:
                shown = (r.get("desired"), r.get("ready"))
                print(f"[demo] t={r['t']:5.0f}s replicas desired={r['desired']} ready={r['ready']}", flush=True)
            time.sleep(2)
        timeline.stop()
        summary = report.summary()
        gpu_hours = timeline.gpu_hours()
        result = {
            "sla_tokens_per_s": sla,
            "sla_attainment": summary["sla_attainment"],
            "per_user_tokens_per_s": summary["per_user_tokens_per_s"],
            "ttft_seconds": summary["ttft_seconds"],
            "requests": summary["requests"], "errors": summary["errors"],
            "output_tokens": summary["output_tokens"],
            "gpu_hours": round(gpu_hours, 4),
            "tokens_per_dollar": round(summary["output_tokens"] / (gpu_hours * GPU_HOURLY_COST)) if gpu_hours else None,
            "max_replicas": max(r["desired"] or 0 for r in timeline.rows),
            "final_replicas": timeline.rows[-1]["desired"],
            "scaling_changes": sum(1 for a, b in zip(timeline.rows, timeline.rows[1:]) if a["desired"] != b["desired"]),
            "wall_seconds": round(time.monotonic() - t_start, 1),
        }  # fmt: skip
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "timeline.json").write_text(json.dumps(timeline.rows, indent=1) + "\n")
        plot(timeline, report, sla, out / "demo.png", offset)
        print("[demo] summary:")
        att = result["sla_attainment"]
        print(f"  SLA attainment (share of output tokens at >= {sla:g} tok/s per user): "
              f"{att * 100:.1f}%" if att is not None else "  SLA attainment: n/a")  # fmt: skip
        print(f"  GPU-hours: {gpu_hours:.3f}   output tokens: {summary['output_tokens']}   "
              f"tokens per dollar (output, ${GPU_HOURLY_COST:g}/GPU-hour): {result['tokens_per_dollar']}")  # fmt: skip
        print(f"  replicas: 1 -> {result['max_replicas']} -> {timeline.rows[-1]['desired']}, "
              f"{result['scaling_changes']} scaling changes; chart {out / 'demo.png'}, summary {out / 'summary.json'}")
        failed = verdict(result)
        for reason in failed:
            print(f"[demo] FAILED: {reason}; logs in {stack.log_dir}", file=sys.stderr)
        return 1 if failed else 0
    finally:
        if not args.keep:
            stack.stop(down=True)


if __name__ == "__main__":
    sys.exit(main())
