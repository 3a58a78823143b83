"""The vLLM flag table and the extraArgs guard built on it: every spelling vLLM accepts for a managed setting
is refused (in Python and by the CRD's CEL rule, which must agree), unmanaged flags pass, and the builder only
emits settings the guard protects."""

from __future__ import annotations

import re
import typing

import pytest
from flashserve.api import v1alpha1 as api
from flashserve.api.crd import generate_crd
from flashserve.api.validation import parse_spec
from flashserve.facts.layout import layout
from flashserve.facts.managed import (
    MANAGED_DESTS,
    REFUSED_DESTS,
    ROUTE_DESTS,
    SECRET_DESTS,
    extra_args_errors,
    managed_arg_pattern,
    managed_flag_of,
)
from flashserve.facts.vllm_flags import (
    ALL2ALL_BACKENDS,
    BY_DEST,
    CUDAGRAPH_MODES,
    KV_CACHE_DTYPES,
    MLA_ATTENTION_BACKENDS,
    OPTIONS,
    resolve,
    spellings,
)
from flashserve.render.vllm_args import START_RANK_SCRIPT, vllm_args

from tests.builders import SUB_KEYS

CEL = re.compile(managed_arg_pattern())
ALL_SPELLINGS = [(o, s) for o in OPTIONS for s in spellings(o, SUB_KEYS.get(o.dest))]
REFUSED = [(o, s) for o, s in ALL_SPELLINGS if o.dest in REFUSED_DESTS]
UNMANAGED = [(o, s) for o, s in ALL_SPELLINGS if o.dest not in REFUSED_DESTS]


def test_every_refused_setting_is_a_vllm_option():
    assert sorted(d for d in REFUSED_DESTS if d not in BY_DEST) == []


def test_every_spelling_of_a_refused_setting_is_refused():
    assert len(REFUSED) > 2000  # all option strings, aliases, negations, prefixes, `=`, `_` and `.key` forms
    missed = [s.argv for _, s in REFUSED if not any(i == 0 for i, _ in extra_args_errors(list(s.argv)))]
    assert missed == []
    # where vLLM would apply the option, the guard names that very setting
    wrong = [(s.argv, managed_flag_of(s.argv[0])) for o, s in REFUSED if s.vllm == "sets"
             and managed_flag_of(s.argv[0]) != o.dest]  # fmt: skip
    assert wrong == []


def test_unmanaged_options_pass_in_every_spelling_vllm_accepts():
    accepted = [(o, s) for o, s in UNMANAGED if s.vllm == "sets"]
    assert len(accepted) > 5000
    assert [(s.argv, extra_args_errors(list(s.argv))) for _, s in accepted if extra_args_errors(list(s.argv))] == []
    # spellings vLLM cannot read (ambiguous prefixes, a value on a switch) are refused too; wrong value types
    # inside `.key` forms are left to vLLM
    unread = [s.argv for _, s in UNMANAGED if s.vllm == "error" and s.form != "dotted"]
    assert [a for a in unread if not extra_args_errors(list(a))] == []


def test_cel_rule_and_python_guard_agree_on_every_spelling():
    tokens = {t for _, s in ALL_SPELLINGS for t in s.argv}
    tokens |= {"--", "-", "-1", "-1.5", "--port 80", "-O", "-O.x", "--portx", "--hf-tokenx", "-x", "---port",
               "-_tp", "--p", "--max-num", "--kv-cache-dtype-skip-layers", "--kv-cache-dt", "--model_impl=x",
               "--config-format=auto", "--conf", "-qfp8", "-n", "-r0", "--tensor-parallel-size.x", "hermes"}  # fmt: skip
    disagree = [t for t in sorted(tokens) if (CEL.search(t) is not None) != (managed_flag_of(t) is not None)]
    assert disagree == []
    # what the CEL rule refuses, the full guard refuses too (it also refuses what needs context)
    assert [t for t in tokens if CEL.search(t) and not extra_args_errors([t])] == []


def test_cel_regex_stays_compact_and_within_the_cel_cost_budget():
    pattern = managed_arg_pattern()
    assert "\\" not in pattern and "(?" not in pattern  # a plain CEL string literal; RE2 has no lookarounds
    extra = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    extra = extra["properties"]["engine"]["properties"]["extraArgs"]
    # cel-go's estimate for `all(a, a.matches(re))`: per item 0.1 per string char times 0.25 per regex char
    per_item = (0.1 * extra["items"]["maxLength"]) * (0.25 * len(pattern))
    assert per_item * extra["maxItems"] < 10_000_000  # the API server's per-expression limit
    assert len(pattern) < 1000


@pytest.mark.parametrize(
    "args, field",
    [
        (["-sc", '{"method":"mtp"}'], "spec.engine.speculative"),
        (["--spec-tokens", "3"], "spec.engine.speculative"),
        (["-cc", "{}"], "spec.engine.cudaGraphMode"),
        (["--compilation-config.cudagraph_mode=NONE"], "spec.engine.cudaGraphMode"),
        (["-cc.cudagraph_mode", "NONE"], "spec.engine.cudaGraphMode"),
        (["-O"], "spec.engine.cudaGraphMode"),
        (["-O3"], "spec.engine.cudaGraphMode"),
        (["-O.x"], "spec.engine.cudaGraphMode"),
        (["-asc", "2"], "operator manages"),
        (["-dph"], "operator manages"),
        (["-dpe"], "operator manages"),
        (["-dpn", "1"], "computed from the pod index"),
        (["-dpm"], "operator manages"),
        (["-dpb", "ray"], "operator manages"),
        (["--nnodes", "2"], "spec.parallelism.nodesPerReplica"),
        (["-n2"], "spec.parallelism.nodesPerReplica"),
        (["--device-memory-utilization", "0.5"], "spec.engine.gpuMemoryUtilization"),
        (["--disable-expert-parallel"], "spec.parallelism.expertParallel"),
        (["--disable-prefix-caching"], "spec.engine.prefixCaching"),
        (["--disable-eplb"], "spec.parallelism.eplb.enabled"),
        (["--disable-dbo"], "spec.parallelism.dbo.enabled"),
        (["--no-trust-remote-code"], "spec.model.trustRemoteCode"),
        (["--async-scheduling"], "spec.engine.asyncScheduling"),
        (["--no_async_scheduling"], "spec.engine.asyncScheduling"),
        (["--max-num-se", "8"], "spec.engine.maxNumSeqs"),
        (["-t", "2"], "spec.parallelism.tensorParallelSize"),
        (["--model", "other/model"], "spec.model.name"),
        (["--config", "serve.yaml"], "a config file can set any flag"),
        (["--hf-token", "hf_abc"], "spec.model.source.huggingFace.tokenSecretRef"),
        (["--hf-token"], "spec.model.source.huggingFace.tokenSecretRef"),
        (["--api-key", "sk-1"], "VLLM_API_KEY"),
        (["--disable-log-stats"], "Prometheus metrics"),
    ],
)
def test_named_spellings_are_refused_with_the_spec_field(args, field):
    errors = extra_args_errors(args)
    assert [i for i, _ in errors] == [0]
    assert field in errors[0][1] and repr(args[0]) in errors[0][1]


@pytest.mark.parametrize(
    "args, index, message",
    [
        (["second/model"], 0, "positional argument"),
        (["--enable-log-requests", "x"], 1, "positional argument"),
        (["--", "--port", "1"], 0, "bare '--'"),
        (["--frobnicate", "1"], 0, "not a vllm serve flag"),
        (["--enable-log", "x"], 0, "ambiguous"),
        (["--tool-call-parser"], 0, "needs a value"),
        (["--tool-call-parser", "--enable-log-requests"], 0, "needs a value"),
        (["--uvicorn-log-level", "loud"], 1, "not a choice"),
        (["--enable-log-requests=yes"], 0, "takes no value"),
        (["--kernel-config.x", "-tp"], 1, "spec.parallelism.tensorParallelSize"),  # a sub-key's value, still judged
        (["-t=2"], 0, "not a vllm serve flag"),  # argparse matches `-t=2` whole: no option, yet it looks managed
    ],
)
def test_items_vllm_could_not_read_are_refused(args, index, message):
    errors = extra_args_errors(args)
    assert index in [i for i, _ in errors] and message in dict(errors)[index]


@pytest.mark.parametrize(
    "args",
    [
        ["--enable-log-requests"],
        ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"],
        ["--reasoning-parser", "deepseek_v3"],
        ["--seed", "-1"],
        ["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"],
        ["--uvicorn-log-level=info", "--disable-uvicorn-access-log"],
        ["--no-enable-chunked-prefill", "--block-size", "64"],
        ["-q", "fp8"],
        ["--allowed-origins", '["*"]', "--max-log-len", "100"],
        ["--kernel-config.moe_backend=auto"],
    ],
)
def test_legit_unmanaged_flags_pass(args):
    for token in args:
        res = resolve(token)
        assert res.token.kind == "value" or res.option is not None, f"{token} is not a vLLM 0.33 option"
    assert extra_args_errors(args) == []


SPECS = [
    {},
    {"parallelism": {"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency", "dbo": {"enabled": True},
                     "eplb": {"enabled": True}},
     "engine": {"attentionBackend": "FLASHINFER_MLA", "cudaGraphMode": "FULL_DECODE_ONLY", "asyncScheduling": True}},
    {"placement": {"accelerator": "B200"}, "model": {"revision": "main", "trustRemoteCode": True}},
    {"engine": {"prefixCaching": False, "speculative": {"enabled": False}}},
]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS)
def test_every_setting_the_builder_emits_is_managed(spec):
    s = parse_spec(spec)
    args = vllm_args(s, layout(s), "leader")
    emitted = {resolve(a).option.dest for a in args[1:] if a.startswith("--")}
    emitted.add(resolve(START_RANK_SCRIPT.split('"$@" ', 1)[1].split()[0]).option.dest)
    assert emitted - set(MANAGED_DESTS) == set()
    assert "model" in MANAGED_DESTS  # args[0], the positional model, has the --model spelling too


def test_every_refusal_points_somewhere():
    for dest in REFUSED_DESTS:
        hint = {**MANAGED_DESTS, **SECRET_DESTS, **ROUTE_DESTS}[dest]
        assert hint.startswith("spec.") or len(hint) > 10, dest


def test_api_enums_are_values_vllm_knows():
    engine, par = api.EngineSpec.model_fields, api.ParallelismSpec.model_fields

    def literal(field) -> set[str]:
        return {a for arg in typing.get_args(field.annotation) for a in (typing.get_args(arg) or [arg])
                if isinstance(a, str)}  # fmt: skip

    assert literal(engine["kv_cache_dtype"]) <= set(KV_CACHE_DTYPES)
    assert literal(engine["attention_backend"]) <= set(MLA_ATTENTION_BACKENDS)
    assert literal(engine["cuda_graph_mode"]) <= set(CUDAGRAPH_MODES)
    assert literal(par["all2all_backend"]) <= set(ALL2ALL_BACKENDS)
