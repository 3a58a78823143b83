"""The router's added TTFT through the router pod the operator deploys, on the local cluster:
`python -m flashserve_testbed.router.bench_pod_overhead [--rounds 5] [--seconds 20] [--sessions 8] [--shared-cpus]`.

bench_vllm_router.py's `overhead` suite measures vllm-router as a process the bench starts and pins itself.
This one measures what a user gets: a serving of one replica group applied as a DeepSeekServing, reconciled
by the operator into its router Deployment (the shipped policy, flags and log level), and run by the mock
runtime. With `routing.resources.dedicatedCpus` (the default here; `--shared-cpus` for the other case) the
router pod is Guaranteed and the runtime, playing the kubelet's static CPU manager, gives its vllm-router a
core of its own; the cores each process ran on are printed.

Each round sends the same sessions straight to the engine pod and then through the router pod, for `--seconds`
each. The figure that resolves a millisecond on a busy 2-core machine is the wire's (wiretime.py: `tcpdump`'s
timestamps of the router's two sides of each routed request, the pods told apart by address since all listen
on port 8000). Also printed: the medians over rounds of the clients' TTFT differences (p50, p99), and of the
paired means with the engine's own TTFT taken out; those carry the clients' own waits for a core.
Figures and command: docs/vllm-router.md, "Through the operator's router pod".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from flashserve_testbed.router import wiretime
from flashserve_testbed.router.bench_vllm_router import load_half, overhead, wire_round
from flashserve_testbed.router.vllm_router import free_port
from flashserve_testbed.runtime.launch import ENGINE_CONTAINER, ROUTER_CONTAINER
from flashserve_testbed.runtime.routerpods import pod_url, router_selector

_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, whatever the proxy env says


def _get(url: str) -> str:
    with _LOCAL.open(url, timeout=10) as r:
        return r.read().decode()


def serving(name: str, dedicated: bool) -> dict:
    """One replica group, its router at one pod; no autoscaling, so the fleet is the same in every half."""
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name},
            "spec": {"placement": {"accelerator": "GB200"}, "replicas": 1, "routing": {
                "replicas": 1, "resources": {"cpu": 1, "memory": "1Gi", "dedicatedCpus": dedicated}}}}  # fmt: skip


def _pods(stack, selector: str) -> list[dict]:
    return json.loads(stack.kubectl(["-n", stack.namespace, "get", "pods", "-l", selector, "-o", "json"]))["items"]


def _endpoint(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashserve_testbed.router.bench_pod_overhead",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=20.0, help="load per half of a round")
    p.add_argument("--sessions", type=int, default=8, help="the demo's sessions per replica")
    p.add_argument("--shared-cpus", action="store_true",
                   help="routing.resources.dedicatedCpus false: the router shares the cores with every other pod")
    p.add_argument("--no-wire", dest="wire", action="store_false",
                   help="skip the packet capture of the routed halves (wiretime.py; needs tcpdump and root)")
    p.add_argument("--cluster-dir", type=Path, help="the local cluster's directory (default: a new temporary one)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.sessions < 1:
        p.error("--rounds and --sessions must be at least 1, --seconds above 0")

    from flashserve_testbed.demo import Stack

    from flashserve.render.naming import COMPONENT_LABEL, SERVING_LABEL, serving_label_value

    work = Path(tempfile.mkdtemp(prefix="pod-overhead-"))
    stack = Stack(cluster_dir=args.cluster_dir or work / "cluster", namespace="overhead", startup_seconds=15,
                  log_dir=work / "logs", status_port=free_port())  # fmt: skip
    name, profile = "overhead", stack.profile
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    stack.start(log=say)
    try:
        stack.apply(serving(name, dedicated=not args.shared_cpus))
        routed = stack.base_url(name, timeout=180)
        router_pod = _pods(stack, router_selector(name))[0]
        engine_pod = _pods(stack, f"{SERVING_LABEL}={serving_label_value(name)},{COMPONENT_LABEL}=engine")[0]
        # the router is Ready once it has found a healthy engine: nothing more to wait for
        engine = pod_url(engine_pod, ENGINE_CONTAINER, "http")
        router_metrics = f"{pod_url(router_pod, ROUTER_CONTAINER, 'metrics')}/metrics"
        procs = json.loads(_get(f"http://127.0.0.1:{stack.status_port}/-/engines"))["engines"]
        cores = {e["kind"]: e.get("cpus") for e in procs if e.get("serving") == name and e.get("pid")}
        say(f"[bench] router pod {router_pod['metadata']['name']} (QoS {router_pod['status'].get('qosClass')}), "
            f"cores: {cores}")  # fmt: skip
        # every pod listens on 8000 at its own address: the wire tells router and engine apart by both
        r_ep, e_ep = _endpoint(routed), _endpoint(engine)
        rounds = []
        for i in range(args.rounds):
            out = {}
            for half, base in (("direct", engine + "/v1"), ("routed", routed)):
                capture = (wiretime.Capture(work / f"routed-{i}.pcap", {r_ep[1], e_ep[1]}) if half == "routed"
                           and args.wire else None)  # fmt: skip
                out[half] = load_half(base, lambda: _get(engine + "/metrics"), lambda: _get(router_metrics),
                                      sessions=args.sessions, seconds=args.seconds, profile=profile, seed=100 + i,
                                      around=capture)  # fmt: skip
                if capture is not None:
                    out["wire"] = wire_round(capture, (r_ep,), (e_ep,))
            out["render_probe_s"] = None
            rounds.append(out)
            say(f"[bench] round {i + 1}/{args.rounds}: TTFT p50 direct {out['direct']['p50'] * 1e3:.2f} ms, "
                f"routed {out['routed']['p50'] * 1e3:.2f} ms")  # fmt: skip
    finally:
        stack.stop(down=True, log=say)
    o = overhead(SimpleNamespace(overhead_rounds=args.rounds), "as rendered", rounds)
    failed = sum(r[h]["failed"] for r in rounds for h in ("direct", "routed"))
    result = {"dedicated_cpus": not args.shared_cpus, "qos": router_pod["status"].get("qosClass"), "cores": cores,
              "sessions": args.sessions, "seconds": args.seconds, "failed_requests": failed,
              **{k: o[k] for k in ("rounds", "ttft_p50_added", "ttft_p99_added", "direct_ttft_p50",
                                   "p50_added_per_round", "p99_added_per_round", "paired_mean_added",
                                   "paired_mean_added_per_round", "router_generate_minus_engine_ttft",
                                   "wire")}}  # fmt: skip
    ms = lambda v: "n/a" if v is None else f"{v * 1e3:.2f} ms"  # noqa: E731
    added = lambda v: "n/a" if v is None else f"{v * 1e3:+.2f} ms"  # noqa: E731
    print(f"router pod overhead ({'dedicated core' if result['dedicated_cpus'] else 'shared cores'}, QoS "
          f"{result['qos']}, 1 group, {args.sessions} sessions, median of {args.rounds} rounds): TTFT p50 "
          f"{added(o['ttft_p50_added'])}, p99 {added(o['ttft_p99_added'])}; paired mean outside the engine "
          f"{added(o['paired_mean_added'])}; direct TTFT p50 {ms(o['direct_ttft_p50'])}; failed requests {failed}")
    w = o["wire"]
    if w:
        print(f"  on the wire (the router's own share of each request's TTFT, {w['requests']} requests, "
              f"{w['unpaired']} unpaired, {w['dropped']} packets dropped): p50 {ms(w['added_p50'])}, p99 "
              f"{ms(w['added_p99'])} (medians of rounds); every request: p50 {ms(w['added_pooled_p50'])}, "
              f"p99 {ms(w['added_pooled_p99'])}")  # fmt: skip
    spread = o["p50_added_per_round"]
    print(f"  p50 added per round: {', '.join(added(v) for v in spread)} (spread {ms(max(spread) - min(spread))}, "
          f"stdev {ms(statistics.pstdev(spread))})")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
