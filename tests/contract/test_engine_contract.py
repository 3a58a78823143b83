"""Every engine pod the operator renders starts as far as the real vLLM 0.33 goes without a GPU.

For each CR of the contract corpus (samples, topologies, an enum sweep) and for hypothesis-generated valid specs,
the exact argv and environment of every engine pod (the start-rank wrapper run for real, pod 0 and pod k) go
through vLLM's own `vllm serve` parser and serve checks, AsyncEngineArgs.from_cli_args and
create_engine_config (tools/vllm-contract/harness/engine_check.py says what is stubbed). One venv process
judges all pods, since importing vLLM is most of the cost.
"""

from __future__ import annotations

import json
import re

import pytest
from flashserve.api import v1alpha1 as api
from flashserve.api.validation import SpecError, parse_serving
from flashserve.facts import vllm_rules
from flashserve.facts.accelerators import ACCELERATORS
from flashserve.facts.managed import ROUTE_DESTS, ROUTE_ENV
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.contract.conftest import check_engines
from tests.contract.corpus import corpus
from tests.contract.pods import engine_pods
from tests.contract.routes import OPENER_PREFIX, OPENERS, REVIEWED, opener_cases, path_of, route_of

LEVELS = ("parse", "serve", "args", "config")
GENERATED = 30


@st.composite
def valid_specs(draw) -> dict:
    acc = draw(st.sampled_from(sorted(ACCELERATORS)))
    gpus = ACCELERATORS[acc].gpus_per_node
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if gpus % t == 0]))
    nodes = draw(st.integers(1, 4))
    ep = draw(st.booleans())
    dp = gpus // tp * nodes
    dbo = ep and dp > 1 and draw(st.booleans())
    spec = {
        "placement": {"accelerator": acc},
        "parallelism": {"tensorParallelSize": tp, "nodesPerReplica": nodes, "expertParallel": ep,
                        "dbo": {"enabled": dbo}, "eplb": {"enabled": ep and draw(st.booleans())}},
        "engine": {
            "maxModelLen": draw(st.one_of(st.integers(1024, 1 << 20), st.sampled_from(["32k", "auto", "1m", "64K"]))),
            "prefixCaching": draw(st.booleans()),
            "speculative": {"enabled": (not dbo) and draw(st.booleans()),
                            "numSpeculativeTokens": draw(st.integers(1, 4))},
            "asyncScheduling": draw(st.sampled_from([True, False, None])),
            "maxNumSeqs": draw(st.sampled_from([64, 256, 1024])),
        },
        "autoscaling": {"sla": {"perUserTokensPerSecond": draw(st.floats(10, 1000))}},
    }
    if spec["engine"]["asyncScheduling"] is None:
        del spec["engine"]["asyncScheduling"]
    if dbo:
        spec["parallelism"]["all2allBackend"] = draw(st.sampled_from(vllm_rules.DBO_ALL2ALL_BACKENDS))
    elif ep and draw(st.booleans()):
        spec["parallelism"]["all2allBackend"] = draw(st.sampled_from(["deepep_low_latency", "deepep_high_throughput"]))
    return spec


def _generated() -> list[dict]:
    drawn: list[dict] = []

    @settings(max_examples=GENERATED, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(valid_specs())
    def collect(spec):
        drawn.append(spec)

    collect()
    return drawn


def _all_crs() -> dict[str, dict]:
    crs = corpus()
    for i, spec in enumerate(_generated()):
        crs[f"generated-{i}"] = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                                 "metadata": {"name": f"gen-{i}"}, "spec": spec}
    return crs


@pytest.fixture(scope="module")
def harness(vllm_python):
    """One run of the harness (one vLLM import) for every case of this module: each corpus pod, with the routes
    its API server would answer for pod 0 of the hand-written CRs, and the route openers' cases."""
    crs = _all_crs()
    hand_written = set(corpus())
    cases, meta = [], {}
    for name, cr in crs.items():
        parse_serving(cr)  # the corpus holds only specs the API admits
        pods = engine_pods(cr)
        # pod 0 and the last pod of the group: the wrapper gives them different start ranks
        for pod in {p["pod"]: p for p in (pods[0], pods[-1])}.values():
            cid = f"{name}/pod-{pod['pod']}"
            cases.append({"id": cid, "argv": pod["argv"], "env": pod["env"], "accelerator": pod["accelerator"],
                          "routes": name in hand_written and pod["pod"] == 0})
            meta[cid] = (cr, pod)
    cases += opener_cases(crs["sample-gb200-minimal"])
    out = check_engines(vllm_python, cases)
    pods = [v for cid, v in out.items() if cid in meta]
    print(f"\ncontract: {len(crs)} CRs ({GENERATED} generated), {len(pods)} pods; "
          + ", ".join(f"{lvl}: {sum(1 for v in pods if v['level'] in LEVELS[i:])}" for i, lvl in enumerate(LEVELS)))
    return out, meta


@pytest.fixture(scope="module")
def verdicts(harness):
    out, meta = harness
    return {cid: v for cid, v in out.items() if cid in meta}, meta


def test_corpus_covers_what_the_issue_names():
    crs = corpus()
    specs = [cr["spec"] for cr in crs.values()]
    accs = {(s.get("placement") or {}).get("accelerator", "GB200") for s in specs}
    nodes = {(s.get("parallelism") or {}).get("nodesPerReplica", 1) for s in specs}
    assert accs == set(ACCELERATORS) and {1, 2, 3, 4} <= nodes and len(crs) >= 20
    assert any((s.get("parallelism") or {}).get("dbo", {}).get("enabled") for s in specs)
    assert any((s.get("engine") or {}).get("extraArgs") for s in specs)
    assert any((s.get("routing") or {}).get("policy") == "cache_aware" for s in specs), "--enable-scale-out"


def test_every_rendered_pod_passes_all_three_levels(verdicts):
    out, _ = verdicts
    failed = {cid: v["error"] for cid, v in out.items() if not v["ok"]}
    assert not failed, f"{len(failed)} of {len(out)} pods refused by vLLM:\n" + "\n".join(
        f"  {cid}: {err[:600]}" for cid, err in sorted(failed.items()))


def test_vllm_configures_what_the_spec_says(verdicts):
    """The engine config vLLM built matches the fields, so no flag was silently ignored or overridden."""
    out, meta = verdicts
    for cid, v in out.items():
        if not v["ok"]:
            continue
        cfg = v["config"]
        spec = parse_serving(meta[cid][0]).spec
        pod = meta[cid][1]
        assert cfg["enable_expert_parallel"] == spec.parallelism.expert_parallel, cid
        assert cfg["enable_prefix_caching"] == spec.engine.prefix_caching, cid
        assert cfg["enable_eplb"] == spec.parallelism.eplb.enabled, cid
        assert bool(cfg["enable_dbo"]) == spec.parallelism.dbo.enabled, cid
        assert cfg["enable_scale_out"] == spec.routing.renders_prompts(), cid
        assert cfg["max_num_seqs"] == spec.engine.max_num_seqs, cid
        assert cfg["tensor_parallel_size"] == spec.parallelism.tensor_parallel_size, cid
        gpus = ACCELERATORS[spec.placement.accelerator].gpus_per_node
        assert cfg["data_parallel_size"] == gpus // spec.parallelism.tensor_parallel_size * spec.parallelism.nodes_per_replica, cid
        assert cfg["data_parallel_size_local"] == gpus // spec.parallelism.tensor_parallel_size, cid
        if spec.parallelism.nodes_per_replica > 1:
            assert cfg["data_parallel_rank"] == pod["pod"] * cfg["data_parallel_size_local"], cid
        if spec.speculative_decoding():
            assert cfg["speculative_method"] == "dspark", cid
            assert cfg["num_speculative_tokens"] == spec.engine.speculative.num_speculative_tokens, cid
        else:
            assert cfg["speculative_method"] is None, cid
        if spec.engine.async_scheduling is not None:
            assert cfg["async_scheduling"] == spec.engine.async_scheduling, cid
        if isinstance(spec.engine.max_model_len, int):
            assert cfg["max_model_len"] == spec.engine.max_model_len, cid
        assert cfg["served_model_name"] == spec.model.served_model_names[0], cid


def test_stubs_are_only_native_extensions(verdicts):
    """What the harness replaced is the compiled extensions that need libcuda, nothing of vLLM's Python."""
    out, _ = verdicts
    stubbed = {m for v in out.values() for m in v.get("stubbed_native_modules") or []}
    assert stubbed, "no stub recorded: the harness did not run the config level"
    assert all(m.startswith("vllm.") and m.rsplit(".", 1)[-1].startswith("_") for m in stubbed), sorted(stubbed)
    print("\nstubbed native modules: " + json.dumps(sorted(stubbed)))


def test_backend_rules_are_vllms(vllm_python):
    """Every all2all backend vLLM offers, with DBO and with EPLB: the API admits the pair exactly when vLLM
    builds the engine config (vllm_rules.py holds the lists the API, the CEL rules and this test share)."""
    from tests.contract.corpus import _literal_values

    backends = _literal_values(api.ParallelismSpec.model_fields["all2all_backend"])
    base = {"parallelism": {"nodesPerReplica": 2}, "engine": {"speculative": {"enabled": False}}}
    cases, admitted = [], {}
    for backend in backends:
        for feature in ("dbo", "eplb"):
            spec = {**base, "parallelism": {**base["parallelism"], "all2allBackend": backend, feature: {"enabled": True}}}
            cid = f"{backend}+{feature}"
            try:
                parse_serving({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "grid"}, "spec": spec})
                admitted[cid] = True
            except SpecError:
                admitted[cid] = False
            # The argv of the spec with the rule under test lifted: render a twin the API admits, then put the
            # backend back, so vLLM judges exactly the pair.
            twin = {**spec, "parallelism": {**spec["parallelism"], "all2allBackend": "deepep_low_latency"}}
            pod = engine_pods({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "grid"}, "spec": twin})[0]
            argv = list(pod["argv"])
            argv[argv.index("--all2all-backend") + 1] = backend
            cases.append({"id": cid, "argv": argv, "env": pod["env"], "accelerator": pod["accelerator"]})
    out = check_engines(vllm_python, cases)
    disagree = {cid: (admitted[cid], out[cid]["error"]) for cid in admitted if admitted[cid] != out[cid]["ok"]}
    assert not disagree, "the API and vLLM disagree on:\n" + "\n".join(
        f"  {cid}: API {'admits' if a else 'refuses'}, vLLM: {err or 'accepts'}" for cid, (a, err) in disagree.items())


def test_every_route_a_rendered_engine_answers_is_reviewed(harness):
    """The routes vLLM's launcher builds for pod 0 of every hand-written CR are the reviewed ones
    (tests/contract/routes.py says what a client can do with each), and every reviewed route is still served,
    so the list neither misses a route nor keeps a stale one. The scale-out routes answer 403 unless the
    routing policy renders prompts (cache_aware: --enable-scale-out)."""
    out, meta = harness
    listed = {cid: v["routes"] for cid, v in out.items() if cid in meta and v.get("routes")}
    failed = [v["error"] for v in out.values() if (v.get("error") or "").startswith("routes:")]
    assert not failed and len(listed) == len(corpus()), failed[:3]
    served = {route_of(r) for routes in listed.values() for r in routes}
    assert served - set(REVIEWED) == set(), "routes nobody reviewed (tests/contract/routes.py)"
    assert set(REVIEWED) - served == set(), "reviewed routes no rendered engine serves any more"
    render = "POST /v1/chat/completions/render"
    for cid, routes in listed.items():
        spec = parse_serving(meta[cid][0]).spec
        assert (render in routes) == spec.routing.renders_prompts(), cid
        assert (render + " (403)" in routes) != spec.routing.renders_prompts(), cid


def test_each_setting_refused_for_its_routes_opens_unreviewed_routes_in_vllm(harness):
    """Each setting facts/managed.py refuses for the routes it opens does open routes outside the reviewed
    list in the real vLLM, among them every route its refusal message names; and the API refuses it."""
    out, _ = harness
    assert set(OPENERS) == set(ROUTE_DESTS) | set(ROUTE_ENV)
    reviewed = {path_of(r) for r in REVIEWED}
    for name, (env, args) in OPENERS.items():
        verdict = out[OPENER_PREFIX + name]
        assert verdict["ok"], verdict["error"]
        opened = {path_of(route_of(r)) for r in verdict["routes"]} - reviewed
        assert opened, f"{name} opens nothing unreviewed: drop it from ROUTE_DESTS/ROUTE_ENV"
        named = set(re.findall(r"(?<![\w-])/[a-z_/0-9]+", ROUTE_DESTS.get(name) or ROUTE_ENV[name]))
        assert named <= opened, (name, sorted(named - opened), sorted(opened))
        engine = {"env": [{"name": k, "value": v} for k, v in env.items()], "extraArgs": args}
        with pytest.raises(SpecError) as exc:
            parse_serving({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
                           "spec": {"engine": engine}})  # fmt: skip
        assert "any client of the serving" in str(exc.value), name
        print(f"\n{name}: opens {', '.join(sorted(opened))}")
