"""spec.startup against the real vLLM 0.33: every load format the API offers, with its options, builds the
loader vLLM would load with (its constructor refuses options the loader does not take), the warm-up flag sets
what it says, and every cache variable the operator sets is read, under that name, by the package that owns
it (tools/vllm-contract/harness/startup_check.py). The same pods also pass the engine levels of
engine_check.py, so the start-up flags go with everything else on the command line."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import zipfile

import pytest
import yaml
from flashserve.api import v1alpha1 as api
from flashserve.api.validation import parse_serving
from flashserve.facts.cache_env import CACHE_ENV_NAMES, CACHE_ENVS, DEEP_GEMM_WARMUP_ENV
from flashserve.facts.engine_choices import LOAD_FORMAT_CHOICES
from flashserve.render.vllm_args import KERNEL_CACHE_MOUNT, loader_extra_config

from tests.contract.conftest import HARNESS, check_engines, run_in_vllm
from tests.contract.corpus import SAMPLES
from tests.contract.pods import engine_pods

# Readers the harness runs, by the variable they read; the other variables' packages are not in the venv.
CHECKED_BY_READER = {"VLLM_CACHE_ROOT": "vllm", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "vllm", "TRITON_CACHE_DIR": "triton"}


def _cr(name: str, startup: dict, **spec) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"startup": startup, **spec}}  # fmt: skip


def _crs() -> dict[str, dict]:
    crs = {f"format-{f}": _cr(f"format-{f.replace('_', '-')}", {"loader": {"format": f}}) for f in LOAD_FORMAT_CHOICES}
    crs.update({
        "threads": _cr("threads", {"loader": {"format": "safetensors", "threads": 8, "safetensorsLoadStrategy": "lazy"}}),
        "eager": _cr("eager", {"loader": {"safetensorsLoadStrategy": "eager"}}),
        "prefetch-strategy": _cr("prefetch", {"loader": {"format": "safetensors", "safetensorsLoadStrategy": "prefetch"}}),
        "runai-options": _cr("runai", {"loader": {"format": "runai_streamer", "runaiStreamer": {
            "concurrency": 32, "memoryLimitBytes": 8 << 30, "distributed": True}}}),
        "autotune-on": _cr("autotune-on", {"warmup": {"flashinferAutotune": True, "deepGemm": "full"}}),
        "caches-2node": _cr("caches", {"kernelCache": {"claimName": "kernels"},
                                       "weightsCache": {"scope": "Shared", "claimName": "weights"},
                                       "warmup": {"deepGemm": "relax", "flashinferAutotune": False}},
                            placement={"accelerator": "GB300"},
                            parallelism={"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency"}),
    })
    for path in sorted(SAMPLES.glob("*.yaml")):
        cr = yaml.safe_load(path.read_text())
        if (cr.get("spec") or {}).get("startup"):
            crs[f"sample-{path.stem}"] = cr
    return crs


@pytest.fixture(scope="module")
def checked(vllm_python):
    crs = _crs()
    cases, meta = [], {}
    for name, cr in crs.items():
        serving = parse_serving(cr)
        pods = engine_pods(cr)
        for pod in {p["pod"]: p for p in (pods[0], pods[-1])}.values():  # pod 0 and pod k: different ranks
            cid = f"{name}/pod-{pod['pod']}"
            cases.append({"id": cid, "argv": pod["argv"], "env": pod["env"], "accelerator": pod["accelerator"],
                          "mount": KERNEL_CACHE_MOUNT})  # fmt: skip
            meta[cid] = serving.spec
    out = run_in_vllm(vllm_python, "startup_check.py", input=json.dumps(cases))
    startup = {v["id"]: v for v in map(json.loads, filter(str.strip, out.splitlines()))}
    engines = check_engines(vllm_python, cases)
    return startup, engines, meta


def test_the_sample_with_caches_is_checked():
    assert any(name.startswith("sample-") for name in _crs()), "no sample sets spec.startup"


def test_every_startup_pod_passes_the_engine_levels(checked):
    _, engines, _ = checked
    failed = {cid: v["error"] for cid, v in engines.items() if not v["ok"]}
    assert not failed, "vLLM refused:\n" + "\n".join(f"  {cid}: {err[:600]}" for cid, err in sorted(failed.items()))


def test_vllm_builds_the_loader_the_spec_names(checked):
    startup, _, meta = checked
    for cid, v in startup.items():
        assert "error" not in v, f"{cid}: {v.get('error')}"
        spec = meta[cid]
        loader = v["loader"]
        assert loader["load_format"] == spec.startup.loader.format, cid
        assert loader["model_loader_extra_config"] == loader_extra_config(spec), cid
        assert loader["safetensors_load_strategy"] == spec.startup.loader.safetensors_load_strategy, cid
        want_class = "RunaiModelStreamerLoader" if spec.startup.loader.format == "runai_streamer" else "DefaultModelLoader"
        assert loader["class"] == want_class, cid
        autotune = spec.startup.warmup.flashinfer_autotune
        assert v["flags"]["enable_flashinfer_autotune"] == autotune, cid


def test_each_cache_variable_is_read_by_its_package(checked):
    startup, _, meta = checked
    seen_cache = False
    for cid, v in startup.items():
        spec, env_in, read = meta[cid], v["env_in"], v["env"]
        for name in ("VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_DEEP_GEMM_WARMUP"):
            assert read[name]["registered"], f"vLLM 0.33 has no {name}"
        warmup = spec.startup.warmup.deep_gemm
        assert read[DEEP_GEMM_WARMUP_ENV]["value"] == (warmup or "relax"), cid
        if spec.startup.kernel_cache is None:
            assert not set(env_in) & CACHE_ENV_NAMES, cid
            continue
        seen_cache = True
        assert set(env_in) >= CACHE_ENV_NAMES, cid
        assert all(env_in[n].startswith(v["tmp"] + "/") for n in CACHE_ENV_NAMES), cid
        assert read["VLLM_CACHE_ROOT"]["value"] == env_in["VLLM_CACHE_ROOT"], cid
        assert read["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]["value"] == env_in["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"], cid
        assert read["flashinfer_autotune_root"] == env_in["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"], cid
        assert read["TRITON_CACHE_DIR"]["value"] == env_in["TRITON_CACHE_DIR"], cid
        # vLLM's torch.compile set-up keeps a Triton directory the pod chose, so Triton stays on the volume
        assert read["triton_after_inductor_setup"] == env_in["TRITON_CACHE_DIR"], cid
        # and it only fills in DG_JIT_CACHE_DIR when unset, so DeepGEMM's stays on the volume too
        assert v["derived"]["DG_JIT_CACHE_DIR"], cid
    assert seen_cache


# Read from the source of the wheel vLLM pins, not run (tools/vllm-contract/install.sh downloads it).
CHECKED_IN_WHEEL = {"FLASHINFER_WORKSPACE_BASE": "flashinfer"}


def test_every_installed_reader_is_checked(checked):
    """A cache variable whose package is in the venv is checked with that package, FlashInfer's in its pinned
    wheel's source; the others (DeepGEMM: not on PyPI) carry the source commit they were taken from."""
    startup, _, _ = checked
    installed = next(iter(startup.values()))["installed"]
    for e in CACHE_ENVS:
        if installed.get(e.package):
            assert CHECKED_BY_READER.get(e.name) == e.package, f"{e.name}: {e.package} is installed but not checked"
        elif e.name in CHECKED_IN_WHEEL:
            assert CHECKED_IN_WHEEL[e.name] == e.package, e.name
        else:
            assert "commit" in e.source, f"{e.name}: {e.package} is not installed; record the source commit"


def _vllm_pin(venv, dist: str) -> str:
    meta = next(venv.glob("lib/python*/site-packages/vllm-*.dist-info/METADATA")).read_text()
    found = re.findall(rf"^Requires-Dist: {re.escape(dist)}==([^\s;]+)", meta, flags=re.M)
    assert len(found) == 1, f"vLLM's metadata pins {dist} {len(found)} times"
    return found[0]


def test_flashinfer_reads_its_workspace_variable_in_the_version_vllm_pins(vllm_python):
    """FLASHINFER_WORKSPACE_BASE, as the operator sets it, is what flashinfer-python (the version vLLM 0.33
    requires) builds its JIT and cubin cache directory from: read in the wheel's flashinfer/jit/env.py."""
    venv = vllm_python.parent.parent
    pin = _vllm_pin(venv, "flashinfer-python")
    entry = next(e for e in CACHE_ENVS if e.name == "FLASHINFER_WORKSPACE_BASE")
    assert f"flashinfer-python {pin} " in entry.source, f"cache_env.py names another FlashInfer than vLLM's {pin}"
    wheel = venv / "wheels" / f"flashinfer_python-{pin}-py3-none-any.whl"
    assert wheel.is_file(), f"{wheel.name} missing: run tools/vllm-contract/install.sh"
    tree = ast.parse(zipfile.ZipFile(wheel).read("flashinfer/jit/env.py"))
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
    reads = [c.args[0].value for c in ast.walk(assigned["FLASHINFER_BASE_DIR"])
             if isinstance(c, ast.Call) and ast.unparse(c.func) in ("os.getenv", "os.environ.get")
             and c.args and isinstance(c.args[0], ast.Constant)]  # fmt: skip
    assert reads == [entry.name], f"FLASHINFER_BASE_DIR reads {reads}"
    assert ast.unparse(assigned["FLASHINFER_CACHE_DIR"]) == "FLASHINFER_BASE_DIR / '.cache' / 'flashinfer'"
    assert ".cache/flashinfer/" in entry.derived


def test_engine_check_keeps_pod_cache_paths_out():
    """engine_check.py drops exactly the operator's cache variables (it must not write into the pod's paths)."""
    spec = importlib.util.spec_from_file_location("engine_check", HARNESS / "engine_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.POD_CACHE_ENV) == CACHE_ENV_NAMES
