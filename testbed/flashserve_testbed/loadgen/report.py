"""What a load run measured: per-request records, and the arithmetic over them.

Per-user speed of a request is its output tokens after the first, over the time from the first token to the
last (the decode time), as vLLM's time-per-output-token reads it. SLA attainment is token weighted: the share
of output tokens that came in requests at or above the SLA speed. Times are engine seconds: wall seconds times
the time scale the engines run at, so a scaled mock reads like the real thing.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from flashserve_testbed.quantiles import nearest_rank

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


@dataclass
class RequestRecord:
    session: int
    turn: int
    start: float  # wall seconds since the run began
    first: float | None = None  # first output token
    end: float | None = None  # last byte
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    max_tokens: int = 0
    status: int = 0
    error: str | None = None
    endpoint: str | None = None  # the engine the router chose (its X-FlashServe-Endpoint header)

    def speed(self, time_scale: float = 1.0) -> float | None:
        """Output tokens per engine second after the first token; None without two tokens or on error."""
        if self.error or self.first is None or self.end is None or self.completion_tokens < 2:
            return None
        decode = (self.end - self.first) * time_scale
        return (self.completion_tokens - 1) / decode if decode > 0 else None

    def ttft(self, time_scale: float = 1.0) -> float | None:
        return None if self.error or self.first is None else (self.first - self.start) * time_scale


def percentile(values: list[float], q: float) -> float | None:
    """The `q` percentile (0-100) of `values` by nearest rank (quantiles.py: a value some request saw)."""
    return nearest_rank(values, q / 100.0)


def percentiles(values: list[float]) -> dict[str, float | None]:
    s = sorted(values)
    return {f"p{q}": percentile(s, q) for q in PERCENTILES} | {"mean": (sum(s) / len(s)) if s else None}


def sla_attainment(records: list[RequestRecord], sla: float, time_scale: float = 1.0) -> float | None:
    """Share of output tokens in requests whose per-user speed is at least `sla` tokens/s."""
    total = met = 0
    for r in records:
        v = r.speed(time_scale)
        if v is None:
            continue
        total += r.completion_tokens
        if v >= sla:
            met += r.completion_tokens
    return met / total if total else None


@dataclass
class LoadReport:
    records: list[RequestRecord]
    wall_seconds: float
    time_scale: float = 1.0
    sla: float | None = None
    config: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)  # controller samples: t (wall), target, active, inflight

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.error]

    def summary(self) -> dict:
        ok = self.ok
        scale = self.time_scale
        engine_s = self.wall_seconds * scale
        speeds = [v for r in ok if (v := r.speed(scale)) is not None]
        ttfts = [v for r in ok if (v := r.ttft(scale)) is not None]
        prompt = sum(r.prompt_tokens for r in ok)
        cached = sum(r.cached_tokens for r in ok)
        output = sum(r.completion_tokens for r in ok)
        errors: dict[str, int] = {}
        for r in self.records:
            if r.error:
                # an HTTP status, else what failed: "ClientConnectorError" says the endpoint was not there
                key = str(r.status) if r.status else r.error.split(":", 1)[0].strip() or "error"
                errors[key] = errors.get(key, 0) + 1
        out = {
            "requests": len(self.records),
            "ok": len(ok),
            "errors": errors,
            "sessions": len({r.session for r in self.records}),
            "wall_seconds": round(self.wall_seconds, 3),
            "engine_seconds": round(engine_s, 3),
            "time_scale": scale,
            "prompt_tokens": prompt,
            "cached_prompt_tokens": cached,
            "cached_fraction": cached / prompt if prompt else None,
            "output_tokens": output,
            "output_tokens_per_s": output / engine_s if engine_s else None,
            "total_tokens_per_s": (prompt + output) / engine_s if engine_s else None,
            "per_user_tokens_per_s": percentiles(speeds),
            "ttft_seconds": percentiles(ttfts),
            "sla_tokens_per_s": self.sla,
            "sla_attainment": sla_attainment(ok, self.sla, scale) if self.sla else None,
        }
        endpoints: dict[str, int] = {}
        for r in ok:
            if r.endpoint:
                endpoints[r.endpoint] = endpoints.get(r.endpoint, 0) + 1
        if endpoints:
            out["requests_by_endpoint"] = dict(sorted(endpoints.items()))
        return out

    def timeseries(self, bin_seconds: float = 1.0) -> list[dict]:
        """Per bin of engine time: target and active sessions, requests in flight, output tokens/s (each request's
        tokens spread over its decode time), and speed, TTFT and SLA attainment of the requests ending in it."""
        scale = self.time_scale
        horizon = self.wall_seconds * scale
        n = max(1, math.ceil(horizon / bin_seconds))
        tokens = [0.0] * n
        ending: list[list[RequestRecord]] = [[] for _ in range(n)]
        for r in self.ok:
            if r.first is None or r.end is None:
                continue
            a, b = r.first * scale, r.end * scale
            ending[min(n - 1, int(b / bin_seconds))].append(r)
            if b <= a:
                tokens[min(n - 1, int(a / bin_seconds))] += r.completion_tokens
                continue
            rate = r.completion_tokens / (b - a)
            i = int(a / bin_seconds)
            while i < n and i * bin_seconds < b:
                lo, hi = max(a, i * bin_seconds), min(b, (i + 1) * bin_seconds)
                tokens[i] += rate * max(0.0, hi - lo)
                i += 1
        samples = sorted(self.samples, key=lambda s: s["t"])
        out = []
        j = 0
        last = {"target": 0, "active": 0, "inflight": 0}
        for i in range(n):
            t_end = (i + 1) * bin_seconds
            while j < len(samples) and samples[j]["t"] * scale < t_end:
                last = samples[j]
                j += 1
            rs = ending[i]
            speeds = sorted(v for r in rs if (v := r.speed(scale)) is not None)
            ttfts = sorted(v for r in rs if (v := r.ttft(scale)) is not None)
            out.append({
                "t": round(i * bin_seconds, 6),
                "target_sessions": last.get("target", 0),
                "active_sessions": last.get("active", 0),
                "inflight": last.get("inflight", 0),
                "output_tokens_per_s": tokens[i] / bin_seconds,
                "requests_finished": len(rs),
                "per_user_p50": percentile(speeds, 50),
                "per_user_p10": percentile(speeds, 10),
                "ttft_p50": percentile(ttfts, 50),
                "sla_attainment": sla_attainment(rs, self.sla, scale) if self.sla else None,
            })
        return out

    def to_dict(self, requests: bool = False, bin_seconds: float = 1.0) -> dict:
        doc = {"config": self.config, "summary": self.summary(), "timeseries": self.timeseries(bin_seconds)}
        if requests:
            doc["requests"] = [asdict(r) for r in self.records]
        return doc

    def write_json(self, path, requests: bool = False, bin_seconds: float = 1.0) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(requests, bin_seconds), fh, indent=1)
            fh.write("\n")

    def format(self) -> str:
        s = self.summary()

        def f(v, spec=".1f", unit=""):
            return "-" if v is None else f"{v:{spec}}{unit}"

        sp, tt = s["per_user_tokens_per_s"], s["ttft_seconds"]
        lines = [
            f"requests {s['ok']}/{s['requests']} ok"
            + (f", errors {s['errors']}" if s["errors"] else "")
            + f", {s['sessions']} sessions, {f(s['engine_seconds'])} engine-s ({f(s['wall_seconds'])} wall-s)",
            f"tokens   prompt {s['prompt_tokens']} ({f(s['cached_fraction'], '.1%')} cached), output "
            f"{s['output_tokens']}; output {f(s['output_tokens_per_s'])} tok/s, total "
            f"{f(s['total_tokens_per_s'], '.0f')} tok/s",
            "per-user tok/s  " + "  ".join(f"{k} {f(sp[k])}" for k in ("p1", "p5", "p10", "p50", "p90", "p99")),
            "TTFT s          " + "  ".join(f"{k} {f(tt[k], '.3f')}" for k in ("p50", "p90", "p99")),
        ]
        if s["sla_tokens_per_s"]:
            lines.append(f"SLA {s['sla_tokens_per_s']:g} tok/s: {f(s['sla_attainment'], '.1%')} of output tokens "
                         "at or above it")
        if s.get("requests_by_endpoint"):
            lines.append("by endpoint     " + "  ".join(f"{k} {v}" for k, v in s["requests_by_endpoint"].items()))
        return "\n".join(lines)
