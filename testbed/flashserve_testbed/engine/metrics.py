"""`/metrics` of the mock engine: what vLLM 0.33's `PrometheusStatLogger` (v1/metrics/loggers.py) registers,
written the way prometheus_client 0.26 (which vLLM uses) writes it.

Every family, type, HELP text, label name and bucket bound is vLLM's for the same command line; the contract
test (tests/contract/test_metrics_exposition.py) builds the real logger in the contract venv and compares.
Families vLLM registers in the same order, series in the order it creates their children, label names sorted
within a series as prometheus_client writes them. Every per-engine series carries `model_name` (the first
served model name) and `engine` (the DP rank as a string). What the mock does not model reads 0 (no external
KV connector, multi-modal cache, admission queue limit, sleep mode or MFU estimates), as in a vLLM that has
none of those.

Not written: the `<family>_created` gauges prometheus_client adds per counter and histogram child. vLLM's
single API server has them, but with several API servers (the default with data parallelism: one per DP rank)
it serves the multiprocess collector, which has none; scrapers and the autoscaler never read them.
Families vLLM adds only for options the operator never sets (`--kv-cache-metrics`, LoRA, a KV consumer
connector, a watermark config, VLLM_COMPUTE_NANS_IN_LOGITS) are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from flashserve_testbed.engine.perfmodel import Engine
from flashserve_testbed.engine.stats import EngineStats, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM 0.33 loggers.py and stats.py: the values it pre-creates a child for, so they show at 0 before any count.
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)
SLEEP_STATE_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
    "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; "
    "sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
)

# (name, help, EngineStats attribute), in vLLM's registration order
HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "req_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "req_generation_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     "req_max_generation_tokens"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "req_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "req_max_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.", "req_preemptions"),
    ("vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).", "req_prefill_computed"),
)  # fmt: skip

# vLLM 0.33's CacheConfig fields in declaration order (CacheConfig.metrics_info: str() of every attribute), with
# what a config that leaves them alone exports. cache_config_info() fills in what the mock's config knows.
CACHE_CONFIG_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("block_size", "16"), ("user_specified_block_size", "False"), ("kv_cache_layout", "None"),
    ("prefix_match_unit", "None"), ("gpu_memory_utilization", "0.92"), ("cache_dtype", "auto"),
    ("is_attention_free", "False"), ("num_gpu_blocks_override", "None"), ("sliding_window", "None"),
    ("enable_prefix_caching", "True"), ("prefix_caching_hash_algo", "sha256"),
    ("prefix_cache_retention_interval", "0"), ("kv_cache_dtype_skip_layers", "[]"),
    ("mamba_page_size_padded", "None"), ("skip_page_size_padded", "None"), ("mamba_block_size", "None"),
    ("mamba_cache_dtype", "auto"), ("mamba_ssm_cache_dtype", "auto"), ("mamba_cache_mode", "none"),
    ("enable_mamba_shared_prefix_checkpoint", "False"), ("replayssm_buffer_len", "16"), ("use_replayssm", "False"),
    ("use_kda_recoverssm", "False"), ("num_gpu_blocks", "None"), ("num_cpu_blocks", "None"),
    ("simple_cpu_offload_num_blocks", "None"), ("effective_attention_block_size", "None"),
    ("kv_cache_size_tokens", "None"), ("kv_cache_max_concurrency", "None"), ("hash_block_size", "None"),
    ("cache_hit_alignment_tokens", "None"), ("kv_sharing_fast_prefill", "False"), ("swa_bounded_replay", "True"),
    ("kv_cache_memory_bytes", "None"), ("kv_offloading_size", "None"), ("kv_offloading_backend", "native"),
    ("_block_size_resolved", "True"),
)  # fmt: skip


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
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs)) + "}"


def cache_config_info(
    engines: Sequence[tuple[int, Engine]],
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    block_size_given: bool = False,
) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` (without `engine`) for the engines one API server fronts.

    As vLLM's front end fills them in after the engines report: `num_gpu_blocks` summed over the engines,
    the capacity in tokens and in max-length requests per engine.
    """
    info = dict(CACHE_CONFIG_DEFAULTS)
    if not engines:
        return info
    cfg = engines[0][1].cfg
    per_request = math.ceil(cfg.max_model_len / cfg.block_size)
    concurrency = cfg.num_blocks / per_request
    info.update(
        block_size=str(cfg.block_size),
        user_specified_block_size=str(block_size_given),
        cache_dtype=kv_cache_dtype,
        enable_prefix_caching=str(cfg.enable_prefix_caching),
        num_gpu_blocks=str(sum(eng.cfg.num_blocks for _, eng in engines)),
        kv_cache_size_tokens=str(int(concurrency * cfg.max_model_len)),
        kv_cache_max_concurrency=str(concurrency),
    )
    if gpu_memory_utilization is not None:
        info["gpu_memory_utilization"] = str(float(gpu_memory_utilization))
    return info


def render(
    engines: Sequence[tuple[int, Engine]], model_name: str, cache_info: dict[str, str] | None = None
) -> str:
    """The whole exposition for the engines this API server fronts. `cache_info`: the labels of
    `vllm:cache_config_info` (default: cache_config_info(engines))."""
    out: list[str] = []
    base = [(rank, eng, [("model_name", model_name), ("engine", str(rank))]) for rank, eng in engines]
    snaps = {rank: eng.snapshot() for rank, eng, _ in base}

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {name} {_escape_help(help_)}")
        out.append(f"# TYPE {name} {kind}")

    def per_engine(name: str, kind: str, help_: str, value: Callable[[int, Engine], float],
                   label: str | None = None, values: Sequence[str] = ("",),
                   by_value: Callable[[int, Engine, str], float] | None = None) -> None:  # fmt: skip
        """One family with a series per engine, or per (label value, engine) when `label` is given."""
        family(name, kind, help_)
        for lv in values:
            for rank, eng, lab in base:
                pairs = lab + [(label, lv)] if label else lab
                v = by_value(rank, eng, lv) if by_value else value(rank, eng)
                out.append(f"{name}{_labels(pairs)} {go_float(v)}")

    def zero(*_: object) -> float:
        return 0.0

    if any(eng.spec for _, eng, _ in base):
        spec = {rank: eng.spec_counters() for rank, eng, _ in base}
        for name, idx, help_ in (
            ("vllm:spec_decode_num_drafts_total", 0, "Number of spec decoding drafts."),
            ("vllm:spec_decode_num_draft_tokens_total", 1, "Number of draft tokens."),
            ("vllm:spec_decode_num_accepted_tokens_total", 2, "Number of accepted tokens."),
        ):
            per_engine(name, "counter", help_, lambda r, e, i=idx: spec[r][i])
        family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.")
        for rank, _, lab in base:
            for pos, count in enumerate(spec[rank][3]):
                out.append(
                    f"vllm:spec_decode_num_accepted_tokens_per_pos_total{_labels(lab + [('position', str(pos))])} "
                    f"{go_float(count)}"
                )

    # Model FLOPs utilisation estimates: vLLM registers them always and counts only with MFU metrics enabled.
    for name, what in (("flops", "floating point operations"), ("read_bytes", "bytes read from memory"),
                       ("write_bytes", "bytes written to memory")):  # fmt: skip
        per_engine(f"vllm:estimated_{name}_per_gpu_total", "counter",
                   f"Estimated number of {what} per GPU (for Model Flops Utilization calculations).", zero)

    per_engine("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               lambda r, e: snaps[r].running)
    per_engine("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               lambda r, e: snaps[r].waiting)
    # The mock defers nothing (no LoRA budget, KV transfer or blocked requests): every waiting one waits on capacity.
    per_engine("vllm:num_requests_waiting_by_reason", "gauge", WAITING_BY_REASON_HELP, zero, "reason", WAITING_REASONS,
               lambda r, e, why: snaps[r].waiting if why == "capacity" else 0.0)
    per_engine("vllm:engine_sleep_state", "gauge", SLEEP_STATE_HELP, zero, "sleep_state", SLEEP_STATES,
               lambda r, e, state: 1.0 if state == "awake" else 0.0)
    per_engine("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               lambda r, e: snaps[r].kv_usage)

    per_engine("vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", lambda r, e: e.stats.prefix_queries)
    per_engine("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
               lambda r, e: e.stats.prefix_hits)
    per_engine("vllm:external_prefix_cache_queries_total", "counter",
               "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number "
               "of queried tokens.", zero)
    per_engine("vllm:external_prefix_cache_hits_total", "counter",
               "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
               "cached tokens.", zero)
    per_engine("vllm:mm_cache_queries_total", "counter",
               "Multi-modal cache queries, in terms of number of queried items.", zero)
    per_engine("vllm:mm_cache_hits_total", "counter", "Multi-modal cache hits, in terms of number of cached items.",
               zero)

    per_engine("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
               lambda r, e: e.stats.preemptions)
    per_engine("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               lambda r, e: e.stats.prompt_tokens)
    per_engine("vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source.", zero,
               "source", PROMPT_TOKEN_SOURCES, _prompt_tokens_by_source)
    per_engine("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens (local + external).",
               lambda r, e: e.stats.prompt_tokens_cached)
    # vLLM counts the local prefix-cache hits under `device` when the scheduler reports them.
    per_engine("vllm:prompt_tokens_cached_by_source_total", "counter", CACHED_BY_SOURCE_HELP, zero, "source",
               CACHE_HIT_SOURCES, lambda r, e, src: e.stats.prefix_hits if src == "device" else 0.0)
    per_engine("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
               lambda r, e: e.generation_tokens())
    per_engine("vllm:request_success_total", "counter", "Count of successfully processed requests.", zero,
               "finished_reason", EngineStats.FINISH_REASONS, lambda r, e, why: e.stats.success.get(why, 0))
    # Per model, not per engine: the front end refuses before any engine is chosen. The mock has no queue limit.
    family("vllm:admission_rejections_total", "counter",
           "Number of admission attempts rejected by a queue limit, by reason.")
    for reason in ADMISSION_REASONS:
        out.append(f"vllm:admission_rejections_total{_labels([('model_name', model_name), ('reason', reason)])} 0.0")

    for name, help_, attr in HISTOGRAMS:
        family(name, "histogram", help_)
        for _, eng, lab in base:
            _histogram(out, name, lab, getattr(eng.stats, attr))

    info = cache_config_info(engines) if cache_info is None else cache_info
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for rank, _, _ in base:
        out.append(f"vllm:cache_config_info{_labels(list(info.items()) + [('engine', str(rank))])} 1.0")
    return "\n".join(out) + "\n"


def _prompt_tokens_by_source(rank: int, eng: Engine, source: str) -> float:
    s = eng.stats
    return {
        "local_compute": s.prompt_tokens - s.prompt_tokens_cached,
        "local_cache_hit": s.prompt_tokens_cached,
        "external_kv_transfer": 0,
    }[source]


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _histogram(out: list[str], name: str, lab: list[tuple[str, str]], h: Histogram) -> None:
    cum = h.cumulative()
    for bound, count in zip(list(h.bounds) + [math.inf], cum):
        out.append(f"{name}_bucket{_labels(lab + [('le', go_float(bound))])} {go_float(count)}")
    out.append(f"{name}_count{_labels(lab)} {go_float(h.n)}")
    out.append(f"{name}_sum{_labels(lab)} {go_float(h.total)}")
