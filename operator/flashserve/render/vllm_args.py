"""The vLLM 0.33 command line and environment of an engine pod, built from a DeepSeekServing spec.

Every flag emitted here must be a `vllm serve` option of the table in vllm_flags (a test holds the builder to
that), and every setting it emits is refused in spec.engine.extraArgs (MANAGED_DESTS). A multi-node group
differs per pod only in `--data-parallel-start-rank`, which a fixed wrapper script computes from the pod's
index; user-supplied values reach that script only as separate arguments, never as script text.
"""

from __future__ import annotations

import hashlib
import json

from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.facts.accelerators import accelerator
from flashserve.facts.cache_env import CACHE_ENVS, DEEP_GEMM_WARMUP_ENV
from flashserve.facts.layout import Layout
from flashserve.facts.managed import DP_LOCAL_ENV, POD_INDEX_ENV, V2_RUNNER_ENV
from flashserve.facts.vllm_flags import (
    DEFAULT_ITL_BUCKETS,
    DEFAULT_TTFT_BUCKETS,
)

MODEL_MOUNT = "/models"
HF_HOME = "/var/cache/huggingface"
# Where spec.startup.kernelCache is mounted; each image and layout has a directory of its own under it.
KERNEL_CACHE_MOUNT = "/var/cache/flashserve/kernels"

# The whole script is this constant: pod index and ranks per node come from the environment, and the vLLM
# arguments (which carry user values) arrive as "$@".
START_RANK_SCRIPT = (
    'case "$FLASHSERVE_POD_INDEX$FLASHSERVE_DP_LOCAL" in ""|*[!0-9]*) '
    'echo "flashserve: bad pod index or ranks per node" >&2; exit 64;; esac\n'
    'exec vllm serve "$@" --data-parallel-start-rank "$((FLASHSERVE_POD_INDEX * FLASHSERVE_DP_LOCAL))"\n'
)


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
    if spec.routing.renders_prompts():
        # cache_aware asks every engine for the prompt's token ids (POST /v1/chat/completions/render), a route
        # vLLM 0.33 serves only with this flag; without it the router gets 403 and routes on load alone.
        args.append("--enable-scale-out")
    args += startup_args(spec)
    return args + list(eng.extra_args)


def loader_extra_config(spec: DeepSeekServingSpec) -> dict:
    """`--model-loader-extra-config` as the loader of the chosen format reads it (default_loader.py and
    runai_streamer_loader.py list the keys they accept); empty when nothing is set."""
    ld = spec.startup.loader if spec.startup else None
    if ld is None:
        return {}
    if ld.threads is not None:
        return {"enable_multithread_load": True, "num_threads": ld.threads}
    if ld.runai_streamer is not None:
        streamer = {"concurrency": ld.runai_streamer.concurrency, "memory_limit": ld.runai_streamer.memory_limit_bytes,
                    "distributed": ld.runai_streamer.distributed}  # fmt: skip
        return {k: v for k, v in streamer.items() if v is not None}
    return {}


def startup_args(spec: DeepSeekServingSpec) -> list[str]:
    """The weight-loader and warm-up flags of spec.startup; none when a setting is left to vLLM."""
    st = spec.startup
    if st is None:
        return []
    args: list[str] = []
    if st.loader.format != "auto":
        args += ["--load-format", st.loader.format]
    if st.loader.safetensors_load_strategy is not None:
        args += ["--safetensors-load-strategy", st.loader.safetensors_load_strategy]
    extra = loader_extra_config(spec)
    if extra:
        args += ["--model-loader-extra-config", _json(extra)]
    if st.warmup.flashinfer_autotune is not None:
        args.append("--enable-flashinfer-autotune" if st.warmup.flashinfer_autotune else "--no-enable-flashinfer-autotune")
    return args


def kernel_cache_key(spec: DeepSeekServingSpec, lay: Layout) -> str:
    """The kernel cache directory of one engine image and parallel layout: replicas that would compile the same
    kernels share it, and a new image or layout starts a directory of its own rather than mixing artifacts.
    Readable layout first, then a digest of the exact image reference (tags and digests alike)."""
    image = hashlib.sha256(spec.engine.image.encode()).hexdigest()[:12]
    ep = "-ep" if spec.parallelism.expert_parallel else ""
    acc = spec.placement.accelerator.lower()
    return f"{acc}-tp{lay.tensor_parallel}-dp{lay.dp_local}-n{lay.nodes}{ep}-{image}"


def startup_env(spec: DeepSeekServingSpec, lay: Layout) -> list[dict]:
    """The cache directories and warm-up choices of spec.startup, as environment variables."""
    st = spec.startup
    if st is None:
        return []
    env: list[dict] = []
    if st.kernel_cache is not None:
        root = f"{KERNEL_CACHE_MOUNT}/{kernel_cache_key(spec, lay)}"
        env += [{"name": e.name, "value": f"{root}/{e.subdir}"} for e in CACHE_ENVS]
    if st.warmup.deep_gemm is not None:
        env.append({"name": DEEP_GEMM_WARMUP_ENV, "value": st.warmup.deep_gemm})
    return env


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
    env += startup_env(spec, lay)
    env += [e.dump() for e in spec.engine.env]
    return env
