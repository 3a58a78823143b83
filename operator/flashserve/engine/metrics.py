"""`/metrics` of the mock engine: vLLM 0.33's metric names, types, label sets and bucket bounds, written in
the Prometheus text format the way prometheus_client (which vLLM uses) writes it.

Every series carries `model_name` (the first served model name) and `engine` (the DP rank as a string).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flashserve.engine.perfmodel import Engine
from flashserve.engine.stats import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
COUNTERS = (
    ("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    ("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local prefix cache)."),
    ("vllm:generation_tokens_total", "Number of generation tokens processed."),
    ("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
)
# (name, help, EngineStats attribute)
HISTOGRAMS = (
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "req_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "req_generation_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     "req_max_generation_tokens"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "req_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "req_max_tokens"),
    ("vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).", "req_prefill_computed"),
    ("vllm:request_num_preemptions", "Number of preemptions per finished request.", "req_preemptions"),
)


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _escape(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def render(engines: Sequence[tuple[int, Engine]], model_name: str) -> str:
    """The whole exposition for the engines this API server fronts."""
    out: list[str] = []
    base = [(rank, eng, [("model_name", model_name), ("engine", str(rank))]) for rank, eng in engines]
    snaps = {rank: eng.snapshot() for rank, eng, _ in base}

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")

    gauge_value = {
        "vllm:num_requests_running": lambda s: s.running,
        "vllm:num_requests_waiting": lambda s: s.waiting,
        "vllm:kv_cache_usage_perc": lambda s: s.kv_usage,
    }
    for name, help_ in GAUGES:
        family(name, "gauge", help_)
        for rank, _, lab in base:
            out.append(f"{name}{_labels(lab)} {go_float(gauge_value[name](snaps[rank]))}")

    counter_value = {
        "vllm:num_preemptions_total": lambda e: e.stats.preemptions,
        "vllm:prompt_tokens_total": lambda e: e.stats.prompt_tokens,
        "vllm:prompt_tokens_cached_total": lambda e: e.stats.prompt_tokens_cached,
        "vllm:generation_tokens_total": lambda e: e.generation_tokens(),
        "vllm:prefix_cache_queries_total": lambda e: e.stats.prefix_queries,
        "vllm:prefix_cache_hits_total": lambda e: e.stats.prefix_hits,
    }
    for name, help_ in COUNTERS:
        family(name, "counter", help_)
        for _, eng, lab in base:
            out.append(f"{name}{_labels(lab)} {go_float(counter_value[name](eng))}")

    family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for _, eng, lab in base:
        for reason, count in eng.stats.success.items():
            out.append(f"vllm:request_success_total{_labels(lab + [('finished_reason', reason)])} {go_float(count)}")

    if any(eng.spec for _, eng, _ in base):
        spec = {rank: eng.spec_counters() for rank, eng, _ in base}
        for name, idx, help_ in (
            ("vllm:spec_decode_num_drafts_total", 0, "Number of spec decoding drafts."),
            ("vllm:spec_decode_num_draft_tokens_total", 1, "Number of draft tokens."),
            ("vllm:spec_decode_num_accepted_tokens_total", 2, "Number of accepted tokens."),
        ):
            family(name, "counter", help_)
            for rank, _, lab in base:
                out.append(f"{name}{_labels(lab)} {go_float(spec[rank][idx])}")
        family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
               "Accepted tokens per draft position.")
        for rank, _, lab in base:
            for pos, count in enumerate(spec[rank][3]):
                out.append(
                    f"vllm:spec_decode_num_accepted_tokens_per_pos_total{_labels(lab + [('position', str(pos))])} "
                    f"{go_float(count)}"
                )

    for name, help_, attr in HISTOGRAMS:
        family(name, "histogram", help_)
        for _, eng, lab in base:
            _histogram(out, name, lab, getattr(eng.stats, attr))

    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for rank, eng, _ in base:
        cfg = eng.cfg
        info = [
            ("block_size", str(cfg.block_size)),
            ("enable_prefix_caching", str(cfg.enable_prefix_caching)),
            ("num_gpu_blocks", str(cfg.num_blocks)),
            ("engine", str(rank)),
        ]
        out.append(f"vllm:cache_config_info{_labels(info)} 1.0")
    return "\n".join(out) + "\n"


def _histogram(out: list[str], name: str, lab: list[tuple[str, str]], h: Histogram) -> None:
    cum = h.cumulative()
    for bound, count in zip(list(h.bounds) + [math.inf], cum):
        out.append(f"{name}_bucket{_labels(lab + [('le', go_float(bound))])} {go_float(count)}")
    out.append(f"{name}_count{_labels(lab)} {go_float(h.n)}")
    out.append(f"{name}_sum{_labels(lab)} {go_float(h.total)}")
