"""The vLLM 0.33 command line and environment of an engine pod, built from a DeepSeekServing spec.

Every flag emitted here must be a `vllm serve` option of the table in vllm_flags (a test holds the builder to
that), and every setting it emits is refused in spec.engine.extraArgs (MANAGED_DESTS). A multi-node group
differs per pod only in `--data-parallel-start-rank`, which a fixed wrapper script computes from the pod's
index; user-supplied values reach that script only as separate arguments, never as script text.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence

from flashserve.accelerators import accelerator
from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.layout import Layout
from flashserve.vllm_flags import (
    BY_DEST,
    BY_FLAG,
    DEFAULT_ITL_BUCKETS,
    DEFAULT_TTFT_BUCKETS,
    VLLM_VERSION,
    Option,
    covered_by,
    cover_regex,
    covers,
    matching_flags,
    read_token,
    resolve,
)

MODEL_MOUNT = "/models"
HF_HOME = "/var/cache/huggingface"

# Environment variables the wrapper script reads: set by the operator, never by users.
POD_INDEX_ENV = "FLASHSERVE_POD_INDEX"
DP_LOCAL_ENV = "FLASHSERVE_DP_LOCAL"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# The whole script is this constant: pod index and ranks per node come from the environment, and the vLLM
# arguments (which carry user values) arrive as "$@".
START_RANK_SCRIPT = (
    'case "$FLASHSERVE_POD_INDEX$FLASHSERVE_DP_LOCAL" in ""|*[!0-9]*) '
    'echo "flashserve: bad pod index or ranks per node" >&2; exit 64;; esac\n'
    'exec vllm serve "$@" --data-parallel-start-rank "$((FLASHSERVE_POD_INDEX * FLASHSERVE_DP_LOCAL))"\n'
)

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
    # options that escape the guard or end the process
    "config": "not supported: a config file can set any flag, the managed ones too; list the flags in extraArgs",
    "help": "not supported: vLLM would print its help and exit",
}

# Settings whose value is a secret: inline it would sit in the DeepSeekServing for anyone who can read it.
SECRET_DESTS: dict[str, str] = {
    "hf_token": "spec.model.source.huggingFace.tokenSecretRef",
    "api_key": "spec.engine.env (VLLM_API_KEY with valueFrom.secretKeyRef)",
}
REFUSED_DESTS: frozenset[str] = frozenset(MANAGED_DESTS) | frozenset(SECRET_DESTS)
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
)


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


# Multiples of an SLA latency that get a bucket bound: about +-5% near the target, coarser out to 0.25x and 4x.
SLA_BUCKET_FACTORS: tuple[float, ...] = (
    0.25, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 3.0, 4.0,
)


def _around(defaults: tuple[float, ...], targets: set[float]) -> list[float]:
    bounds = set(defaults)
    for target in targets:
        bounds |= {round(target * f, 6) for f in SLA_BUCKET_FACTORS}
    return sorted(b for b in bounds if b > 0)


def itl_buckets(sla_tokens_per_second: float, tokens_per_step: float = 1.0) -> list[float]:
    """Inter-token-latency bucket bounds with fine resolution around the SLA's latency.

    A 100 tok/s SLA is a 10 ms ITL: vLLM's lowest default bound, so histogram_quantile could not tell
    110 tok/s from 1000 tok/s. vLLM observes ITL once per engine step, and with MTP a step yields up to
    1 + num_speculative_tokens tokens, so the step latency at the SLA is tokens_per_step / SLA. The same
    bucket family also holds `vllm:request_time_per_output_token_seconds` (one observation per request, per
    output token), the autoscaler's SLA reading, whose value at the SLA is 1 / SLA. Bounds from 0.25x to 4x
    of both latencies (about +-5% near them) are merged with the defaults so dashboards keep working.
    """
    return _around(DEFAULT_ITL_BUCKETS, {tokens_per_step / sla_tokens_per_second, 1.0 / sla_tokens_per_second})


def ttft_buckets(ttft_seconds: float) -> list[float]:
    """Time-to-first-token bucket bounds with fine resolution around `sla.ttftSeconds`.

    vLLM's defaults have no bound between 1.0 and 2.5 s, and histogram_quantile interpolates linearly inside
    a bucket: a steady 1.1 s TTFT reads as p90 2.35 s and breaches a 2 s target. Bounds from 0.25x to 4x of
    the target (about +-5% near it) are merged with the defaults, as for the ITL.
    """
    return _around(DEFAULT_TTFT_BUCKETS, {ttft_seconds})


def model_argument(spec: DeepSeekServingSpec) -> str:
    pvc = spec.model.source.pvc
    if pvc is not None:
        return f"{MODEL_MOUNT}/{pvc.path.strip('/')}".rstrip("/")
    return spec.model.name


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def vllm_args(spec: DeepSeekServingSpec, lay: Layout, leader_address: str | None = None) -> list[str]:
    """Arguments after `vllm serve`. For a multi-node group `leader_address` is pod 0's stable DNS name; the
    per-pod start rank is appended by START_RANK_SCRIPT."""
    eng, par = spec.engine, spec.parallelism
    args = [model_argument(spec)]
    # One flag with every name: vLLM's flag takes several values, and a repeated flag keeps only the last.
    args += ["--served-model-name", *spec.model.served_model_names]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--port", str(eng.port)]
    args += ["--tensor-parallel-size", str(lay.tensor_parallel)]
    args += ["--data-parallel-size", str(lay.dp_size)]
    if lay.multi_node:
        # Hybrid load balancing on every pod: each serves the API for its own ranks. Without the flag, pod 0
        # (start rank 0) would act as the balancer for the whole group while the others balance locally.
        args += ["--data-parallel-hybrid-lb", "--data-parallel-size-local", str(lay.dp_local)]
        args += ["--data-parallel-address", leader_address or "", "--data-parallel-rpc-port", str(par.rpc_port)]
    if par.expert_parallel:
        args.append("--enable-expert-parallel")
    if par.all2all_backend:
        args += ["--all2all-backend", par.all2all_backend]
    if par.eplb.enabled:
        cfg = {
            "num_redundant_experts": par.eplb.num_redundant_experts,
            "window_size": par.eplb.window_size,
            "step_interval": par.eplb.step_interval,
        }
        args += ["--enable-eplb", "--eplb-config", _json(cfg)]
    if par.dbo.enabled:
        args += [
            "--enable-dbo",
            "--dbo-decode-token-threshold",
            str(par.dbo.decode_token_threshold),
            "--dbo-prefill-token-threshold",
            str(par.dbo.prefill_token_threshold),
        ]
    args.append("--enable-prefix-caching" if eng.prefix_caching else "--no-enable-prefix-caching")
    if eng.attention_backend:
        args += ["--attention-backend", eng.attention_backend]
    args += ["--kv-cache-dtype", eng.kv_cache_dtype]
    args += ["--max-model-len", str(eng.max_model_len)]
    args += ["--gpu-memory-utilization", f"{eng.gpu_memory_utilization:g}"]
    args += ["--max-num-seqs", str(eng.max_num_seqs), "--max-num-batched-tokens", str(eng.max_num_batched_tokens)]
    if spec.speculative_decoding():
        # DeepSeek V4.1 checkpoints carry DSpark draft stages, not a classic MTP head: vLLM refuses "mtp".
        spec_cfg = {"method": "dspark", "num_speculative_tokens": eng.speculative.num_speculative_tokens}
        args += ["--speculative-config", _json(spec_cfg)]
    if eng.cuda_graph_mode:
        args += ["--compilation-config", _json({"cudagraph_mode": eng.cuda_graph_mode})]
    if eng.async_scheduling is not None:
        # Unset leaves it to vLLM, which turns it on where supported: off must be said.
        args.append("--async-scheduling" if eng.async_scheduling else "--no-async-scheduling")
    # Centre on the expected step latency: between one token per step (no draft accepted) and all accepted.
    drafts = eng.speculative.num_speculative_tokens if spec.speculative_decoding() else 0
    buckets = {"inter_token_latency": itl_buckets(spec.autoscaling.sla.per_user_tokens_per_second, 1 + 0.8 * drafts)}
    if spec.autoscaling.sla.ttft_seconds is not None:
        buckets["time_to_first_token"] = ttft_buckets(spec.autoscaling.sla.ttft_seconds)
    args += ["--custom-histogram-buckets", _json(buckets)]
    return args + list(eng.extra_args)


def command(lay: Layout) -> list[str]:
    """The container command; `vllm_args` follow as the container's args."""
    if lay.multi_node:
        # "$0" is "vllm" (for messages); the args become "$@".
        return ["/bin/sh", "-c", START_RANK_SCRIPT, "vllm"]
    return ["vllm", "serve"]


def engine_env(spec: DeepSeekServingSpec, lay: Layout) -> list[dict]:
    """Environment the operator sets for the engine container (before the user's own)."""
    env: list[dict] = []
    if lay.multi_node:
        env.append(
            {
                "name": POD_INDEX_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}},
            }
        )
        env.append({"name": DP_LOCAL_ENV, "value": str(lay.dp_local)})
        env.append({"name": "GLOO_SOCKET_IFNAME", "value": "eth0"})
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": "eth0"})
        if accelerator(spec.placement.accelerator).multi_node_nvlink:
            env += [{"name": n, "value": "1"} for n in ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE")]
    if spec.speculative_decoding():
        # DSpark runs only on vLLM's V2 model runner; unset, vLLM may fall back to V1 and refuse it.
        env.append({"name": V2_RUNNER_ENV, "value": "1"})
    source = spec.model.source
    if source.pvc is not None:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    else:
        env.append({"name": "HF_HOME", "value": HF_HOME})
        hf = source.hugging_face
        if hf is not None and hf.token_secret_ref is not None:
            ref = hf.token_secret_ref
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env += [e.dump() for e in spec.engine.env]
    return env
