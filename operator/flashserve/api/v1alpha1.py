"""DeepSeekServing, flashserve.io/v1alpha1: the typed API and the single source of truth for the CRD.

Field docstrings become the CRD's descriptions (what `kubectl explain` shows), so they are written for users.
Single-field limits live here as constraints; rules that relate several fields live in `validation.py`, and
the same rules as CEL in `crd.py`, so the API server refuses at admission what the operator would refuse
(docs/api-validation.md lists the few it cannot check, and why).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from flashserve.api import kubevalues
from flashserve.api.context_length import MAX_MODEL_LEN_JSON_SCHEMA
from flashserve.api.kubevalues import DNS_LABEL, DNS_SUBDOMAIN, LabelValue, QualifiedName, SecretKey, TolerationKey
from flashserve.api.quantity import QUANTITY_JSON_SCHEMA
from flashserve.facts import engine_choices as choices
from flashserve.facts import router as router_facts
from flashserve.facts.accelerators import AcceleratorName

GROUP = "flashserve.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DeepSeekServing"
PLURAL = "deepseekservings"
SINGULAR = "deepseekserving"
SHORT_NAMES = ["dss"]

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4.1-Flash-1017"
DEFAULT_SERVED_NAME = "deepseek-flash"
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"

# Bounds that keep CEL rule costs within the API server's budget and objects within etcd's size limit.
MAX_LIST = 64
MAX_STRING = 4096
# Replica groups one serving may hold. A group is one node (4 GPUs on GB200/GB300, 8 on B200/B300) up to a
# whole NVL72 rack (18 nodes, 72 GPUs), so 256 groups are 1,024 to 18,432 GPUs on up to 4,608 nodes: the size
# of the largest Kubernetes clusters (5,000 nodes is the tested limit). A fleet larger than that spans several
# clusters, hence several servings. It also bounds what one reconcile renders when the spec changes and a
# full rollout at one group at a time (docs/api-validation.md).
MAX_GROUPS = 256
# Group start-ups listed in status.startup.recent, and kernel-cache keys remembered in it
STARTUP_RECENT_MAX = 8
STARTUP_WARM_KERNELS_MAX = 16

K8sName = Annotated[str, Field(min_length=1, max_length=253, pattern=rf"^{DNS_SUBDOMAIN}$")]
# The IMEX channel templates the operator creates for a serving's groups (render/naming.py compute_domain_name
# plus `-channel`): a serving may not name another's, whose pods would then join that serving's IMEX domain.
OPERATOR_CHANNEL_TEMPLATE = r"--[a-z0-9]{8}-g[0-9]+-cd-channel$"
CHANNEL_MESSAGE = ("names the IMEX channel template the operator creates for a serving: set computeDomain.enabled "
                   "for a ComputeDomain of this serving's own, or name a template you created")
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"
# The host part of prometheusUrl: a name or an IP literal, and a port (autoscaling/allowlist.py checks the host
# the operator will reach with the same pattern). The path has no space, control character or `\` (spelled
# out, not `\s`, which pydantic reads as Unicode whitespace and RE2 as ASCII only).
PROMETHEUS_NETLOC = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)(:[0-9]{1,5})?"
PROMETHEUS_URL = rf"^https?://{PROMETHEUS_NETLOC}(/[^\x00-\x20\x7f\\]*)?$"
# How the operator names a serving's router objects (render/naming.py router_name). The engines' PodDisruptionBudget
# and NetworkPolicy take the serving's own name, so a serving named like that would take another serving's router
# PodDisruptionBudget and NetworkPolicy names first, leaving that router without them.
# Checked when a serving is made (a name never changes), so one that exists is never refused an update. The
# prefix is what naming._prefix makes: a letter, then letters and digits with single dashes; 63 characters in all.
OPERATOR_ROUTER_NAME = r"^[a-z]([a-z0-9]|-[a-z0-9])*--[a-z2-7]{8}-router$"
ROUTER_NAME_MAX = kubevalues.DNS_LABEL_MAX
ROUTER_NAME_MESSAGE = ("has the shape of the names the operator gives a serving's router objects "
                       "(<name>--<8 characters>-router): choose a name that does not end so")
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=rf"^{DNS_LABEL}$")]
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
Quantity = Annotated[int | str, Field(json_schema_extra=QUANTITY_JSON_SCHEMA)]
MaxModelLen = Annotated[int | str, Field(json_schema_extra=MAX_MODEL_LEN_JSON_SCHEMA)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        strict=True,  # JSON types as the API server reads them: no "5" for 5, no "yes" for true
        allow_inf_nan=False,  # JSON has neither; a YAML .inf would otherwise reach the rendered flags
    )

    def dump(self) -> dict:
        """The object as it appears in the API: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# ---------------------------------------------------------------------------------------------- model


class SecretKeyRef(_Model):
    name: K8sName
    """Name of a Secret in the serving's namespace."""
    key: SecretKey = "HF_TOKEN"
    """Key within the Secret."""


class HuggingFaceSource(_Model):
    token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hugging Face token, for gated or private repositories. Passed to the engine only as an
    environment variable taken from the Secret; never inline."""
    cache_pvc_name: K8sName | None = None
    """Optional PersistentVolumeClaim used as the Hugging Face cache (HF_HOME), so restarts skip the download.
    Without it the cache is an emptyDir and each new pod downloads the weights."""


class PVCSource(_Model):
    claim_name: K8sName
    """PersistentVolumeClaim that already holds the weights (mounted read-only)."""
    path: str = Field("", max_length=1024)
    """Directory of the model inside the volume; empty means the volume's root."""


class WeightsSource(_Model):
    hugging_face: HuggingFaceSource | None = None
    """Download from the Hugging Face Hub (the default when no source is given)."""
    pvc: PVCSource | None = None
    """Load from an existing PersistentVolumeClaim; no download, the Hub is not contacted."""


class ModelSpec(_Model):
    name: str = Field(DEFAULT_MODEL, min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """Hugging Face model id."""
    # The first character may not be `-`: the value follows a flag on vLLM's command line, where `--x` would
    # be read as a flag of its own (served names follow each other, so a later one could add any flag).
    revision: str | None = Field(None, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """Model revision (branch, tag or commit) to pin; pinning a commit is recommended for production."""
    served_model_names: list[Annotated[str, Field(min_length=1, max_length=256, pattern=SERVED_NAME)]] = (
        Field(default_factory=lambda: [DEFAULT_SERVED_NAME], min_length=1, max_length=8)
    )
    """Names clients use in the `model` field of OpenAI requests; the first is the one reported in metrics."""
    source: WeightsSource = Field(default_factory=WeightsSource)
    """Where the weights come from: Hugging Face (default) or an existing PVC."""
    trust_remote_code: bool = True
    """Allow the model repository's own Python code (DeepSeek checkpoints ship their configuration code)."""


# --------------------------------------------------------------------------------------------- engine


class SpeculativeSpec(_Model):
    enabled: bool | None = None
    """DSpark speculative decoding with the draft stages shipped in the DeepSeek V4.1 checkpoint (vLLM method
    `dspark`, which runs on vLLM's V2 model runner; V4.1 has no classic MTP draft). Unset: on, except with
    dual-microbatch overlap (parallelism.dbo), which vLLM cannot combine with speculative decoding."""
    num_speculative_tokens: int = Field(1, ge=1, le=4)
    """Draft tokens proposed per step."""


class EnvVarSource(_Model):
    secret_key_ref: SecretKeyRef | None = None
    config_map_key_ref: SecretKeyRef | None = None


class EnvVar(_Model):
    name: EnvName
    value: str | None = Field(None, max_length=MAX_STRING)
    value_from: EnvVarSource | None = None


class ResourcesSpec(_Model):
    cpu: Quantity = "32"
    """CPU request (and limit) of each engine pod."""
    memory: Quantity = "256Gi"
    """Memory request (and limit) of each engine pod."""
    shm_size: Quantity = "64Gi"
    """Size of the memory-backed /dev/shm used by NCCL and the data-parallel processes."""


class EngineSpec(_Model):
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512, pattern=kubevalues.IMAGE)
    """vLLM OpenAI server image (vLLM 0.33). Pin a digest in production."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    max_model_len: MaxModelLen = 131072
    """Context length in tokens, as vLLM reads `--max-model-len`: an integer, a size with a decimal suffix
    (`k`, `m`: `32k` is 32000, `25.6k` is 25600) or a binary one (`K`, `M`: `32K` is 32768; whole numbers
    only), or `auto` for the model's own maximum. At most 1048576 (1M, DeepSeek V4.1's context)."""
    kv_cache_dtype: Literal[choices.KV_CACHE_DTYPE_CHOICES] = "fp8_ds_mla"  # type: ignore[valid-type]
    """KV cache dtype; `fp8_ds_mla` is DeepSeek's FP8 MLA cache layout."""
    attention_backend: Literal[choices.ATTENTION_BACKEND_CHOICES] | None = None  # type: ignore[valid-type]
    """MLA attention backend; unset lets vLLM choose (FLASHINFER_MLA first on Blackwell)."""
    prefix_caching: bool = True
    """Automatic prefix caching: agentic sessions resend a growing context, mostly served from cache."""
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    """DSpark speculative decoding."""
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    """Share of each GPU's memory vLLM may use."""
    max_num_seqs: int = Field(1024, ge=1, le=65536)
    """Most sequences one engine (data-parallel rank) batches at once."""
    max_num_batched_tokens: int = Field(16384, ge=1, le=1048576)
    """Token budget of one engine step (prefill chunks plus decodes)."""
    cuda_graph_mode: Literal[choices.CUDA_GRAPH_MODE_CHOICES] | None = None  # type: ignore[valid-type]
    """CUDA graph mode (compilation config `cudagraph_mode`); unset keeps vLLM's default FULL_AND_PIECEWISE."""
    async_scheduling: bool | None = None
    """Overlap scheduling with execution: true renders `--async-scheduling`, false `--no-async-scheduling`;
    unset lets vLLM decide (it turns it on where the configuration supports it)."""
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(default_factory=list, max_length=MAX_LIST)
    """Further `vllm serve` options, passed as separate arguments (never through a shell). Options that set what
    the operator manages (parallelism, port, model, context, batching, speculative decoding, buckets, ...) are
    refused under every spelling vLLM accepts, and so are inline secrets, unknown options, positional
    arguments and `--config`: set the matching field instead."""
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_LIST)
    """Further environment variables for the engine. Variables the operator manages are refused."""
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    """CPU, memory and shared memory per pod; GPUs follow from the accelerator."""
    port: int = Field(8000, ge=1024, le=65535)
    """Port of the OpenAI API and /metrics inside the pod."""
    # Unset rather than false by default, so that servings that never set it keep their template hash and
    # their engines are not restarted by an operator upgrade.
    ipc_lock: bool | None = None
    """Add the IPC_LOCK capability to the engine container, so NCCL, NIXL or DeepEP can pin memory for RDMA
    (InfiniBand or RoCE verbs) between nodes. Multi-node NVLink on GB200/GB300 through an IMEX ComputeDomain
    does not need it. Unset or false: every capability is dropped and the pods meet the `restricted` Pod
    Security Standard; true needs a namespace that allows `privileged` (IPC_LOCK is outside `baseline`)."""


# ---------------------------------------------------------------------------------------- parallelism


class EPLBSpec(_Model):
    enabled: bool = False
    """Expert-parallel load balancing: replicate hot experts and rebalance while serving."""
    num_redundant_experts: int = Field(32, ge=0, le=1024)
    """Extra expert replicas spread over the EP group."""
    window_size: int = Field(1000, ge=1)
    """Steps of expert load history considered."""
    step_interval: int = Field(3000, ge=1)
    """Steps between rebalances."""


class DBOSpec(_Model):
    enabled: bool = False
    """Dual-microbatch overlap: overlap the all-to-all of one microbatch with compute of the other."""
    decode_token_threshold: int = Field(32, ge=1)
    """Smallest decode batch (tokens) that is split into two microbatches."""
    prefill_token_threshold: int = Field(512, ge=1)
    """Smallest prefill batch (tokens) that is split into two microbatches."""


class ParallelismSpec(_Model):
    tensor_parallel_size: int = Field(1, ge=1, le=8)
    """GPUs per data-parallel rank (attention is data parallel, so 1 suits MLA models)."""
    data_parallel_size_local: int | None = Field(None, ge=1, le=8)
    """Data-parallel ranks per node; unset fills the node (GPUs per node / tensorParallelSize)."""
    nodes_per_replica: int = Field(1, ge=1, le=72)
    """Nodes in one serving replica (one expert-parallel group). More than 1 makes a multi-node wide-EP group
    whose data-parallel ranks span the nodes."""
    expert_parallel: bool = True
    """Expert parallelism across all ranks of the group (EP size = TP x DP)."""
    all2all_backend: Literal[choices.ALL2ALL_BACKEND_CHOICES] | None = Field(  # type: ignore[valid-type]
        None, alias="all2allBackend"
    )
    """All-to-all kernel for expert parallelism; unset keeps vLLM's default. `deepep_low_latency` suits decode."""
    eplb: EPLBSpec = Field(default_factory=EPLBSpec)
    """Expert-parallel load balancer."""
    dbo: DBOSpec = Field(default_factory=DBOSpec)
    """Dual-microbatch overlap."""
    rpc_port: int = Field(29550, ge=1024, le=65535)
    """Data-parallel RPC port on a group's leader (pod 0)."""


# ------------------------------------------------------------------------------------------ placement


class Toleration(_Model):
    key: TolerationKey | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class NVLinkDomainSpec(_Model):
    enabled: bool = True
    """Keep every pod of a multi-node group on nodes of one NVLink domain (same clique label value).
    Required for multi-node groups on GB200/GB300."""
    topology_key: QualifiedName = "nvidia.com/gpu.clique"
    """Node label whose value names the NVLink domain."""


class ComputeDomainSpec(_Model):
    enabled: bool = False
    """Create a ComputeDomain (NVIDIA DRA driver, resource.nvidia.com) per multi-node group and claim its IMEX
    channel from every pod, for multi-node NVLink on GB200/GB300."""
    resource_claim_template_name: K8sName | None = None
    """Use this existing ResourceClaimTemplate instead of creating a ComputeDomain."""


class PlacementSpec(_Model):
    accelerator: AcceleratorName = "GB200"
    """GPU system: GB200 or GB300 (4 GPUs per node, NVL72 racks) or B200 or B300 (8 GPUs per node)."""
    node_selector: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict, max_length=MAX_LIST
    )
    """Extra node labels the pods require (e.g. a node pool)."""
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        max_length=MAX_LIST,
    )
    """Tolerations for the engine pods; the default tolerates the usual `nvidia.com/gpu` GPU-node taint."""
    nvlink_domain: NVLinkDomainSpec = Field(default_factory=NVLinkDomainSpec)
    """Gang placement of multi-node groups inside one NVLink domain."""
    compute_domain: ComputeDomainSpec = Field(default_factory=ComputeDomainSpec)
    """DRA ComputeDomain (IMEX) claim for multi-node NVLink on GB200/GB300."""
    priority_class_name: K8sName | None = None
    """PriorityClass of the engine pods."""


# ---------------------------------------------------------------------------------------- autoscaling


class SLASpec(_Model):
    per_user_tokens_per_second: float = Field(100.0, gt=0, le=100000)
    """Decode speed every user should see, in output tokens per second per request."""
    percentile: float = Field(90.0, gt=0, lt=100)
    """Share of users (by percentile of per-user speed) that must meet the target."""
    ttft_seconds: float | None = Field(None, gt=0)
    """Optional time-to-first-token target."""


class ScaleUpSpec(_Model):
    stabilization_seconds: int = Field(0, ge=0, le=3600)
    """How long a breach must last before adding replicas."""


class ScaleDownSpec(_Model):
    delay_seconds: int | None = Field(None, ge=0, le=86400)
    """How long a surplus must last before removing a replica; unset uses replicaStartupSeconds (a replica
    that took that long to start is not given up for less)."""
    step: int | None = Field(None, ge=1, le=100)
    """Replicas removed per step. Unset: one, except the first release after a scale-up, which removes the
    whole surplus; the recent peak and the delay still apply."""
    peak_window_seconds: int | None = Field(None, ge=0, le=604800)
    """Never release below what the highest demand of this recent past needed: a burst shorter than a start-up
    is only served by replicas that are already there, and the last bursts predict the next. Unset uses four
    times replicaStartupSeconds; 0 releases down to the demand of the moment."""


class AutoscalingSpec(_Model):
    enabled: bool = False
    """Let the operator set spec.replicas from per-user speed. When on, the autoscaler owns spec.replicas."""
    mode: Literal["Active", "Advisory"] = "Active"
    """Active acts on its decisions; Advisory only reports them in status and events."""
    min_replicas: int = Field(1, ge=1, le=MAX_GROUPS)
    """Fewest replica groups; at least one, since a cold replica takes minutes to serve."""
    max_replicas: int = Field(4, ge=1, le=MAX_GROUPS)
    """Most replica groups (the GPU budget); at most 256, the groups one serving may hold."""
    sla: SLASpec = Field(default_factory=SLASpec)
    # A host name or IP literal, an optional port, then a path: no user@, no backslash (which the HTTP client
    # reads as the end of the host where a URL parser does not), so the allow-list judges the host it will reach.
    prometheus_url: str | None = Field(None, max_length=1024, pattern=PROMETHEUS_URL)
    """Prometheus that scrapes the engines; unset uses the operator's --prometheus-url."""
    evaluation_interval_seconds: int = Field(15, ge=1, le=3600)
    metrics_window_seconds: int = Field(60, ge=10, le=1800)
    """Rate window of the metric queries: at least four Prometheus scrape intervals. Shorter reacts sooner,
    longer is steadier."""
    initial_capacity: float | None = Field(None, gt=0)
    """Concurrent users one replica serves at the SLA, as a starting estimate; the autoscaler learns the real
    figure online. Unset: the operator's built-in estimate for DeepSeek-V4.1-Flash on the replica's GPUs at the
    SLA's per-user speed."""
    replica_startup_seconds: int = Field(900, ge=0, le=86400)
    """Expected time from creating a replica to serving (image pull, weight load, CUDA graphs)."""
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)
    gpu_hourly_cost: float | None = Field(None, ge=0)
    """Cost of one GPU-hour in dollars, for tokens-per-dollar in status."""


# ------------------------------------------------------------------------------------------- start-up


class WeightsCacheSpec(_Model):
    scope: Literal["Shared", "NodeLocal"]
    """`Shared`: claimName is a ReadWriteMany claim (NFS, Lustre, a CSI file store) that every replica on every
    node mounts, filled once by a prefetch Job. `NodeLocal`: claimName is bound to a `local` PersistentVolume
    whose nodeAffinity spans the accelerator pool, so each node mounts its own disk under the same claim; a
    prefetch DaemonSet fills it once per node, and its pod on a node turns Ready when that node's copy is
    complete. Neither puts a hostPath in a pod, so both run in a namespace at Pod Security `restricted`."""
    claim_name: K8sName
    """Existing PersistentVolumeClaim in the serving's namespace, mounted read-write as the Hugging Face cache
    (HF_HOME) of every engine: an engine that finds the weights there skips the download."""
    prefetch: bool = True
    """Download spec.model.name (at spec.model.revision, with the token Secret of
    spec.model.source.huggingFace.tokenSecretRef when set) into the cache before engines need it. False: the
    first engine to start on the cache downloads the weights itself."""


class KernelCacheSpec(_Model):
    claim_name: K8sName
    """Existing PersistentVolumeClaim for the compiled kernels and autotune results of vLLM (torch.compile,
    CUDA-graph-ready Inductor code), Triton, DeepGEMM and FlashInfer. Each engine image and parallel layout
    gets its own directory in it, so replicas share what they compiled only with replicas that would compile
    the same. ReadWriteMany shares it across nodes; a claim on a node-local PersistentVolume, per node."""


class RunaiStreamerSpec(_Model):
    concurrency: int | None = Field(None, ge=1, le=1024)
    """Threads (and so concurrent reads) that stream the weights; unset keeps the streamer's default."""
    memory_limit_bytes: int | None = Field(None, ge=-1)
    """CPU memory the streamer's buffer may use, in bytes; -1 is unlimited; unset keeps the default."""
    distributed: bool | None = None
    """Each rank streams a part of the files and the ranks exchange them, rather than every rank reading
    every file; unset keeps vLLM's default (off)."""


class LoaderSpec(_Model):
    format: Literal[choices.LOAD_FORMAT_CHOICES] = "auto"  # type: ignore[valid-type]
    """vLLM's `--load-format`: `auto` (safetensors through vLLM's default loader), `safetensors`,
    `fastsafetensors` or `instanttensor` (GPU-direct reads) or `runai_streamer` (concurrent streaming from a
    file system or object store); the last three need their package in the engine image (vLLM's extras
    `vllm[fastsafetensors]`, `vllm[instanttensor]`, `vllm[runai]`)."""
    threads: int | None = Field(None, ge=1, le=256)
    """Read the safetensors files with this many threads (vLLM's multi-threaded loader); `auto` and
    `safetensors` only. Unset: one thread, memory-mapped."""
    safetensors_load_strategy: Literal[choices.SAFETENSORS_LOAD_STRATEGY_CHOICES] | None = None  # type: ignore[valid-type]
    """`--safetensors-load-strategy`: `lazy` memory-maps, `eager` reads each file whole (network file
    systems), `prefetch` warms the page cache ahead of the workers. Unset: lazy, with prefetch on NFS when
    the checkpoint fits in memory. `auto` and `safetensors` only."""
    runai_streamer: RunaiStreamerSpec | None = None
    """Options of the Run:ai streamer (format `runai_streamer` only)."""


class WarmupSpec(_Model):
    deep_gemm: Literal[choices.DEEP_GEMM_WARMUP_CHOICES] | None = None  # type: ignore[valid-type]
    """VLLM_DEEP_GEMM_WARMUP: `relax` (vLLM's default) compiles the DeepGEMM kernels for the shapes a heuristic
    expects, `full` for every shape the engine can meet, `skip` none at start-up: faster to ready, and the
    first requests of a new shape compile theirs (suggested for DeepSeek-V4 in vLLM issue 43189)."""
    flashinfer_autotune: bool | None = None
    """false renders `--no-enable-flashinfer-autotune`: no benchmarking of FlashInfer kernels at start-up (a
    large part of a cold DeepSeek-V4 launch), at the cost of the heuristic kernel choice. true renders
    `--enable-flashinfer-autotune`; unset keeps vLLM's default (on). With a kernel cache, the results of one
    autotune are kept and reused by the replicas of the same image and layout."""


class ImagePrepullSpec(_Model):
    enabled: bool = False
    """A DaemonSet on the accelerator pool (the engines' node selector, affinity and tolerations) pulls the
    engine image onto every node before a replica is placed there, so a scale-out skips the pull (tens of GB
    for vllm-openai). It runs the image's `true` once, then a pause container; no GPU is requested."""
    pause_image: str = Field("registry.k8s.io/pause:3.10", min_length=1, max_length=512, pattern=kubevalues.IMAGE)
    """The image of the container that keeps a pre-pull pod (and a node-local prefetch pod) running once its
    work on the node is done."""


class StartupSpec(_Model):
    weights_cache: WeightsCacheSpec | None = None
    """A weights cache shared by the replicas, filled before they start. Unset: each new pod downloads the
    weights into its own emptyDir (or spec.model.source.huggingFace.cachePvcName)."""
    kernel_cache: KernelCacheSpec | None = None
    """A kernel and JIT cache shared by the replicas of the same image and layout. Unset: each pod compiles
    and autotunes its kernels again."""
    loader: LoaderSpec = Field(default_factory=LoaderSpec)
    """How vLLM reads the weights."""
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    """Start-up work vLLM does before it serves, each an explicit choice."""
    image_prepull: ImagePrepullSpec = Field(default_factory=ImagePrepullSpec)
    """Pull the engine image onto the accelerator pool ahead of scale-outs."""


class NetworkPolicySpec(_Model):
    enabled: bool = True
    """Create NetworkPolicies for the engine pods and the router pods (on by default; false removes them and
    leaves both open to every pod of the cluster). Engine pods of this serving reach each other on every port
    (data-parallel RPC, NCCL bootstrap); its router pods, pods of the serving's namespace, of
    `allowedNamespaces`, of `monitoringNamespaces` and of the operator's namespace (which reads the engines'
    /metrics while draining a group) reach only the engine API port, which also serves /metrics. The router
    pods take the API from the serving's namespace and `allowedNamespaces`, and /metrics from
    `monitoringNamespaces`. Nothing else reaches either."""
    allowed_namespaces: list[NamespaceName] = Field(default_factory=list, max_length=MAX_LIST)
    """Namespaces (besides the serving's own) whose pods may call the API, e.g. a gateway's: the router's
    port and the engines' API port (an inference gateway reaches the engines of an InferencePool directly)."""
    monitoring_namespaces: list[NamespaceName] = Field(default_factory=lambda: ["monitoring"], max_length=MAX_LIST)
    """Namespaces of the Prometheus that scrapes the engines (the autoscaler reads their metrics from it):
    their pods may reach the API port, which serves /metrics. Empty: no namespace beyond the ones above."""


# ------------------------------------------------------------------------------------------- routing


class CacheAwareSpec(_Model):
    """Knobs of the `cache_aware` policy (read only when routing.policy is cache_aware), with vllm-router's
    own defaults."""

    cache_threshold: float = Field(router_facts.CACHE_THRESHOLD, ge=0, le=1)
    """Share of a prompt that must match an engine's prefix tree for the request to follow the cache;
    below it the request goes to the engine with the smallest tree (`--cache-threshold`)."""
    balance_abs_threshold: int = Field(router_facts.BALANCE_ABS_THRESHOLD, ge=0, le=1000000)
    """Load balancing replaces cache affinity when the busiest and idlest engines differ by more than this
    many requests and by more than balanceRelThreshold times (`--balance-abs-threshold`)."""
    balance_rel_threshold: float = Field(router_facts.BALANCE_REL_THRESHOLD, ge=1, le=1000)
    """The relative half of that test: busiest > idlest x this (`--balance-rel-threshold`)."""
    eviction_interval_seconds: int = Field(router_facts.EVICTION_INTERVAL_SECS, ge=1, le=86400)
    """Seconds between evictions from the prefix trees (`--eviction-interval-secs`)."""
    max_tree_size: int = Field(router_facts.MAX_TREE_SIZE, ge=1024, le=2147483647)
    """Characters each engine may hold in each model's prefix tree, enforced at eviction (`--max-tree-size`)."""


# Shorter counts fewer ended sessions against the engines (the router sweeps them out a minute later at most),
# longer re-places fewer live ones after a pause; two minutes is above nearly every tool pause of the
# benchmark's sessions (median 4 s) and the load generator's (at most 60 s): docs/routing.md, "Sessions that end".
DEFAULT_STICKY_IDLE_SECONDS = 120


class StickyLeastLoadedSpec(_Model):
    """Knobs of the `sticky_least_loaded` policy (read only when routing.policy is sticky_least_loaded)."""

    session_idle_seconds: int = Field(DEFAULT_STICKY_IDLE_SECONDS, ge=60, le=86400)
    """A session with no request for this long leaves the router's session table, and its next request is placed
    again on the engine with the fewest sessions. The router cannot tell that a conversation ended, so an ended
    one also counts against its engine for this long: set it a little above the longest pause inside a
    conversation (tool runs, a person reading). Longer keeps counting sessions that have ended, and an engine
    that joins later then takes every new session until its count catches up (docs/routing.md). Clients that
    post a session's end to the router's /finish_session release it at once."""


class RouterResourcesSpec(_Model):
    cpu: Quantity = "1"
    """CPU request of each router pod; without dedicatedCpus there is no CPU limit, so bursts use idle cores."""
    memory: Quantity = "2Gi"
    """Memory request and limit of each router pod; cache_aware's prefix trees grow with engines and
    maxTreeSize."""
    dedicated_cpus: bool = False
    """true: a CPU limit equal to the request, so the router pods are Guaranteed; on nodes whose kubelet runs
    the static CPU manager policy each then has whole cores of its own, and no request waits for a core that
    another pod is using (cpu must then be a whole number). false: no CPU limit, cores shared with the node's
    other pods."""


class EndpointPickerPort(_Model):
    number: int = Field(ge=1, le=65535)
    """Port number of the endpoint picker's Service (the Service port, not the target port)."""


class EndpointPickerRef(_Model):
    """The gateway's endpoint picker (GAIE `endpointPickerRef`), copied into the InferencePool."""

    group: str = Field("", max_length=253, pattern=r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    """API group of the picker; empty is the core group (a Service)."""
    kind: str = Field("Service", min_length=1, max_length=63, pattern=r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")
    """Kind of the picker; a Service unless the gateway documents another."""
    name: K8sName
    """Name of the picker in the serving's namespace."""
    port: EndpointPickerPort | None = None
    """Port of the picker; required when kind is Service (the InferencePool API refuses a Service without it)."""
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What the gateway does when the picker does not answer: FailOpen forwards to an endpoint of its own
    choice, FailClose drops the request."""


class InferencePoolSpec(_Model):
    enabled: bool = False
    """Render a Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1) named like the
    serving, selecting its engine pods that take traffic, with the engine port as target port. Needs the
    InferencePool CRD in the cluster (installed with the gateway) and a gateway whose HTTPRoute names the pool."""
    endpoint_picker_ref: EndpointPickerRef | None = None
    """The gateway's endpoint picker for this pool; unset leaves it to the gateway's implementation."""


class RoutingSpec(_Model):
    enabled: bool = True
    """Deploy vLLM's router (vllm-router) in front of the engines: the client Service then points at the router
    pods, which discover the engines of this serving that take traffic. False: the Service points at those
    engines directly and spreads connections over them, with no session affinity."""
    policy: Literal[router_facts.API_POLICIES] = "consistent_hash"  # type: ignore[valid-type]
    """How the router picks an engine. consistent_hash (default) hashes the session key (X-Session-ID header,
    else X-User-ID, X-Tenant-ID or body session_params.session_id) onto the engines: it keeps no state, so
    every router replica sends one session to the same engine and its prefix cache, but the hash balances
    sessions only as well as the ring's shares. sticky_least_loaded places each new session on the engine with
    the fewest and keeps it there; cache_aware keeps a prefix tree and turns on the engines' --enable-scale-out
    render routes. Both keep that state per router replica, so the client Service then sends each client to one
    router pod (client-IP affinity). rendezvous_hash hashes the session key like consistent_hash but scores
    each engine (or rank) for the key and takes the best, which spreads sessions more evenly than the ring's
    shares; vllm-router takes it only from workers registered through its worker API, so the router runs
    without pod discovery and the operator registers the engines that take traffic (and removes every other
    worker), which needs the operator to reach the router pods. It applies to requests that name the first of
    model.servedModelNames in `model`, so clients name it: in that mode the router routes another name by
    consistent_hash, may refuse a request naming none, and answers /v1/models with its own list, not
    OpenAI's.
    power_of_two, round_robin and random ignore sessions."""
    cache_aware: CacheAwareSpec = Field(default_factory=CacheAwareSpec)
    """Knobs of the cache_aware policy."""
    sticky_least_loaded: StickyLeastLoadedSpec = Field(default_factory=StickyLeastLoadedSpec)
    """Knobs of the sticky_least_loaded policy."""
    data_parallel_aware: bool = True
    """Route each request to one data-parallel rank of an engine pod, not to the pod (the router's
    --intra-node-data-parallel-size, set to the pod's ranks; the rank travels in the X-data-parallel-rank
    header). vLLM's own balancer between a pod's ranks weighs load only, so without this a session's turns
    spread over the pod's ranks and find their prefix cache on one of them at best. No effect on pods with one
    rank. False: the router picks a pod and vLLM picks the rank."""
    log_level: Literal[router_facts.LOG_LEVELS] = router_facts.DEFAULT_LOG_LEVEL  # type: ignore[valid-type]
    """The router pods' log level (their RUST_LOG). warn (default) logs errors and warnings only. info adds
    start-up, worker added/removed and three lines per routed request that carry its session key, a user
    identifier in the pods' logs at the request rate; debug adds more per request."""
    replicas: int = Field(2, ge=1, le=64)
    """Router pods. Two or more get a PodDisruptionBudget keeping all but one, so a node drain never takes the
    endpoint down."""
    resources: RouterResourcesSpec = Field(default_factory=RouterResourcesSpec)
    """CPU and memory of each router pod."""
    image: str = Field(router_facts.ROUTER_IMAGE, min_length=1, max_length=512, pattern=kubevalues.IMAGE)
    """Image with the `vllm-router` command (0.1.17; the project's router image by default). Pin a digest in
    production."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    port: int = Field(router_facts.DEFAULT_PORT, ge=1024, le=65535)
    """Port the router serves the OpenAI API on inside its pods (the client Service keeps engine.port)."""
    metrics_port: int = Field(router_facts.DEFAULT_METRICS_PORT, ge=1024, le=65535)
    """Port of the router's Prometheus /metrics inside its pods; must differ from port."""
    inference_pool: InferencePoolSpec = Field(default_factory=InferencePoolSpec)
    """A Gateway API InferencePool over the engines, for an inference gateway (independent of the router)."""
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=MAX_LIST)
    """Node labels the router pods require. The router needs no GPU: unset, its pods land wherever the
    scheduler puts them (which may be a GPU node with room for a small pod); set it to pin them to a CPU pool."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_LIST)
    """Tolerations of the router pods, for a CPU pool behind a taint. Empty by default: unlike the engines, the
    router does not tolerate the GPU-node taint, so it stays off tainted GPU nodes."""

    def registers_workers(self) -> bool:
        """Whether the operator registers the engines with the router itself (a policy `--policy` lacks)."""
        return self.enabled and self.policy in router_facts.WORKER_LABEL_POLICIES

    def renders_prompts(self) -> bool:
        """Whether the router asks the engines to render prompts, so they need --enable-scale-out."""
        return self.enabled and self.policy in router_facts.RENDERING_POLICIES
# Bounds of a drain: long enough for the longest agentic turn (a few minutes of decode at the SLA speed),
# short enough that a stuck request cannot hold a scale-down, and the GPUs it frees, for long.
DEFAULT_DRAIN_SECONDS = 300
MAX_DRAIN_SECONDS = 3600


class RolloutSpec(_Model):
    max_unavailable: int = Field(1, ge=1, le=MAX_GROUPS)
    """Replica groups that may be updating at once; a group's pods are always replaced together. A group that
    is draining before its replacement counts as updating."""
    drain_seconds: int = Field(DEFAULT_DRAIN_SECONDS, ge=0, le=MAX_DRAIN_SECONDS)
    """Before a group is removed (scale-down) or its pods are replaced (rollout), it is taken out of routing and
    the operator waits until its engines report no running or waiting requests, at most this long; then the
    group goes even with requests left (status.lastDrains says which ended each drain). 0 removes groups at
    once, cutting the requests they still serve."""
    surge: bool = True
    """When the serving has one replica group, a rollout first creates a second group on the new template,
    waits until it is ready, then drains and replaces the old group, then drains and removes the extra one: the
    serving keeps serving throughout. Needs room for one more group in the pool (and, with autoscaling,
    maxReplicas of at least 2). False, or no room: the one group is drained and replaced in place, and the
    serving does not serve until the new pods are ready."""


class DeepSeekServingSpec(_Model):
    model: ModelSpec = Field(default_factory=ModelSpec)
    """Model to serve."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """vLLM engine settings."""
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    """Tensor, data and expert parallelism, and how many nodes one replica spans."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Where the pods run."""
    startup: StartupSpec | None = None
    """Weight and kernel caches, the weight loader, warm-up choices and image pre-pull: what makes a new
    replica serve sooner (docs/startup.md). Unset: none of them, vLLM's defaults."""
    replicas: int = Field(1, ge=0, le=MAX_GROUPS)
    """Serving replica groups. Owned by the autoscaler when autoscaling is enabled. At most 256 groups per
    serving (1,024 to 18,432 GPUs, from one-node groups to whole NVL72 racks); a larger fleet is split into
    several servings."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Per-user-speed autoscaling."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How pod changes roll out over groups, and how groups are drained before they are removed or replaced."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """The NetworkPolicies that limit who may reach the engines and the router (on by default)."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """vLLM's router in front of the engines (on by default), and an optional Gateway API InferencePool."""

    def speculative_decoding(self) -> bool:
        """Whether the engines run speculative decoding: as set, or by default unless DBO is on."""
        enabled = self.engine.speculative.enabled
        return (not self.parallelism.dbo.enabled) if enabled is None else enabled


# --------------------------------------------------------------------------------------------- status


# The condition types the operator writes: Ready, Progressing and Degraded from the groups, MetricsAvailable and
# ScalingLimited from the autoscaler. Conditions of other types belong to other tools.
CONDITION_TYPES: tuple[str, ...] = ("Ready", "Progressing", "Degraded", "MetricsAvailable", "ScalingLimited")


class Condition(_Model):
    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field("", max_length=32768)
    last_transition_time: str = Field(max_length=64)
    observed_generation: int | None = None


class SLAStatus(_Model):
    per_user_tokens_per_second_p50: float | None = None
    per_user_tokens_per_second_p90: float | None = None
    tokens_per_second: float | None = None
    tokens_per_dollar: float | None = None
    attainment: float | None = None
    """Share of output tokens delivered at or above the per-user speed target (recent window)."""


class ScalingEvent(_Model):
    time: str = Field(max_length=64)
    from_replicas: int = Field(alias="from")
    to_replicas: int = Field(alias="to")
    reason: str = Field(max_length=1024)


class DrainingGroup(_Model):
    group: int
    """Index of the replica group that is draining."""
    since: str = Field(max_length=64)
    """When its pods were taken out of routing (RFC 3339, UTC)."""
    reason: Literal["ScaleDown", "Rollout", "Rename"]
    """ScaleDown: the group is beyond the desired count (also the extra group of a one-group rollout once the
    replaced group is ready); Rollout: its pods are about to be replaced by the new template; Rename: a copy of
    the group under a name an earlier operator version gave it, deleted once drained (the copy under the
    current name serves)."""


class EndedDrain(_Model):
    group: int
    reason: Literal["ScaleDown", "Rollout", "Rename"]
    ended_by: Literal["Idle", "Timeout"]
    """Idle: every engine of the group reported no running or waiting request (and, under routing.policy
    rendezvous_hash, every router pod had confirmed that the group left its workers); Timeout:
    rollout.drainSeconds passed first, and the group went with the requests it still had."""
    seconds: float
    """How long the drain took."""
    requests_in_flight: int | None = None
    """Requests the group still had when it went (0 when idle; unknown when its engines could not be read)."""
    routers_behind: bool | None = None
    """True when a router pod had not confirmed that the group left its workers (routing.policy
    rendezvous_hash): until the group went, that router may have sent it new requests."""
    time: str = Field(max_length=64)
    """When the drain ended (RFC 3339, UTC)."""


class StartupSeconds(_Model):
    scheduled: float | None = None
    """Seconds from the StatefulSet's creation until all its pods were bound to nodes."""
    running: float | None = None
    """Seconds from its creation until the engine container of every pod had started."""
    ready: float | None = None
    """Seconds from its creation until every pod was Ready (all engines healthy)."""


class GroupStartupRecord(_Model):
    group: int
    """Index of the replica group."""
    stateful_set: str = Field(max_length=253)
    """The group's StatefulSet."""
    uid: str = Field(max_length=64)
    """Its uid: a group made again is a new start-up."""
    cache_state: Literal["cold", "weights-cached", "warm"]
    """What the group started from (docs/startup.md): `cold` (weights not known to be in a cache before they
    were needed), `weights-cached` (in the weights cache), `warm` (weights cached, and an earlier group of the
    same kernel-cache key had completed its start-up before this group's engines started)."""
    created: str = Field(max_length=64)
    """The StatefulSet's creationTimestamp (RFC 3339, as the API gives it)."""
    scheduled: str | None = Field(None, max_length=64)
    """The latest PodScheduled transition over the group's pods."""
    running: str | None = Field(None, max_length=64)
    """The latest start of the engine container over the group's pods."""
    ready: str | None = Field(None, max_length=64)
    """The latest Ready transition over the group's pods."""
    seconds: StartupSeconds = Field(default_factory=StartupSeconds)
    """Each phase in seconds since created."""


class WarmKernelCache(_Model):
    key: str = Field(max_length=253)
    """A kernel-cache directory (accelerator, layout, image digest) under spec.startup.kernelCache."""
    since: str = Field(max_length=64)
    """When the first start-up of a group with it completed (RFC 3339)."""


class StartupStatus(_Model):
    last: GroupStartupRecord | None = None
    """The most recent group start-up to complete."""
    recent: list[GroupStartupRecord] | None = Field(None, max_length=STARTUP_RECENT_MAX)
    """The last few group start-ups, newest last."""
    warm_kernel_caches: list[WarmKernelCache] | None = Field(None, max_length=STARTUP_WARM_KERNELS_MAX)
    """Kernel-cache keys a start-up has completed with: a later group of the same key starts warm."""


class RouterStatus(_Model):
    replicas: int = 0
    """Router pods the router Deployment has (its status.replicas)."""
    ready_replicas: int = 0
    """Router pods that pass their readiness probe, which they do once they have found a healthy engine."""
    available_replicas: int = 0
    """Router pods ready for the Deployment's minReadySeconds. The client Service points at the router only
    while this is at least 1; at 0 it points at the engines that take traffic directly (no session affinity)."""
    unavailable_since: str | None = Field(None, max_length=64)
    """Since when (RFC 3339) the serving's groups have served with no router pod available; absent while one is
    available or no group serves. Degraded (RouterUnavailable) is reported a grace period after this time, also
    across operator restarts."""


class DeepSeekServingStatus(_Model):
    observed_generation: int | None = None
    replicas: int | None = None
    """Replica groups that exist."""
    ready_replicas: int | None = None
    """Groups that take new requests: every pod ready and in routing. A group drained before its pods are
    replaced is not counted; during a one-group rollout the surge group counts for the group it stands in for."""
    updated_replicas: int | None = None
    """Groups running the current pod template."""
    desired_replicas: int | None = None
    selector: str | None = Field(None, max_length=1024)
    """Label selector of the serving's pods (for the scale subresource)."""
    endpoint: str | None = Field(None, max_length=1024)
    """OpenAI-compatible base URL inside the cluster."""
    sla_state: str | None = Field(None, max_length=32)
    """Met, AtRisk, Breached or Unknown."""
    sla: SLAStatus | None = None
    last_scaling: ScalingEvent | None = None
    learned_capacity: float | None = None
    """Learned concurrent users one replica serves at the SLA."""
    learned_startup_seconds: float | None = None
    """Start-up time the autoscaler's horizons use, learned from the serving's completed group start-ups
    (spec.autoscaling.replicaStartupSeconds is its prior); unset while none was seen."""
    learned_startup_seconds_by_cache_state: dict[str, float] | None = Field(None, max_length=3)
    """Learned start-up seconds per cache state seen (cold, weights-cached, warm)."""
    draining_groups: list[DrainingGroup] | None = Field(None, max_length=MAX_GROUPS + 1)
    """Replica groups taken out of routing that wait for their requests to finish before they go."""
    last_drains: list[EndedDrain] | None = Field(None, max_length=MAX_GROUPS + 1)
    """The drains that ended at the most recent reconcile that ended any, and what ended each."""
    startup: StartupStatus | None = None
    """Start-ups of replica groups, per phase, from the API's own timestamps (written only when one
    completes)."""
    router: RouterStatus | None = None
    """The router Deployment's pods, while spec.routing.enabled."""
    conditions: list[Condition] | None = Field(None, max_length=MAX_LIST)


class DeepSeekServing(_Model):
    """Serves DeepSeek-V4.1-Flash with vLLM on NVIDIA Blackwell: one StatefulSet per replica group."""

    model_config = ConfigDict(extra="ignore")  # metadata and status come from the API server
    api_version: Literal["flashserve.io/v1alpha1"] = API_VERSION
    kind: Literal["DeepSeekServing"] = KIND
    metadata: dict = Field(default_factory=dict)
    spec: DeepSeekServingSpec = Field(default_factory=DeepSeekServingSpec)
    status: DeepSeekServingStatus | None = None
