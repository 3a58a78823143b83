"""The settings the operator manages and refuses from users: vLLM flags (by argparse dest) and environment
variables. The API's validation and the CRD's CEL rule read them to refuse spec.engine.extraArgs and
spec.engine.env items; the argument builder (render/vllm_args.py) emits them, and a test holds everything it
emits to this list."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from flashserve.facts.cache_env import CACHE_ENV_NAMES, DEEP_GEMM_WARMUP_ENV
from flashserve.facts.vllm_flags import (
    BY_DEST,
    BY_FLAG,
    VLLM_VERSION,
    Option,
    cover_regex,
    covered_by,
    covers,
    matching_flags,
    resolve,
)

# Environment variables the wrapper script reads: set by the operator, never by users.
POD_INDEX_ENV = "FLASHSERVE_POD_INDEX"
DP_LOCAL_ENV = "FLASHSERVE_DP_LOCAL"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


# Settings (argparse dests) the operator owns: setting them through extraArgs would desynchronise the pods of a
# group, the probes or the metrics, so every spelling vLLM accepts for them is refused, with the spec field to
# use (a value starting with "spec.") or why it cannot be set. Everything vllm_args() emits is here (a test
# holds it to that), and some settings it does not emit that would undo or bypass what it does emit.
MANAGED_DESTS: dict[str, str] = {
    # the model
    "model": "spec.model.name",
    "served_model_name": "spec.model.servedModelNames",
    "revision": "spec.model.revision",
    "trust_remote_code": "spec.model.trustRemoteCode",
    "download_dir": "spec.model.source",
    # the API server the probes, the router and Prometheus reach over plain HTTP
    "port": "spec.engine.port",
    "host": "the engine listens on all pod interfaces",
    "uds": "the probes and the router reach the engine over TCP",
    "grpc": "the probes, the router and Prometheus speak HTTP",
    "ssl_certfile": "the probes, the router and Prometheus speak plain HTTP",
    "ssl_keyfile": "the probes, the router and Prometheus speak plain HTTP",
    "headless": "every pod of a group serves the API",
    "api_server_count": "vLLM derives it from the group's data-parallel layout",
    "disable_log_stats": "the autoscaler reads the engine's Prometheus metrics",
    "enable_scale_out": "spec.routing.policy (cache_aware turns it on: the router renders prompts on every engine)",
    "custom_histogram_buckets": "finer inter-token latency and time-to-first-token buckets around the SLA",
    # parallelism and the group's wiring
    "tensor_parallel_size": "spec.parallelism.tensorParallelSize",
    "pipeline_parallel_size": "not supported: use more nodes per replica",
    "prefill_context_parallel_size": "not supported: it multiplies the GPUs per data-parallel rank",
    "nnodes": "spec.parallelism.nodesPerReplica",
    "node_rank": "computed from the pod index",
    "master_addr": "the group's leader pod",
    "master_port": "the group's leader pod",
    "data_parallel_size": "spec.parallelism.dataParallelSizeLocal and nodesPerReplica",
    "data_parallel_size_local": "spec.parallelism.dataParallelSizeLocal",
    "data_parallel_start_rank": "computed from the pod index",
    "data_parallel_rank": "computed from the pod index",
    "data_parallel_address": "the group's leader pod",
    "data_parallel_rpc_port": "spec.parallelism.rpcPort",
    "data_parallel_backend": "the operator runs data-parallel ranks as processes",
    "data_parallel_hybrid_lb": "the operator sets the load-balancing mode",
    "data_parallel_external_lb": "the operator sets the load-balancing mode",
    "data_parallel_multi_port_external_lb": "the operator sets the load-balancing mode",
    "data_parallel_supervisor_port": "the operator sets the load-balancing mode",
    "enable_elastic_ep": "not supported: the operator scales whole replica groups",
    "enable_expert_parallel": "spec.parallelism.expertParallel",
    "all2all_backend": "spec.parallelism.all2allBackend",
    "enable_eplb": "spec.parallelism.eplb.enabled",
    "eplb_config": "spec.parallelism.eplb",
    "enable_dbo": "spec.parallelism.dbo.enabled",
    "dbo_decode_token_threshold": "spec.parallelism.dbo.decodeTokenThreshold",
    "dbo_prefill_token_threshold": "spec.parallelism.dbo.prefillTokenThreshold",
    # cache, batching, kernels
    "enable_prefix_caching": "spec.engine.prefixCaching",
    "attention_backend": "spec.engine.attentionBackend",
    "attention_config": "spec.engine.attentionBackend",  # its `backend` key is the attention backend
    "kv_cache_dtype": "spec.engine.kvCacheDtype",
    "max_model_len": "spec.engine.maxModelLen",
    "gpu_memory_utilization": "spec.engine.gpuMemoryUtilization",
    "kv_cache_memory_bytes": "spec.engine.gpuMemoryUtilization",  # when set, vLLM ignores the utilization
    "max_num_seqs": "spec.engine.maxNumSeqs",
    "max_num_batched_tokens": "spec.engine.maxNumBatchedTokens",
    "speculative_config": "spec.engine.speculative",
    "spec_method": "spec.engine.speculative",
    "spec_model": "spec.engine.speculative",
    "spec_tokens": "spec.engine.speculative",
    "compilation_config": "spec.engine.cudaGraphMode",
    "optimization_level": "spec.engine.cudaGraphMode",  # -O picks the compilation and CUDA graph defaults
    "async_scheduling": "spec.engine.asyncScheduling",
    # start-up: weight loading and warm-up
    "load_format": "spec.startup.loader.format",
    "model_loader_extra_config": "spec.startup.loader",
    "safetensors_load_strategy": "spec.startup.loader.safetensorsLoadStrategy",
    "enable_flashinfer_autotune": "spec.startup.warmup.flashinferAutotune",
    # options that escape the guard or end the process
    "config": "not supported: a config file can set any flag, the managed ones too; list the flags in extraArgs",
    "help": "not supported: vLLM would print its help and exit",
}

# Settings whose value is a secret: inline it would sit in the DeepSeekServing for anyone who can read it.
SECRET_DESTS: dict[str, str] = {
    "hf_token": "spec.model.source.huggingFace.tokenSecretRef",
    "api_key": "spec.engine.env (VLLM_API_KEY with valueFrom.secretKeyRef)",
}
# Settings that open routes on the engines' API port beyond the inference, tokenizer and read-only ones.
# vllm-router forwards every path it does not serve itself to an engine, so whatever the engines answer, every
# client of the serving can call. Which routes each one opens is the real wheel's answer (tests/contract/routes.py
# and test_engine_contract.py); docs/routing.md, "Every path the router does not serve goes to an engine".
ROUTE_DESTS: dict[str, str] = {
    "profiler_config": "/start_profile and /stop_profile",
    "tokens_only": "the token-in/token-out routes and an /abort_requests that skips the API key",
}
ROUTE_ENV: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": "/collective_rpc, /sleep, /pause, /update_weights, /reset_prefix_cache and more",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "/v1/load_lora_adapter, /v1/unload_lora_adapter and /adapters",
}
ROUTES_HINT = ("on every engine, where any client of the serving can call them (the router forwards every path "
               "to the engines): remove it")
REFUSED_DESTS: frozenset[str] = frozenset(MANAGED_DESTS) | frozenset(SECRET_DESTS) | frozenset(ROUTE_DESTS)
# Token prefixes that can only mean a refused setting (or a flag vLLM would refuse): the Python guard and the
# CRD's CEL rule both use them, so the API server and `flashserve validate` agree.
REFUSED_COVER = covers(REFUSED_DESTS)

# Environment the operator sets; users may not override it through spec.engine.env.
MANAGED_ENV: frozenset[str] = frozenset(
    {
        POD_INDEX_ENV,
        DP_LOCAL_ENV,
        V2_RUNNER_ENV,
        "HF_TOKEN",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "VLLM_PORT",
        "VLLM_HOST_IP",
        "NCCL_MNNVL_ENABLE",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    }
) | CACHE_ENV_NAMES | {DEEP_GEMM_WARMUP_ENV}


def managed_flag_of(arg: str) -> str | None:
    """The refused setting (dest) an extra argument would set, else None; for a prefix that several refused
    options share, the first of them. Position-blind, as the CRD's CEL rule: it judges one item alone."""
    prefix = covered_by(arg, REFUSED_COVER)
    if prefix is None:
        return None
    res = resolve(arg)
    if res.option is not None and res.option.dest in REFUSED_DESTS:
        return res.option.dest
    dests = sorted({BY_FLAG[f].dest for f in matching_flags(prefix)} & REFUSED_DESTS)
    return dests[0] if dests else "optimization_level"  # only -O has no option string of its own


def managed_arg_pattern() -> str:
    """The RE2 pattern the CRD refuses extraArgs items with; matches exactly where managed_flag_of is not None."""
    return cover_regex(REFUSED_COVER)


def _refusal(arg: str, dest: str) -> str:
    flag = BY_DEST[dest].name
    if dest in SECRET_DESTS:
        return f"{arg!r} sets {flag}, a secret that would sit in the resource: use {SECRET_DESTS[dest]} instead"
    if dest in ROUTE_DESTS:
        res = resolve(arg)
        if res.flag is not None and res.flag in BY_DEST[dest].negative:
            # Position-blind like the CEL rule, so the harmless spelling is refused too: say what it is.
            return f"{arg!r} turns {flag} off, which is already its setting: remove it"
        return f"{arg!r} sets {flag}, which opens {ROUTE_DESTS[dest]} {ROUTES_HINT}"
    hint = MANAGED_DESTS[dest]
    if hint.startswith("spec."):
        return f"{arg!r} sets {flag}, which the operator manages: use {hint} instead"
    return f"{arg!r} sets {flag}, which the operator manages ({hint}): remove it"


_TAKES = {"1": "one", "?": "optional", "+": "some", "*": "many"}


def extra_args_errors(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, message) for each item of spec.engine.extraArgs that vLLM would read as a refused setting,
    could not read (an unknown or ambiguous flag, a missing or invalid value: vLLM would exit at start), or
    would read as a positional argument (a second model), or a bare `--`, after which nothing can be checked.

    The items follow the operator's own flags, which leave no option waiting for a value."""
    errors: list[tuple[int, str]] = []
    takes: str | None = None  # what the items after an option are: "one", "optional", "some", "many", "any"
    owner: tuple[int, Option | None] | None = None

    def check_choice(i: int, option: Option | None, value: str) -> None:
        if option is not None and option.value == "str" and option.choices and value not in option.choices:
            choices = ", ".join(map(str, option.choices))
            errors.append((i, f"{value!r} is not a choice of {option.name}: choose from {choices}"))

    def needs_value() -> None:
        if takes in ("one", "some", "any") and owner is not None and owner[0] not in {i for i, _ in errors}:
            errors.append((owner[0], f"{args[owner[0]]!r} needs a value: add it as the next item"))

    for i, arg in enumerate(args):
        res, refused = resolve(arg), managed_flag_of(arg)
        if takes == "any":  # FlexibleArgumentParser takes the item after `--x.key` as its value, whatever it is
            takes, owner = None, None
            if refused is not None:  # still refused: the CRD's rule judges every item alone
                errors.append((i, _refusal(arg, refused)))
            continue
        tok, option = res.token, res.option
        if tok.kind == "value" and refused is None:
            if takes is None:
                errors.append((i, f"{arg!r} is a positional argument: vllm serve would take it for a second model "
                                  "(the model is spec.model.name); give it as the value of a flag"))  # fmt: skip
            else:
                check_choice(i, owner[1] if owner else None, arg)
                takes = "many" if takes in ("some", "many") else None
            continue
        needs_value()
        takes, owner = None, None
        if tok.kind == "end":
            errors.append((i, "a bare '--' makes vLLM read every later argument, the operator's too, as a "
                              "positional argument: remove it"))  # fmt: skip
            continue
        glued = tok.inline if tok.inline is not None else res.glued
        if refused is not None and option is None and len(res.candidates) > 1:
            errors.append((i, f"{arg!r} is ambiguous to vLLM {VLLM_VERSION} (it could be "
                              f"{', '.join(res.candidates)}), and the operator manages those: remove it"))  # fmt: skip
        elif refused is not None and not res.candidates:
            errors.append((i, f"{arg!r} is not a vllm serve flag of vLLM {VLLM_VERSION}, which would exit at "
                              f"start; it looks like {_refusal(arg, refused).split(' sets ', 1)[1]}"))  # fmt: skip
        elif refused is not None:
            errors.append((i, _refusal(arg, refused)))
        elif len(res.candidates) > 1:
            more = ", ..." if len(res.candidates) > 4 else ""
            errors.append((i, f"{arg!r} is ambiguous to vLLM {VLLM_VERSION} (it could be "
                              f"{', '.join(res.candidates[:4])}{more}): spell the flag out"))  # fmt: skip
        elif option is None:
            close = difflib.get_close_matches(tok.key, list(BY_FLAG), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            errors.append((i, f"{arg!r} is not a vllm serve flag of vLLM {VLLM_VERSION}, which would exit at "
                              f"start{hint}: check the spelling"))  # fmt: skip
        elif glued is not None and not option.takes_value:
            errors.append((i, f"{arg!r}: {option.name} is a switch and takes no value: drop the value"))
        elif glued is not None and tok.dotted is None:
            check_choice(i, option, glued)
        if tok.dotted is not None:
            takes = None if tok.inline is not None else "any"
        elif glued is None:
            takes = _TAKES.get(option.nargs) if option is not None else "optional"  # an unknown flag's value
        owner = (i, option) if takes else None
    needs_value()
    return sorted(errors)
