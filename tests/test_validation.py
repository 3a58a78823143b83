"""Each rule rejects what it should, naming the field path and the fix; valid specs pass."""

from __future__ import annotations

import pytest
from flashserve.api import quantity
from flashserve.api.validation import SpecError, parse_serving, parse_spec


def cr(spec: dict, name: str = "flash") -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name}, "spec": spec}


def errors_of(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        parse_spec(spec)
    return {e.path: e.message for e in exc.value.errors}


def test_minimal_spec_is_a_sensible_deployment():
    spec = parse_spec({})
    assert spec.placement.accelerator == "GB200"
    assert spec.model.name == "deepseek-ai/DeepSeek-V4.1-Flash-1017"
    assert spec.model.served_model_names == ["deepseek-flash"]
    assert spec.parallelism.expert_parallel and spec.engine.prefix_caching and spec.speculative_decoding()
    assert spec.replicas == 1


@pytest.mark.parametrize(
    "spec, path, words",
    [
        ({"parallelism": {"tensorParallelSize": 2, "dataParallelSizeLocal": 4}}, "spec.parallelism.dataParallelSizeLocal", "GB200 node has 4"),
        ({"placement": {"accelerator": "B200"}, "parallelism": {"dataParallelSizeLocal": 4}}, "spec.parallelism.dataParallelSizeLocal", "B200 node has 8"),
        ({"parallelism": {"tensorParallelSize": 8}}, "spec.parallelism.dataParallelSizeLocal", "has 4"),
        ({"parallelism": {"expertParallel": False, "dbo": {"enabled": True}}}, "spec.parallelism.dbo.enabled", "expertParallel"),
        ({"parallelism": {"tensorParallelSize": 4, "dataParallelSizeLocal": 1, "dbo": {"enabled": True}}}, "spec.parallelism.dbo.enabled", "more than one data-parallel rank"),
        ({"parallelism": {"expertParallel": False, "eplb": {"enabled": True}}}, "spec.parallelism.eplb.enabled", "expertParallel: true"),
        ({"parallelism": {"expertParallel": False, "all2allBackend": "deepep_low_latency"}}, "spec.parallelism.all2allBackend", "expertParallel"),
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "spec.autoscaling.minReplicas", "above maxReplicas"),
        ({"autoscaling": {"sla": {"perUserTokensPerSecond": 0}}}, "spec.autoscaling.sla.perUserTokensPerSecond", "greater than 0"),
        ({"parallelism": {"nodesPerReplica": 2}, "placement": {"nvlinkDomain": {"enabled": False}}}, "spec.placement.nvlinkDomain.enabled", "NVLink domain"),
        ({"parallelism": {"nodesPerReplica": 19}}, "spec.parallelism.nodesPerReplica", "at most 18"),
        ({"placement": {"accelerator": "B200", "computeDomain": {"enabled": True}}}, "spec.placement.computeDomain", "GB200/GB300"),
        ({"model": {"source": {"huggingFace": {}, "pvc": {"claimName": "w"}}}}, "spec.model.source", "exactly one"),
        ({"model": {"servedModelNames": ["a", "a"]}}, "spec.model.servedModelNames", "unique"),
        ({"engine": {"maxNumSeqs": 4096, "maxNumBatchedTokens": 2048}}, "spec.engine.maxNumBatchedTokens", "at least maxNumSeqs"),
        ({"engine": {"maxModelLen": "lots"}}, "spec.engine.maxModelLen", "not a context length"),
        ({"engine": {"maxModelLen": "1.5K"}}, "spec.engine.maxModelLen", "32K (32768)"),
        ({"engine": {"maxModelLen": "2M"}}, "spec.engine.maxModelLen", "at most 1M"),
        ({"engine": {"maxModelLen": 0}}, "spec.engine.maxModelLen", "at least 1"),
        ({"parallelism": {"nodesPerReplica": 2, "dbo": {"enabled": True}}, "engine": {"speculative": {"enabled": True}}},
         "spec.engine.speculative.enabled", "dual-microbatch overlap"),
        ({"engine": {"extraArgs": ["--enable-log-requests", "--tensor-parallel-size=2"]}}, "spec.engine.extraArgs[1]", "spec.parallelism.tensorParallelSize"),
        ({"engine": {"extraArgs": ["-tp", "2"]}}, "spec.engine.extraArgs[0]", "operator manages"),
        ({"engine": {"extraArgs": ["--max_num_seqs=5"]}}, "spec.engine.extraArgs[0]", "spec.engine.maxNumSeqs"),
        ({"engine": {"extraArgs": ["--no-enable-prefix-caching"]}}, "spec.engine.extraArgs[0]", "spec.engine.prefixCaching"),
        ({"engine": {"extraArgs": ["--compilation-config.cudagraph_mode=NONE"]}}, "spec.engine.extraArgs[0]", "cudaGraphMode"),
        ({"engine": {"extraArgs": ["--custom-histogram-buckets={}"]}}, "spec.engine.extraArgs[0]", "operator manages"),
        ({"engine": {"env": [{"name": "HF_TOKEN", "value": "x"}]}}, "spec.engine.env[0].name", "spec.model.source"),
        ({"engine": {"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}}, "spec.engine.env[0].name",
         "/collective_rpc"),
        ({"engine": {"env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"}]}},
         "spec.engine.env[0].name", "/v1/load_lora_adapter"),
        ({"engine": {"extraArgs": ["--profiler-config.profiler=torch"]}}, "spec.engine.extraArgs[0]", "/start_profile"),
        ({"engine": {"extraArgs": ["--tokens-only"]}}, "spec.engine.extraArgs[0]", "any client of the serving"),
        ({"engine": {"extraArgs": ["--no-tokens-only"]}}, "spec.engine.extraArgs[0]", "turns --tokens-only off"),
        # a name or revision starting with `-` would be read by vLLM as a flag of its own
        ({"model": {"servedModelNames": ["flash", "--tokens-only"]}}, "spec.model.servedModelNames[1]", "pattern"),
        ({"model": {"revision": "--headless"}}, "spec.model.revision", "pattern"),
        ({"parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {
            "resourceClaimTemplateName": "team-a--s3biq3cr-g0-cd-channel"}}},
         "spec.placement.computeDomain.resourceClaimTemplateName", "the operator creates for a serving"),
        ({"engine": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, "spec.engine.env[1].name", "twice"),
        ({"engine": {"kvCacheDtype": "int4"}}, "spec.engine.kvCacheDtype", "fp8_ds_mla"),
        ({"placement": {"accelerator": "H100"}}, "spec.placement.accelerator", "GB200"),
        ({"enginee": {}}, "spec.enginee", "unknown field"),
        ({"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
        ({"replicas": "2"}, "spec.replicas", "valid integer"),  # strict JSON types, as the API server
        ({"engine": {"prefixCaching": "yes"}}, "spec.engine.prefixCaching", "valid boolean"),
        ({"engine": {"resources": {"cpu": "lots"}}}, "spec.engine.resources.cpu", "not a Kubernetes quantity"),
        ({"engine": {"resources": {"memory": "0Gi"}}}, "spec.engine.resources.memory", "not positive"),
        ({"engine": {"resources": {"shmSize": -1}}}, "spec.engine.resources.shmSize", "not positive"),
    ],
)
def test_rule(spec, path, words):
    errs = errors_of(spec)
    assert path in errs, errs
    assert words in errs[path]


def test_all_broken_rules_are_reported_together():
    errs = errors_of({"autoscaling": {"minReplicas": 3, "maxReplicas": 1},
                      "parallelism": {"expertParallel": False, "eplb": {"enabled": True}}})  # fmt: skip
    assert {"spec.autoscaling.minReplicas", "spec.parallelism.eplb.enabled"} <= set(errs)


def test_unmanaged_extra_args_and_env_are_allowed():
    spec = parse_spec({"engine": {"extraArgs": ["--enable-log-requests", "--tool-call-parser", "deepseek_v3"],
                                  "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}})  # fmt: skip
    assert spec.engine.extra_args[0] == "--enable-log-requests"


def test_document_level_errors_name_fields():
    with pytest.raises(SpecError) as exc:
        parse_serving({"apiVersion": "v1", "kind": "Pod", "spec": {}})
    paths = [e.path for e in exc.value.errors]
    assert paths == ["apiVersion", "kind", "metadata.name"]


def test_valid_cr_parses():
    obj = parse_serving(cr({"placement": {"accelerator": "B300"}}))
    assert obj.spec.placement.accelerator == "B300"


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "HUGGINGFACEHUB_API_TOKEN",
                                  "HF_API_TOKEN", "hf_token"])  # fmt: skip
@pytest.mark.parametrize("source", [{"value": "hf_secret"}, {"valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}])
def test_a_hub_token_in_env_points_to_the_token_secret_ref(name, source):
    errs = errors_of({"engine": {"env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": name, **source}]}})
    assert "spec.model.source.huggingFace.tokenSecretRef" in errs["spec.engine.env[1].name"], errs


@pytest.mark.parametrize("spec, path", [
    ({"replicas": 257}, "spec.replicas"),
    ({"autoscaling": {"enabled": True, "maxReplicas": 257}}, "spec.autoscaling.maxReplicas"),
])  # fmt: skip
def test_one_serving_holds_at_most_the_group_ceiling(spec, path):
    from flashserve.api.v1alpha1 import MAX_GROUPS

    assert MAX_GROUPS == 256
    assert "256" in errors_of(spec)[path]
    at_ceiling = {k: ({**v, "maxReplicas": 256} if isinstance(v, dict) else 256) for k, v in spec.items()}
    assert parse_spec(at_ceiling)


@pytest.mark.parametrize(
    ("value", "whole"),
    [(2, True), ("2", True), ("16", True), ("1.5", False), ("500m", False), ("2000m", False), ("2.0", False),
     ("2e0", False), ("1k", False), ("2\n", False), (True, False)],
)
def test_whole_cores_are_digits_as_the_crds_rule_reads_them(value, whole):
    """The API server's own quantity(x).isInteger() refuses 2000m and admits 1k (checked on a server-side dry
    run); the rule both sides state is plainer: digits."""
    assert quantity.is_whole(value) is whole


@pytest.mark.parametrize(("a", "b"), [("1024Gi", "1Ti"), ("1.5", "1500m"), ("1000m", "1"), ("1e3", "1k"),
                                      (".5", "500m"), (8, "8"), ("1E", "1e18"), ("0.5Gi", "512Mi"), ("1.", "1"),
                                      ("2e-3", "2m")])  # fmt: skip
def test_quantities_of_one_amount_in_two_spellings_are_equal(a, b):
    assert quantity.amount(a) == quantity.amount(b) is not None


@pytest.mark.parametrize("q", ["", "abc", "1.5.5", "1e", "10Gib", ".", True, 1.5, None, "+"])
def test_what_is_not_a_quantity_has_no_amount(q):
    assert quantity.amount(q) is None


def test_sections_left_empty_in_a_file_mean_their_defaults_as_the_api_server_prunes_them():
    """The API server drops a null in a field that is not nullable before defaulting; `flashserve validate`
    reads a file the same way, and keeps the nulls of nullable fields."""
    obj = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "flash"},
           "spec": {"engine": None, "placement": {"tolerations": None, "nodeSelector": None},
                    "autoscaling": {"prometheusUrl": None, "sla": None}, "routing": None}}  # fmt: skip
    from flashserve.api.validation import _spec_schema, prune_nulls

    kept = prune_nulls(obj["spec"], _spec_schema())
    assert kept == {"placement": {}, "autoscaling": {"prometheusUrl": None}}, "nullable fields keep their null"
    spec = parse_serving(obj).spec
    default = parse_spec({})
    assert spec.engine == default.engine and spec.placement.tolerations == default.placement.tolerations
    assert spec.autoscaling.prometheus_url is None and spec.routing.enabled
    with pytest.raises(SpecError, match="spec.replicas"):
        parse_serving({**obj, "spec": {"replicas": "two"}})
