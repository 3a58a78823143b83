"""vllm-router in front of mock engines, under the load generator's agentic sessions:
`python -m flashserve_testbed.router.bench_vllm_router [--suite NAME ...] [--seconds 30] [--sessions 8] [--engines 3]`.

Suites (default: policies and overhead):
  * policies: the runs below;
  * calibrate: consistent_hash through the real binary, then the simulator's `router` model (ring_replay.py)
    on the same requests (same session ids, prompts, outputs and start times): hit rate and spread side by side;
  * replicas: two router processes behind a random-per-request proxy (clients behind a Service without
    affinity: consecutive requests of a session reach either router), for consistent_hash, sticky_least_loaded
    and cache_aware, beside one router of each;
  * overhead: the router's added TTFT (below), also from the engines' own TTFT histograms and the router's, and
    on the wire (wiretime.py: tcpdump's timestamps of the router's two sides of each request).

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
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from flashserve.facts import router as router_facts

from flashserve_testbed.loadgen import Workload, run_load
from flashserve_testbed.localcluster.procs import end
from flashserve_testbed.quantiles import nearest_rank
from flashserve_testbed.router import mockfleet as mf
from flashserve_testbed.router import wiretime
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
    routers: int = 1  # more than one: a random-per-request proxy in front of them (a Service without affinity)
    replay: bool = False  # also run the simulator's router model on the run's requests (calibrate)
    dp_routing: str | None = None  # the mock's balancer between its ranks (None: its default, `prefix`)
    repeat: bool = False  # run at --rounds seeds, medians printed (as calibrate)


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


SUITES = ("policies", "calibrate", "replicas", "dp", "overhead")
DP_AWARE = (router_facts.DP_AWARE_FLAG, ENGINE_FLAGS[1])  # one ring entry per rank of each engine pod


def dp_runs() -> list[Run]:
    """Routing to a pod or to one of its ranks, with vLLM 0.33's own balancer between a pod's ranks (by load
    only: a session's turns spread over the ranks) and with the mock's (which also prefers the rank holding
    the prefix, as no vLLM does): what pinning each session to a rank buys on a real engine."""
    return [Run("consistent_hash / vLLM rank balancer", "router", "consistent_hash", dp_routing="load", repeat=True),
            Run("consistent_hash per rank (DP-aware) / vLLM rank balancer", "router", "consistent_hash",
                router_args=DP_AWARE, dp_routing="load", repeat=True),
            Run("consistent_hash / mock prefix rank balancer", "router", "consistent_hash",
                dp_routing="prefix", repeat=True),
            Run("service / vLLM rank balancer", "service", dp_routing="load", repeat=True),
            Run("one engine / vLLM rank balancer", "direct", engines=1, dp_routing="load", repeat=True),
            Run("one engine per rank (DP-aware) / vLLM rank balancer", "router", "consistent_hash", engines=1,
                router_args=DP_AWARE, dp_routing="load", repeat=True)]


def suite_runs(suite: str, args) -> list[Run]:
    if suite == "policies":
        return runs(args)
    if suite == "calibrate":
        return [Run("calibrate: consistent_hash", "router", "consistent_hash", replay=True)]
    if suite == "dp":
        return dp_runs()
    if suite == "replicas":
        out = []
        for policy in ("consistent_hash", "sticky_least_loaded", "cache_aware"):
            out += [Run(f"{policy} / 1 router", "router", policy),
                    Run(f"{policy} / 2 routers", "router", policy, routers=2)]
        return out
    return []


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


def _start_service(port: int, engines: list, log: Path) -> subprocess.Popen:
    """The random-per-request proxy in front of `engines` (anything with a `.url` or `.base`)."""
    out = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.router.randomproxy", str(port),
                             *(getattr(e, "url", None) or e.base for e in engines)], stdout=out,
                            stderr=subprocess.STDOUT)  # fmt: skip
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
    engines = mf.start_engines(n, d, profile=args.profile, flags=flags, seed=seed, dp_routing=run.dp_routing)
    routers: list[VllmRouter] = []
    service = None
    try:
        if run.route == "router":
            for i in range(run.routers):
                opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(),
                                     prometheus_port=free_port(), policy=run.policy, extra_args=run.router_args,
                                     log_level=args.router_log_level)
                routers.append(VllmRouter(opts, d / f"router-{i}.log", cpus=args.router_cpu_set).start())
            if run.routers > 1:
                port = free_port()
                service = _start_service(port, routers, d / "proxy.log")
                base = f"http://127.0.0.1:{port}/v1"
            else:
                base = routers[0].base + "/v1"
        elif run.route == "service":
            port = free_port()
            service = _start_service(port, engines, d / "proxy.log")
            base = f"http://127.0.0.1:{port}/v1"
        else:
            base = engines[0].url + "/v1"
        report = asyncio.run(_load(base, sessions, args.seconds, args.profile, seed))
        texts = [e.metrics() for e in engines]
        router_metrics = [r.metrics() for r in routers]
    finally:
        for router in routers:
            router.stop()
        if service:
            end(service)
        mf.stop_all(engines)
    hits = sum(mf.counter(t, "vllm:prefix_cache_hits_total") for t in texts)
    queries = sum(mf.counter(t, "vllm:prefix_cache_queries_total") for t in texts)
    per_engine = [mf.counter(t, "vllm:request_success_total") for t in texts]
    ranks = [v for t in texts for v in per_rank(t, "vllm:request_success_total")]
    s = report.summary()
    inputs = _summed(router_metrics, "vllm_router_kv_routing_inputs_total")
    renders = sum(inputs.values())
    decisions = _summed(router_metrics, "vllm_router_prefix_routing_decisions_total")
    out = {
        "run": run.name, "engines": n, "routers": run.routers if run.route == "router" else 0,
        "sessions": sessions, "requests": s["requests"], "ok": s["ok"],
        "errors": s["errors"], "hit_rate": hits / queries if queries else None, "requests_per_engine": per_engine,
        "requests_per_rank": ranks,
        "ttft_p50": s["ttft_seconds"]["p50"], "ttft_p99": s["ttft_seconds"]["p99"],
        "router_token_inputs": inputs,
        "prefix_decisions": decisions, "router_token_input_calls": renders,
    }
    if run.replay:
        from flashserve_testbed.router.ring_replay import replay

        urls = [e.url for e in engines]
        # the mocks run no MTP drafts without --speculative-config (decoding 1 token a step, not the profile's
        # 1.8): the model's engines the same, or its requests finish early and its ranks look idler
        spec = None if "--speculative-config" in flags else 0
        # the load generator's session ids, served where the binary sent them
        sim = replay(report.records, urls, args.profile, seed=seed, num_speculative_tokens=spec)
        # the same with the prefix cache resolved to the mock's KV blocks instead of the benchmark's 512-token
        # units (0: one key per KV block)
        fine = replay(report.records, urls, args.profile, seed=seed, cache_unit=0, num_speculative_tokens=spec)
        out["sim"] = {"requests_per_engine": sim.requests_per_engine, "hit_rate": sim.hit_rate,
                      "hit_rate_block_units": fine.hit_rate}
        out["client_cached_fraction"] = s["cached_fraction"]
        out["urls"] = urls
        # the requests themselves, so the replay can be rerun offline (replay_json) against the same run
        out["records"] = [asdict(rec) for rec in report.records]
    return out


def rank_peak(per_rank: list[float]) -> float | None:
    """The busiest rank's requests over the mean rank's: what pinning sessions to ranks costs in balance."""
    if not per_rank or not sum(per_rank):
        return None
    return max(per_rank) / (sum(per_rank) / len(per_rank))


def rank_medians(runs: list[dict]) -> dict:
    """Medians over a repeated run's rounds of its hit rate and its busiest rank's share."""
    med = statistics.median
    hits = [r["hit_rate"] for r in runs if r["hit_rate"] is not None]
    per_round = [(r["seed"], r["hit_rate"], rank_peak(r["requests_per_rank"])) for r in runs]
    peaks = [p for _, _, p in per_round if p is not None]
    return {"rounds": len(runs), "hit_rate": med(hits) if hits else None, "rank_peak": med(peaks) if peaks else None,
            "per_round": per_round}


def spread_diff(real: list[float], sim: list[float]) -> float:
    """Largest difference, in points, between two per-engine shares of requests."""
    a = [100 * v / (sum(real) or 1) for v in real]
    b = [100 * v / (sum(sim) or 1) for v in sim]
    return max(abs(x - y) for x, y in zip(a, b))


def calibrate_medians(runs: list[dict]) -> dict:
    """Medians over calibrate rounds of the real and simulated hit rates, their differences and the spread."""
    med = statistics.median
    ok = [r for r in runs if r["hit_rate"] is not None and r["sim"]["hit_rate"] is not None]
    return {"rounds": len(ok), "real": med(r["hit_rate"] for r in ok),
            "sim": med(r["sim"]["hit_rate"] for r in ok),
            "sim_blocks": med(r["sim"]["hit_rate_block_units"] for r in ok),
            "diff": med(r["sim"]["hit_rate"] - r["hit_rate"] for r in ok),
            "diff_blocks": med(r["sim"]["hit_rate_block_units"] - r["hit_rate"] for r in ok),
            "spread": med(spread_diff(r["requests_per_engine"], r["sim"]["requests_per_engine"]) for r in ok)}


def _summed(texts: list[str], name: str) -> dict[str, float]:
    """label string -> value of one metric, summed over several routers' metrics."""
    out: dict[str, float] = {}
    for text in texts:
        for k, v in mf.samples(text, name).items():
            out[k] = out.get(k, 0.0) + v
    return out


def per_rank(text: str, name: str) -> list[float]:
    """One engine pod's counter per data-parallel rank (its `engine` label), in rank order."""
    ranks: dict[int, float] = {}
    for labels, v in mf.samples(text, name).items():
        rank = int(labels.split('engine="', 1)[1].split('"', 1)[0]) if 'engine="' in labels else 0
        ranks[rank] = ranks.get(rank, 0.0) + v
    return [ranks[r] for r in sorted(ranks)]


def _hist(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram over all its label sets."""
    return mf.counter(text, name + "_sum"), mf.counter(text, name + "_count")


def _render_probe(url: str, n: int = 20) -> float:
    """Median seconds of one prompt render on an idle engine (what cache_aware asks every worker per request),
    for a first turn of the demo's sessions (~1,100 tokens)."""
    import urllib.request

    body = json.dumps({"model": mf.SERVED, "messages": [
        {"role": "system", "content": "You are a coding agent. " * 130},
        {"role": "user", "content": "Fix the failing test in the repository. " * 30}]}).encode()
    times = []
    for _ in range(n):
        req = urllib.request.Request(url + "/v1/chat/completions/render", data=body,
                                     headers={"content-type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _overhead_round(args, work: Path, policy: str, seed: int) -> dict:
    """One engine, the same load straight to it and then through the router. Besides the clients' TTFT, the
    engine's own TTFT histogram over each half: client TTFT minus engine TTFT is the time spent outside the
    engine (HTTP, the client, and the router when there is one), so the difference of that between the halves
    is what the router adds with the engine's own variation taken out."""
    d = work / f"overhead-{policy}-{seed}"
    engines = mf.start_engines(1, d, profile=args.profile, flags=ENGINE_FLAGS + SCALE_OUT, seed=seed)
    eng = engines[0]
    try:
        name, ranks, level = overhead_variant(policy)
        opts = RouterOptions(worker_urls=(eng.url,), port=free_port(), prometheus_port=free_port(),
                             policy=name, log_level=level or args.router_log_level,
                             extra_args=DP_AWARE if ranks else ())
        with VllmRouter(opts, d / "router.log", cpus=args.router_cpu_set) as router:
            out = {}
            for name, base in (("direct", eng.url + "/v1"), ("routed", router.base + "/v1")):
                # the routed half on the wire too (wiretime.py): the router's own share of each request's TTFT
                capture = (wiretime.Capture(d / "routed.pcap", (opts.port, eng.port)) if name == "routed"
                           and args.wire else None)
                out[name] = load_half(base, eng.metrics, router.metrics, sessions=args.sessions,
                                      seconds=args.overhead_seconds, profile=args.profile, seed=seed, around=capture)
                if capture is not None:
                    out["wire"] = wire_round(capture, (opts.port,), (eng.port,))
            out["render_probe_s"] = _render_probe(eng.url) if policy.startswith("cache_aware") else None
    finally:
        mf.stop_all(engines)
    return out


def load_half(base: str, engine_metrics: Callable[[], str], router_metrics: Callable[[], str], *, sessions: int,
              seconds: float, profile: str, seed: int, around: contextlib.AbstractContextManager | None = None) -> dict:
    """One half of an overhead round: `sessions` sessions to `base` for `seconds`. The clients' TTFT beside the
    engine's own (its histogram over the half) and the router's generate duration over the same requests.
    `around` (a packet capture) is entered for the load only, not for the metrics reads."""
    e0, r0 = engine_metrics(), router_metrics()
    with around or contextlib.nullcontext():
        rep = asyncio.run(run_load(base, schedule=f"hold {sessions} {seconds:g}s", seed=seed, drain_seconds=5,
                                   workload=Workload.from_profile(profile)))  # fmt: skip
    e1, r1 = engine_metrics(), router_metrics()
    ttfts = [t for r in rep.ok if (t := r.ttft()) is not None]
    es0, ec0 = _hist(e0, "vllm:time_to_first_token_seconds")
    es1, ec1 = _hist(e1, "vllm:time_to_first_token_seconds")
    gs0, gc0 = _hist(r0, "vllm_router_generate_duration_seconds")
    gs1, gc1 = _hist(r1, "vllm_router_generate_duration_seconds")
    return {
        **rep.summary()["ttft_seconds"],
        "failed": len(rep.records) - len(rep.ok),
        "client_ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "engine_ttft_mean": (es1 - es0) / (ec1 - ec0) if ec1 > ec0 else None,
        "router_generate_mean": (gs1 - gs0) / (gc1 - gc0) if gc1 > gc0 else None,
    }


def wire_round(capture: wiretime.Capture, router: tuple, engines: tuple) -> dict:
    """A routed half's capture read: the router's share of each request (wiretime.py's endpoints)."""
    wt = wiretime.measure(capture.path, router, engines)
    return {**wt.summary(), "dropped": capture.dropped, "added_values": [r.added for r in wt.requests]}


def router_cpus(text: str | None, available: set[int]) -> frozenset[int] | None:
    """`--router-cpus` ("1", "2,3", "2-3") -> the routers' CPUs, a non-empty proper subset of `available` so
    that the engines, the clients and the capture keep the rest."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise SystemExit(f"--router-cpus: {text!r}: give CPU numbers, e.g. 1 or 2,3 or 2-3") from None
    if not cpus or not cpus < available:
        raise SystemExit(f"--router-cpus: {text!r}: give some but not all of this process's CPUs "
                         f"{sorted(available)}, so the engines and clients keep the rest")
    return frozenset(cpus)


def overhead_variant(spec: str) -> tuple[str, bool, str | None]:
    """`POLICY[@ranks][/LEVEL]` -> (policy, per rank, the router's log level or None for --router-log-level)."""
    rest, _, level = spec.partition("/")
    policy, _, where = rest.partition("@")
    if where not in ("", "ranks"):
        raise SystemExit(f"--overhead-policies: {spec!r}: after @ only `ranks` is known (POLICY@ranks)")
    if level and level not in router_facts.LOG_LEVELS:
        raise SystemExit(f"--overhead-policies: {spec!r}: log level {level!r} is not one of "
                         f"{', '.join(router_facts.LOG_LEVELS)}")
    return policy, where == "ranks", level or None


def overhead_all(args, work: Path, policies: list[str]) -> list[dict]:
    """Every policy's rounds, interleaved (round 1 of each, then round 2 of each, ...), so that the machine's
    drift over the run falls on every policy alike."""
    rounds: dict[str, list[dict]] = {p: [] for p in policies}
    for i in range(args.overhead_rounds):
        for policy in policies:
            rounds[policy].append(_overhead_round(args, work, policy, seed=100 + i))
    return [overhead(args, policy, rounds[policy]) for policy in policies]


def overhead(args, policy: str, rounds: list[dict]) -> dict:

    def outside(x: dict) -> float | None:
        if x["client_ttft_mean"] is None or x["engine_ttft_mean"] is None:
            return None
        return x["client_ttft_mean"] - x["engine_ttft_mean"]

    d50 = [r["routed"]["p50"] - r["direct"]["p50"] for r in rounds]
    d99 = [r["routed"]["p99"] - r["direct"]["p99"] for r in rounds]
    paired = [a - b for r in rounds if (a := outside(r["routed"])) is not None and (b := outside(r["direct"])) is not None]
    gen = [r["routed"]["router_generate_mean"] - r["routed"]["engine_ttft_mean"] for r in rounds
           if r["routed"]["router_generate_mean"] is not None and r["routed"]["engine_ttft_mean"] is not None]
    renders = [r["render_probe_s"] for r in rounds if r["render_probe_s"] is not None]
    med = statistics.median
    wire = [r["wire"] for r in rounds if r.get("wire") and r["wire"]["requests"]]

    def wire_med(part: str, q: str) -> float | None:
        xs = [w[part][q] for w in wire if w[part][q] is not None]
        return med(xs) if xs else None
    pooled = [x for w in wire for x in w.get("added_values", ())]
    return {"policy": policy, "rounds": args.overhead_rounds, "ttft_p50_added": med(d50),
            "ttft_p99_added": med(d99), "direct_ttft_p50": med([r["direct"]["p50"] for r in rounds]),
            "p50_added_per_round": d50, "p99_added_per_round": d99,
            "paired_mean_added": med(paired) if paired else None, "paired_mean_added_per_round": paired,
            "router_generate_minus_engine_ttft": med(gen) if gen else None,
            "router_generate_mean": med([r["routed"]["router_generate_mean"] or 0.0 for r in rounds]),
            "engine_ttft_mean": med([r["routed"]["engine_ttft_mean"] or 0.0 for r in rounds]),
            "render_probe_s": med(renders) if renders else None,
            "wire": {f"{part}_{q}": wire_med(part, q) for part in ("added", "own", "render", "inbound", "outbound")
                     for q in ("p50", "p99")} | {
                "rounds": len(wire), "requests": sum(w["requests"] for w in wire),
                "unpaired": sum(w["unpaired"] for w in wire), "dropped": sum(w["dropped"] or 0 for w in wire),
                "added_p50_per_round": [w["added"]["p50"] for w in wire],
                # every round's requests together: a p99 of a few hundred requests, not of a round's 35
                "added_pooled_p50": nearest_rank(pooled, 0.5),
                "added_pooled_p99": nearest_rank(pooled, 0.99),
                "added_p99_per_round": [w["added"]["p99"] for w in wire]} if wire else None,
            "rounds_detail": rounds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashserve_testbed.router.bench_vllm_router",
                                description=__doc__.split("\n")[0])
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--sessions", type=int, default=8, help="sessions per engine (the demo profile's SLA load)")
    p.add_argument("--seconds", type=float, default=25.0, help="wall seconds of load per run")
    p.add_argument("--profile", default="gb200-4gpu-demo")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1,
                   help="calibrate: rounds at seeds --seed, --seed+1, ... (medians printed when more than one)")
    p.add_argument("--tuned-cache", type=float, default=0.8, help="--cache-threshold of the tuned cache_aware run")
    p.add_argument("--tuned-abs", type=int, default=4, help="--balance-abs-threshold of the tuned cache_aware run")
    p.add_argument("--overhead-rounds", type=int, default=5)
    p.add_argument("--overhead-seconds", type=float, default=5.0)
    p.add_argument("--overhead-policies", default="cache_aware,consistent_hash",
                   help="comma-separated policies of the overhead suite, run round by round interleaved: "
                        "POLICY[@ranks][/LEVEL]; @ranks routes per data-parallel rank "
                        "(--intra-node-data-parallel-size, the operator's default), /LEVEL sets the router's log "
                        "level for that policy")
    p.add_argument("--router-log-level", choices=router_facts.LOG_LEVELS, default=router_facts.DEFAULT_LOG_LEVEL,
                   help="the routers' log level, in their RUST_LOG (default: the operator's, %(default)s)")
    p.add_argument("--router-cpus", metavar="CPUS",
                   help="pin the routers to these CPUs (e.g. 1) and everything else (engines, clients, capture) to "
                        "the others: the router's time without other processes competing for its core")
    p.add_argument("--no-wire", dest="wire", action="store_false",
                   help="overhead: skip the packet capture (wiretime.py; needs tcpdump and root)")
    p.add_argument("--suite", nargs="+", choices=SUITES, default=["policies", "overhead"],
                   help="what to run (default: policies overhead)")
    p.add_argument("--only", help="comma-separated run names to keep (default: all)")
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    available = os.sched_getaffinity(0)
    args.router_cpu_set = router_cpus(args.router_cpus, available)
    if args.router_cpu_set:
        # set before any child starts: engines, tcpdump and the clients' threads inherit the rest
        os.sched_setaffinity(0, available - args.router_cpu_set)
        print(f"routers on CPUs {sorted(args.router_cpu_set)}, everything else on "
              f"{sorted(available - args.router_cpu_set)}", flush=True)
    t0 = time.monotonic()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items() if k != "router_cpu_set"}, "runs": [],
                     "overhead": []}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-router-") as tmp:
        work = Path(tmp)
        todo = [r for suite in args.suite for r in suite_runs(suite, args)]
        if args.only:
            keep = set(args.only.split(","))
            todo = [r for r in todo if r.name in keep]
        print(f"{'run':38} {'hit rate':>8} {'requests/engine %':>18} {'TTFT p50':>9} {'p99':>7}  ok/err  "
              "router token inputs", flush=True)
        # calibrate repeats over --rounds seeds (its medians below); the other suites run once, at --seed
        todo = [(run, args.seed + i) for run in todo for i in range(args.rounds if run.replay or run.repeat else 1)]
        for run, seed in todo:
            r = one_run(run, args, work, seed)
            r["seed"] = seed
            results["runs"].append(r)
            inputs = ",".join(f"{_result_label(k)}:{v:.0f}" for k, v in r["router_token_inputs"].items()) or "-"
            hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}%"
            print(f"{r['run']:38} {hit:>8} {_shares(r['requests_per_engine']):>18} {_ms(r['ttft_p50']):>7}ms "
                  f"{_ms(r['ttft_p99']):>5}ms  {r['ok']}/{sum(r['errors'].values())}  {inputs}", flush=True)
            if "sim" in r:
                sim = r["sim"]
                shit = "-" if sim["hit_rate"] is None else f"{100 * sim['hit_rate']:.1f}%"
                print(f"{'  simulator, router model, same requests':38} {shit:>8} "
                      f"{_shares(sim['requests_per_engine']):>18}  (hit rate {100 * ((sim['hit_rate'] or 0) - (r['hit_rate'] or 0)):+.1f} "
                      f"points; spread max |diff| {spread_diff(r['requests_per_engine'], sim['requests_per_engine']):.1f} points)", flush=True)
                fh = sim["hit_rate_block_units"]
                print(f"{'  the same, cache in KV blocks':38} {'-' if fh is None else f'{100 * fh:.1f}%':>8} "
                      f"{'':>18}  (hit rate {100 * ((fh or 0) - (r['hit_rate'] or 0)):+.1f} points)", flush=True)
        repeated = [run.name for run, _ in todo if run.repeat]
        if repeated:
            print("medians over rounds: hit rate, busiest rank's share of the requests over the mean rank's")
            for name in dict.fromkeys(repeated):
                rs = [r for r in results["runs"] if r["run"] == name]
                med = rank_medians(rs)
                results.setdefault("medians", {})[name] = med
                print(f"  {name}: {100 * med['hit_rate']:.1f}%, {med['rank_peak']:.2f}x "
                      f"({med['rounds']} rounds)", flush=True)
        cal = [r for r in results["runs"] if "sim" in r]
        if len(cal) > 1:
            results["calibrate_medians"] = med = calibrate_medians(cal)
            print(f"calibrate, median of {len(cal)} rounds (seeds {cal[0]['seed']}-{cal[-1]['seed']}): hit rate real "
                  f"{100 * med['real']:.1f}%, simulator {100 * med['sim']:.1f}% ({100 * med['diff']:+.1f} points), "
                  f"KV-block units {100 * med['sim_blocks']:.1f}% ({100 * med['diff_blocks']:+.1f}); spread max "
                  f"|diff| {med['spread']:.1f} points", flush=True)
        policies = [p for p in args.overhead_policies.split(",") if p] if "overhead" in args.suite else []
        for spec in policies:
            overhead_variant(spec)  # a bad spec stops the run before it starts
        for o in overhead_all(args, work, policies):
            policy = o["policy"]
            results["overhead"].append(o)
            print(f"router overhead ({policy}, 1 engine, {args.sessions} sessions, median of {o['rounds']}): "
                  f"TTFT p50 {1e3 * o['ttft_p50_added']:+.1f} ms, p99 {1e3 * o['ttft_p99_added']:+.1f} ms "
                  f"(direct p50 {1e3 * o['direct_ttft_p50']:.0f} ms; per round p50 "
                  f"{', '.join(f'{1e3 * x:+.1f}' for x in o['p50_added_per_round'])})", flush=True)
            pm = o["paired_mean_added"]
            print(f"  paired (client TTFT - engine TTFT, routed - direct, mean): "
                  f"{'-' if pm is None else f'{1e3 * pm:+.1f} ms'} (per round "
                  f"{', '.join(f'{1e3 * x:+.1f}' for x in o['paired_mean_added_per_round'])}); router "
                  f"generate_duration mean {1e3 * o['router_generate_mean']:.1f} ms vs engine TTFT mean "
                  f"{1e3 * o['engine_ttft_mean']:.1f} ms"
                  + (f"; one render on an idle engine {1e3 * o['render_probe_s']:.1f} ms"
                     if o["render_probe_s"] is not None else ""), flush=True)
            if w := o["wire"]:
                print(f"  on the wire ({w['requests']} requests, {w['unpaired']} unpaired, {w['dropped']} packets "
                      f"dropped; medians of {w['rounds']} rounds): added to TTFT p50 {1e3 * w['added_p50']:.3f} ms, "
                      f"p99 {1e3 * w['added_p99']:.3f} ms; the router's own p50 {1e3 * w['own_p50']:.3f} ms, p99 "
                      f"{1e3 * w['own_p99']:.3f} ms; waiting on renders p50 {1e3 * w['render_p50']:.3f} ms, p99 "
                      f"{1e3 * w['render_p99']:.3f} ms (per round p50 "
                      f"{', '.join(f'{1e3 * x:.3f}' for x in w['added_p50_per_round'])}; p99 "
                      f"{', '.join(f'{1e3 * x:.3f}' for x in w['added_p99_per_round'])}); every round's "
                      f"requests together p50 {1e3 * w['added_pooled_p50']:.3f} ms, p99 "
                      f"{1e3 * w['added_pooled_p99']:.3f} ms", flush=True)
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
