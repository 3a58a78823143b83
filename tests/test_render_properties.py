"""Property-based: any valid spec renders schema-valid objects with consistent data-parallel ranks; any
spec the validator refuses raises an error naming a field."""

from __future__ import annotations

from flashserve.api.validation import SpecError, parse_serving
from flashserve.facts.accelerators import ACCELERATORS
from flashserve.render.renderer import render_serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.k8s_schema import validate

accel = st.sampled_from(sorted(ACCELERATORS))


@st.composite
def valid_specs(draw) -> dict:
    acc = draw(accel)
    gpus = ACCELERATORS[acc].gpus_per_node
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if gpus % t == 0]))
    nodes = draw(st.integers(1, 4))
    ep = draw(st.booleans())
    dp = gpus // tp * nodes
    spec = {
        "placement": {"accelerator": acc},
        "parallelism": {
            "tensorParallelSize": tp,
            "nodesPerReplica": nodes,
            "expertParallel": ep,
            "dbo": {"enabled": ep and dp > 1 and draw(st.booleans())},
            "eplb": {"enabled": ep and draw(st.booleans())},
        },
        "replicas": draw(st.integers(0, 3)),
        "engine": {
            "maxModelLen": draw(st.one_of(st.integers(1024, 1 << 20), st.sampled_from(["32k", "auto", "1m"]))),
            # arbitrary text, as the value of a flag (alone vLLM would read it as a second model)
            "extraArgs": [a for v in draw(st.lists(st.text(min_size=1, max_size=20).filter(
                lambda a: not a.startswith("-")), max_size=3)) for a in ("--response-role", v)],
            "prefixCaching": draw(st.booleans()),
        },
        "autoscaling": {"sla": {"perUserTokensPerSecond": draw(st.floats(1, 1000))}},
    }
    if spec["parallelism"]["dbo"]["enabled"] or (ep and draw(st.booleans())):
        spec["parallelism"]["all2allBackend"] = "deepep_low_latency"
    if ACCELERATORS[acc].multi_node_nvlink and draw(st.booleans()):
        spec["placement"]["computeDomain"] = {"enabled": True}
    return spec


def _cr(spec: dict, name: str = "flash") -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
            "metadata": {"name": name, "namespace": "ns"}, "spec": spec}  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs(), st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,60}[a-z0-9])?\Z", fullmatch=True))
def test_valid_specs_render_valid_objects_with_consistent_ranks(spec, name):
    obj = parse_serving(_cr(spec, name))
    objs = render_serving(obj)
    for o in objs:
        validate(o)
    stss = [o for o in objs if o["kind"] == "StatefulSet"]
    assert len(stss) == spec["replicas"]
    for sts in stss:
        c = sts["spec"]["template"]["spec"]["containers"][0]
        args = c["args"]
        pairs = dict(zip(args, args[1:]))
        nodes = spec["parallelism"]["nodesPerReplica"]
        assert sts["spec"]["replicas"] == nodes
        gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
        tp = int(pairs["--tensor-parallel-size"])
        dp = int(pairs["--data-parallel-size"])
        assert gpus == ACCELERATORS[spec["placement"]["accelerator"]].gpus_per_node
        assert tp * dp == gpus * nodes, "every GPU of the group has exactly one rank slot"
        if nodes > 1:
            assert int(pairs["--data-parallel-size-local"]) * nodes == dp
            env = {e["name"]: e for e in c["env"]}
            assert int(env["FLASHSERVE_DP_LOCAL"]["value"]) * tp == gpus
            assert pairs["--data-parallel-address"].startswith(sts["metadata"]["name"] + "-0.")


invalid_edits = st.sampled_from([
    ("parallelism", {"tensorParallelSize": 3}),
    ("parallelism", {"dataParallelSizeLocal": 3}),
    ("parallelism", {"expertParallel": False, "eplb": {"enabled": True}}),
    ("parallelism", {"expertParallel": False, "dbo": {"enabled": True}}),
    ("autoscaling", {"minReplicas": 9, "maxReplicas": 2}),
    ("autoscaling", {"sla": {"perUserTokensPerSecond": -5}}),
    ("engine", {"extraArgs": ["--port=1"]}),
    ("engine", {"gpuMemoryUtilization": 1.5}),
    ("engine", {"maxNumSeqs": 0}),
    ("placement", {"accelerator": "A100"}),
    ("placement", {"tolerations": [{"operator": "Sometimes"}]}),
    ("model", {"servedModelNames": []}),
    ("rollout", {"maxUnavailable": 0}),
    ("unknownSection", {}),
])  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(valid_specs(), invalid_edits)
def test_invalid_specs_raise_errors_naming_a_field(spec, edit):
    key, value = edit
    spec = {**spec, key: {**spec.get(key, {}), **value}}
    try:
        parse_serving(_cr(spec))
    except SpecError as exc:
        assert exc.errors
        for err in exc.errors:
            assert err.path.startswith("spec."), err
            assert err.message
    else:
        raise AssertionError(f"accepted invalid spec edit {edit}")
