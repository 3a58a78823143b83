"""Checks the start-up settings of rendered engine pods against the packages that read them, in the contract
venv (tools/vllm-contract/install.sh). Reads a JSON list of cases on stdin, each
`{"id", "argv": [...after vllm serve], "env": {...}, "mount": "<kernel cache mount>"}`, and prints one JSON
line per case:

  loader   the weight loader vLLM builds from the command line: `vllm serve`'s parser,
           AsyncEngineArgs.from_cli_args, create_load_config, then get_model_loader (whose constructor refuses
           model_loader_extra_config keys and values the chosen loader does not take), and what it holds;
  flags    enable_flashinfer_autotune as the parser set it;
  env      each cache variable as its reader reads it: vllm.envs (VLLM_CACHE_ROOT,
           VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, VLLM_DEEP_GEMM_WARMUP, whose choices vLLM checks on read),
           flashinfer_autotune_root() (where vLLM puts the autotune results), triton.knobs.cache.dir, and
           whether vLLM's Inductor set-up (compiler_interface.initialize_inductor_cache) keeps the pod's
           TRITON_CACHE_DIR or moves Triton elsewhere;
  derived  vLLM's own source for the paths it derives when a variable is unset (DG_JIT_CACHE_DIR);
  installed  which reader packages this venv holds (deep_gemm and flashinfer are not installed here).

Paths under `mount` are moved to a temporary directory first, so nothing is written outside it. Each case
runs in a forked child (engine_check.fork_call), so its environment never leaks into the next.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_check import _hf_cache, _model_and_revision, fork_call, prepare  # noqa: E402
from gen_flags import build_serve_parser  # noqa: E402

READERS = ("vllm", "triton", "deep_gemm", "flashinfer")


def _check(case: dict) -> dict:
    try:
        return _check_case(case)
    except Exception:
        import traceback

        traceback.print_exc()
        raise


def _check_case(case: dict) -> dict:
    out: dict = {"id": case["id"], "installed": {p: importlib.util.find_spec(p) is not None for p in READERS}}
    tmp = tempfile.mkdtemp(prefix="startup-", dir=os.environ["FLASHSERVE_CONTRACT_WORK"])
    mount = case.get("mount") or "/nonexistent-mount"
    env = {k: (tmp + v[len(mount):] if v.startswith(mount) else v) for k, v in (case.get("env") or {}).items()}
    out["tmp"] = tmp
    for key in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    for key in ("VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR",
                "FLASHINFER_WORKSPACE_BASE", "VLLM_DEEP_GEMM_WARMUP"):
        os.environ.pop(key, None)  # only what the pod sets
    os.environ.update(env)

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.model_loader import get_model_loader

    model, revision = _model_and_revision(case["argv"])
    if model:  # the synthetic checkpoint, offline, as engine_check.py lays it out
        _hf_cache(Path(os.environ["HF_HOME"]), model, revision)
    top, _ = build_serve_parser()
    try:
        args = top.parse_args(["serve", *case["argv"]])
        if getattr(args, "model_tag", None):  # as ServeSubcommand.cmd does before it builds the engine args
            args.model = args.model_tag
        engine_args = AsyncEngineArgs.from_cli_args(args)
        load_config = engine_args.create_load_config()
        loader = get_model_loader(load_config)
    except (ValueError, SystemExit, TypeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    extra = load_config.model_loader_extra_config
    out["loader"] = {
        "class": type(loader).__name__,
        "load_format": load_config.load_format,
        "model_loader_extra_config": extra if isinstance(extra, dict) else str(extra),
        "safetensors_load_strategy": load_config.safetensors_load_strategy,
    }
    out["flags"] = {"enable_flashinfer_autotune": getattr(args, "enable_flashinfer_autotune", "absent")}

    import vllm.envs as envs

    read: dict = {}
    for name in ("VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_DEEP_GEMM_WARMUP"):
        read[name] = {"registered": name in envs.environment_variables, "value": getattr(envs, name)}
    if env.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
        # Without the variable the root needs flashinfer (absent here) for its version and arch directories.
        from vllm.model_executor.warmup.flashinfer_autotune_cache import (
            flashinfer_autotune_root,
        )

        read["flashinfer_autotune_root"] = str(flashinfer_autotune_root())
    if out["installed"]["triton"]:
        from triton import knobs

        read["TRITON_CACHE_DIR"] = {"value": knobs.cache.dir}
        from vllm.compilation.compiler_interface import initialize_inductor_cache

        initialize_inductor_cache(os.path.join(tmp, "compile-base"))
        read["triton_after_inductor_setup"] = os.environ.get("TRITON_CACHE_DIR")
    out["env"] = read
    out["env_in"] = env

    import vllm.utils.deep_gemm as vllm_deep_gemm

    src = inspect.getsource(vllm_deep_gemm)
    derives = re.search(r'DEEP_GEMM_JIT_CACHE_ENV_NAME = "DG_JIT_CACHE_DIR".*?os\.environ\[DEEP_GEMM_JIT_CACHE_ENV_NAME\]'
                        r'\s*=\s*os\.path\.join\(\s*envs\.VLLM_CACHE_ROOT,\s*"deep_gemm"', src, re.DOTALL)
    # vLLM sets DG_JIT_CACHE_DIR to $VLLM_CACHE_ROOT/deep_gemm only when it is unset: the pod's value stands.
    out["derived"] = {"DG_JIT_CACHE_DIR": derives is not None and "if not os.environ.get(DEEP_GEMM_JIT_CACHE_ENV_NAME" in src}
    return out


def main() -> int:
    cases = json.load(sys.stdin)
    work = prepare()
    try:
        for case in cases:
            data, log = fork_call(_check, case)
            if os.environ.get("FLASHSERVE_CONTRACT_STDERR"):
                sys.stderr.write(log)
            verdict = json.loads(data) if data else {"error": f"harness: child died: {log[-2000:]}"}
            verdict.setdefault("id", case.get("id"))
            print(json.dumps(verdict), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
