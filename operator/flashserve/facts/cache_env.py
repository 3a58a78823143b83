"""The environment variables that place each kernel and JIT cache of a vLLM 0.33 engine, each taken from the
package that reads it, with where it reads it. The renderer points every one at the serving's kernel cache
volume (spec.startup.kernelCache); the API refuses them in spec.engine.env (managed.py).

tests/contract/test_startup_contract.py checks, in the contract venv, that vLLM and Triton read the names they
own and derive what `derived` says, and, in the source of the flashinfer-python wheel vLLM pins (downloaded
beside the venv: importing FlashInfer needs CUDA packages), that FlashInfer reads its name. DeepGEMM is not on
PyPI and vLLM's wheel does not depend on it: its name comes from its source, at the commit recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheEnv:
    name: str  # the environment variable
    subdir: str  # its directory under the serving's kernel cache key
    package: str  # the Python distribution (import name) that reads it
    source: str  # where that package reads it
    derived: str  # what the reader puts under it, or derives from it


CACHE_ENVS: tuple[CacheEnv, ...] = (
    CacheEnv(
        "VLLM_CACHE_ROOT", "vllm", "vllm",
        "vllm/envs.py, environment_variables['VLLM_CACHE_ROOT'] (default ~/.cache/vllm or $XDG_CACHE_HOME/vllm)",
        "torch_compile_cache/<hash>/ (Inductor, and Triton's kernels when TRITON_CACHE_DIR is unset: "
        "vllm/compilation/compiler_interface.py), deep_gemm/ when DG_JIT_CACHE_DIR is unset "
        "(vllm/utils/deep_gemm.py), flashinfer_autotune_cache/ when VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR is unset, "
        "modelinfos/, startup_plan/",
    ),
    CacheEnv(
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "flashinfer-autotune", "vllm",
        "vllm/envs.py; read by vllm/model_executor/warmup/flashinfer_autotune_cache.py:flashinfer_autotune_root",
        "<config hash>/autotune_configs*.json: FlashInfer's autotune results, keyed by vLLM's config hash",
    ),
    CacheEnv(
        "TRITON_CACHE_DIR", "triton", "triton",
        "triton/knobs.py, cache_knobs.dir (Triton 3.8.0; default $TRITON_HOME/.triton/cache)",
        "compiled Triton kernels (content-addressed) and, as vLLM enables TRITON_CACHE_AUTOTUNING, autotune results",
    ),
    CacheEnv(
        "DG_JIT_CACHE_DIR", "deep_gemm", "deep_gemm",
        "deepseek-ai/DeepGEMM csrc/jit/compiler.hpp (Compiler(): get_env(\"DG_JIT_CACHE_DIR\"), default "
        "$HOME/.deep_gemm) and README.md, commit 54e22612409371d6364144b69086735beb54e98b",
        "JIT-compiled DeepGEMM kernels",
    ),
    CacheEnv(
        "FLASHINFER_WORKSPACE_BASE", "flashinfer", "flashinfer",
        "flashinfer-python 0.7.2.post1 (vLLM 0.33's pin) flashinfer/jit/env.py: FLASHINFER_BASE_DIR = "
        "$FLASHINFER_WORKSPACE_BASE or $HOME, FLASHINFER_CACHE_DIR = FLASHINFER_BASE_DIR/.cache/flashinfer",
        ".cache/flashinfer/<version>/<arch>/cached_ops (JIT modules) and .cache/flashinfer/cubins (downloaded "
        "cubins, unless the flashinfer-cubin package is installed)",
    ),
)

CACHE_ENV_NAMES: frozenset[str] = frozenset(e.name for e in CACHE_ENVS)

# Start-up knobs read from the environment (the others are flags).
DEEP_GEMM_WARMUP_ENV = "VLLM_DEEP_GEMM_WARMUP"  # vllm/envs.py, env_with_choices: skip, full, relax (default)
