"""Runs `vllm serve` command lines through the real vLLM 0.33 on a CPU machine, as far as vLLM gets without a GPU.

Run with the contract venv's python (tools/vllm-contract/install.sh). Reads a JSON list of cases on stdin,
each `{"id": str, "argv": [...], "env": {...}, "accelerator": "GB200"}` where argv is what follows
`vllm serve` in the pod, and prints one JSON verdict per case, in order:
`{"id", "ok", "level", "error", "config": {...}}`, `level` the last level passed:

  parse    vLLM's own CLI: the `vllm` parser with its `serve` subcommand (FlexibleArgumentParser, its
           argv preprocessing, choices and types) and the subcommand's `validate`;
  serve    the checks `vllm serve` makes before it starts anything (load-balancing mode, api-server count,
           headless), by running ServeSubcommand.cmd with the launchers replaced by a recorder;
  args     AsyncEngineArgs.from_cli_args, as the launcher calls it;
  config   AsyncEngineArgs.create_engine_config (usage context OPENAI_API_SERVER, headless as the launcher
           passes it): ModelConfig from the synthetic checkpoint, parallel, cache, scheduler, speculative,
           compilation and observability configs and every cross-field check of VllmConfig.

A case with `"routes": true` also gets `routes`: the HTTP routes the pod's API server would answer, from the
app vLLM's launcher builds (served_routes); no server is started.

Each case runs in a forked child, so one case's environment, caches and platform never leak into the next.

What is stubbed, and nothing else:
  * the platform's device queries: a CUDA platform (vLLM's own CudaPlatformBase, every rule of it intact)
    whose device capability, name, count and memory are those of the case's accelerator (sm_100 for
    B200/GB200, sm_103 for B300/GB300) instead of an NVML/CUDA driver query;
  * the compiled extension modules that vLLM imports at config time and that need libcuda (`vllm._C*`,
    `vllm._qutlass_C`, ...): empty modules, so importing them succeeds; no kernel is ever called;
  * the checkpoint: the model id resolves, offline, to a Hugging Face cache holding only the synthetic
    `config.json` of `model/` beside this file and a tiny tokenizer with DeepSeek's special tokens (no weights).
    A PVC model path (`/models/...`) is pointed at the same files.
Not reached: weight loading, model construction, kernels, CUDA graphs, NCCL/torch.distributed, serving HTTP.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The target model and the DSpark draft vLLM builds from it for speculative decoding.
MODEL_ARCHITECTURES = ("DeepseekV41ForCausalLM", "DSparkV41DraftModel")
MODEL_DIR = HERE.parent / "model"

# name, compute capability, GPUs per node, memory per GPU (bytes). Memory: the usable HBM NVML reports.
ACCELERATORS = {
    "GB200": ("NVIDIA GB200", (10, 0), 4, 186 * 2**30),
    "B200": ("NVIDIA B200", (10, 0), 8, 179 * 2**30),
    "GB300": ("NVIDIA GB300", (10, 3), 4, 279 * 2**30),
    "B300": ("NVIDIA B300 SXM6 AC", (10, 3), 8, 268 * 2**30),
}

class _NativeStubLoader(importlib.abc.Loader):
    """Loads a compiled vLLM extension; when it cannot load (it links libcuda, absent here), an empty module
    takes its place, so importing it succeeds and its kernels are simply never there."""

    stubbed: list[str] = []

    def __init__(self, real: importlib.machinery.ExtensionFileLoader):
        self.real = real

    def create_module(self, spec):
        try:
            return self.real.create_module(spec)
        except ImportError:
            _NativeStubLoader.stubbed.append(spec.name)
            module = types.ModuleType(spec.name)
            module.__file__ = None
            module.__flashserve_stub__ = True
            return module

    def exec_module(self, module):
        if not getattr(module, "__flashserve_stub__", False):
            self.real.exec_module(module)


class _NativeStubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.startswith("vllm."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None
        spec.loader = _NativeStubLoader(spec.loader)
        return spec


def _stub_native_modules() -> None:
    sys.meta_path.insert(0, _NativeStubFinder())


class _Accelerator:
    """The accelerator the stub platform reports; set per case in the forked child."""

    name, capability, count, memory = ACCELERATORS["GB200"]


def _install_platform() -> None:
    """Make vLLM's current platform a CUDA platform that reports `_Accelerator`'s GPUs. Runs before anything
    imports `vllm.platforms.current_platform`, since importers keep the object they got."""
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    class BlackwellStub(CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            major, minor = _Accelerator.capability
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return _Accelerator.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return _Accelerator.memory

        @classmethod
        def device_count(cls) -> int:
            return _Accelerator.count

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True  # NVLink between every pair of a node's GPUs

        @classmethod
        def log_warnings(cls) -> None:
            pass

    platforms._current_platform = BlackwellStub()
    return BlackwellStub


def _import_model_stack(platform_cls) -> None:
    """Import the model class and its layers the way vLLM's registry inspects it: in a process without a GPU
    platform. Their import-time kernel probes (`torch.ops._C.*_supported`, fake-op registrations guarded by
    `hasattr(torch.ops._C, ...)`) then take their no-CUDA branches instead of calling kernels of the stubbed
    extensions. Module constants they set steer kernel choice at run time, not the config checks, which run
    afterwards on the CUDA platform. The config modules were imported before, with the platform on CUDA."""
    from vllm.platforms.interface import PlatformEnum

    platform_cls._enum = PlatformEnum.UNSPECIFIED
    try:
        import vllm.model_executor.model_loader  # noqa: F401
        from vllm.model_executor.models import ModelRegistry

        for arch in MODEL_ARCHITECTURES:
            ModelRegistry.models[arch].load_model_cls()
            # vLLM inspects the class in a subprocess and caches the answer per process: once here, before
            # forking, rather than once per case.
            if ModelRegistry._try_inspect_model_cls(arch) is None:
                raise RuntimeError(f"vLLM could not inspect {arch}")
    finally:
        platform_cls._enum = PlatformEnum.CUDA


def _hf_cache(root: Path, model: str, revision: str | None) -> None:
    """An offline Hugging Face hub cache in which `model` at `revision` holds the synthetic checkpoint."""
    commit = revision if revision and len(revision) == 40 and all(c in "0123456789abcdef" for c in revision) else "0" * 40
    repo = root / "hub" / ("models--" + model.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in {revision or "main", "main"}:
        ref_file = repo / "refs" / ref
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.write_text(commit)
    _write_checkpoint(snap)


def _write_checkpoint(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for f in MODEL_DIR.iterdir():
        if f.is_file():
            (target / f.name).write_bytes(f.read_bytes())
    _write_tokenizer(target)


def _write_tokenizer(target: Path) -> None:
    """A word-level tokenizer: DeepSeek's special tokens, a few words, and the vocabulary padded to the
    config's vocab_size so token ids line up with the embedding size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    special = json.loads((MODEL_DIR / "special_tokens.json").read_text())
    vocab: dict[str, int] = {}
    for tok in [*special["tokens"], "<unk>", *"abcdefghijklmnopqrstuvwxyz", "hello", "world"]:
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(special["tokens"])
    tok.save(str(target / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": special["bos"],
        "eos_token": special["eos"],
        "pad_token": special["pad"],
        "unk_token": "<unk>",
        "model_max_length": cfg["text_config"]["max_position_embeddings"],
        "add_bos_token": True,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def _model_and_revision(argv: list[str]) -> tuple[str | None, str | None]:
    model = argv[0] if argv and not argv[0].startswith("-") else None
    revision = None
    for i, a in enumerate(argv):
        if a == "--revision" and i + 1 < len(argv):
            revision = argv[i + 1]
        elif a.startswith("--revision="):
            revision = a.split("=", 1)[1]
    return model, revision


class _Launched(Exception):
    """Raised by the recording launcher: `vllm serve` got as far as starting a server."""

    def __init__(self, mode: str, args):
        self.mode, self.namespace = mode, args


def _check(case: dict) -> dict:
    return check_case(case)[0]


def check_case(case: dict):
    """The case's verdict, and the VllmConfig vLLM built (None where it refused)."""
    result = {"id": case["id"], "ok": False, "level": None, "error": None, "config": {}}
    vc = None
    argv = list(case["argv"])
    work = Path(tempfile.mkdtemp(prefix="case-", dir=os.environ["FLASHSERVE_CONTRACT_WORK"]))
    model, revision = _model_and_revision(argv)
    if model and model.startswith("/"):
        # A PVC path inside the pod: the same synthetic files at a local directory.
        local = work / "pvc" / model.strip("/")
        _write_checkpoint(local)
        argv[0] = str(local)
    elif model:
        _hf_cache(Path(os.environ["HF_HOME"]), model, revision)
    env = dict(case.get("env") or {})
    # The pod's HF_HOME points at its cache volume; here the cache is the synthetic one, fixed before
    # huggingface_hub was imported (it reads the variable once). Its kernel cache directories point at a
    # volume too: here vLLM keeps its caches beside the venv (startup_check.py checks those variables).
    for key in OFFLINE_ENV + POD_CACHE_ENV:
        env.pop(key, None)
    os.environ.update(env)

    _Accelerator.name, _Accelerator.capability, _Accelerator.count, _Accelerator.memory = ACCELERATORS[
        case.get("accelerator", "GB200")
    ]

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli import serve as serve_mod
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    stage = "parse"
    try:
        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        cmd = serve_mod.ServeSubcommand()
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        args = parser.parse_args(["serve", *argv])
        cmd.validate(args)
        result["level"] = "parse"

        stage = "serve"

        def recorder(mode):
            def launch(a, *rest, **kw):
                raise _Launched(mode, a)

            return launch

        serve_mod.run_headless = recorder("headless")
        serve_mod.run_multi_api_server = recorder("multi_api_server")
        serve_mod.run_dp_supervisor = recorder("dp_supervisor")
        serve_mod.run_server = recorder("api_server")
        serve_mod.uvloop = types.SimpleNamespace(run=lambda coro: coro)
        try:
            cmd.cmd(args)
            raise RuntimeError("vllm serve returned without starting a server")
        except _Launched as launched:
            mode, args = launched.mode, launched.namespace
        result["config"]["launch"] = mode
        result["config"]["api_server_count"] = args.api_server_count
        # A frontend option (the render routes vllm-router's cache_aware policy asks for): only in the namespace.
        result["config"]["enable_scale_out"] = getattr(args, "enable_scale_out", None)
        result["level"] = "serve"

        stage = "args"
        engine_args = AsyncEngineArgs.from_cli_args(args)
        result["level"] = "args"

        stage = "config"
        vc = engine_args.create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER, headless=mode == "headless"
        )
        result["level"] = "config"
        result["ok"] = True
        result["config"].update(_summary(vc))
        if case.get("routes"):
            stage = "routes"
            result["routes"] = served_routes(args, vc)
        result["stubbed_native_modules"] = sorted(set(_NativeStubLoader.stubbed))
    except BaseException as exc:  # noqa: BLE001 - every failure is a verdict, SystemExit from argparse included
        msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if isinstance(exc, SystemExit):
            msg = f"argparse exited ({exc.code}): {_stderr_tail()}"
        result["error"] = f"{stage}: {msg}"
        vc = None
        if os.environ.get("FLASHSERVE_CONTRACT_TRACEBACK"):
            result["traceback"] = traceback.format_exc()
    return result, vc


def served_routes(args, vc) -> list[str]:
    """What the pod's API server would answer: the FastAPI app vLLM's own launcher builds (build_app) from the
    namespace `vllm serve` handed it, for a generative model (the tasks a generate runner reports), as
    "METHOD /path"; a route that answers only 403 (the scale-out routes without --enable-scale-out) ends in
    " (403)". Built, not served: no socket is opened."""
    from vllm.entrypoints.launchers.app import build_app

    app = build_app(args, ("generate",), vc.model_config)
    out = set()
    for route in app.routes:
        refused = getattr(getattr(route, "endpoint", None), "__name__", "") == "disabled_scale_out"
        for method in sorted(getattr(route, "methods", None) or ["*"]):
            out.add(f"{method} {route.path}" + (" (403)" if refused else ""))
    return sorted(out)


_STDERR_FILE: Path | None = None


def _stderr_tail() -> str:
    if _STDERR_FILE is None:
        return ""
    sys.stderr.flush()
    lines = [ln for ln in _STDERR_FILE.read_text(errors="replace").splitlines() if "error:" in ln]
    return lines[-1].strip() if lines else ""


def _summary(vc) -> dict:
    """The settings the contract tests compare with what the operator meant to configure."""
    pc, mc, cc, sc = vc.parallel_config, vc.model_config, vc.cache_config, vc.scheduler_config
    spec = vc.speculative_config
    out = {
        "max_model_len": mc.max_model_len,
        "tensor_parallel_size": pc.tensor_parallel_size,
        "data_parallel_size": pc.data_parallel_size,
        "data_parallel_size_local": pc.data_parallel_size_local,
        "data_parallel_rank": pc.data_parallel_rank,
        "enable_expert_parallel": pc.enable_expert_parallel,
        "enable_eplb": pc.enable_eplb,
        "enable_dbo": getattr(pc, "enable_dbo", None),
        "all2all_backend": getattr(pc, "all2all_backend", None),
        "enable_prefix_caching": cc.enable_prefix_caching,
        "cache_dtype": str(cc.cache_dtype),
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "async_scheduling": sc.async_scheduling,
        "speculative_method": spec.method if spec is not None else None,
        "num_speculative_tokens": spec.num_speculative_tokens if spec is not None else None,
        "cudagraph_mode": str(vc.compilation_config.cudagraph_mode),
        "served_model_name": mc.served_model_name,
        "use_v2_model_runner": getattr(vc, "use_v2_model_runner", None),
    }
    obs = vc.observability_config
    buckets = getattr(obs, "custom_histogram_buckets", None)
    if buckets is not None:
        out["custom_histogram_buckets"] = {k: list(v) for k, v in dict(buckets).items()}
    return json.loads(json.dumps(out, default=str))


def fork_call(fn, arg) -> tuple[str | None, str]:
    """Run `fn(arg)` in a forked child: its JSON result (None if the child died) and what it logged. vLLM
    logs to stdout, so the child's stdout and stderr go to a file and the result comes through a pipe."""
    global _STDERR_FILE
    r, w = os.pipe()
    log = Path(tempfile.mkstemp(prefix="vllm-contract-log-")[1])
    pid = os.fork()
    if pid == 0:
        os.close(r)
        fd = os.open(log, os.O_WRONLY | os.O_TRUNC)
        os.dup2(fd, 2)
        os.dup2(fd, 1)
        _STDERR_FILE = log
        try:
            out = json.dumps(fn(arg))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the case
            out = json.dumps({"error": f"harness: {type(exc).__name__}: {exc}"})
        with os.fdopen(w, "w") as f:
            f.write(out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    text = log.read_text(errors="replace")
    log.unlink(missing_ok=True)
    return (data or None), text


def _run_forked(case: dict) -> dict:
    data, log = fork_call(_check, case)
    if data is None:
        return {"id": case.get("id"), "ok": False, "level": None, "error": f"harness: child died: {log[-2000:]}"}
    if os.environ.get("FLASHSERVE_CONTRACT_STDERR"):
        sys.stderr.write(log)
    verdict = json.loads(data)
    verdict.setdefault("id", case.get("id"))
    verdict.setdefault("ok", False)
    verdict.setdefault("level", None)
    return verdict


# Set for the whole run, before vLLM and huggingface_hub are imported.
OFFLINE_ENV = ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# The kernel cache variables the operator sets (operator/flashserve/facts/cache_env.py; a contract test holds
# the two lists equal).
POD_CACHE_ENV = ("VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR",
                 "FLASHINFER_WORKSPACE_BASE")


def prepare() -> str:
    """Set-up before any case, shared by the harness scripts: an offline Hugging Face cache, the stubbed native
    modules and platform, and the heavy imports once (each forked child then starts at once). Returns the
    work directory, to remove at the end."""
    work = tempfile.mkdtemp(prefix="vllm-contract-")
    os.environ["FLASHSERVE_CONTRACT_WORK"] = work
    os.environ.update({"HF_HOME": os.path.join(work, "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    # vLLM caches what it learnt inspecting a model class (in a subprocess, ~10 s a class) under its cache
    # root: keep that beside the venv so later runs skip it.
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(sys.prefix, "vllm-cache"))
    _stub_native_modules()
    platform_cls = _install_platform()
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.entrypoints.cli.serve  # noqa: F401
    import vllm.v1.metrics.loggers  # noqa: F401
    _import_model_stack(platform_cls)
    return work


def main() -> int:
    cases = json.load(sys.stdin)
    work = prepare()
    started = time.monotonic()
    try:
        for i, case in enumerate(cases, 1):
            t0 = time.monotonic()
            verdict = _run_forked(case)
            verdict["seconds"] = round(time.monotonic() - t0, 2)
            print(json.dumps(verdict), flush=True)
            sys.stderr.write(
                f"[engine-check] {i}/{len(cases)} {case['id']}: {'ok' if verdict['ok'] else 'REFUSED'} "
                f"({verdict['seconds']:.1f}s, {time.monotonic() - started:.0f}s total)\n"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
