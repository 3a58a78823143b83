"""The values the API admits for vLLM's enum settings: the ones that apply to DeepSeek V4.1 on Blackwell, each
a subset of what vLLM 0.33 knows (vllm_flags.json, written from vLLM itself). The API's Literal types, and so
the CRD's enums, are built from these tuples; this module refuses to load if one names a value vLLM lacks."""

from __future__ import annotations

from flashserve.facts.vllm_flags import (
    ALL2ALL_BACKENDS,
    BY_DEST,
    CUDAGRAPH_MODES,
    DEEP_GEMM_WARMUPS,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    MLA_ATTENTION_BACKENDS,
)

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

# Weight loaders for a safetensors checkpoint served as is: the default loader and its safetensors-only form,
# the GPU-direct loaders (fastsafetensors, instanttensor: their packages must be in the engine image) and the
# Run:ai streamer (concurrent reads from a file system or object store). Left out: formats for other
# checkpoints (pt, npcache, mistral, the pre-sharded ones, which need a checkpoint saved for one layout),
# loaders that need a server or daemon of their own (modelexpress, ipc_cache, tensorizer's serialized
# weights) and `dummy`, which serves random weights.
LOAD_FORMAT_CHOICES: tuple[str, ...] = ("auto", "safetensors", "fastsafetensors", "instanttensor", "runai_streamer")
# The formats DefaultModelLoader reads a safetensors checkpoint with on its multi-threaded path
# (model_loader/default_loader.py: enable_multithread_load applies to the safetensors iterator only).
MULTITHREAD_LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors")
DEEP_GEMM_WARMUP_CHOICES: tuple[str, ...] = DEEP_GEMM_WARMUPS
# `torchao` is for torchao-quantized checkpoints, which DeepSeek's are not.
SAFETENSORS_LOAD_STRATEGY_CHOICES: tuple[str, ...] = ("lazy", "eager", "prefetch")

_KNOWN = {
    "KV_CACHE_DTYPE_CHOICES": (KV_CACHE_DTYPE_CHOICES, KV_CACHE_DTYPES),
    "ATTENTION_BACKEND_CHOICES": (ATTENTION_BACKEND_CHOICES, MLA_ATTENTION_BACKENDS),
    "ALL2ALL_BACKEND_CHOICES": (ALL2ALL_BACKEND_CHOICES, ALL2ALL_BACKENDS),
    "LOAD_FORMAT_CHOICES": (LOAD_FORMAT_CHOICES, LOAD_FORMATS),
    "SAFETENSORS_LOAD_STRATEGY_CHOICES": (SAFETENSORS_LOAD_STRATEGY_CHOICES,
                                          BY_DEST["safetensors_load_strategy"].choices or ()),
}
for _name, (_chosen, _known) in _KNOWN.items():
    if set(_chosen) - set(_known):
        raise ImportError(f"{_name}: vLLM does not know {sorted(set(_chosen) - set(_known))}")
