"""The real vllm-router (PyPI 0.1.17) in front of mock engines: OpenAI streaming through it, consistent hashing
on the session header, and the render route its cache_aware policy asks each engine for (docs/vllm-router.md).
Also the launcher's command line and its refusals, which need no binary."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from flashserve.facts import router as router_facts
from flashserve_testbed.bench.routing import rendezvous_pick, session_key
from flashserve_testbed.localcluster.procs import end
from flashserve_testbed.router.bench_registrar import start_igw
from flashserve_testbed.router import mockfleet as mf
from flashserve_testbed.router.vllm_router import (
    RouterOptions,
    RouterOptionsError,
    VllmRouter,
    argv,
    free_port,
    wait_serving,
)

pytestmark = pytest.mark.timeout(150)

SYSTEM = "You are a coding agent working in a large repository. " * 40


def _router(engines, tmp_path: Path, policy: str, **kw) -> VllmRouter:
    opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(), prometheus_port=free_port(),
                         policy=policy, **kw)
    return VllmRouter(opts, tmp_path / f"router-{policy}.log").start()


@pytest.fixture
def engines(tmp_path, vllm_router_bin):
    fleet = mf.start_engines(2, tmp_path / "engines", flags=("--enable-scale-out",), time_scale=10)
    yield fleet
    mf.stop_all(fleet)


def _served(engines) -> list[float]:
    return [mf.counter(e.metrics(), "vllm:request_success_total") for e in engines]


def _finish_session(base: str, key: str) -> None:
    """End a session the way the router's sticky_least_loaded documents: POST /finish_session?session_id=."""
    req = urllib.request.Request(f"{base}/finish_session?session_id={key}", b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok", "session_id": key}


def _chat(base: str, content: str, headers: dict | None = None, extra: dict | None = None) -> None:
    body = {"model": mf.SERVED, "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}], **(extra or {})}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        r.read()


def test_openai_client_streams_through_the_router_and_cache_aware_gets_tokens(engines, tmp_path):
    router = _router(engines, tmp_path, "cache_aware")
    try:
        client = openai.OpenAI(base_url=router.base + "/v1", api_key="unused")
        for turn in range(3):
            chunks = list(client.chat.completions.create(
                model=mf.SERVED, max_tokens=12, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {turn}"}]))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert len(text) == 4 * 12  # the mock's 4-character tokens, every one streamed through
            assert chunks[-1].usage.completion_tokens == 12
        metrics = router.metrics()
        inputs = mf.samples(metrics, "vllm_router_kv_routing_inputs_total")
        decisions = mf.samples(metrics, "vllm_router_prefix_routing_decisions_total")
        assert sum(v for k, v in inputs.items() if 'result="render"' in k) >= 3
        assert not [k for k in inputs if "render_unavailable" in k or "preparation_rejected" in k], inputs
        assert not [k for k in decisions if "missing_tokens" in k], decisions
        # the later turns share the system prompt's tokens with the first: the tree matched them
        assert sum(v for k, v in decisions.items() if "prefix_hit" in k) >= 2, decisions
        log = router.log_text()
        assert "render_unavailable" not in log and "missing_tokens" not in log
    finally:
        router.stop()


def test_consistent_hash_keeps_a_session_key_on_one_engine(engines, tmp_path):
    router = _router(engines, tmp_path, "consistent_hash")
    try:
        homes: dict[str, int] = {}
        for key in [f"session-{i}" for i in range(12)]:
            for turn in range(3):
                before = _served(engines)
                _chat(router.base, f"{key} turn {turn} " + "x" * turn, {"X-Session-ID": key})
                after = _served(engines)
                moved = [i for i, (a, b) in enumerate(zip(before, after)) if b > a]
                assert len(moved) == 1
                assert homes.setdefault(key, moved[0]) == moved[0], f"{key} moved engines on turn {turn}"
        assert set(homes.values()) == {0, 1}, "12 keys all hashed to one of two engines"
        # the body's session_params.session_id is a key too ...
        for key in ("b1", "b2", "b3"):
            before = _served(engines)
            for turn in range(3):
                _chat(router.base, f"{key} turn {turn}", extra={"session_params": {"session_id": key}})
            assert sorted(b - a for a, b in zip(before, _served(engines))) == [0, 3], key
        # ... and the header wins over it: six body keys, all on the header's engine
        before = _served(engines)
        for i in range(6):
            _chat(router.base, f"both {i}", {"X-Session-ID": "session-0"}, {"session_params": {"session_id": f"o{i}"}})
        assert [b - a for a, b in zip(before, _served(engines))][homes["session-0"]] == 6
    finally:
        router.stop()


def test_sticky_least_loaded_places_new_sessions_by_count_keeps_them_and_expires_idle_ones(engines, tmp_path):
    """What docs/vllm-router.md says of sticky_least_loaded: a new session goes to the engine with the fewest
    active sessions (so six new sessions split 3/3, where a hash ring need not), its later turns stay there, a
    session the client ends frees its place, and a session idle past VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S is
    placed again as a new one."""
    opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(), prometheus_port=free_port(),
                         policy="sticky_least_loaded", log_level="debug")
    env = {**os.environ, router_facts.SLL_EXPIRY_ENV: "1"}
    router = VllmRouter(opts, tmp_path / "router-sll.log", env=env).start()
    try:
        homes: dict[str, int] = {}
        for i in range(6):
            before = _served(engines)
            _chat(router.base, f"sll-{i} turn 0", {"X-Session-ID": f"sll-{i}"})
            homes[f"sll-{i}"] = next(k for k, (a, b) in enumerate(zip(before, _served(engines))) if b > a)
        assert sorted(homes.values()) == [0, 0, 0, 1, 1, 1], homes
        for key, home in homes.items():
            before = _served(engines)
            _chat(router.base, f"{key} turn 1", {"X-Session-ID": key})
            assert [b - a for a, b in zip(before, _served(engines))][home] == 1, f"{key} left its engine"
        # a session the client ends (POST /finish_session?session_id=...) leaves its engine's count at once: with
        # two of one engine's three ended, the next two new sessions both go there
        other = 1 - homes["sll-0"]
        for key in [k for k, h in homes.items() if h == other][:2]:
            _finish_session(router.base, key)
        before = _served(engines)
        for i in range(2):
            _chat(router.base, f"fresh-{i} turn 0", {"X-Session-ID": f"fresh-{i}"})
        assert [b - a for a, b in zip(before, _served(engines))][other] == 2
        time.sleep(2.5)
        _chat(router.base, "sll-0 turn 2", {"X-Session-ID": "sll-0"})
        log = router.log_path.read_text(errors="replace")
        assert re.search(r"session 'sll-0' on replica '\S+' expired, reassigning", log), log[-2000:]
    finally:
        router.stop()


def test_sticky_least_loaded_keeps_ended_sessions_two_hours_by_default_and_sweeps_idle_ones_once_a_minute(
        engines, tmp_path):
    """The facts the operator's sessionIdleSeconds and the simulator's router-sticky model rest on
    (facts/router.py): the binary's own default expiry, which it prints for an unreadable value, and its sweep of
    idle sessions out of the engines' counts, which runs on a request at most once a minute: sessions idle far
    past a 1-second expiry are still counted half a minute in, and gone after the first minute."""
    opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(), prometheus_port=free_port(),
                         policy="sticky_least_loaded", log_level="debug")
    bad = VllmRouter(opts, tmp_path / "router-sll-default.log", env={**os.environ, router_facts.SLL_EXPIRY_ENV: "soon"})
    bad.start()
    try:
        log = bad.log_path.read_text(errors="replace")
        assert f"using default {router_facts.SLL_DEFAULT_EXPIRY_SECS}s" in log, log[-2000:]
    finally:
        bad.stop()
    opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(), prometheus_port=free_port(),
                         policy="sticky_least_loaded", log_level="debug")
    router = VllmRouter(opts, tmp_path / "router-sll-sweep.log", env={**os.environ, router_facts.SLL_EXPIRY_ENV: "1"})
    router.start()
    started = time.monotonic()
    try:
        for key in ("idle-a", "idle-b"):
            _chat(router.base, f"{key} turn 0", {"X-Session-ID": key})
        swept = re.compile(r"SLL: expired session 'idle-[ab]'")
        time.sleep(max(0.0, started + router_facts.SLL_SWEEP_SECS / 2 - time.monotonic()))
        _chat(router.base, "later 0", {"X-Session-ID": "later-0"})
        assert not swept.search(router.log_path.read_text(errors="replace"))
        time.sleep(max(0.0, started + router_facts.SLL_SWEEP_SECS + 2 - time.monotonic()))
        _chat(router.base, "later 1", {"X-Session-ID": "later-1"})
        log = router.log_path.read_text(errors="replace")
        assert len(set(swept.findall(log))) == 2, log[-2000:]
    finally:
        router.stop()


def test_sticky_least_loaded_sends_every_new_session_to_a_joining_engine_until_ended_ones_are_released(
        engines, tmp_path):
    """Why the operator sets a short expiry and asks clients to end sessions (docs/routing.md, "Sessions that
    end"): six sessions placed 3/3 and then abandoned still count, so an engine added afterwards takes all of
    the next three new sessions; had the client ended them (/finish_session), the three would spread 1/1/1."""
    third = mf.start_engines(1, tmp_path / "third", time_scale=10)
    try:
        for finish, expected in ((False, [0, 0, 3]), (True, [1, 1, 1])):
            opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(),
                                 prometheus_port=free_port(), policy="sticky_least_loaded")
            router = VllmRouter(opts, tmp_path / f"router-join-{finish}.log").start()
            try:
                for i in range(6):
                    _chat(router.base, f"old-{i} turn 0", {"X-Session-ID": f"old-{i}"})
                if finish:
                    for i in range(6):
                        _finish_session(router.base, f"old-{i}")
                req = urllib.request.Request(f"{router.base}/add_worker?url={third[0].url}", b"", method="POST")
                urllib.request.urlopen(req, timeout=30).read()
                fleet = [*engines, *third]
                before = [mf.counter(e.metrics(), "vllm:request_success_total") for e in fleet]
                for i in range(3):
                    _chat(router.base, f"new-{i} turn 0", {"X-Session-ID": f"new-{i}"})
                after = [mf.counter(e.metrics(), "vllm:request_success_total") for e in fleet]
                assert [b - a for a, b in zip(before, after)] == expected, (finish, before, after)
            finally:
                router.stop()
    finally:
        mf.stop_all(third)


def test_requests_total_counts_each_inference_request_once_and_no_health_check(engines, tmp_path):
    """The autoscaler's arrival rate is `sum(rate(vllm_router_requests_total{...}))` (promql.Queries.arrival_rate):
    one count per inference request the router receives, by route, and none for probes or the model list."""
    from flashserve.autoscaling.promql import ROUTER_REQUESTS

    router = _router(engines, tmp_path, "round_robin")
    try:
        for i in range(5):
            _chat(router.base, f"arrival {i}")
        for path in ("/health", "/v1/models"):
            with urllib.request.urlopen(router.base + path, timeout=10) as r:
                r.read()
        counts = mf.samples(router.metrics(), ROUTER_REQUESTS)
        assert counts == {'{route="/v1/chat/completions"}': 5.0}, counts
    finally:
        router.stop()


def _post(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


@pytest.mark.parametrize("extra", [(), ("--api-key", "s3cret")], ids=["as-rendered", "with-api-key"])
def test_any_client_of_the_api_port_can_add_and_remove_workers(engines, tmp_path, extra):
    """The router serves its worker admin routes on the port that serves the OpenAI API, with no credentials
    (--api-key is what it sends to workers, not what it asks of clients): a client can point it at a server of
    its own choosing, which then gets other clients' requests, and take the real engines out. So the router's
    NetworkPolicy limits where its pods may connect (docs/routing.md, "Who can steer the router")."""
    first, second = engines
    router = _router([first], tmp_path, "round_robin", extra_args=extra)
    try:
        status, text = _post(f"{router.base}/add_worker?url={urllib.parse.quote(second.url, safe='')}")
        assert status == 200 and "Successfully added worker" in text, text
        status, text = _post(f"{router.base}/remove_worker?url={urllib.parse.quote(first.url, safe='')}")
        assert status == 200, text
        before = _served(engines)
        for i in range(4):
            _chat(router.base, f"hijacked {i}")
        after = _served(engines)
        assert after[0] == before[0] and after[1] == before[1] + 4, (before, after)
    finally:
        router.stop()


class _Recording(http.server.BaseHTTPRequestHandler):
    """A worker that answers 200 to everything (its /health included) and records each request's method and
    path but /health's in `seen`: what the router sends it. Each test subclasses it with a list of its own."""

    seen: list[str] = []

    def _any(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path != "/health":
            self.seen.append(f"{self.command} {self.path}")
        body = b'{"object": "list", "data": []}' if self.path == "/v1/models" else b"{}"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _any

    def log_message(self, *args):
        pass


@pytest.fixture
def recording_worker(serve_http):
    """(a worker with a `url`, the requests it got) on 127.0.0.1."""
    handler = type("Handler", (_Recording,), {"seen": []})
    return SimpleNamespace(url=serve_http(handler)[0]), handler.seen


def test_the_router_forwards_every_path_it_does_not_serve_to_a_worker(tmp_path, vllm_router_bin, recording_worker):
    """0.1.17 sends a request for any path it has no route of its own for to a worker, method and path as the
    client sent them: vLLM's admin routes (dev mode's /collective_rpc, /sleep, /pause; the profiler's; LoRA
    loading) and anything else. So whatever an engine answers, every client of the serving can call, and the
    operator refuses the settings that open such routes on the engines (facts/managed.py ROUTE_DESTS and
    ROUTE_ENV; tests/contract/test_engine_contract.py shows, with the real vLLM, what each opens)."""
    worker, seen = recording_worker
    router = _router([worker], tmp_path, "round_robin")
    asked = ["POST /flush_cache", "POST /collective_rpc", "POST /sleep", "POST /pause", "POST /start_profile",
             "POST /v1/load_lora_adapter", "DELETE /adapters/a", "GET /server_info", "POST /no/such/route"]
    try:
        for item in asked:
            method, path = item.split(" ")
            req = urllib.request.Request(router.base + path, b"{}" if method != "GET" else None, method=method,
                                         headers={"content-type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200, item
        assert [s for s in seen if s in asked] == asked, seen
    finally:
        router.stop()


def test_the_wasm_middleware_cannot_guard_the_worker_routes(engines, tmp_path, vllm_router_bin):
    """0.1.17's `--wasm-middleware` (a WebAssembly component the router calls on each request of the routes
    named) would be the place inside the router to refuse the worker routes to clients, but it takes only the
    inference routes: named with `/add_worker`, the router refuses to start. An empty module is enough to show
    it: the routes are checked before the module is read, once the workers are healthy."""
    module = tmp_path / "empty.wasm"
    module.write_bytes(b"")
    cmd = [str(vllm_router_bin), "--host", "127.0.0.1", "--port", str(free_port()), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--worker-urls", engines[0].url, "--wasm-middleware", str(module),
           "--wasm-middleware-route", "/add_worker"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out[-2000:]
    assert "unsupported wasm middleware route `/add_worker`" in out, out[-2000:]
    supported = out.split("supported routes:", 1)[1].splitlines()[0]
    assert "/v1/chat/completions" in supported and "worker" not in supported, supported


def test_engines_without_the_render_route_leave_cache_aware_without_tokens(tmp_path, vllm_router_bin):
    """What a plain `vllm serve` (no --enable-scale-out) gives the router: render answers 403, and 0.1.17 does
    not fall back to /tokenize then (it does on a 404), so cache_aware routes without the prompt's tokens."""
    fleet = mf.start_engines(2, tmp_path / "engines", time_scale=10)
    try:
        router = _router(fleet, tmp_path, "cache_aware")
        try:
            for i in range(2):
                _chat(router.base, f"task {i}")
            metrics = router.metrics()
            inputs = mf.samples(metrics, "vllm_router_kv_routing_inputs_total")
            decisions = mf.samples(metrics, "vllm_router_prefix_routing_decisions_total")
            assert any("preparation_rejected" in k for k in inputs), inputs
            assert any("missing_tokens" in k for k in decisions), decisions
        finally:
            router.stop()
    finally:
        mf.stop_all(fleet)


def test_the_session_key_reaches_the_log_at_info_and_not_at_the_shipped_warn(engines, tmp_path):
    """The operator sets the router's level in RUST_LOG (router_facts.LOG_ENV), warn by default, because at info
    0.1.17 logs every routed request with its session key, and its --log-level flag cannot say warn: it reads
    `warning` (one of the choices its help offers) as info."""
    key = "session-key-7c1f"

    def routed_log(level: str, flag: str | None = None) -> str:
        opts = RouterOptions(worker_urls=tuple(e.url for e in engines), port=free_port(),
                             prometheus_port=free_port(), policy="consistent_hash", log_level=level)
        log = tmp_path / f"router-{level}-{flag}.log"
        if flag is None:
            router = VllmRouter(opts, log).start()
            stop, base = router.stop, router.base
        else:  # the flag alone, RUST_LOG unset, as the router's help suggests
            env = {k: v for k, v in os.environ.items() if k != router_facts.LOG_ENV}
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv(opts) + ["--log-level", flag], stdout=out, stderr=subprocess.STDOUT,
                                        env=env, stdin=subprocess.DEVNULL)
            stop, base = (lambda: end(proc)), f"http://127.0.0.1:{opts.port}"
            wait_serving(base, proc, 60)
        try:
            for i in range(2):
                _chat(base, f"logged {i}", {"X-Session-ID": key})
        finally:
            stop()
        return log.read_text(errors="replace")

    assert key in routed_log("info")  # the test can fail: at info the key is there
    assert key in routed_log("info", flag="warning"), "the router now honours --log-level warning: use the flag"
    shipped = routed_log(router_facts.DEFAULT_LOG_LEVEL)
    assert key not in shipped and " INFO " not in shipped, shipped[-2000:]


def _igw_router(tmp_path: Path, binary: Path, *args: str) -> tuple[subprocess.Popen, str, Path]:
    """vllm-router in IGW mode with no worker: workers come through its `POST /workers`, as no flag sets them."""
    log = tmp_path / "router-igw.log"
    proc, base = start_igw(log, *args, executable=binary)
    return proc, base, log


def _register(base: str, url: str, **fields) -> None:
    body = json.dumps({"url": url, "labels": {"policy": "rendezvous_hash"}, **fields}).encode()
    req = urllib.request.Request(base + "/workers", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["success"] is True


def _log_text(log: Path) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())


def _rendezvous_lines(log: Path) -> list[tuple[str, str]]:
    """(session key, worker) of each rendezvous_hash decision the router logged, in order."""
    return re.findall(r"Rendezvous hash routing: key='header:x-session-id:([^']+)' -> worker='([^']+)'",
                      _log_text(log))


def _rendezvous_choices(log: Path) -> dict[str, str]:
    assert "Assigning policy rendezvous_hash to new model" in _log_text(log)
    return dict(_rendezvous_lines(log))


def test_rendezvous_hash_is_reached_only_through_igw_worker_labels_and_routes_as_the_simulator_models(
        engines, tmp_path, vllm_router_bin):
    """vllm-router 0.1.17 carries `rendezvous_hash` (docs/vllm-router.md, "Where a load bound would come from"):
    `--policy` refuses it, and a model takes it only from the first worker registered in IGW mode through
    `POST /workers` with the label `policy: rendezvous_hash`, which the pod discovery the operator uses never
    sends. Routed that way, every session goes where the simulator's `rendezvous_pick` (bench/routing.py) says,
    and a worker removed with `DELETE /workers/<url>` leaves `GET /workers` and takes no more sessions."""
    refused = subprocess.run([str(vllm_router_bin), "--policy", "rendezvous_hash", "--host", "127.0.0.1"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "invalid choice: 'rendezvous_hash'" in refused.stderr
    proc, base, log = _igw_router(tmp_path, vllm_router_bin)
    try:
        for e in engines:
            _register(base, e.url)
        keys = [f"hrw-{i}" for i in range(24)]
        for key in keys:
            _chat(base, f"{key} turn 0", {"X-Session-ID": key})
        gone = engines[0].url.rstrip("/")  # what a registrar does when a pod leaves: DELETE /workers/<url>
        req = urllib.request.Request(f"{base}/workers/{urllib.parse.quote(gone, safe='')}", method="DELETE")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["success"] is True
        with urllib.request.urlopen(base + "/workers", timeout=30) as r:
            assert [w["url"] for w in json.loads(r.read())["workers"]] == [engines[1].url.rstrip("/")]
        for key in keys[:6]:
            _chat(base, f"{key} turn 1", {"X-Session-ID": key})
    finally:
        end(proc)
    urls = [e.url.rstrip("/") for e in engines]
    lines = _rendezvous_lines(log)
    chosen = dict(lines[:24])
    assert chosen == {k: rendezvous_pick(session_key(k), urls, {}) for k in keys}
    assert set(chosen.values()) == set(urls)
    assert lines[24:] == [(k, urls[1]) for k in keys[:6]]


def test_rendezvous_hash_routes_per_rank_when_igw_workers_are_registered_as_rank_urls(tmp_path, vllm_router_bin):
    """The per-rank form the operator ships (`dataParallelAware`) also works this way: with
    `--intra-node-data-parallel-size 4`, workers registered as `<engine url>@<rank>` with the served model's
    name are scored per rank as the simulator's `router-rendezvous` does, and each request reaches the rank
    chosen (the engine counts it under that rank's `engine` label)."""
    from flashserve_testbed.router.bench_vllm_router import per_rank

    fleet = mf.start_engines(1, tmp_path / "engines", flags=("--data-parallel-size", "4"), time_scale=10)
    proc, base, log = _igw_router(tmp_path, vllm_router_bin, "--intra-node-data-parallel-size", "4")
    try:
        ranks = [f"{fleet[0].url.rstrip('/')}@{i}" for i in range(4)]
        for url in ranks:
            _register(base, url, model_id=mf.SERVED)
        keys = [f"rank-{i}" for i in range(24)]
        for key in keys:
            _chat(base, f"{key} turn 0", {"X-Session-ID": key})
        served = per_rank(fleet[0].metrics(), "vllm:request_success_total")
    finally:
        end(proc)
        mf.stop_all(fleet)
    chosen = _rendezvous_choices(log)
    assert chosen == {k: rendezvous_pick(session_key(k), ranks, {}) for k in keys}
    expected = Counter(int(url.rsplit("@", 1)[1]) for url in chosen.values())
    assert served == [float(expected[rank]) for rank in range(4)] and len(expected) > 1


def test_the_operators_registrar_keeps_an_igw_router_on_the_engines_ranks_and_drops_what_a_client_added(
        tmp_path, vllm_router_bin):
    """controller/router_workers.py against the real binary, as rendered for `routing.policy: rendezvous_hash`
    (`--policy consistent_hash --enable-igw --intra-node-data-parallel-size 2`): one sync replaces a worker a
    client posted with every rank of the engines, a second finds nothing to do, sessions then go where the
    simulator's rendezvous_pick says, and an engine taken out of the desired set leaves the router."""
    from flashserve.controller.router_workers import RouterWorkersClient, Sync, Worker
    from flashserve_testbed.router.bench_vllm_router import per_rank

    fleet = mf.start_engines(2, tmp_path / "engines", flags=("--data-parallel-size", "2"), time_scale=10)
    proc, base, log = _igw_router(tmp_path, vllm_router_bin, "--intra-node-data-parallel-size", "2")
    client = RouterWorkersClient()
    try:
        foreign = "http://127.0.0.1:9@0"
        req = urllib.request.Request(base + "/workers", json.dumps({"url": foreign}).encode(),
                                     {"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["success"] is True
        ranks = [f"{e.url.rstrip('/')}@{i}" for e in fleet for i in range(2)]
        desired = {Worker(url, mf.SERVED) for url in ranks}
        steps = client.sync(base, desired, "rendezvous_hash")
        assert steps.remove == (foreign,) and {w.url for w in steps.add} == set(ranks)
        assert client.sync(base, desired, "rendezvous_hash") == Sync(), "steady state: nothing to do"
        keys = [f"reg-{i}" for i in range(16)]
        for key in keys:
            _chat(base, f"{key} turn 0", {"X-Session-ID": key})
        chosen = _rendezvous_choices(log)
        assert chosen == {k: rendezvous_pick(session_key(k), ranks, {}) for k in keys}
        before = [per_rank(e.metrics(), "vllm:request_success_total") for e in fleet]
        steps = client.sync(base, {w for w in desired if fleet[0].url.rstrip("/") not in w.url}, "rendezvous_hash")
        assert set(steps.remove) == set(ranks[:2]) and steps.add == ()
        for key in keys:
            _chat(base, f"{key} turn 1", {"X-Session-ID": key})
        after = [per_rank(e.metrics(), "vllm:request_success_total") for e in fleet]
    finally:
        end(proc)
        mf.stop_all(fleet)
    assert after[0] == before[0], "a removed engine gets no request"
    assert sum(after[1]) - sum(before[1]) == len(keys)


def test_the_operators_repair_undoes_what_a_client_did_to_a_discovering_routers_workers(tmp_path, vllm_router_bin):
    """controller/router_workers.py's repair against the real binary in its default mode (workers it was given,
    `--intra-node-data-parallel-size 2`, as under the discovery policies): a client takes one engine out
    (`POST /remove_worker` with the engine's URL takes all its ranks) and adds a server of its own; the repair
    adds the engine back by its URL (the router lists its ranks again) and removes the server, and requests
    reach the serving's engines only."""
    from flashserve.controller.router_workers import Repair, RouterWorkersClient
    from flashserve_testbed.router.bench_vllm_router import per_rank

    fleet = mf.start_engines(3, tmp_path / "engines", flags=("--data-parallel-size", "2"), time_scale=10)
    serving, (foreign,) = fleet[:2], fleet[2:]
    url = [e.url.rstrip("/") for e in fleet]
    router = _router(serving, tmp_path, "consistent_hash", extra_args=("--intra-node-data-parallel-size", "2"))
    client = RouterWorkersClient()
    try:
        assert sorted(client.workers(router.base)) == sorted(f"{u}@{r}" for u in url[:2] for r in (0, 1))
        # One rank by its URL: answered as removed, yet still listed; so the repair works on whole pods.
        status, text = _post(f"{router.base}/remove_worker?url={urllib.parse.quote(url[0] + '@1', safe='')}")
        assert status == 200 and "Successfully removed" in text, text
        assert f"{url[0]}@1" in client.workers(router.base)
        for route, target in (("remove_worker", url[0]), ("add_worker", url[2])):
            status, text = _post(f"{router.base}/{route}?url={urllib.parse.quote(target, safe='')}")
            assert status == 200, text
        tampered = client.workers(router.base)
        assert sorted(tampered) == sorted(f"{u}@{r}" for u in url[1:] for r in (0, 1))
        done = client.repair(router.base, lambda urls: Repair(tuple(urls), add=(url[0],), remove=(url[2],)), 5.0)
        assert done.failed == () and sorted(done.listed) == sorted(tampered)
        assert sorted(client.workers(router.base)) == sorted(f"{u}@{r}" for u in url[:2] for r in (0, 1))
        before = [sum(per_rank(e.metrics(), "vllm:request_success_total")) for e in fleet]
        for i in range(12):
            _chat(router.base, f"repaired {i}", {"X-Session-ID": f"s{i}"})
        after = [sum(per_rank(e.metrics(), "vllm:request_success_total")) for e in fleet]
    finally:
        router.stop()
        mf.stop_all(fleet)
    assert after[2] == before[2], "the client's server gets no request once removed"
    assert after[0] > before[0] and after[1] > before[1] and sum(after) - sum(before) == 12


def test_argv_binds_loopback_and_passes_the_options():
    opts = RouterOptions(worker_urls=("http://127.0.0.1:8001/", "http://127.0.0.2:8002"), port=30001,
                         prometheus_port=30002, policy="consistent_hash", balance_abs_threshold=4,
                         cache_threshold=0.5)
    cmd = argv(opts, executable="vllm-router")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--policy") + 1] == "consistent_hash"
    assert cmd[cmd.index("--balance-abs-threshold") + 1] == "4"
    assert cmd[cmd.index("--cache-threshold") + 1] == "0.5"
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:8001", "http://127.0.0.2:8002"]
    assert "--balance-rel-threshold" not in cmd  # unset: the router's own default


@pytest.mark.parametrize("kw, field", [
    ({"worker_urls": ("http://10.0.0.5:8000",)}, "worker_urls[0]"),
    ({"worker_urls": ("127.0.0.1:8000",)}, "worker_urls[0]"),
    ({"worker_urls": ()}, "worker_urls"),
    ({"policy": "least_busy"}, "policy"),
    ({"cache_threshold": 1.5}, "cache_threshold"),
    ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
    ({"prometheus_port": 30001}, "prometheus_port"),
    ({"extra_args": ("--host", "0.0.0.0")}, "extra_args"),
    ({"extra_args": ("--log-level", "warning")}, "extra_args"),
    ({"log_level": "warning"}, "log_level"),
])
def test_options_refuse_what_would_leave_loopback_or_not_run(kw, field):
    base = {"worker_urls": ("http://127.0.0.1:8001",), "port": 30001, "prometheus_port": 30002}
    with pytest.raises(RouterOptionsError) as e:
        RouterOptions(**{**base, **kw})
    assert str(e.value).startswith(field + ":")


def test_the_router_reads_its_kubeconfigs_token_file_again_so_a_refreshed_token_is_used(
    tmp_path, vllm_router_bin, serve_http
):
    """The mock runtime refreshes a router pod's token by rewriting the file its kubeconfig names (tokenFile):
    that works only because kube-client re-reads it (at least once a minute), which this checks on the binary,
    against a stand-in API server on 127.0.0.1 that records each request's bearer token."""
    from flashserve_testbed.runtime.credentials import kubeconfig, write_private

    seen: list[str] = []

    class API(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization") or "")
            # An empty pod list, and a watch that ends after a moment, so the router asks again and again.
            if "watch=" in self.path:
                time.sleep(2)
                body = b""
            else:
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                   "items": []}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    api_url, _ = serve_http(API)
    token = tmp_path / "router.kubeconfig.token"
    write_private(token, "first-token")
    config = tmp_path / "router.kubeconfig"
    doc = kubeconfig(api_url, None, str(token), "ns", "system:serviceaccount:ns:r")
    write_private(config, json.dumps(doc))
    args = [str(vllm_router_bin), "--host", "127.0.0.1", "--port", str(free_port()), "--policy", "round_robin",
            "--service-discovery", "--selector", "a=b", "--service-discovery-namespace", "ns",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(config), "HOME": str(tmp_path)}
    with open(tmp_path / "router.log", "wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while "Bearer first-token" not in seen and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Bearer first-token" in seen, (tmp_path / "router.log").read_text()[-2000:]
        write_private(token, "second-token")  # atomically, as the runtime's refresh does
        deadline = time.monotonic() + 80  # kube-client reloads a token file at least once a minute
        while "Bearer second-token" not in seen and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "Bearer second-token" in seen, "the router kept the first token: a refresh would not reach it"
    finally:
        proc.terminate()
        proc.wait(10)


def test_per_rank_counts_and_the_busiest_ranks_share():
    from flashserve_testbed.router.bench_vllm_router import per_rank, rank_peak

    text = "\n".join([
        'vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 3',
        'vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 1',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2',
        'vllm:request_success_total{engine="3",finished_reason="stop",model_name="m"} 6',
    ])  # fmt: skip
    assert per_rank(text, "vllm:request_success_total") == [2.0, 4.0, 6.0]
    assert rank_peak([2.0, 4.0, 6.0]) == pytest.approx(1.5)
    assert rank_peak([]) is None and rank_peak([0.0, 0.0]) is None


def test_overhead_variants_name_policy_rank_routing_and_log_level():
    from flashserve_testbed.router.bench_vllm_router import overhead_variant

    assert overhead_variant("consistent_hash@ranks/info") == ("consistent_hash", True, "info")
    assert overhead_variant("consistent_hash@ranks") == ("consistent_hash", True, None)
    assert overhead_variant("cache_aware/warn") == ("cache_aware", False, "warn")
    for bad, words in (("consistent_hash@pods", "@ranks"), ("consistent_hash/warning", "warn")):
        with pytest.raises(SystemExit, match=words):
            overhead_variant(bad)


def test_overhead_pools_every_rounds_requests_for_its_percentiles():
    """A round of the demo's load has ~35 requests, so its p99 is its slowest request; the pooled figure takes
    the percentile over every round's requests at once."""
    from types import SimpleNamespace

    from flashserve_testbed.router.bench_vllm_router import overhead

    def half(p50: float) -> dict:
        return {"p50": p50, "p99": 2 * p50, "client_ttft_mean": p50, "engine_ttft_mean": 0.01,
                "router_generate_mean": 0.011}

    def wire(values: list[float]) -> dict:
        stats = {"p50": sorted(values)[len(values) // 2], "p99": max(values), "mean": sum(values) / len(values)}
        return {"requests": len(values), "unpaired": 0, "dropped": 0, "added_values": values, "added": stats,
                **{part: stats for part in ("own", "render", "inbound", "outbound")}}

    # three rounds of 100 requests: 1 ms each, but one round also has one slow request of 50 ms
    rounds = [{"direct": half(0.020), "routed": half(0.021), "render_probe_s": None,
               "wire": wire([0.001] * 99 + [0.050 if i == 1 else 0.001])} for i in range(3)]
    o = overhead(SimpleNamespace(overhead_rounds=3), "consistent_hash", rounds)
    w = o["wire"]
    assert w["added_p99_per_round"] == [0.001, 0.050, 0.001] and w["added_p99"] == 0.001
    assert w["added_pooled_p50"] == 0.001 and w["added_pooled_p99"] == 0.001  # 1 of 300 is under the 1%
    rounds[2]["wire"] = wire([0.001] * 97 + [0.040] * 3)
    assert overhead(SimpleNamespace(overhead_rounds=3), "consistent_hash", rounds)["wire"]["added_pooled_p99"] == 0.040


def test_router_cpus_are_a_proper_subset_and_the_router_runs_on_them(engines, tmp_path):
    """The overhead bench's --router-cpus: the router process (and the worker threads it starts) on the CPUs
    given, so its own time is measured without the engines and clients competing for its core."""
    from flashserve_testbed.router.bench_vllm_router import router_cpus

    assert router_cpus("1", {0, 1}) == {1}
    assert router_cpus("1-2,4", {0, 1, 2, 3, 4}) == {1, 2, 4}
    assert router_cpus(None, {0, 1}) is None
    for bad, words in (("0,1", "not all"), ("5", "not all"), ("x", "CPU numbers")):
        with pytest.raises(SystemExit, match=words):
            router_cpus(bad, {0, 1})
    cpu = max(os.sched_getaffinity(0))
    opts = RouterOptions(worker_urls=(engines[0].url,), port=free_port(), prometheus_port=free_port(),
                         policy="consistent_hash")
    with VllmRouter(opts, tmp_path / "pinned.log", cpus=frozenset({cpu})) as router:
        threads = list(Path(f"/proc/{router.proc.pid}/task").iterdir())
        assert all(os.sched_getaffinity(int(t.name)) == {cpu} for t in threads)
        # tokio sizes its worker pool from the CPUs it may use: one core, one worker
        workers = [t for t in threads if (t / "comm").read_text().strip() == "tokio-rt-worker"]
        assert len(workers) == 1, [(t / "comm").read_text() for t in threads]
