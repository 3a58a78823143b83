"""The `vllm serve` flags of vLLM 0.33 that FlashServe knows about: one table shared by the argument builder
(which must only emit flags listed here) and the mock engine (which rejects flags not listed here).

Source: vLLM 0.33.0 engine/arg_utils.py, config/*, v1/metrics/* (see docs/vllm-0.33.md in the design notes).
`gpu_only` flags change how kernels run on a GPU and have no meaning for the CPU mock engine, which accepts
and ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    name: str
    takes_value: bool
    gpu_only: bool = False
    aliases: tuple[str, ...] = ()
    negatable: bool = False  # vLLM's BooleanOptionalAction: --x / --no-x


FLAGS: tuple[Flag, ...] = (
    # parallelism
    Flag("--tensor-parallel-size", True, aliases=("-tp",)),
    Flag("--pipeline-parallel-size", True, aliases=("-pp",)),
    Flag("--data-parallel-size", True, aliases=("-dp",)),
    Flag("--data-parallel-size-local", True, aliases=("-dpl",)),
    Flag("--data-parallel-start-rank", True, aliases=("-dpr",)),
    Flag("--data-parallel-address", True, aliases=("-dpa",)),
    Flag("--data-parallel-rpc-port", True, aliases=("-dpp",)),
    Flag("--data-parallel-hybrid-lb", False),
    Flag("--data-parallel-external-lb", False),
    Flag("--headless", False),
    Flag("--api-server-count", True),
    Flag("--enable-expert-parallel", False, aliases=("-ep",)),
    Flag("--all2all-backend", True, gpu_only=True),
    Flag("--enable-eplb", False, gpu_only=True),
    Flag("--eplb-config", True, gpu_only=True),
    Flag("--enable-dbo", False, gpu_only=True),
    Flag("--dbo-decode-token-threshold", True, gpu_only=True),
    Flag("--dbo-prefill-token-threshold", True, gpu_only=True),
    Flag("--ubatch-size", True, gpu_only=True),
    # model and cache
    Flag("--served-model-name", True),
    Flag("--revision", True),
    Flag("--trust-remote-code", False),
    Flag("--download-dir", True),
    Flag("--max-model-len", True),
    Flag("--kv-cache-dtype", True, gpu_only=True),
    Flag("--attention-backend", True, gpu_only=True),
    Flag("--enable-prefix-caching", False, negatable=True),
    Flag("--gpu-memory-utilization", True),
    Flag("--max-num-seqs", True),
    Flag("--max-num-batched-tokens", True),
    Flag("--speculative-config", True),
    Flag("--compilation-config", True, gpu_only=True),
    Flag("--async-scheduling", False, gpu_only=True),
    Flag("--block-size", True),
    Flag("--enforce-eager", False, gpu_only=True),
    Flag("--enable-chunked-prefill", False, negatable=True),
    Flag("--seed", True),
    # server and observability
    Flag("--host", True),
    Flag("--port", True),
    Flag("--uvicorn-log-level", True),
    Flag("--disable-log-requests", False),
    Flag("--enable-log-requests", False),
    Flag("--disable-uvicorn-access-log", False),
    Flag("--custom-histogram-buckets", True),
    Flag("--tool-call-parser", True),
    Flag("--enable-auto-tool-choice", False),
    Flag("--reasoning-parser", True),
    Flag("--generation-config", True),
)

BY_NAME: dict[str, Flag] = {}
for _flag in FLAGS:
    BY_NAME[_flag.name] = _flag
    for _alias in _flag.aliases:
        BY_NAME[_alias] = _flag
    if _flag.negatable:
        BY_NAME["--no-" + _flag.name[2:]] = _flag

HISTOGRAM_FAMILIES: tuple[str, ...] = (
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "iteration_tokens",
    "request_params_n",
    "request_num_preemptions",
    "request_tokens",
    "kv_cache_residency",
)

ALL2ALL_BACKENDS: tuple[str, ...] = (
    "allgather_reducescatter",
    "deepep_low_latency",
    "deepep_high_throughput",
    "deepep_v2",
    "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
    "nixl_ep",
    "moonep",
)
MLA_ATTENTION_BACKENDS: tuple[str, ...] = ("FLASHINFER_MLA", "FLASHMLA", "CUTLASS_MLA", "TRITON_MLA", "FLASHMLA_SPARSE")
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "nvfp4_ds_mla")
CUDAGRAPH_MODES: tuple[str, ...] = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

# Default histogram bucket bounds of vLLM 0.33 (seconds).
DEFAULT_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
DEFAULT_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)


def lookup(token: str) -> Flag | None:
    """The flag a command-line token names (`--x=v` form included), or None if vLLM 0.33 has no such flag."""
    return BY_NAME.get(token.split("=", 1)[0])
