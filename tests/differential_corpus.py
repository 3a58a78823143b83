"""A seeded corpus of DeepSeekServing objects for the admission differential: the API server (the CRD's
schema and CEL rules) and the operator (`parse_serving`) must give every one the same verdict, except the
classes docs/api-validation.md lists.

Each case names its class: `valid` (generated to pass), one class per rule of api/validation.py (a valid object
broken in exactly that way), `field:*` (single-field limits and JSON types, which both sides take from the
same schema) and `mutated` (a valid object with one field set to a value drawn at random, valid or not).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from flashserve.facts.accelerators import ACCELERATORS
from flashserve.facts.engine_choices import ALL2ALL_BACKEND_CHOICES
from flashserve.facts.managed import MANAGED_ENV, ROUTE_ENV
from flashserve.facts.vllm_rules import DBO_ALL2ALL_BACKENDS, NO_EPLB_ALL2ALL_BACKENDS

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"

# Classes whose verdicts may differ, with the reason in docs/api-validation.md: the API server checks each
# extraArgs item alone (the managed-flag pattern), the operator also reads the items in sequence.
DOCUMENTED = {"extraArgs:context"}


@dataclass(frozen=True)
class Case:
    klass: str
    obj: dict
    expect_admit: bool | None  # what the generator meant (None: drawn at random)


def _cr(name: str, spec: dict) -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def _set(spec: dict, path: str, value) -> dict:
    out = copy.deepcopy(spec)
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return out


def _valid_spec(rng: random.Random) -> dict:
    """A spec that every rule admits, drawn over the settings the cross-field rules read."""
    acc = rng.choice(sorted(ACCELERATORS))
    a = ACCELERATORS[acc]
    tp = rng.choice([t for t in (1, 2, 4, 8) if a.gpus_per_node % t == 0])
    nodes = rng.choice([1, 2, min(4, a.nodes_per_nvlink_domain) if a.multi_node_nvlink else 3])
    spec: dict = {
        "placement": {"accelerator": acc},
        "parallelism": {"tensorParallelSize": tp, "nodesPerReplica": nodes},
        "replicas": rng.randint(0, 8),
    }
    if rng.random() < 0.5:
        spec["parallelism"]["dataParallelSizeLocal"] = a.gpus_per_node // tp
    dp = (a.gpus_per_node // tp) * nodes
    if dp > 1 and rng.random() < 0.3:
        spec["parallelism"]["dbo"] = {"enabled": True}
        spec["parallelism"]["all2allBackend"] = rng.choice(DBO_ALL2ALL_BACKENDS)
        if rng.random() < 0.5:
            spec["engine"] = {"speculative": {"enabled": False}}
    elif rng.random() < 0.4:
        spec["parallelism"]["all2allBackend"] = rng.choice(
            [b for b in ALL2ALL_BACKEND_CHOICES if b not in NO_EPLB_ALL2ALL_BACKENDS])
        spec["parallelism"]["eplb"] = {"enabled": rng.random() < 0.5}
    if a.multi_node_nvlink and rng.random() < 0.3:
        spec["placement"]["computeDomain"] = {"enabled": True}
    if rng.random() < 0.3:
        spec["engine"] = {**spec.get("engine", {}), "maxNumSeqs": 256, "maxNumBatchedTokens": rng.choice([256, 8192]),
                          "maxModelLen": rng.choice([4096, "32k", "25.6k", "128K", "auto"]),
                          "resources": {"cpu": rng.choice([8, "16", "500m", "1.5e1"]), "memory": "64Gi"},
                          "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
                                  {"name": "MY_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                          "extraArgs": ["--enable-log-requests", "--disable-uvicorn-access-log"]}  # fmt: skip
    if rng.random() < 0.3:
        lo = rng.randint(1, 4)
        spec["autoscaling"] = {"enabled": True, "minReplicas": lo, "maxReplicas": rng.randint(lo, 16)}
    if rng.random() < 0.2:
        spec["model"] = {"servedModelNames": ["a", "b"], "source": {"pvc": {"claimName": "weights"}}}
    if rng.random() < 0.3:
        picker = rng.choice([None, {"name": "epp", "port": {"number": 9002}},
                             {"name": "epp", "kind": "Picker", "group": "epp.example.com", "failureMode": "FailOpen"}])
        spec["routing"] = {"enabled": rng.random() < 0.8, "policy": rng.choice(["consistent_hash", "cache_aware",
                                                                                "power_of_two", "sticky_least_loaded"]),
                           "replicas": rng.randint(1, 4), "port": 8100, "metricsPort": 29100,
                           "inferencePool": {"enabled": True, **({"endpointPickerRef": picker} if picker else {})}}  # fmt: skip
        if rng.random() < 0.5:
            spec["routing"]["resources"] = {"dedicatedCpus": True, "cpu": rng.choice(["2", 4, "16"])}
        if spec["routing"]["policy"] == "sticky_least_loaded":
            spec["routing"]["stickyLeastLoaded"] = {"sessionIdleSeconds": rng.choice([60, 300, 86400])}
    return spec


def _broken(rng: random.Random, base: dict) -> list[tuple[str, dict]]:
    """One object per rule of api/validation.py, each breaking exactly that rule (on top of a valid base)."""
    nv = rng.choice([a.name for a in ACCELERATORS.values() if a.multi_node_nvlink])
    plain = rng.choice([a.name for a in ACCELERATORS.values() if not a.multi_node_nvlink])
    gb = {"placement": {"accelerator": nv}}
    dbo_ok = {"placement": {"accelerator": nv},
              "parallelism": {"dbo": {"enabled": True}, "all2allBackend": DBO_ALL2ALL_BACKENDS[0]}}  # fmt: skip
    gpus = ACCELERATORS[nv].gpus_per_node
    return [
        ("gpusPerNode", _set(gb, "parallelism", {"tensorParallelSize": 1, "dataParallelSizeLocal": rng.choice([1, 2, 3, 8])
                                                 if gpus == 4 else 1})),  # fmt: skip
        ("gpusPerNode", _set(gb, "parallelism.tensorParallelSize", rng.choice([3, 8]))),
        ("dboNeedsExpertParallel", _set(dbo_ok, "parallelism.expertParallel", False)),
        ("dboNeedsExpertParallel", _set(_set(dbo_ok, "parallelism.tensorParallelSize", gpus), "parallelism.nodesPerReplica", 1)),
        ("dboAll2allBackend", _set(dbo_ok, "parallelism.all2allBackend",
                                   rng.choice([b for b in ALL2ALL_BACKEND_CHOICES if b not in DBO_ALL2ALL_BACKENDS]))),
        ("dboAll2allBackend", {**dbo_ok, "parallelism": {"dbo": {"enabled": True}}}),
        ("eplbAll2allBackend", _set(gb, "parallelism", {"eplb": {"enabled": True},
                                                         "all2allBackend": NO_EPLB_ALL2ALL_BACKENDS[0]})),
        ("eplbNeedsExpertParallel", _set(gb, "parallelism", {"eplb": {"enabled": True}, "expertParallel": False})),
        ("all2allNeedsExpertParallel", _set(gb, "parallelism", {"expertParallel": False, "all2allBackend": "deepep_v2"})),
        ("nvlinkDomain", _set(_set(gb, "parallelism.nodesPerReplica", 2), "placement.nvlinkDomain", {"enabled": False})),
        ("nvlinkDomainSize", _set(gb, "parallelism.nodesPerReplica",
                                  rng.randint(ACCELERATORS[nv].nodes_per_nvlink_domain + 1, 72))),
        ("computeDomainAccelerator", _set({"placement": {"accelerator": plain}}, "placement.computeDomain",
                                          rng.choice([{"enabled": True}, {"resourceClaimTemplateName": "imex"}]))),
        ("computeDomainBoth", _set(gb, "placement.computeDomain", {"enabled": True, "resourceClaimTemplateName": "imex"})),
        ("computeDomainOthersChannel", _set(gb, "placement.computeDomain", {"resourceClaimTemplateName":
                                            f"team-{rng.randint(0, 9)}--s3biq3cr-g{rng.randint(0, 9)}-cd-channel"})),
        ("servedNameFlag", _set(base, "model.servedModelNames", ["flash", rng.choice(["--tokens-only", "-x"])])),
        ("prometheusUrlBackslash", _set(base, "autoscaling", {"enabled": True,
                                        "prometheusUrl": "http://169.254.169.254\\.monitoring.svc/"})),
        ("weightsSourceBoth", _set(base, "model.source", {"pvc": {"claimName": "w"}, "huggingFace": {}})),
        ("startupWeightsCache", _set(_set(base, "model.source", rng.choice([{"pvc": {"claimName": "w"}},
                                                                           {"huggingFace": {"cachePvcName": "hf"}}])),
                                     "startup", {"weightsCache": {"scope": rng.choice(["Shared", "NodeLocal"]),
                                                                  "claimName": "c"}})),
        ("startupLoaderOptions", _set(base, "startup.loader", rng.choice([
            {"format": "runai_streamer", "threads": 4}, {"format": "fastsafetensors", "safetensorsLoadStrategy": "eager"},
            {"threads": 4, "safetensorsLoadStrategy": "prefetch"}, {"runaiStreamer": {"concurrency": 2}}]))),
        ("servedModelNamesUnique", _set(base, "model.servedModelNames", ["a", "b", "a"][: rng.choice([2, 3])] + ["a"])),
        ("batchedTokensBelowSeqs", _set(_set(base, "engine.maxNumSeqs", 512), "engine.maxNumBatchedTokens",
                                        rng.randint(1, 511))),
        ("maxModelLen", _set(base, "engine.maxModelLen", rng.choice(["1.5K", "1e5", "2M", "0", "0.0001k", "AUTO", 0,
                                                                      2_000_000, "32 k", "-1"]))),
        ("dboSpeculative", _set(dbo_ok, "engine.speculative", {"enabled": True})),
        ("extraArgs:managed", _set(base, "engine.extraArgs", [rng.choice(["--port=9000", "-tp", "--max-model-len",
                                                                          "--async-scheduling", "--hf-token=x",
                                                                          "--config", "-O3", "--served-model",
                                                                          "--profiler-config={}", "--tokens-only"])])),
        ("extraArgs:context", _set(base, "engine.extraArgs", [rng.choice(["--no-such-flag", "positional", "--",
                                                                          "--swap-space", "--enable-log"])])),
        ("envHubToken", _set(base, "engine.env", [{"name": rng.choice(["HUGGING_FACE_HUB_TOKEN", "hf_api_token",
                                                                       "HuggingFaceToken"]), "value": "x"}])),
        ("envManaged", _set(base, "engine.env", [{"name": rng.choice(sorted(MANAGED_ENV)), "value": "1"}])),
        ("envOpensRoutes", _set(base, "engine.env", [{"name": rng.choice(sorted(ROUTE_ENV)), "value": "1"}])),
        ("envDuplicate", _set(base, "engine.env", [{"name": "A", "value": "1"}, {"name": "B"}, {"name": "A"}])),
        ("envValueAndValueFrom", _set(base, "engine.env", [{"name": "A", "value": "1",
                                                            "valueFrom": {"secretKeyRef": {"name": "s"}}}])),
        ("envValueFromExactlyOne", _set(base, "engine.env", [{"name": "A", "valueFrom": rng.choice(
            [{}, {"secretKeyRef": {"name": "s"}, "configMapKeyRef": {"name": "c"}}])}])),
        ("minAboveMaxReplicas", _set(base, "autoscaling", {"minReplicas": rng.randint(3, 9), "maxReplicas": 2})),
        ("resourceQuantity", _set(base, "engine.resources." + rng.choice(["cpu", "memory", "shmSize"]),
                                  rng.choice(["abc", "-1", "0", 0, -4, "1.5.5", "1e", "10Gib", "", "+", "0.0Gi"]))),
        ("routerResourceQuantity", _set(base, "routing.resources." + rng.choice(["cpu", "memory"]),
                                        rng.choice(["abc", "-1", "0", 0, "1.5.5", "10Gib", ""]))),
        ("routerDedicatedCpusWhole", _set(base, "routing.resources", {"dedicatedCpus": True,
                                                                      "cpu": rng.choice(["1.5", "500m", "2000m", "1e1", "2.0"])})),
        ("routerPortsDiffer", _set(base, "routing", dict.fromkeys(("port", "metricsPort"), rng.choice([8000, 29000])))),
        ("pickerServiceNeedsPort", _set(base, "routing.inferencePool", {"enabled": True, "endpointPickerRef": {
            "name": "epp", **rng.choice([{}, {"kind": "Service"}, {"kind": "Service", "group": ""}])}})),
        # values the children carry, in Kubernetes' own grammars (api/kubevalues.py)
        ("tolerationKeylessEqual", _set(base, "placement.tolerations", [rng.choice(
            [{"operator": "Equal", "value": "x"}, {"key": "", "effect": "NoSchedule"}, {}])])),
        ("tolerationExistsValue", _set(base, "placement.tolerations", [{"key": "k", "operator": "Exists",
                                                                         "value": "v"}])),
        ("tolerationSecondsEffect", _set(base, "placement.tolerations", [{"key": "k", "operator": "Exists",
                                      "tolerationSeconds": 30, "effect": rng.choice(["NoSchedule", None])}])),
        ("tolerationKeyGrammar", _set(base, "placement.tolerations", [{"key": rng.choice(
            ["has space", "-x", "a/b/c", "Upper.Case/x", "x" * 64, "nul\u0000"]), "operator": "Exists"}])),
        ("tolerationValueGrammar", _set(base, "placement.tolerations", [{"key": "k", "value": rng.choice(
            ["has space", "-x", "x" * 64, "a/b"])}])),
        ("nodeSelectorKey", _set(base, "placement.nodeSelector", {rng.choice(["has space", "-x", "a/b/c", "x" * 64,
                                                                              "p" * 254 + "/x"]): "v"})),
        ("nodeSelectorValue", _set(base, "placement.nodeSelector", {"pool": rng.choice(["has space", "-x", "a/b",
                                                                                        "nul\u0000"])})),
        ("topologyKey", _set(base, "placement.nvlinkDomain.topologyKey", rng.choice(["has space", "-x", "a/b/c"]))),
        ("secretKey", _set(base, "model.source", {"huggingFace": {"tokenSecretRef": {"name": "s", "key": rng.choice(
            ["has space", "a/b", "x:y", ".", "..", "..token"])}}})),
        ("secretName", _set(base, "model.source", {"huggingFace": {"tokenSecretRef": {"name": rng.choice(
            ["hf..tok", "hf.-tok", "hf-.tok"])}}})),
        ("rpcPortClash", _set(_set(gb, "parallelism.nodesPerReplica", 2), "engine.port", 29550)),
        ("envSecretKey", _set(base, "engine.env", [{"name": "A", "valueFrom": {"secretKeyRef": {
            "name": "s", "key": rng.choice(["has space", "a/b"])}}}])),
    ]


# Values a mutation may set: valid and invalid ones, of the right and the wrong JSON type.
_MUTATIONS: dict[str, list] = {
    "replicas": [0, 3, 256, 257, -1, "2", 1.5, True],
    "parallelism.tensorParallelSize": [1, 2, 4, 8, 0, 9, "1"],
    "parallelism.dataParallelSizeLocal": [1, 2, 4, 8, 0, 9],
    "parallelism.nodesPerReplica": [1, 2, 18, 19, 72, 73],
    "parallelism.all2allBackend": [*ALL2ALL_BACKEND_CHOICES, "pplx", "naive", ""],
    "parallelism.expertParallel": [True, False, "true"],
    "parallelism.rpcPort": [1024, 80, 65536],
    "placement.accelerator": [*sorted(ACCELERATORS), "H100", "gb200"],
    "placement.nodeSelector": [{"pool": "a"}, {"k" * 317: "v"}, {"pool": "v" * 64}],
    "placement.tolerations": [[], [{"operator": "Bad"}], [{"key": "x", "operator": "Exists", "tolerationSeconds": 5}],
                              None],
    "engine.kvCacheDtype": ["auto", "fp8_ds_mla", "float16", "bogus"],
    "engine.attentionBackend": ["FLASHMLA", "FLASH_ATTN", "CPU_MLA"],
    "engine.cudaGraphMode": ["FULL", "NONE", "full"],
    "engine.gpuMemoryUtilization": [0.5, 1, 0, 1.01, "0.9"],
    "engine.maxNumSeqs": [1, 65536, 65537, 0],
    "engine.maxModelLen": [1, 1_048_576, 1_048_577, "1M", "1m", "1G", "1024K", "auto", "", "1048.5765k", "1048.577k"],
    "engine.image": ["repo/img:tag", "has space", "", "img\u00a0x", "img\u2028x"],
    "engine.port": [8000, 1023, 65535],
    "engine.extraArgs": [["--enable-log-requests"], ["--port"], ["x" * 1025]],
    "engine.resources.cpu": [1, "1", "100m", "1Ki", "1e3", "1E", "0.5", ".5", "1.", "-1", "1x", "1e2.5"],
    "engine.speculative.numSpeculativeTokens": [1, 4, 5, 0],
    "model.name": ["deepseek-ai/x", "", "-bad", "a" * 257],
    "model.servedModelNames": [["x"], [], ["x", "x"], ["a"] * 9, ["has space"]],
    "model.revision": ["main", "bad rev", ""],
    "autoscaling.minReplicas": [1, 256, 0, 257],
    "autoscaling.maxReplicas": [1, 4, 256, 257],
    "autoscaling.mode": ["Active", "Advisory", "active"],
    "autoscaling.prometheusUrl": ["http://p:9090", "ftp://p", "http://a b", None],
    "autoscaling.sla.percentile": [50, 0, 100, 99.9],
    "autoscaling.metricsWindowSeconds": [10, 9, 1800, 1801],
    "networkPolicy.allowedNamespaces": [["gw"], ["Bad_NS"], ["a"] * 65],
    "rollout.maxUnavailable": [1, 0, 256, 257],
    "routing.policy": ["consistent_hash", "cache_aware", "random", "kv_aware", ""],
    "routing.replicas": [1, 2, 64, 0, 65],
    "routing.metricsPort": [29000, 8000, 1023, 65536],
    "routing.cacheAware.cacheThreshold": [0, 0.3, 1, 1.01, -0.1],
    "routing.cacheAware.balanceRelThreshold": [1, 1.5, 0.99],
    "routing.image": ["repo/router:1", "has space", "", "r\x01outer:1", "r\u00a0outer"],
    "routing.resources.cpu": ["2", "1.5", 3, "abc"],
    "routing.resources.dedicatedCpus": [True, False, "yes"],
    "routing.inferencePool.endpointPickerRef": [{"name": "e", "port": {"number": 9002}}, {"name": "e"},
                                                {"name": "e", "port": {"number": 0}}, {"name": ""}],
    "rollout.drainSeconds": [0, 3600, -1, 3601, "60"],
    "rollout.surge": [False, "yes"],
    "engine": [None],  # a null in a field that is not nullable is pruned, so the defaults apply
    "unknownField": [1],
    "engine.unknownField": ["x"],
}


def corpus(seed: int = 17, valid: int = 120, broken_rounds: int = 8, mutated: int = 200) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    for path in sorted(SAMPLES.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        cases.append(Case("valid:sample", _cr(obj["metadata"]["name"], obj.get("spec") or {}), True))
    bases = [_valid_spec(rng) for _ in range(valid)]
    cases += [Case("valid", _cr(f"v{i}", s), True) for i, s in enumerate(bases)]
    for r in range(broken_rounds):
        for j, (klass, spec) in enumerate(_broken(rng, rng.choice(bases))):
            cases.append(Case(klass, _cr(f"b{r}-{j}", spec), False))
        # a name shaped like the one the operator gives another serving's router objects (render/naming.py)
        cases.append(Case("routerName", _cr(f"flash{r}--{rng.choice(['qupehpke', 'abcdefgh'])}-router",
                                            rng.choice(bases)), False))
    for i in range(mutated):
        path = rng.choice(sorted(_MUTATIONS))
        spec = _set(rng.choice(bases), path, rng.choice(_MUTATIONS[path]))
        cases.append(Case("mutated", _cr(f"m{i}", spec), None))
    for i, name in enumerate(["UPPER", "a" * 254, "-x", "ok.name"]):
        cases.append(Case("field:metadata.name", {**_cr(name, {}), "metadata": {"name": name}}, name == "ok.name"))
    return cases
