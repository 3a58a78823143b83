"""vllm-router in front of mock engines, under the load generator's agentic sessions:
`python -m flashserve_testbed.router.bench_vllm_router [--seconds 30] [--sessions 8] [--engines 3]`.

Each run starts fresh engines (cold caches) and drives `--sessions` sessions per engine for `--seconds`:
  * through the real vllm-router, once per policy (and cache_aware with and without the engines' render route),
  * through a random-per-request proxy (what a plain Service gives),
  * to one engine alone with one engine's share of the sessions (the hit rate affinity should reach).
Per run it prints the prefix-cache hit rate (vllm:prefix_cache_hits / queries summed over the engines), each
engine's share of the requests, TTFT p50/p99 and failures. Then the router's overhead: one engine, the same
load straight to it and through the router (one worker, so only the router's own work differs), alternating,
`--overhead-rounds` short runs each; the median over rounds of the TTFT differences.
Figures and command: docs/vllm-router.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flashserve_testbed.loadgen import Workload, run_load
from flashserve_testbed.router import mockfleet as mf
from flashserve_testbed.router.vllm_router import RouterOptions, VllmRouter, free_port

ENGINE_FLAGS = ("--data-parallel-size", "4")  # one mock = one GB200 replica of the demo profile
SCALE_OUT = ("--enable-scale-out",)


@dataclass(frozen=True)
class Run:
    name: str
    route: str  # "router", "service" or "direct"
    policy: str | None = None
    render: bool = True  # engines started with --enable-scale-out
    router_args: tuple[str, ...] = ()
    engines: int | None = None  # default: --engines


def runs(args) -> list[Run]:
    out = [Run("cache_aware", "router", "cache_aware"),
           Run("cache_aware, no render route", "router", "cache_aware", render=False),
           Run(f"cache_aware, threshold {args.tuned_cache:g}, abs {args.tuned_abs}", "router", "cache_aware",
               router_args=("--cache-threshold", f"{args.tuned_cache:g}",
                            "--balance-abs-threshold", str(args.tuned_abs))),
           Run("consistent_hash (X-Session-ID)", "router", "consistent_hash")]
    out += [Run(p, "router", p) for p in ("power_of_two", "round_robin", "random", "sticky_least_loaded")]
    out += [Run("service: random per request", "service"), Run("one engine, its share of sessions", "direct",
                                                               engines=1)]
    return out


def _shares(values: list[float]) -> str:
    total = sum(values) or 1.0
    return "/".join(f"{100 * v / total:.0f}" for v in values)


def _result_label(labels: str) -> str:
    return labels.split('result="', 1)[-1].split('"', 1)[0]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:.0f}"


async def _load(base: str, sessions: int, seconds: float, profile: str, seed: int):
    ramp = min(5.0, seconds / 4)
    return await run_load(base, schedule=f"ramp 1 {sessions} {ramp:g}s; hold {sessions} {seconds - ramp:g}s",
                          workload=Workload.from_profile(profile), seed=seed, drain_seconds=5)


def _start_service(port: int, engines: list[mf.MockEngine], log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.router.randomproxy", str(port),
                             *(e.url for e in engines)], stdout=out, stderr=subprocess.STDOUT)
    out.close()
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"random proxy did not start: {log.read_text()[-2000:]}")


def one_run(run: Run, args, work: Path, seed: int) -> dict:
    n = run.engines or args.engines
    sessions = args.sessions * n
    d = work / run.name.replace(" ", "_").replace("/", "-").replace(",", "").replace(":", "")
    flags = ENGINE_FLAGS + (SCALE_OUT if run.render else ())
    engines = mf.start_engines(n, d, profile=args.profile, flags=flags, seed=seed)
    router = service = None
    try:
        if run.route == "router":
            opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(),
                                 prometheus_port=free_port(), policy=run.policy, extra_args=run.router_args)
            router = VllmRouter(opts, d / "router.log").start()
            base = router.base + "/v1"
        elif run.route == "service":
            port = free_port()
            service = _start_service(port, engines, d / "proxy.log")
            base = f"http://127.0.0.1:{port}/v1"
        else:
            base = engines[0].url + "/v1"
        report = asyncio.run(_load(base, sessions, args.seconds, args.profile, seed))
        texts = [e.metrics() for e in engines]
        router_metrics = router.metrics() if router else ""
    finally:
        if router:
            router.stop()
        if service:
            service.terminate()
            service.wait(10)
        mf.stop_all(engines)
    hits = sum(mf.counter(t, "vllm:prefix_cache_hits_total") for t in texts)
    queries = sum(mf.counter(t, "vllm:prefix_cache_queries_total") for t in texts)
    per_engine = [mf.counter(t, "vllm:request_success_total") for t in texts]
    s = report.summary()
    renders = sum(mf.samples(router_metrics, "vllm_router_kv_routing_inputs_total").values())
    decisions = mf.samples(router_metrics, "vllm_router_prefix_routing_decisions_total")
    return {
        "run": run.name, "engines": n, "sessions": sessions, "requests": s["requests"], "ok": s["ok"],
        "errors": s["errors"], "hit_rate": hits / queries if queries else None, "requests_per_engine": per_engine,
        "ttft_p50": s["ttft_seconds"]["p50"], "ttft_p99": s["ttft_seconds"]["p99"],
        "router_token_inputs": {k: v for k, v in mf.samples(router_metrics,
                                                           "vllm_router_kv_routing_inputs_total").items()},
        "prefix_decisions": decisions, "router_token_input_calls": renders,
    }


def _overhead_round(args, work: Path, policy: str, seed: int) -> tuple[dict, dict]:
    d = work / f"overhead-{policy}-{seed}"
    engines = mf.start_engines(1, d, profile=args.profile, flags=ENGINE_FLAGS + SCALE_OUT, seed=seed)
    try:
        opts = RouterOptions(worker_urls=(engines[0].url,), port=free_port(), prometheus_port=free_port(),
                             policy=policy)
        with VllmRouter(opts, d / "router.log") as router:
            out = []
            for base in (engines[0].url + "/v1", router.base + "/v1"):
                r = asyncio.run(run_load(base, schedule=f"hold {args.sessions} {args.overhead_seconds:g}s",
                                         workload=Workload.from_profile(args.profile), seed=seed,
                                         drain_seconds=5))
                out.append(r.summary()["ttft_seconds"])
    finally:
        mf.stop_all(engines)
    return out[0], out[1]


def overhead(args, work: Path, policy: str) -> dict:
    d50, d99, direct50 = [], [], []
    for i in range(args.overhead_rounds):
        direct, routed = _overhead_round(args, work, policy, seed=100 + i)
        d50.append(routed["p50"] - direct["p50"])
        d99.append(routed["p99"] - direct["p99"])
        direct50.append(direct["p50"])
    return {"policy": policy, "rounds": args.overhead_rounds, "ttft_p50_added": statistics.median(d50),
            "ttft_p99_added": statistics.median(d99), "direct_ttft_p50": statistics.median(direct50),
            "p50_added_per_round": d50, "p99_added_per_round": d99}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashserve_testbed.router.bench_vllm_router",
                                description=__doc__.split("\n")[0])
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--sessions", type=int, default=8, help="sessions per engine (the demo profile's SLA load)")
    p.add_argument("--seconds", type=float, default=25.0, help="wall seconds of load per run")
    p.add_argument("--profile", default="gb200-4gpu-demo")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tuned-cache", type=float, default=0.8, help="--cache-threshold of the tuned cache_aware run")
    p.add_argument("--tuned-abs", type=int, default=4, help="--balance-abs-threshold of the tuned cache_aware run")
    p.add_argument("--overhead-rounds", type=int, default=5)
    p.add_argument("--overhead-seconds", type=float, default=5.0)
    p.add_argument("--overhead-policies", default="cache_aware,consistent_hash")
    p.add_argument("--only", help="comma-separated run names to keep (default: all)")
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": [], "overhead": []}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-router-") as tmp:
        work = Path(tmp)
        todo = runs(args)
        if args.only:
            keep = set(args.only.split(","))
            todo = [r for r in todo if r.name in keep]
        print(f"{'run':38} {'hit rate':>8} {'requests/engine %':>18} {'TTFT p50':>9} {'p99':>7}  ok/err  "
              "router token inputs", flush=True)
        for run in todo:
            r = one_run(run, args, work, args.seed)
            results["runs"].append(r)
            inputs = ",".join(f"{_result_label(k)}:{v:.0f}" for k, v in r["router_token_inputs"].items()) or "-"
            hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}%"
            print(f"{r['run']:38} {hit:>8} {_shares(r['requests_per_engine']):>18} {_ms(r['ttft_p50']):>7}ms "
                  f"{_ms(r['ttft_p99']):>5}ms  {r['ok']}/{sum(r['errors'].values())}  {inputs}", flush=True)
        for policy in filter(None, args.overhead_policies.split(",")):
            o = overhead(args, work, policy)
            results["overhead"].append(o)
            print(f"router overhead ({policy}, 1 engine, {args.sessions} sessions, median of {o['rounds']}): "
                  f"TTFT p50 {1e3 * o['ttft_p50_added']:+.1f} ms, p99 {1e3 * o['ttft_p99_added']:+.1f} ms "
                  f"(direct p50 {1e3 * o['direct_ttft_p50']:.0f} ms; per round p50 "
                  f"{', '.join(f'{1e3 * x:+.1f}' for x in o['p50_added_per_round'])})", flush=True)
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
