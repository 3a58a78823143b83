"""The values the API admits for vLLM's enum settings: the ones that apply to DeepSeek V4.1 on Blackwell, each
a subset of what vLLM 0.33 knows (vllm_flags.json, written from vLLM itself). The API's Literal types, and so
the CRD's enums, are built from these tuples; this module refuses to load if one names a value vLLM lacks."""

from __future__ import annotations

from flashserve.facts.vllm_flags import ALL2ALL_BACKENDS, CUDAGRAPH_MODES, KV_CACHE_DTYPES, MLA_ATTENTION_BACKENDS

# FP8 and NVFP4 MLA layouts, plus the model's own dtype (auto); the per-head and turboquant caches are not
# MLA layouts.
KV_CACHE_DTYPE_CHOICES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "nvfp4_ds_mla")
# MLA backends that run on Blackwell (SM100); the ROCm, XPU and CPU ones do not.
ATTENTION_BACKEND_CHOICES: tuple[str, ...] = ("FLASHINFER_MLA", "FLASHMLA", "CUTLASS_MLA", "TRITON_MLA", "FLASHMLA_SPARSE")
CUDA_GRAPH_MODE_CHOICES: tuple[str, ...] = CUDAGRAPH_MODES
# The all-to-all kernels for NVIDIA GPUs; the ROCm (mori), pplx and naive ones are left out.
ALL2ALL_BACKEND_CHOICES: tuple[str, ...] = (
    "allgather_reducescatter",
    "deepep_low_latency",
    "deepep_high_throughput",
    "deepep_v2",
    "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
    "nixl_ep",
    "moonep",
)

_KNOWN = {
    "KV_CACHE_DTYPE_CHOICES": (KV_CACHE_DTYPE_CHOICES, KV_CACHE_DTYPES),
    "ATTENTION_BACKEND_CHOICES": (ATTENTION_BACKEND_CHOICES, MLA_ATTENTION_BACKENDS),
    "ALL2ALL_BACKEND_CHOICES": (ALL2ALL_BACKEND_CHOICES, ALL2ALL_BACKENDS),
}
for _name, (_chosen, _known) in _KNOWN.items():
    if set(_chosen) - set(_known):
        raise ImportError(f"{_name}: vLLM does not know {sorted(set(_chosen) - set(_known))}")
