"""Prefix-cache hit rate through the serving path the operator deploys, on the local cluster (issue 18's target):

* `routed`: a serving of 3 replicas behind its router Deployment (vllm-router, consistent_hash, 2 router pods),
  under 3 x S agentic sessions;
* `single`: a serving of 1 replica (and its router) under S sessions (the same per-replica load), the best a
  replica can do;
* `service`: a serving of 3 replicas with `routing.enabled: false` (the plain Service), under 3 x S sessions.

Loopback pod IPs have no Service endpoints locally, so one stand-in for the client Service serves all three
modes: a proxy that sends each request to a pod drawn at random (`randomproxy.py`), over the serving's router
pods (routed, single: the Service in front of the router Deployment, so both router pods take turns of every
session) or over its engine pods (service: no session affinity, as a Service balancing per request; one
balancing per keep-alive connection is no better, since the client's pooled connections carry any session).

Hit rate = the change of vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total (tokens) summed over
the serving's engines, read at their pod IPs once no request runs or waits there, before and after each run.
Targets, on the medians over rounds: `routed` within 5 points of `single`, and at least 25 points above
`service`.

Rounds are independent: each (window, round) has its own seed (a new system prompt and new session texts, so
no cached block of an earlier run can match) and its own session-id prefix (a new placement of the sessions on
the consistent-hash ring); the three modes of one round share both, so they are compared on the same sessions.
`--seconds` takes several windows: sessions start together, and their contexts grow over minutes, so a short
window is mostly early turns.

`--kv-tokens` sizes each engine's (data-parallel rank's) KV cache, through the serving's own
`spec.engine.gpuMemoryUtilization` (and a `maxModelLen` that fits): the demo profile keeps the real GB200's
4.2 M tokens per rank for a load of a few thousand, so its engines never evict, and a request sent to an engine
that served its session two turns ago still finds most of its prefix there. A production rank holds about 1.8x
its running sequences' contexts (gb200-4gpu: 4.23 M tokens for 64 x ~36 K), so copies of one session on several
engines evict each other. Each value is measured on servings of its own, after the previous ones are deleted;
`default` is the profile's own cache.

    PYTHONPATH=operator:testbed .venv/bin/python -m flashserve_testbed.router.bench_serving_path \\
        [--seconds 40 [120 ...]] [--sessions 8] [--rounds 3] [--kv-tokens default 12800 ...] [--json OUT.json] \\
        [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from flashserve.api.v1alpha1 import DEFAULT_SERVED_NAME
from flashserve.facts import router as router_facts
from flashserve_testbed.localcluster.procs import end

SERVINGS = {
    "routed": {"replicas": 3},
    "single": {"replicas": 1},
    "service": {"replicas": 3, "routing": {"enabled": False}},
}
ENGINES = "flashserve.io/serving={name},app.kubernetes.io/component=engine"
PROFILE = "gb200-4gpu-demo"  # the mock runtime's profile (demo.Stack's default)
NEAR_POINTS = 5.0  # routed at most this far from single
ABOVE_POINTS = 25.0  # routed at least this far above service


def _pct(v: float | None, spec: str = ".1%") -> str:
    return "-" if v is None else format(v, spec)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- pure parts -------------------------------------------------------------------------------------------


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Hits over queries between two (hits, queries) readings; NaN when nothing was queried."""
    dq = after[1] - before[1]
    return (after[0] - before[0]) / dq if dq > 0 else float("nan")


def engine_for_kv(kv_tokens: int | None, profile_name: str = PROFILE) -> dict:
    """The `spec.engine` settings that give each engine (data-parallel rank) of the profile the fewest whole KV
    blocks holding `kv_tokens` tokens, by the memory arithmetic the engines run (`Profile.kv_blocks`), with a
    `maxModelLen` no larger than that cache; {} for None (the profile's own cache)."""
    if kv_tokens is None:
        return {}
    from flashserve_testbed.engine.profile import GIB, load

    p = load(profile_name)
    blocks = math.ceil(kv_tokens / p.block_size)
    need = p.non_kv_memory_gib * GIB + blocks * p.block_size * p.kv_bytes_per_token
    util = math.ceil(need / (p.gpu_memory_gib * GIB) * 1e6) / 1e6  # six digits, rounded up
    while p.kv_blocks(util) < blocks:
        util = round(util + 1e-6, 6)
    if util > 1:
        raise ValueError(f"--kv-tokens {kv_tokens}: more than a {p.gpu_product} has room for")
    return {"gpuMemoryUtilization": util, "maxModelLen": min(p.max_model_len, p.kv_blocks(util) * p.block_size)}


def rank_balancer_env(balancer: str | None) -> dict:
    """`spec.engine` settings choosing the mock engines' balancer between a pod's data-parallel ranks: `load`,
    vLLM 0.33's own (by load only), or `prefix`, the mock's default (it also prefers a rank holding the prompt's
    prefix, which no vLLM does); {} for None (the mock's default). Through the serving's own env field: a real
    vLLM ignores the variable."""
    if balancer is None:
        return {}
    from flashserve_testbed.engine.replica import ENV_ROUTING

    return {"env": [{"name": ENV_ROUTING, "value": balancer}]}


def serving_name(mode: str, kv_tokens: int | None) -> str:
    return mode if kv_tokens is None else f"{mode}-kv{kv_tokens}"


def first_turn_share(requests: list[dict]) -> float | None:
    """Share of the prompt tokens sent in first turns (cold but for the system prompt) among the ok requests."""
    ok = [r for r in requests if not r.get("error")]
    total = sum(r.get("prompt_tokens") or 0 for r in ok)
    first = sum(r.get("prompt_tokens") or 0 for r in ok if r.get("turn") == 0)
    return first / total if total else None


def resident_tokens(requests: list[dict], engines: int) -> float | None:
    """Mean tokens of context resident per engine (data-parallel rank) while the run's requests ran, by Little's
    law: each ok request holds its prompt and output for its lifetime, over the run's span and `engines`. What a
    cache must hold to keep only the running sequences; None without ok requests."""
    ok = [r for r in requests if not r.get("error") and r.get("end") is not None and r.get("start") is not None]
    if not ok:
        return None
    span = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    held = sum(((r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0)) * (r["end"] - r["start"])
               for r in ok)
    return held / span / engines if span > 0 else None


def ceilings(requests: list[dict], replicas: int = 3, block: int = 64, draws: int = 64, seed: int = 0) -> dict:
    """What placement alone allows on the requests a run sent, with caches that never evict and one cache per
    replica (no data-parallel split, no timing): `affinity`, every turn on its session's engine (it hits all its
    session sent and received before, to whole `block`s); `random`, each turn on one of `replicas` engines drawn
    at random (the expectation over `draws` draws), where an engine holds what the session had when that engine
    last served it. Both also hit the shared system prompt, read as the largest hit of a first turn. Hit rates
    over the prompt tokens of the ok requests; None without any."""
    import random

    sessions: dict[object, list[dict]] = {}
    for r in requests:
        if not r.get("error") and r.get("prompt_tokens"):
            sessions.setdefault(r["session"], []).append(r)
    turns = [sorted(v, key=lambda r: r["turn"]) for v in sessions.values()]
    queried = sum(r["prompt_tokens"] for t in turns for r in t)
    if not queried:
        return {"affinity": None, "random": None, "replicas": replicas}
    shared = max((r.get("cached_tokens") or 0 for t in turns for r in t if r["turn"] == 0), default=0)

    def hit(cached: int, prompt: int) -> int:
        return min(cached, prompt - 1) // block * block  # vLLM always computes the last token

    affinity = 0
    for t in turns:
        prev = shared
        for r in t:
            affinity += hit(prev, r["prompt_tokens"])
            prev = r["prompt_tokens"] + (r.get("completion_tokens") or 0)
    rng = random.Random(seed)
    spread = 0
    for _ in range(draws):
        for t in turns:
            seen: dict[int, int] = {}
            for r in t:
                e = rng.randrange(replicas)
                spread += hit(seen.get(e, shared), r["prompt_tokens"])
                seen[e] = r["prompt_tokens"] + (r.get("completion_tokens") or 0)
    return {"affinity": affinity / queried, "random": spread / draws / queried, "replicas": replicas}


def summarize(rates: dict[str, list[float]]) -> dict:
    """Medians over rounds, the two differences (in points, of the medians and per round) and the targets.
    `rates[mode]` lists one hit rate (0..1) per round, for the modes routed, single and service."""
    clean = {k: [v for v in vs if not math.isnan(v)] for k, vs in rates.items()}
    missing = [k for k in SERVINGS if not clean.get(k)]
    if missing:
        raise ValueError(f"no hit rate measured for {', '.join(missing)}")
    med = {k: statistics.median(clean[k]) for k in SERVINGS}
    near = 100 * (med["routed"] - med["single"])
    above = 100 * (med["routed"] - med["service"])
    n = min(len(rates[k]) for k in SERVINGS)
    return {
        "median": med,
        "routed_minus_single_points": near,
        "routed_minus_service_points": above,
        "per_round_routed_minus_single_points": [100 * (rates["routed"][i] - rates["single"][i]) for i in range(n)],
        "per_round_routed_minus_service_points": [100 * (rates["routed"][i] - rates["service"][i]) for i in range(n)],
        "near_single": abs(near) <= NEAR_POINTS,
        "above_service": above >= ABOVE_POINTS,
    }


def ceiling_summary(rounds: list[dict]) -> dict | None:
    """Medians over rounds of the placement ceilings (`ceilings`) on the routed runs' requests and the service
    runs' requests: the most any router could reach, what random placement is expected to reach, and the gap
    between the two in points. None when the rounds carry no ceilings."""
    out = {}
    for mode in ("routed", "service"):
        cs = [rnd["modes"][mode].get("ceilings") or {} for rnd in rounds]
        aff = [c["affinity"] for c in cs if c.get("affinity") is not None]
        rnd_ = [c["random"] for c in cs if c.get("random") is not None]
        if not aff or not rnd_:
            return None
        out[mode] = {"affinity": statistics.median(aff), "random": statistics.median(rnd_),
                     "gap_points": statistics.median(100 * (c["affinity"] - c["random"]) for c in cs
                                                     if c.get("affinity") is not None and c.get("random") is not None)}
    return out


def target_lines(summary: dict, label: str) -> list[str]:
    near, above = summary["routed_minus_single_points"], summary["routed_minus_service_points"]
    return [
        f"{'PASS' if summary['near_single'] else 'FAIL'} [{label}] routed within {NEAR_POINTS:g} points of single: "
        f"{near:+.1f} points (medians)",
        f"{'PASS' if summary['above_service'] else 'FAIL'} [{label}] routed at least {ABOVE_POINTS:g} points above "
        f"service: {above:+.1f} points (medians)",
    ]


def markdown(window: dict, sessions_per_replica: int) -> str:
    """The table of one window: per mode the median, every round, stream errors."""
    lines = ["| serving | replicas | sessions | prefix hit rate (median) | per round | first-turn share of prompt "
             "tokens | stream errors |", "|---|---|---|---|---|---|---|"]
    for name, spec in SERVINGS.items():
        runs = [rnd["modes"][name] for rnd in window["rounds"]]
        per = ", ".join(f"{r['hit_rate']:.1%}" for r in runs)
        share = ", ".join("-" if r["first_turn_share"] is None else f"{r['first_turn_share']:.0%}" for r in runs)
        errs = sum(sum(r["errors"].values()) for r in runs)
        lines.append(f"| {name} | {spec['replicas']} | {sessions_per_replica * spec['replicas']} | "
                     f"{window['summary']['median'][name]:.1%} | {per} | {share} | {errs} |")
    return "\n".join(lines)


# --- the cluster side -------------------------------------------------------------------------------------


def _metrics(url: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def served_per_rank(urls: list[str]) -> list[float]:
    """Requests each data-parallel rank of the engines has finished, engine by engine."""
    from flashserve_testbed.router.bench_vllm_router import per_rank

    out: list[float] = []
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            out += per_rank(resp.read().decode(), "vllm:request_success_total")
    return out


def busiest_share(before: list[float], after: list[float]) -> float | None:
    """The busiest rank's requests over the mean rank's, over a run (1.0: perfectly even)."""
    moved = [a - b for a, b in zip(after, before)]
    mean = sum(moved) / len(moved) if moved else 0.0
    return max(moved) / mean if mean > 0 else None


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(hits, queries) summed over the engines (every data-parallel rank's series)."""
    hits = queries = 0.0
    for url in urls:
        for s in _metrics(url):
            if s.name == "vllm:prefix_cache_hits_total":
                hits += s.value
            elif s.name == "vllm:prefix_cache_queries_total":
                queries += s.value
    return hits, queries


def wait_idle(urls: list[str], timeout: float = 60.0) -> None:
    """Until no request runs or waits on any engine: a reading then counts every admitted request."""
    deadline = time.monotonic() + timeout
    while True:
        busy = sum(s.value for url in urls for s in _metrics(url)
                   if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))  # fmt: skip
        if not busy:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{busy:g} requests still running or waiting on {urls} after {timeout:.0f} s")
        time.sleep(0.5)


def _pods(stack, selector: str) -> list[dict]:
    from kubernetes import client

    items = client.CoreV1Api(stack.api).list_namespaced_pod(stack.namespace, label_selector=selector).items
    return [stack.api.sanitize_for_serialization(p) for p in items]


def engine_urls(stack, name: str) -> list[str]:
    pods = _pods(stack, ENGINES.format(name=name))
    return sorted(f"http://{p['status']['podIP']}:8000" for p in pods if (p.get("status") or {}).get("podIP"))


def router_pods(stack, name: str) -> list[tuple[str, str]]:
    """(http URL, metrics URL) of each Ready router pod of the serving."""
    from flashserve_testbed.runtime.routerpods import ROUTER_CONTAINER, router_selector, router_urls

    out = []
    pods = _pods(stack, router_selector(name))
    for url in router_urls(pods):
        ip = url.split("//", 1)[1].rsplit(":", 1)[0]
        pod = next(p for p in pods if p["status"].get("podIP") == ip)
        router = next(c for c in pod["spec"]["containers"] if c["name"] == ROUTER_CONTAINER)
        port = next((p["containerPort"] for p in router.get("ports") or [] if p.get("name") == "metrics"), 29000)
        out.append((url, f"http://{ip}:{port}"))
    return out


def router_workers(engines: list[str], ranks: int) -> list[str]:
    """The workers a router lists for `engines`: each engine URL, or with DP-aware routing (the default for
    pods of several ranks, `routing.dataParallelAware`) each of its ranks as `URL@rank`."""
    return list(engines) if ranks <= 1 else [f"{e}@{r}" for e in engines for r in range(ranks)]


def wait_routers(stack, name: str, engines: list[str], routers: int, ranks: int = 1,
                 timeout: float = 120.0, registered: bool = False) -> list[str]:
    """Until `routers` router pods are Ready and each counts exactly the workers of `engines` (router_workers) as
    healthy: a router that found an engine mid-run would rebuild its ring and move a third of the sessions off
    their caches. `registered`: workers the operator registers (IGW mode), whose router leaves
    vllm_router_active_workers at 0, so the health gauges alone are read."""
    engines = router_workers(engines, ranks)
    deadline = time.monotonic() + timeout
    while True:
        pods = router_pods(stack, name)
        ok = len(pods) >= routers
        for _, metrics in pods:
            samples = _metrics(metrics)
            active = next((s.value for s in samples if s.name == "vllm_router_active_workers"), None)
            healthy = {s.labels.get("worker") for s in samples
                       if s.name == "vllm_router_worker_health" and s.value == 1}  # fmt: skip
            ok = ok and (registered or active == len(engines)) and set(engines) <= healthy
        if ok:
            return [u for u, _ in pods]
        if time.monotonic() > deadline:
            raise TimeoutError(f"router pods of {name} do not all route to {engines} after {timeout:.0f} s")
        time.sleep(1)


def _proxy(urls: list[str], log: Path):
    from flashserve_testbed.demo import _free_port

    port = _free_port()
    # Its log only: the client closes a stream once it reads [DONE], and aiohttp logs the proxy's late end-of-body.
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flashserve_testbed.router.randomproxy", str(port), *urls],
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"random proxy over {urls} did not answer /v1/models")
            time.sleep(0.3)


def _load(base_url: str, sessions: int, seconds: float, seed: int, prefix: str, out: Path) -> dict:
    # The model is named: a router in IGW mode (rendezvous_hash) answers /v1/models with a list of its own.
    cmd = [sys.executable, "-m", "flashserve.cli", "load", "--base-url", base_url, "--model", DEFAULT_SERVED_NAME,
           "--schedule",
           f"hold {sessions} {seconds:g}s", "--profile", PROFILE, "--seed", str(seed),
           "--session-prefix", prefix, "--json", str(out), "--json-requests", "-q"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"load failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


@functools.cache
def _ranks() -> int:
    """Engines (data-parallel ranks, each with its own KV cache) per replica of the profile the servings run."""
    from flashserve_testbed.engine.profile import load

    return load(PROFILE).engines_per_replica


def measure(stack, mode: str, name: str, sessions: int, seconds: float, seed: int, prefix: str, out: Path,
            policy: str = "consistent_hash") -> dict:  # fmt: skip
    spec = SERVINGS[mode]
    urls = engine_urls(stack, name)
    if len(urls) != spec["replicas"]:
        raise RuntimeError(f"{name}: {len(urls)} engine pods, expected {spec['replicas']}")
    if spec.get("routing", {}).get("enabled", True):
        registered = policy in router_facts.WORKER_LABEL_POLICIES
        targets, via = wait_routers(stack, name, urls, routers=2, ranks=_ranks(), registered=registered), "router pods"
    else:
        targets, via = urls, "engine pods"
    wait_idle(urls)
    proxy, base = _proxy(targets, out.with_suffix(".proxy.log"))
    try:
        before, served_before = prefix_counters(urls), served_per_rank(urls)
        doc = _load(base, sessions, seconds, seed, prefix, out)
    finally:
        end(proxy)
    wait_idle(urls)
    after = prefix_counters(urls)
    spread = busiest_share(served_before, served_per_rank(urls))
    s = doc["summary"]
    return {"hit_rate": hit_rate(before, after), "queried_tokens": after[1] - before[1],
            "hit_tokens": after[0] - before[0], "via": f"{len(targets)} {via}", "requests": s["requests"],
            "ok": s["ok"], "errors": s["errors"], "sessions_started": s["sessions"],
            "client_cached_fraction": s["cached_fraction"], "first_turn_share": first_turn_share(doc["requests"]),
            "ceilings": ceilings(doc["requests"], replicas=3),
            "resident_tokens_per_engine": resident_tokens(doc["requests"], len(urls) * _ranks()),
            "busiest_rank_share": spread}


def _wait_ready(stack, names: dict[str, str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(int((stack.serving(n).get("status") or {}).get("readyReplicas") or 0) >= SERVINGS[m]["replicas"]
                  for m, n in names.items()):  # fmt: skip
        if time.monotonic() > deadline:
            raise TimeoutError(f"servings {', '.join(names.values())} not ready after {timeout:.0f} s")
        time.sleep(2)


def _wait_gone(stack, names: list[str], timeout: float = 180) -> None:
    """Until the deleted servings' engine pods are gone (their mock engines no longer take a core)."""
    deadline = time.monotonic() + timeout
    while any(engine_urls(stack, n) for n in names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine pods of {', '.join(names)} still there after {timeout:.0f} s")
        time.sleep(2)


def run_capacity(stack, args: argparse.Namespace, kv_tokens: int | None, tmp: Path) -> dict:
    """Every window and round of the three modes on servings whose engines hold `kv_tokens` (None: the profile's
    own cache); the servings are deleted afterwards."""
    engine = {**engine_for_kv(kv_tokens), **rank_balancer_env(args.rank_balancer)}
    names = {mode: serving_name(mode, kv_tokens) for mode in SERVINGS}
    for mode, spec in SERVINGS.items():
        routing = spec.get("routing") or {"policy": args.policy}
        stack.apply({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                     "metadata": {"name": names[mode]},
                     "spec": {"placement": {"accelerator": "GB200"}, **spec, "routing": routing,
                              **({"engine": engine} if engine else {})}})  # fmt: skip
    label = "the profile's KV cache" if kv_tokens is None else f"{kv_tokens} KV tokens per engine ({engine})"
    _log(f"[bench] {label}: servings {', '.join(names.values())}")
    _wait_ready(stack, names)
    windows = []
    run_no = 0
    for seconds in args.seconds:
        rounds = []
        for r in range(args.rounds):
            seed = args.seed + run_no
            prefix = f"w{seconds:g}r{r + 1}{'' if kv_tokens is None else f'k{kv_tokens}'}-s"
            run_no += 1
            modes = {}
            for mode, spec in SERVINGS.items():
                sessions = args.sessions * spec["replicas"]
                _log(f"[bench] {seconds:g} s window, round {r + 1}/{args.rounds} (seed {seed}, sessions "
                     f"{prefix}N): {names[mode]}, {spec['replicas']} replicas, {sessions} sessions")  # fmt: skip
                m = measure(stack, mode, names[mode], sessions, seconds, seed, prefix,
                            tmp / f"{names[mode]}-{seconds:g}-{r}.json", args.policy)
                modes[mode] = m
                _log(f"[bench]   {mode}: hit rate {m['hit_rate']:.1%} (client usage "
                     f"{_pct(m['client_cached_fraction'])}), {m['ok']}/{m['requests']} streams ok via {m['via']}, errors {m['errors'] or 0}, "
                     f"first turns {_pct(m['first_turn_share'], '.0%')} of prompt tokens, busiest rank "
                     f"{m['busiest_rank_share'] or 0:.2f}x the mean")  # fmt: skip
            rounds.append({"seed": seed, "session_prefix": prefix, "modes": modes})
            rr, rs, rv = (modes[k]["hit_rate"] for k in SERVINGS)
            _log(f"[bench] {seconds:g} s round {r + 1}/{args.rounds}: routed {rr:.1%}, single {rs:.1%}, "
                 f"service {rv:.1%} (routed - single {100 * (rr - rs):+.1f}, routed - service "
                 f"{100 * (rr - rv):+.1f} points)")  # fmt: skip
        rates = {k: [rnd["modes"][k]["hit_rate"] for rnd in rounds] for k in SERVINGS}
        windows.append({"seconds": seconds, "rounds": rounds, "hit_rate": rates, "summary": summarize(rates),
                        "ceilings": ceiling_summary(rounds)})
    stack.kubectl(["-n", stack.namespace, "delete", "dss", *names.values(), "--wait=true"])
    _wait_gone(stack, list(names.values()))
    return {"kv_tokens": kv_tokens, "engine": engine, "rank_balancer": args.rank_balancer or "prefix",
            "windows": windows}


def run(args: argparse.Namespace) -> dict:
    from flashserve_testbed.demo import Stack

    stack = Stack(namespace="bench-serving-path", startup_seconds=3.0).start(log=_log)
    try:
        tmp = Path(tempfile.mkdtemp(prefix="bench-serving-path-"))
        capacities = [run_capacity(stack, args, kv, tmp) for kv in args.kv_tokens]
    finally:
        stack.stop(down=not args.keep_cluster, log=_log)
    return {"config": {"rounds": args.rounds, "seconds": list(args.seconds), "sessions_per_replica": args.sessions,
                       "seed": args.seed, "profile": PROFILE, "policy": args.policy,
                       "servings": {k: {"replicas": v["replicas"], "routing": v.get("routing", {"enabled": True})}
                                    for k, v in SERVINGS.items()},
                       "targets": {"near_single_points": NEAR_POINTS, "above_service_points": ABOVE_POINTS}},
            "capacities": capacities}  # fmt: skip


def _groups(out: dict) -> list[tuple[str, dict]]:
    """(label, window) for every window of every KV capacity, in the order run."""
    caps = out.get("capacities") or [{"kv_tokens": None, "windows": out.get("windows", [])}]
    def label(c: dict, w: dict) -> str:
        kv = "" if c["kv_tokens"] is None else f"KV {c['kv_tokens'] / 1000:g}K/engine, "
        ranks = "vLLM's rank balancer, " if c.get("rank_balancer") == "load" else ""
        return f"{kv}{ranks}{w['seconds']:g} s"
    return [(label(c, w), w) for c in caps for w in c["windows"]]


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"routed": "tab:red", "single": "tab:gray", "service": "tab:blue"}
    groups = _groups(out)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 + 2.2 * len(groups)), 3.8))
    width = 0.26
    for wi, (_, w) in enumerate(groups):
        for mi, name in enumerate(SERVINGS):
            x = wi + (mi - 1) * width
            ax.bar(x, 100 * w["summary"]["median"][name], width * 0.9, color=colors[name], alpha=0.75,
                   label=name if wi == 0 else None)
            pts = [100 * v for v in w["hit_rate"][name]]
            ax.plot([x] * len(pts), pts, "k.", ms=5)
            ax.text(x, 50 * w["summary"]["median"][name], f"{100 * w['summary']['median'][name]:.1f}%",
                    ha="center", fontsize=8, color="white")
            c = (w.get("ceilings") or {}).get(name)
            if c:  # the placement ceiling of the mode's own requests: affinity for routed, random for service
                y = 100 * c["affinity" if name == "routed" else "random"]
                ax.plot([x - width * 0.45, x + width * 0.45], [y, y], "k--", lw=1,
                        label="ceiling (routed: affinity, service: random)" if wi == 0 and name == "routed" else None)
    ax.set_xticks(range(len(groups)), [f"{label}, {len(w['rounds'])} rounds" for label, w in groups], fontsize=7)
    ax.set_ylabel("prefix-cache hit rate, % (bars: median; dots: rounds)")
    ax.set_ylim(0, 115)
    ax.legend(loc="upper center", ncol=4, fontsize=7, frameon=False)
    policy = out["config"].get("policy", "consistent_hash")
    ax.set_title(f"{out['config']['sessions_per_replica']} agentic sessions per replica, local cluster, "
                 f"routing.policy {policy}", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(out: dict) -> list[str]:
    lines = []
    for label, w in _groups(out):
        lines += [f"## {label} window, {len(w['rounds'])} rounds", "",
                  markdown(w, out["config"]["sessions_per_replica"]), ""]  # fmt: skip
        s = w["summary"]
        per_near = ", ".join(f"{v:+.1f}" for v in s["per_round_routed_minus_single_points"])
        per_above = ", ".join(f"{v:+.1f}" for v in s["per_round_routed_minus_service_points"])
        lines.append(f"routed - single per round: {per_near} points; routed - service per round: {per_above} points")
        c = ceiling_summary(w["rounds"])
        if c:
            lines.append(f"placement ceilings on the same requests (medians): routed runs: perfect affinity "
                         f"{c['routed']['affinity']:.1%}, random over 3 {c['routed']['random']:.1%} (gap "
                         f"{c['routed']['gap_points']:.1f} points); service runs: {c['service']['affinity']:.1%}, "
                         f"{c['service']['random']:.1%} (gap {c['service']['gap_points']:.1f} points)")
        lines += [*target_lines(s, label), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_serving_path", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, nargs="+", default=[40.0],
                   help="load window per run; several values measure each on the same cluster (default 40)")
    p.add_argument("--sessions", type=int, default=8, help="sessions per replica (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per window; medians are taken over them")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--plot", help="write a PNG of the medians and the rounds here")
    p.add_argument("--kv-tokens", nargs="+", default=["default"], metavar="N|default",
                   help="KV cache per engine (data-parallel rank) in tokens; `default`: the profile's own. Several "
                        "values measure each on servings of its own (default: default)")
    p.add_argument("--rank-balancer", choices=("load", "prefix"), default=None,
                   help="the mock engines' choice of data-parallel rank inside a pod: load (vLLM 0.33's own) or "
                        "prefix (the mock's default, which also prefers the rank holding the prefix)")
    p.add_argument("--policy", choices=router_facts.API_POLICIES, default="consistent_hash",
                   help="routing.policy of the routed and single servings (default %(default)s)")
    p.add_argument("--keep-cluster", action="store_true", help="leave the local cluster up")
    args = p.parse_args(argv)
    try:
        args.kv_tokens = [None if v == "default" else int(v) for v in args.kv_tokens]
        for kv in args.kv_tokens:
            engine_for_kv(kv)
    except ValueError as e:
        p.error(f"--kv-tokens: {e} (a whole number of tokens, or default)")
    if args.rounds < 1 or any(s <= 0 for s in args.seconds) or args.sessions < 1:
        p.error("--rounds, --sessions and every --seconds must be positive")
    out = run(args)
    print("\n".join(report(out)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(out, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
