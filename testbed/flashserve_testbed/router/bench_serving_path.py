"""Prefix-cache hit rate through the serving path the operator deploys, on the local cluster (issue 18's target):

* `routed`: a serving of 3 replicas behind its router Deployment (vllm-router, consistent_hash, 2 router pods),
  under 3 x S agentic sessions sent to a router pod;
* `single`: a serving of 1 replica under S sessions (the same per-replica load), the best a replica can do;
* `service`: a serving of 3 replicas with `routing.enabled: false` (the plain Service), under 3 x S sessions.
  Loopback pod IPs have no Service endpoints locally, so a random-per-request proxy over the serving's engine pods
  stands in for the Service's spread (`randomproxy.py`; a Service with keep-alive spreads per connection,
  which is no better for sessions).

Hit rate = the change of vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total summed over the
serving's engines, read from the engines at their pod IPs. Targets: `routed` within 5 points of `single`, and at
least 25 points above `service`.

    PYTHONPATH=operator:testbed .venv/bin/python -m flashserve_testbed.router.bench_serving_path [--seconds 40]
        [--sessions 8] [--rounds 1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from flashserve_testbed.demo import Stack, _free_port

SERVINGS = {
    "routed": {"replicas": 3},
    "single": {"replicas": 1},
    "service": {"replicas": 3, "routing": {"enabled": False}},
}
ENGINES = "flashserve.io/serving={name},app.kubernetes.io/component=engine"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def engine_urls(stack: Stack, name: str) -> list[str]:
    from kubernetes import client

    pods = client.CoreV1Api(stack.api).list_namespaced_pod(stack.namespace, label_selector=ENGINES.format(name=name))
    return sorted(f"http://{p.status.pod_ip}:8000" for p in pods.items if p.status.pod_ip)


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(hits, queries) summed over the engines."""
    from prometheus_client.parser import text_string_to_metric_families

    hits = queries = 0.0
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "vllm:prefix_cache_hits_total":
                    hits += s.value
                elif s.name == "vllm:prefix_cache_queries_total":
                    queries += s.value
    return hits, queries


def _ready(stack: Stack, name: str, replicas: int) -> bool:
    st = stack.serving(name).get("status") or {}
    return int(st.get("readyReplicas") or 0) >= replicas


def _load(base_url: str, sessions: int, seconds: float, seed: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "flashserve.cli", "load", "--base-url", base_url, "--schedule",
           f"hold {sessions} {seconds:g}s", "--profile", "gb200-4gpu-demo", "--seed", str(seed), "--json", str(out),
           "-q"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"load failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["summary"]


def run(args: argparse.Namespace) -> dict:
    stack = Stack(namespace="bench-serving-path", startup_seconds=3.0).start(log=_log)
    results: dict[str, list[float]] = {k: [] for k in SERVINGS}
    errors: dict[str, int] = {k: 0 for k in SERVINGS}
    try:
        for name, spec in SERVINGS.items():
            stack.apply({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name},
                         "spec": {"placement": {"accelerator": "GB200"}, **spec}})  # fmt: skip
        deadline = time.monotonic() + 300
        while not all(_ready(stack, n, s["replicas"]) for n, s in SERVINGS.items()):
            if time.monotonic() > deadline:
                raise TimeoutError("servings not ready after 300 s")
            time.sleep(2)
        tmp = Path(tempfile.mkdtemp(prefix="bench-serving-path-"))
        for r in range(args.rounds):
            for name, spec in SERVINGS.items():
                urls = engine_urls(stack, name)
                sessions = args.sessions * spec["replicas"]
                proxy = None
                if name == "service":
                    port = _free_port()
                    proxy = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.router.randomproxy",
                                              str(port), *urls])  # fmt: skip
                    time.sleep(2)
                    base = f"http://127.0.0.1:{port}/v1"
                else:
                    base = stack.base_url(name)
                before = prefix_counters(urls)
                try:
                    _log(f"[bench] round {r + 1}/{args.rounds}: {name} ({spec['replicas']} replicas, {sessions} "
                         f"sessions, {args.seconds:g} s)")  # fmt: skip
                    summary = _load(base, sessions, args.seconds, args.seed + r, tmp / f"{name}-{r}.json")
                finally:
                    if proxy is not None:
                        proxy.terminate()
                        proxy.wait(timeout=10)
                after = prefix_counters(urls)
                dq = after[1] - before[1]
                rate = (after[0] - before[0]) / dq if dq else float("nan")
                results[name].append(rate)
                errors[name] += sum(summary["errors"].values())
                _log(f"[bench]   hit rate {rate:.1%}, {summary['ok']} streams ok, errors {summary['errors']}")
    finally:
        stack.stop(down=not args.keep_cluster, log=_log)
    med = {k: statistics.median(v) for k, v in results.items()}
    return {"rounds": args.rounds, "seconds": args.seconds, "sessions_per_replica": args.sessions,
            "hit_rate": results, "median": med, "errors": errors,
            "routed_minus_single_points": 100 * (med["routed"] - med["single"]),
            "routed_minus_service_points": 100 * (med["routed"] - med["service"])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_serving_path", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=40.0, help="load per run (default %(default)s)")
    p.add_argument("--sessions", type=int, default=8, help="sessions per replica (default %(default)s)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--keep-cluster", action="store_true", help="leave the local cluster up")
    args = p.parse_args(argv)
    out = run(args)
    print("| serving | replicas | sessions | prefix hit rate (median) | per round | stream errors |")
    print("|---|---|---|---|---|---|")
    for name, spec in SERVINGS.items():
        rounds = ", ".join(f"{v:.1%}" for v in out["hit_rate"][name])
        print(f"| {name} | {spec['replicas']} | {args.sessions * spec['replicas']} | {out['median'][name]:.1%} | "
              f"{rounds} | {out['errors'][name]} |")
    near = abs(out["routed_minus_single_points"]) <= 5
    above = out["routed_minus_service_points"] >= 25
    print(f"routed - single: {out['routed_minus_single_points']:+.1f} points ({'within' if near else 'NOT within'} 5)")
    print(f"routed - service: {out['routed_minus_service_points']:+.1f} points ({'>=' if above else 'BELOW'} 25)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
