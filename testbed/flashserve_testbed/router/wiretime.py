"""What vllm-router adds to a request's time to first token, read off the wire.

Client-side TTFT differences (routed minus direct) cannot resolve a millisecond on a shared 2-core machine: the
load generator's and the mock engine's Python processes wait tens of milliseconds for a core. The kernel's
timestamps of the loopback packets do not: `tcpdump` records when each segment left its sender, so on the
router's two sides of one request

    client -> router   the request's last byte reaches the router           (t1)
    router -> engine   the router's forwarded request is complete           (t2)
    engine -> router   the engine sends the first token event               (t3)
    router -> client   the router sends that event on                       (t4)

give the router's share of the TTFT as (t2 - t1) + (t4 - t3), whoever else waits for a core. With
`cache_aware` the router first asks every engine to render the prompt (`POST .../render`); the time from its
first render request to its last render answer is reported apart (`render`), and `own` is the rest.

Requests are paired across the two sides by their session header and their messages (the router re-serialises
the body, so bytes differ; the conversation does not). `docs/vllm-router.md`, "Router overhead on the wire".
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import json
import re
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dpkt

from flashserve_testbed.quantiles import nearest_rank

GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")
RENDER_SUFFIX = "/render"
_DROPPED = re.compile(rb"(\d+) packets? dropped by kernel")


class WireError(RuntimeError):
    """A capture that cannot be taken or read; the message says what to install or change."""


# --- capture -------------------------------------------------------------------------------------------------


class Capture:
    """`tcpdump` on the loopback interface for the given TCP ports, as a context manager. Needs root (or
    CAP_NET_RAW) and the Debian package `tcpdump` (`e2e/install-system-deps.sh` installs it)."""

    def __init__(self, path: Path, ports: Iterable[int], interface: str = "lo", buffer_kib: int = 65536):
        self.path = Path(path)
        self.ports = sorted(set(ports))
        self.interface = interface
        self.buffer_kib = buffer_kib
        self.proc: subprocess.Popen | None = None
        self.dropped: int | None = None
        self._log = self.path.with_suffix(".log")

    def __enter__(self) -> "Capture":
        exe = shutil.which("tcpdump") or next((p for p in ("/usr/bin/tcpdump", "/usr/sbin/tcpdump")
                                               if Path(p).exists()), None)
        if exe is None:
            raise WireError("tcpdump is not installed: apt-get install tcpdump (e2e/install-system-deps.sh does)")
        if not self.ports:
            raise WireError("Capture: no ports given")
        expr = " or ".join(f"tcp port {p}" for p in self.ports)
        log = open(self._log, "wb")
        # --immediate-mode and -U: each packet is read from the ring and written as it comes (otherwise the ring
        # hands them over in blocks, and a stop loses what it still holds); -s 0: whole payloads (the HTTP
        # bodies pair requests); -B: a kernel buffer large enough that a busy machine drops nothing.
        self.proc = subprocess.Popen([exe, "-i", self.interface, "-s", "0", "--immediate-mode", "-U",
                                      "-B", str(self.buffer_kib), "-w", str(self.path), expr],
                                     stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        deadline = time.monotonic() + 10
        while b"listening on" not in self._log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise WireError(f"tcpdump did not start (root or CAP_NET_RAW is needed): "
                                f"{self._log.read_text(errors='replace')[-500:]}")
            time.sleep(0.02)
        return self

    def _stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            # let it write what it has read: stop once the file has not grown for 0.3 s (5 s at most)
            size, stable, deadline = -1, time.monotonic(), time.monotonic() + 5
            while time.monotonic() < deadline and time.monotonic() - stable < 0.3:
                now = self.path.stat().st_size if self.path.exists() else 0
                if now != size:
                    size, stable = now, time.monotonic()
                time.sleep(0.05)
            self.proc.send_signal(signal.SIGINT)  # tcpdump flushes and prints its counts on SIGINT
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc) -> None:
        self._stop()
        m = _DROPPED.search(self._log.read_bytes())
        self.dropped = int(m.group(1)) if m else None


# --- TCP streams ---------------------------------------------------------------------------------------------

Flow = tuple[str, int, str, int]  # (src ip, src port, dst ip, dst port): one direction of a connection


@dataclass
class Stream:
    """One direction's bytes in order, and when each segment carrying them was sent."""

    data: bytes
    starts: list[int]  # byte offset where each segment begins (increasing)
    times: list[float]  # its timestamp
    complete: bool  # False: a gap in the sequence space (a packet the capture lost): parsed up to it

    def ts(self, offset: int) -> float:
        """Timestamp of the segment that carried byte `offset`."""
        return self.times[bisect.bisect_right(self.starts, offset) - 1]


def _streams_from_segments(segments: dict[Flow, list[tuple[float, int, bytes, bool]]]) -> dict[Flow, Stream]:
    out = {}
    for flow, segs in segments.items():
        if not any(payload for _, _, payload, _ in segs):
            continue
        syn = next((seq for _, seq, _, is_syn in segs if is_syn), None)
        base = (syn + 1) if syn is not None else min(seq for _, seq, payload, _ in segs if payload)
        pieces: dict[int, tuple[float, bytes]] = {}
        for ts, seq, payload, _ in segs:
            if not payload:
                continue
            off = (seq - base) % (1 << 32)  # sequence numbers wrap at 2**32
            if off not in pieces:  # a retransmission keeps the first send's time
                pieces[off] = (ts, payload)
        data = bytearray()
        starts, times = [], []
        complete = True
        for off in sorted(pieces):
            ts, payload = pieces[off]
            if off > len(data):
                complete = False
                break
            new = payload[len(data) - off:]
            if new:
                starts.append(len(data))
                times.append(ts)
                data += new
        out[flow] = Stream(bytes(data), starts, times, complete)
    return out


def read_streams(pcap: Path) -> dict[Flow, Stream]:
    """Every TCP direction in a capture (Ethernet or Linux cooked link layer, IPv4 or IPv6)."""
    segments: dict[Flow, list[tuple[float, int, bytes, bool]]] = {}
    with open(pcap, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        frame = {dpkt.pcap.DLT_LINUX_SLL: dpkt.sll.SLL,
                 dpkt.pcap.DLT_NULL: dpkt.loopback.Loopback}.get(reader.datalink(), dpkt.ethernet.Ethernet)
        for ts, buf in reader:
            ip = frame(buf).data
            if not isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) or not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            tcp = ip.data
            src = _addr(ip.src)
            dst = _addr(ip.dst)
            segments.setdefault((src, tcp.sport, dst, tcp.dport), []).append(
                (float(ts), tcp.seq, bytes(tcp.data), bool(tcp.flags & dpkt.tcp.TH_SYN)))
    return _streams_from_segments(segments)


def _addr(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


# --- HTTP/1.1 on a stream ------------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    start: float  # first byte sent
    end: float  # last byte sent


@dataclass
class Response:
    status: int
    start: float  # status line sent
    first_token: float | None  # the first event carrying output text (None: none seen)
    end: float | None  # last byte of the body (None: the capture ended first)


def _head(data: bytes, pos: int) -> tuple[str, dict[str, str], int] | None:
    end = data.find(b"\r\n\r\n", pos)
    if end < 0:
        return None
    lines = data[pos:end].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return lines[0], headers, end + 4


def parse_requests(s: Stream) -> list[Request]:
    out, pos, data = [], 0, s.data
    while pos < len(data):
        head = _head(data, pos)
        if head is None:
            break
        line, headers, body_at = head
        n = int(headers.get("content-length") or 0)
        parts = line.split(" ")
        if body_at + n > len(data) or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            break
        method, path, _ = parts
        last = body_at + n - 1 if n else body_at - 1
        out.append(Request(method, path, headers, data[body_at:body_at + n], s.ts(pos), s.ts(last)))
        pos = body_at + n
    return out


def _has_output(event: bytes) -> bool:
    """An SSE event whose JSON carries output text (a chat delta's content or a completion's text)."""
    if not event.startswith(b"data:"):
        return False
    raw = event[5:].strip()
    if raw == b"[DONE]":
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    for choice in doc.get("choices") or []:
        if (choice.get("delta") or {}).get("content") or choice.get("text"):
            return True
    return False


def _events(data: bytes, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """(offset, event) for each complete SSE event in data[start:stop]."""
    pos = start
    while True:
        end = data.find(b"\n\n", pos, stop)
        if end < 0:
            return
        yield pos, data[pos:end]
        pos = end + 2


def parse_responses(s: Stream) -> list[Response]:
    out, pos, data = [], 0, s.data
    while pos < len(data):
        head = _head(data, pos)
        if head is None:
            break
        line, headers, body_at = head
        status = int(line.split(" ")[1])
        start = s.ts(pos)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            # Decode the chunks into one body, remembering where each body byte sat on the wire.
            body, where, p, done = bytearray(), [], body_at, False
            while True:
                eol = data.find(b"\r\n", p)
                if eol < 0:
                    break
                size = int(data[p:eol].split(b";")[0], 16)
                if eol + 2 + size + 2 > len(data):
                    break
                where.append((len(body), eol + 2))
                body += data[eol + 2:eol + 2 + size]
                p = eol + 2 + size + 2
                if size == 0:
                    done = True
                    break
            first = None
            for off, event in _events(bytes(body), 0, len(body)):
                if _has_output(event):
                    i = bisect.bisect_right([b for b, _ in where], off) - 1
                    first = s.ts(where[i][1] + off - where[i][0])
                    break
            out.append(Response(status, start, first, s.ts(p - 1) if done else None))
            if not done:
                break
            pos = p
        else:
            n = int(headers.get("content-length") or 0)
            if body_at + n > len(data):
                out.append(Response(status, start, None, None))
                break
            first = None
            for off, event in _events(data, body_at, body_at + n):
                if _has_output(event):
                    first = s.ts(off)
                    break
            out.append(Response(status, start, first, s.ts(body_at + n - 1) if n else start))
            pos = body_at + n
    return out


@dataclass
class Exchange:
    client: tuple[str, int]
    server: tuple[str, int]
    request: Request
    response: Response | None


def exchanges(streams: dict[Flow, Stream]) -> list[Exchange]:
    """Every HTTP request in the capture with its response (HTTP/1.1: in order on a connection)."""
    out = []
    for (src, sport, dst, dport), s in streams.items():
        reqs = parse_requests(s)
        if not reqs:
            continue
        back = streams.get((dst, dport, src, sport))
        resps = parse_responses(back) if back else []
        for i, req in enumerate(reqs):
            out.append(Exchange((src, sport), (dst, dport), req, resps[i] if i < len(resps) else None))
    return out


# --- pairing the router's two sides ---------------------------------------------------------------------------


def request_key(req: Request) -> tuple | None:
    """What identifies one request on both sides of the router: its session header and its conversation."""
    try:
        doc = json.loads(req.body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    convo = doc.get("messages") if "messages" in doc else doc.get("prompt")
    digest = hashlib.sha256(json.dumps(convo, sort_keys=True).encode()).hexdigest()
    return req.headers.get("x-session-id"), digest


@dataclass
class RequestTime:
    """One request's time in the router, in seconds."""

    inbound: float  # the request's last byte at the router -> its last byte sent to the engine
    outbound: float  # the engine's first token event -> the router sending it on
    render: float  # of `inbound`: waiting for the engines' render answers (cache_aware)

    @property
    def added(self) -> float:
        return self.inbound + self.outbound

    @property
    def own(self) -> float:
        return self.added - self.render


@dataclass
class WireTimes:
    requests: list[RequestTime] = field(default_factory=list)
    unpaired: int = 0  # client requests with no forwarded request or no token event on either side

    def summary(self) -> dict:
        out: dict = {"requests": len(self.requests), "unpaired": self.unpaired}
        for name in ("added", "own", "render", "inbound", "outbound"):
            xs = [getattr(r, name) for r in self.requests]
            out[name] = {"p50": nearest_rank(xs, 0.5), "p99": nearest_rank(xs, 0.99),
                         "mean": statistics.fmean(xs) if xs else None}
        return out


Endpoint = int | tuple[str, int]  # a port on any address, or one address and port (pods that share a port number)


def _serves(endpoints: Iterable[Endpoint]):
    ports = {e for e in endpoints if isinstance(e, int)}
    addrs = {tuple(e) for e in endpoints if not isinstance(e, int)}
    return lambda server: server[1] in ports or tuple(server) in addrs


def router_times(exs: list[Exchange], router_ports: Iterable[Endpoint], engine_ports: Iterable[Endpoint]) -> WireTimes:
    """Pair each generate request the router received with the one it forwarded, and its renders. The router
    and the engines are told apart by the server side of each connection (`Endpoint`)."""
    is_router, is_engine = _serves(router_ports), _serves(engine_ports)

    def generate(ex: Exchange) -> bool:
        return ex.request.method == "POST" and ex.request.path.split("?")[0] in GENERATE_PATHS

    front = sorted((e for e in exs if is_router(e.server) and generate(e)), key=lambda e: e.request.end)
    back: dict[tuple, list[Exchange]] = {}
    renders: dict[tuple, list[Exchange]] = {}
    for e in exs:
        if not is_engine(e.server) or e.request.method != "POST":
            continue
        key = request_key(e.request)
        if key is None:
            continue
        if e.request.path.split("?")[0].endswith(RENDER_SUFFIX):
            # a render need not carry the session header: key it by the conversation alone
            renders.setdefault(key[1], []).append(e)
        elif generate(e):
            back.setdefault(key, []).append(e)
    for lst in (*back.values(), *renders.values()):
        lst.sort(key=lambda e: e.request.start)
    out = WireTimes()
    for f in front:
        key = request_key(f.request)
        fwd = None
        if key is not None:
            cands = back.get(key, [])
            fwd = next((b for b in cands if b.request.start >= f.request.start), None)
            if fwd is not None:
                cands.remove(fwd)
        if (fwd is None or f.response is None or fwd.response is None or f.response.first_token is None
                or fwd.response.first_token is None):
            out.unpaired += 1
            continue
        mine = [r for r in renders.get(key[1], ())
                if f.request.start <= r.request.start <= fwd.request.start and r.response and r.response.end]
        render = (max(r.response.end for r in mine) - min(r.request.start for r in mine)) if mine else 0.0
        out.requests.append(RequestTime(inbound=fwd.request.end - f.request.end,
                                        outbound=f.response.first_token - fwd.response.first_token,
                                        render=render))
    return out


def measure(pcap: Path, router_ports: Iterable[Endpoint], engine_ports: Iterable[Endpoint]) -> WireTimes:
    return router_times(exchanges(read_streams(pcap)), router_ports, engine_ports)
