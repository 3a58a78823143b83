"""The router's share of TTFT read off the wire (flashserve_testbed/router/wiretime.py): pairing the router's two
sides of each request on captures written here with known timestamps, and once on a real capture of the real
vllm-router in front of a mock engine (tcpdump, root)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.request
from pathlib import Path

import dpkt
import pytest
from flashserve_testbed.router import mockfleet as mf
from flashserve_testbed.router import wiretime as wt
from flashserve_testbed.router.vllm_router import RouterOptions, VllmRouter, free_port

ROUTER, ENGINE = 30000, 31000
CLIENT_IP = ROUTER_IP = ENGINE_IP = "127.0.0.1"


class Wire:
    """Writes TCP segments of HTTP exchanges into a pcap, one (time, bytes) per segment."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bytes]] = []
        self.sent: list[tuple[int, bytes]] = []  # (source port, payload) of each frame, for dropping some
        self.seq: dict[tuple[int, int], int] = {}
        self.addr: dict[tuple[int, int], tuple[str, str]] = {}  # (sport, dport) -> (src, dst); default 127.0.0.1

    def send(self, t: float, sport: int, dport: int, data: bytes, *, syn: bool = False, seq: int | None = None):
        key = (sport, dport)
        if syn:
            self.seq[key] = 1_000 + sport
        s = self.seq.setdefault(key, 1_000 + sport) if seq is None else seq
        tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=s, flags=dpkt.tcp.TH_SYN if syn else dpkt.tcp.TH_ACK,
                           data=data)
        src, dst = self.addr.get(key, (CLIENT_IP, CLIENT_IP))
        ip = dpkt.ip.IP(src=socket.inet_aton(src), dst=socket.inet_aton(dst), p=dpkt.ip.IP_PROTO_TCP, data=tcp)
        ip.len = len(bytes(ip))
        eth = dpkt.ethernet.Ethernet(type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        self.frames.append((t, bytes(eth)))
        self.sent.append((sport, data))
        if seq is None:
            self.seq[key] = s + (1 if syn else len(data))

    def open(self, t: float, cport: int, sport: int, server_ip: str = CLIENT_IP) -> None:
        self.addr[(cport, sport)], self.addr[(sport, cport)] = (CLIENT_IP, server_ip), (server_ip, CLIENT_IP)
        self.send(t, cport, sport, b"", syn=True)
        self.send(t, sport, cport, b"", syn=True)

    def write(self, path: Path) -> Path:
        with open(path, "wb") as f:
            w = dpkt.pcap.Writer(f)
            for t, frame in sorted(self.frames, key=lambda x: x[0]):
                w.writepkt(frame, ts=t)
        return path


def request(path: str, body: dict, session: str | None = None) -> tuple[bytes, bytes]:
    raw = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(raw)}\r\n"
    if session:
        head += f"x-session-id: {session}\r\n"
    return (head + "\r\n").encode(), raw


def chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def event(content: str | None) -> bytes:
    delta = {"role": "assistant"} if content is None else {"content": content}
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def stream(w: Wire, sport: int, dport: int, t_head: float, t_role: float, t_first: float, t_end: float) -> None:
    """An SSE answer: headers, a role-only event, then the first text event (what TTFT waits for), then done."""
    w.send(t_head, sport, dport, STREAM_HEAD)
    w.send(t_role, sport, dport, chunk(event(None)))
    w.send(t_first, sport, dport, chunk(event("Hel")))
    w.send(t_end, sport, dport, chunk(event("lo")) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def conversation(text: str) -> dict:
    return {"model": "m", "stream": True, "messages": [{"role": "system", "content": "sys"},
                                                        {"role": "user", "content": text}]}


def one_request(w: Wire, *, client: int, upstream: int, session: str, t0: float, text: str,
                inbound: float, engine_first: float, outbound: float, router: int = ROUTER, engine: int = ENGINE,
                router_ip: str = ROUTER_IP) -> None:  # fmt: skip
    body = conversation(text)
    head, raw = request("/v1/chat/completions", body, session)
    w.open(t0 - 0.01, client, router, router_ip)
    w.send(t0, client, router, head)
    w.send(t0 + 0.0005, client, router, raw)  # the body in a second segment: its end is what counts
    # the router re-serialises the body: other key order and a field added, the same conversation
    fwd = json.dumps({"stream_options": {"include_usage": True}, **dict(reversed(list(body.items())))}).encode()
    fhead = (f"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: {len(fwd)}\r\nx-session-id: {session}\r\n"
             "\r\n").encode()
    t1 = t0 + 0.0005
    w.send(t1 + inbound, upstream, engine, fhead + fwd)
    stream(w, engine, upstream, t1 + inbound + 0.001, t1 + inbound + 0.002, engine_first, engine_first + 0.05)
    stream(w, router, client, t1 + inbound + 0.0011, t1 + inbound + 0.0021, engine_first + outbound,
           engine_first + 0.0501)


def test_the_router_share_is_its_forwarding_delay_plus_its_first_token_delay(tmp_path):
    w = Wire()
    w.open(0.5, 40001, ENGINE)
    one_request(w, client=50001, upstream=40001, session="s0", t0=1.0, text="fix the test", inbound=0.0008,
                engine_first=1.030, outbound=0.0003)
    times = wt.measure(w.write(tmp_path / "c.pcap"), [ROUTER], [ENGINE])
    assert times.unpaired == 0 and len(times.requests) == 1
    r = times.requests[0]
    assert r.inbound == pytest.approx(0.0008, abs=2e-6)
    # the role-only event comes earlier on both sides; the first text event is what a client's TTFT waits for
    assert r.outbound == pytest.approx(0.0003, abs=2e-6)
    assert r.added == pytest.approx(0.0011, abs=4e-6) and r.render == 0 and r.own == r.added


def test_a_router_and_an_engine_on_one_port_number_are_told_apart_by_address(tmp_path):
    # The local cluster's pods: every one listens on port 8000, each at its own loopback address.
    w = Wire()
    w.open(0.5, 40001, 8000, "127.0.3.1")
    one_request(w, client=50001, upstream=40001, session="s0", t0=1.0, text="pods", inbound=0.0008,
                engine_first=1.030, outbound=0.0003, router=8000, engine=8000, router_ip="127.0.2.1")
    path = w.write(tmp_path / "c.pcap")
    times = wt.measure(path, [("127.0.2.1", 8000)], [("127.0.3.1", 8000)])
    assert times.unpaired == 0 and len(times.requests) == 1
    assert times.requests[0].added == pytest.approx(0.0011, abs=4e-6)
    # by the port alone both sides look like the router and the engine: each request pairs with itself, share 0
    by_port = wt.measure(path, [8000], [8000])
    assert len(by_port.requests) == 2 and all(r.added == 0 for r in by_port.requests)


def test_requests_forwarded_out_of_order_pair_by_session_and_conversation(tmp_path):
    w = Wire()
    w.open(0.5, 40001, ENGINE)
    w.open(0.5, 40002, ENGINE)
    # s1 arrives second but is forwarded first, on the other pooled connection; the same text in both sessions
    one_request(w, client=50001, upstream=40002, session="s0", t0=1.0, text="same", inbound=0.004,
                engine_first=1.030, outbound=0.0002)
    one_request(w, client=50002, upstream=40001, session="s1", t0=1.001, text="same", inbound=0.0005,
                engine_first=1.020, outbound=0.0007)
    times = wt.measure(w.write(tmp_path / "c.pcap"), [ROUTER], [ENGINE])
    got = sorted((round(r.inbound, 6), round(r.outbound, 6)) for r in times.requests)
    assert got == [(0.0005, 0.0007), (0.004, 0.0002)]


def test_keep_alive_connections_carry_several_requests_in_order(tmp_path):
    w = Wire()
    w.open(0.5, 40001, ENGINE)
    one_request(w, client=50001, upstream=40001, session="s0", t0=1.0, text="turn 1", inbound=0.001,
                engine_first=1.03, outbound=0.0001)
    one_request(w, client=50002, upstream=40001, session="s0", t0=2.0, text="turn 2", inbound=0.002,
                engine_first=2.04, outbound=0.0004)
    times = wt.measure(w.write(tmp_path / "c.pcap"), [ROUTER], [ENGINE])
    assert [round(r.added, 6) for r in times.requests] == [0.0011, 0.0024]


def test_render_calls_before_forwarding_are_reported_apart_from_the_routers_own_time(tmp_path):
    w = Wire()
    for port in (40001, 40002, 40003):
        w.open(0.5, port, ENGINE)
    body = conversation("refactor")
    # cache_aware asks each worker to render the prompt (no session header), then forwards
    rhead, rbody = request("/v1/chat/completions/render", body)
    w.send(1.0010, 40002, ENGINE, rhead + rbody)
    w.send(1.0020, 40003, ENGINE, rhead + rbody)
    answer = b'{"token_ids": [1, 2, 3]}'
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(answer) + answer
    w.send(1.0040, ENGINE, 40002, ok)
    w.send(1.0070, ENGINE, 40003, ok)
    one_request(w, client=50001, upstream=40001, session="s0", t0=1.0, text="refactor", inbound=0.0075,
                engine_first=1.04, outbound=0.0002)
    [r] = wt.measure(w.write(tmp_path / "c.pcap"), [ROUTER], [ENGINE]).requests
    assert r.render == pytest.approx(1.0070 - 1.0010, abs=2e-6)
    assert r.own == pytest.approx(0.0075 + 0.0002 - 0.006, abs=4e-6)


def test_a_retransmission_keeps_the_first_send_and_a_lost_segment_leaves_the_request_unpaired(tmp_path):
    w = Wire()
    w.open(0.5, 40001, ENGINE)
    one_request(w, client=50001, upstream=40001, session="s0", t0=1.0, text="a", inbound=0.001,
                engine_first=1.03, outbound=0.0002)
    # the forwarded request sent again 200 ms later (same sequence numbers): its time stays the first send's
    first = next(f for t, f in w.frames if b"POST /v1/chat/completions" in f and b"stream_options" in f)
    w.frames.append((1.2, first))
    [r] = wt.measure(w.write(tmp_path / "a.pcap"), [ROUTER], [ENGINE]).requests
    assert r.inbound == pytest.approx(0.001, abs=2e-6)

    lost = Wire()
    lost.open(0.5, 40001, ENGINE)
    one_request(lost, client=50001, upstream=40001, session="s0", t0=1.0, text="a", inbound=0.001,
                engine_first=1.03, outbound=0.0002)
    # drop the engine's role-only event: the stream has a gap, so no first token is claimed after it
    lost.frames = [f for f, (sport, data) in zip(lost.frames, lost.sent) if not (sport == ENGINE and b'"role"' in data)]
    times = wt.measure(lost.write(tmp_path / "b.pcap"), [ROUTER], [ENGINE])
    assert times.requests == [] and times.unpaired == 1


def test_summary_percentiles():
    times = wt.WireTimes([wt.RequestTime(inbound=i / 1000, outbound=0.0, render=0.0) for i in range(1, 101)])
    s = times.summary()
    # nearest rank (quantiles.py), the same definition as the load generator's and the benchmark's
    assert s["added"]["p50"] == pytest.approx(0.050) and s["added"]["p99"] == pytest.approx(0.099)
    assert s["requests"] == 100 and s["render"]["p99"] == 0


@pytest.mark.timeout(120)
def test_a_real_capture_of_vllm_router_pairs_every_request(tmp_path, vllm_router_bin):
    if shutil.which("tcpdump") is None or os.geteuid() != 0:
        msg = "tcpdump as root is needed (e2e/install-system-deps.sh installs tcpdump)"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must install it: make deps)")
        pytest.skip(msg)
    engines = mf.start_engines(1, tmp_path / "engines", time_scale=10)
    try:
        opts = RouterOptions(worker_urls=(engines[0].url,), port=free_port(), prometheus_port=free_port(),
                             policy="consistent_hash")
        with VllmRouter(opts, tmp_path / "router.log") as router, \
                wt.Capture(tmp_path / "c.pcap", (opts.port, engines[0].port)) as cap:
            for i in range(6):
                body = json.dumps({"model": mf.SERVED, "max_tokens": 4, "stream": True,
                                   "messages": [{"role": "user", "content": f"turn {i}"}]}).encode()
                req = urllib.request.Request(router.base + "/v1/chat/completions", body,
                                             {"content-type": "application/json", "x-session-id": f"s{i % 2}"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert b"[DONE]" in r.read()
    finally:
        mf.stop_all(engines)
    assert cap.dropped == 0
    times = wt.measure(cap.path, [opts.port], [engines[0].port])
    assert times.unpaired == 0 and len(times.requests) == 6
    for r in times.requests:
        # the router can only add time, and on loopback far less than a second
        assert 0 < r.inbound < 1 and 0 <= r.outbound < 1 and r.render == 0
