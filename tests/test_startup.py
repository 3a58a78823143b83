"""spec.startup: validation (each error names the field and the fix), the engine pod's cache volumes, env and
flags, the prefetch and pre-pull children, and what a change re-rolls. The real vLLM's side is
tests/contract/test_startup_contract.py."""

from __future__ import annotations

import copy

import pytest
from flashserve.api.crd import generate_crd
from flashserve.api.validation import SpecError, parse_spec
from flashserve.facts.cache_env import CACHE_ENV_NAMES, CACHE_ENVS
from flashserve.facts.engine_choices import LOAD_FORMAT_CHOICES
from flashserve.facts.layout import layout
from flashserve.render.naming import SERVING_LABEL
from flashserve.render.renderer import render, selector, template_hash
from flashserve.render.vllm_args import HF_HOME, KERNEL_CACHE_MOUNT, kernel_cache_key

from tests.builders import by_kind, cr, pod
from tests.conftest import ROOT, load_sample
from tests.pod_security import violations

SAMPLE = ROOT / "manifests" / "samples" / "gb200-startup-caches.yaml"
CACHES = {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"}, "kernelCache": {"claimName": "kernels"}}


def _errors(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        parse_spec(spec)
    return {e.path: e.message for e in exc.value.errors}


@pytest.mark.parametrize(
    ("spec", "path", "fix"),
    [
        ({"model": {"source": {"pvc": {"claimName": "w"}}}, "startup": CACHES},
         "spec.startup.weightsCache", "remove weightsCache"),
        ({"model": {"source": {"huggingFace": {"cachePvcName": "hf"}}}, "startup": CACHES},
         "spec.startup.weightsCache", "keep one"),
        ({"startup": {"loader": {"format": "runai_streamer", "threads": 4}}}, "spec.startup.loader.threads", "unset threads"),
        ({"startup": {"loader": {"format": "fastsafetensors", "safetensorsLoadStrategy": "eager"}}},
         "spec.startup.loader.safetensorsLoadStrategy", "change the format"),
        ({"startup": {"loader": {"threads": 4, "safetensorsLoadStrategy": "eager"}}},
         "spec.startup.loader.safetensorsLoadStrategy", "set it to lazy"),
        ({"startup": {"loader": {"runaiStreamer": {"concurrency": 8}}}}, "spec.startup.loader.runaiStreamer",
         "set format: runai_streamer"),
        ({"startup": {"loader": {"format": "dummy"}}}, "spec.startup.loader.format", "'auto'"),
        ({"startup": {"warmup": {"deepGemm": "none"}}}, "spec.startup.warmup.deepGemm", "'skip'"),
        ({"startup": {"weightsCache": {"scope": "Node", "claimName": "w"}}}, "spec.startup.weightsCache.scope", "NodeLocal"),
        ({"startup": {"weightsCache": {"scope": "Shared"}}}, "spec.startup.weightsCache.claimName", "required"),
        ({"startup": {"imagePrepull": {"enabled": True, "pauseImage": "bad image"}}},
         "spec.startup.imagePrepull.pauseImage", "image"),
        ({"engine": {"env": [{"name": "TRITON_CACHE_DIR", "value": "/x"}]}}, "spec.engine.env[0].name",
         "spec.startup.kernelCache"),
        ({"engine": {"env": [{"name": "VLLM_DEEP_GEMM_WARMUP", "value": "skip"}]}}, "spec.engine.env[0].name",
         "spec.startup.warmup.deepGemm"),
        ({"engine": {"extraArgs": ["--load-format", "runai_streamer"]}}, "spec.engine.extraArgs[0]",
         "spec.startup.loader.format"),
        ({"engine": {"extraArgs": ["--no-enable-flashinfer-autotune"]}}, "spec.engine.extraArgs[0]",
         "spec.startup.warmup.flashinferAutotune"),
        ({"engine": {"extraArgs": ["--model-loader-extra-config", "{}"]}}, "spec.engine.extraArgs[0]",
         "spec.startup.loader"),
    ],
)  # fmt: skip
def test_bad_startup_names_the_field_and_the_fix(spec, path, fix):
    errors = _errors(spec)
    assert path in errors, errors
    assert fix.lower() in errors[path].lower(), errors[path]


def test_the_crd_offers_what_the_api_does_and_defaults_nothing():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    startup = spec["properties"]["startup"]
    # no default: a serving that never set spec.startup is stored (and rendered) as before
    assert "default" not in startup
    assert startup["properties"]["loader"]["properties"]["format"]["enum"] == list(LOAD_FORMAT_CHOICES)
    rules = [r["rule"] for r in startup["properties"]["loader"]["x-kubernetes-validations"]]
    assert any("runaiStreamer" in r for r in rules) and any("threads" in r for r in rules)
    assert any("startup.weightsCache" in r["rule"] for r in spec["x-kubernetes-validations"])


def _container(objs: list[dict]) -> dict:
    return next(c for c in pod(objs)["containers"] if c["name"] == "vllm")


def test_the_sample_mounts_both_caches_and_points_every_cache_variable_at_its_key():
    cr_ = load_sample(SAMPLE)
    objs = render(cr_)
    spec = parse_spec(cr_["spec"])
    podspec, container = pod(objs), _container(objs)
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in podspec["volumes"]}
    assert claims["hf-cache"] == "deepseek-weights" and claims["kernel-cache"] == "deepseek-kernels"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["hf-cache"] == HF_HOME and mounts["kernel-cache"] == KERNEL_CACHE_MOUNT
    env = {e["name"]: e.get("value") for e in container["env"]}
    root = f"{KERNEL_CACHE_MOUNT}/{kernel_cache_key(spec, layout(spec))}"
    assert {e.name: env[e.name] for e in CACHE_ENVS} == {e.name: f"{root}/{e.subdir}" for e in CACHE_ENVS}
    assert env["VLLM_DEEP_GEMM_WARMUP"] == "skip"
    args = container["args"]
    assert args[args.index("--load-format") + 1] == "safetensors"
    assert args[args.index("--model-loader-extra-config") + 1] == '{"enable_multithread_load":true,"num_threads":16}'
    assert "--no-enable-flashinfer-autotune" in args


def test_without_startup_nothing_changes_in_the_pod():
    container = _container(render(cr({})))
    assert not {e["name"] for e in container["env"]} & (CACHE_ENV_NAMES | {"VLLM_DEEP_GEMM_WARMUP"})
    assert not {"--load-format", "--model-loader-extra-config", "--no-enable-flashinfer-autotune"} & set(container["args"])
    assert not {"DaemonSet", "Job"} & {o["kind"] for o in render(cr({}))}


def test_default_loader_options_render_no_flags():
    args = _container(render(cr({"startup": {"loader": {"format": "auto"}, "warmup": {}}})))["args"]
    assert "--load-format" not in args and "--model-loader-extra-config" not in args


def test_runai_streamer_options_become_the_loader_config():
    spec = {"startup": {"loader": {"format": "runai_streamer",
                                   "runaiStreamer": {"concurrency": 16, "memoryLimitBytes": -1}}}}  # fmt: skip
    args = _container(render(cr(spec)))["args"]
    assert args[args.index("--load-format") + 1] == "runai_streamer"
    assert args[args.index("--model-loader-extra-config") + 1] == '{"concurrency":16,"memory_limit":-1}'


def test_kernel_cache_key_follows_image_and_layout():
    base = parse_spec({"startup": {"kernelCache": {"claimName": "k"}}})
    key = kernel_cache_key(base, layout(base))
    same = parse_spec({"startup": {"kernelCache": {"claimName": "other"}}, "replicas": 3})
    assert kernel_cache_key(same, layout(same)) == key  # claim and replica count do not matter
    for change in ({"engine": {"image": "vllm/vllm-openai:v0.33.1"}}, {"parallelism": {"nodesPerReplica": 2}},
                   {"parallelism": {"tensorParallelSize": 2}}, {"parallelism": {"expertParallel": False}},
                   {"placement": {"accelerator": "GB300"}}):  # fmt: skip
        other = parse_spec({"startup": {"kernelCache": {"claimName": "k"}}, **change})
        assert kernel_cache_key(other, layout(other)) != key, change


def test_template_hash_ignores_prepull_and_prefetch_but_not_the_caches():
    spec = {"startup": copy.deepcopy(CACHES)}
    h = template_hash(parse_spec(spec))
    spec["startup"]["imagePrepull"] = {"enabled": True}
    spec["startup"]["weightsCache"]["prefetch"] = False
    assert template_hash(parse_spec(spec)) == h
    spec["startup"]["kernelCache"]["claimName"] = "kernels-2"
    assert template_hash(parse_spec(spec)) != h
    assert template_hash(parse_spec({"startup": {"warmup": {"deepGemm": "skip"}}})) != template_hash(parse_spec({}))


def _startup_children(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] in ("DaemonSet", "Job")]


def test_node_local_prefetch_is_a_daemonset_on_the_pool_with_the_token_from_its_secret():
    objs = render(load_sample(SAMPLE))
    prefetch, prepull = by_kind(objs, "DaemonSet")
    engine = pod(objs)
    tpl = prefetch["spec"]["template"]["spec"]
    download = tpl["initContainers"][0]
    assert download["command"] == ["hf", "download"]
    assert download["args"] == ["deepseek-ai/DeepSeek-V4.1-Flash-1017", "--revision", "main"]
    env = {e["name"]: e for e in download["env"]}
    assert env["HF_HOME"]["value"] == HF_HOME
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert {v["persistentVolumeClaim"]["claimName"] for v in tpl["volumes"]} == {"deepseek-weights"}
    for child in (prefetch, prepull):
        t = child["spec"]["template"]["spec"]
        assert t["tolerations"] == engine["tolerations"] and t["affinity"]["nodeAffinity"] == engine["affinity"]["nodeAffinity"]
    assert prepull["spec"]["template"]["spec"]["initContainers"][0]["image"] == _container(objs)["image"]


def test_startup_pods_are_not_engine_pods():
    """The client Service, the PDB and the NetworkPolicy select engine pods by the serving label: a prefetch or
    pre-pull pod must never match, or it would take traffic or count against the budget."""
    cr_ = load_sample(SAMPLE)
    objs = render(cr_)
    engine_selector = selector(cr_["metadata"]["name"])
    children = _startup_children(objs)
    assert len(children) == 2
    for child in children:
        labels = child["spec"]["template"]["metadata"]["labels"]
        assert SERVING_LABEL not in labels
        assert not all(labels.get(k) == v for k, v in engine_selector.items())
        assert child["metadata"]["labels"][SERVING_LABEL] == engine_selector[SERVING_LABEL]  # found as a child
        sel = child["spec"].get("selector", {}).get("matchLabels")
        if sel:
            assert all(labels[k] == v for k, v in sel.items())


def test_shared_cache_prefetch_is_one_job_renamed_when_what_it_downloads_changes():
    spec = {"startup": {"weightsCache": {"scope": "Shared", "claimName": "rwx"}}}
    (job,) = _startup_children(render(cr(spec)))
    assert job["kind"] == "Job" and job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert len(job["metadata"]["name"]) <= 63
    pinned = _startup_children(render(cr({**spec, "model": {"revision": "abc123"}})))[0]
    assert pinned["metadata"]["name"] != job["metadata"]["name"]
    assert pinned["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--revision", "abc123"]
    assert _startup_children(render(cr({"startup": {"weightsCache": {"scope": "Shared", "claimName": "rwx",
                                                                     "prefetch": False}}}))) == []  # fmt: skip


@pytest.mark.parametrize("spec", [{"startup": {**CACHES, "imagePrepull": {"enabled": True}}, "engine": {"ipcLock": True}},
                                  {"startup": {"weightsCache": {"scope": "Shared", "claimName": "rwx"}}}])
def test_startup_pods_meet_restricted_even_when_engines_need_more(spec):
    for child in _startup_children(render(cr(spec))):
        assert violations(child["spec"]["template"]["spec"], "restricted") == []
