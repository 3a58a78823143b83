"""NVIDIA Dynamo's SLA planner in throughput mode (components/planner), defaults: every 180 s it

1. observes the last interval from Prometheus: requests, mean input and output lengths, KV-cache hit rate,
   mean ITL and TTFT;
2. forecasts the next interval's request count, ISL and OSL (ARIMA by default; here ARIMA(1,1,0) with drift
   fitted by least squares, constant until five intervals are known, standing in for pmdarima's auto-ARIMA);
3. corrects the ITL target by observed/expected ITL (expected: the pre-deployment profile at the observed
   load) and reverse-interpolates the profiled decode throughput per GPU at that corrected ITL;
4. decode replicas = ceil(rate x OSL / throughput per GPU / GPUs per engine); prefill replicas =
   ceil(rate x ISL x (1 - KV hit rate) x min(1, TTFT correction) / prefill throughput per GPU / GPUs per
   engine); this fleet is aggregated (every replica prefills and decodes), so the larger of the two is the
   replica count;
5. holds while a scaling operation is in progress (replicas still starting); no scale to zero.

The profile is the benchmark's calibration (calibrate.py), i.e. what Dynamo's profiler would have measured on
this engine and workload. The ITL target is the SLA's: 1/100 s per token for 100 tok/s (Dynamo's own default
of 50 ms would be 20 tok/s).
"""

from __future__ import annotations

import math

from flashserve_testbed.bench.context import Context, Policy


class ArimaPredictor:
    """ARIMA(1,1,0) with drift: d_t = c + phi * d_(t-1) on first differences, least squares."""

    MIN_POINTS = 5
    HISTORY = 50

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, v: float) -> None:
        self.values.append(v)
        del self.values[: -self.HISTORY]

    def predict(self) -> float | None:
        y = self.values
        if not y:
            return None
        if len(y) < self.MIN_POINTS:
            return y[-1]
        d = [b - a for a, b in zip(y, y[1:])]
        x, z = d[:-1], d[1:]
        n = len(x)
        mx, mz = sum(x) / n, sum(z) / n
        sxx = sum((a - mx) ** 2 for a in x)
        phi = sum((a - mx) * (b - mz) for a, b in zip(x, z)) / sxx if sxx > 0 else 0.0
        phi = max(-0.95, min(0.95, phi))
        c = mz - phi * mx
        return max(0.0, y[-1] + c + phi * d[-1])


class ConstantPredictor(ArimaPredictor):
    def predict(self) -> float | None:
        return self.values[-1] if self.values else None


def reverse_interpolate(profile: list[tuple[float, float]], itl: float) -> float:
    """find_best_throughput_per_gpu: the highest profiled throughput per GPU whose ITL stays within `itl`
    (the table rises in both columns)."""
    pts = sorted(profile)
    if itl <= pts[0][1]:
        return pts[0][0]
    for (t0, i0), (t1, i1) in zip(pts, pts[1:]):
        if i0 <= itl <= i1:
            return t0 + (t1 - t0) * (itl - i0) / (i1 - i0) if i1 > i0 else t1
    return pts[-1][0]


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[-1][1]


def decode_replicas(rate: float, osl: float, itl_target_s: float, correction: float,
                    profile: list[tuple[float, float]], gpus_per_engine: int) -> int:  # fmt: skip
    corrected = itl_target_s / correction if correction > 0 else itl_target_s
    per_gpu = reverse_interpolate(profile, corrected)
    return math.ceil(rate * osl / per_gpu / gpus_per_engine) if per_gpu > 0 else 1


def prefill_replicas(rate: float, isl: float, hit_rate: float, ttft_correction: float, per_gpu: float,
                     gpus_per_engine: int) -> int:  # fmt: skip
    return math.ceil(rate * isl * (1.0 - hit_rate) * min(1.0, ttft_correction) / per_gpu / gpus_per_engine)


class DynamoPlanner(Policy):
    name = "dynamo"
    offset_s = 5.0
    knob = "itl_target_ms"

    def __init__(self, itl_target_s: float, ttft_target_s: float = 0.5, interval_s: float = 180.0,
                 predictor: str = "arima", name: str = "dynamo") -> None:  # fmt: skip
        self.itl_target_s = itl_target_s
        self.ttft_target_s = ttft_target_s
        self.interval_s = interval_s
        make = ArimaPredictor if predictor == "arima" else ConstantPredictor
        self.num_req, self.isl, self.osl = make(), make(), make()
        self.hit_rate = 0.0
        self.name = name
        self.knob_value = itl_target_s * 1000.0

    def decide(self, ctx: Context) -> int | None:
        p, now, w = ctx.prom, ctx.now, self.interval_s
        reqs = p.rate_sum(now, w, "ttft_count")
        if not reqs:
            return None
        prompt = p.rate_sum(now, w, "prompt_tokens") or 0.0
        prompt_n = p.rate_sum(now, w, "prompt_count") or 0.0
        out = p.rate_sum(now, w, "output_tokens_done") or 0.0
        out_n = p.rate_sum(now, w, "output_count") or 0.0
        if prompt_n <= 0 or out_n <= 0:
            return None
        self.num_req.add(reqs * w)
        self.isl.add(prompt / prompt_n)
        self.osl.add(out / out_n)
        queries = p.rate_sum(now, w, "prefix_queries") or 0.0
        if queries > 0:
            self.hit_rate = (p.rate_sum(now, w, "prefix_hits") or 0.0) / queries
        calib = ctx.calib
        # correction factors: observed over what the profile expects at the observed load
        gen = p.rate_sum(now, w, "gen_tokens") or 0.0
        itl_sum = p.rate_sum(now, w, "itl_sum") or 0.0
        decode_tokens = gen - reqs
        d_corr = 1.0
        running = p.over_time_by_pod(now, w, "running")
        ready = max(1, ctx.counts.ready)
        if decode_tokens > 0 and running:
            observed_itl = itl_sum / decode_tokens
            per_engine = sum(running.values()) / (ready * calib.engines_per_replica)
            expected_itl = calib.at(per_engine, "itl_per_token_s")
            if expected_itl > 0:
                d_corr = observed_itl / expected_itl
        ttft_n = p.rate_sum(now, w, "ttft_count") or 0.0
        p_corr = 1.0
        if ttft_n > 0:
            observed_ttft = (p.rate_sum(now, w, "ttft_sum") or 0.0) / ttft_n
            expected_ttft = calib.nominal.ttft_s
            if expected_ttft > 0:
                p_corr = observed_ttft / expected_ttft
        if ctx.counts.starting > 0:
            return None  # a scaling operation is still in progress
        rate = (self.num_req.predict() or 0.0) / w
        isl, osl = self.isl.predict() or 0.0, self.osl.predict() or 0.0
        gpus = calib.gpus_per_replica
        n_d = decode_replicas(rate, osl, self.itl_target_s, d_corr, calib.decode_profile(), gpus)
        n_p = prefill_replicas(rate, isl, self.hit_rate, p_corr, calib.prefill_tokens_per_s_per_gpu, gpus)
        return max(ctx.min_replicas, n_d, n_p)


def default(sla_tokens_per_s: float) -> DynamoPlanner:
    return DynamoPlanner(1.0 / sla_tokens_per_s)


def tuned(sla_tokens_per_s: float, startup_s: float) -> DynamoPlanner:
    """An ITL target 20% tighter than the SLA: the planner sizes on mean ITL, and the per-user speed of the
    slowest tenth of the tokens needs that margin (the best of the ITL sweep on flash-crowd seed 0; a 60 s
    interval was worse: the ITL correction over-reacts to overload)."""
    return DynamoPlanner(0.8 / sla_tokens_per_s, name="dynamo-tuned")


SWEEP = (0.7, 0.9, 1.1)
"""ITL target as a share of 1/SLA."""
