"""The vLLM command line: only known vLLM 0.33 flags, the documented multi-node pattern, SLA-aware buckets,
and a start-rank wrapper that user values cannot inject into."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from flashserve.api.validation import parse_spec
from flashserve.facts.layout import layout
from flashserve.facts.vllm_flags import (
    DEFAULT_ITL_BUCKETS,
    DEFAULT_TTFT_BUCKETS,
    lookup,
)
from flashserve.render.vllm_args import (
    START_RANK_SCRIPT,
    command,
    engine_env,
    itl_buckets,
    ttft_buckets,
    vllm_args,
)
from flashserve_testbed.bench.prom import bucket_quantile

WIDE_EP = {
    "parallelism": {"nodesPerReplica": 2, "all2allBackend": "deepep_low_latency", "dbo": {"enabled": True},
                    "eplb": {"enabled": True}},  # fmt: skip
    "engine": {"attentionBackend": "FLASHINFER_MLA", "cudaGraphMode": "FULL_DECODE_ONLY", "asyncScheduling": True},
}


def flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("-")]


@pytest.mark.parametrize("spec", [{}, WIDE_EP, {"placement": {"accelerator": "B200"}},
                                  {"engine": {"prefixCaching": False, "speculative": {"enabled": False}}}])  # fmt: skip
def test_every_emitted_flag_is_a_vllm_033_flag(spec):
    s = parse_spec(spec)
    for flag in flags(vllm_args(s, layout(s), "leader")):
        assert lookup(flag) is not None, f"{flag} is not in the vLLM 0.33 flag table"


def test_single_node_gb200_defaults():
    s = parse_spec({})
    args = vllm_args(s, layout(s))
    assert args[0] == "deepseek-ai/DeepSeek-V4.1-Flash-1017"
    assert args[1:3] == ["--served-model-name", "deepseek-flash"]
    joined = " ".join(args)
    assert "--data-parallel-size 4" in joined and "--tensor-parallel-size 1" in joined
    assert "--enable-expert-parallel" in args and "--enable-prefix-caching" in args
    assert "--data-parallel-address" not in args and "--data-parallel-size-local" not in args
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "dspark", "num_speculative_tokens": 1}
    assert {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"} in engine_env(s, layout(s))
    assert "--async-scheduling" not in args and "--no-async-scheduling" not in args
    assert command(layout(s)) == ["vllm", "serve"]


@pytest.mark.parametrize("value,flag", [(True, "--async-scheduling"), (False, "--no-async-scheduling")])
def test_async_scheduling_is_said_either_way(value, flag):
    s = parse_spec({"engine": {"asyncScheduling": value}})
    args = vllm_args(s, layout(s))
    assert flag in args and {"--async-scheduling", "--no-async-scheduling"} - {flag} - set(args)


def test_dbo_turns_unset_speculative_decoding_off():
    s = parse_spec(WIDE_EP)
    assert "--speculative-config" not in vllm_args(s, layout(s), "leader")
    assert all(e["name"] != "VLLM_USE_V2_MODEL_RUNNER" for e in engine_env(s, layout(s)))


def test_multi_node_pattern():
    s = parse_spec(WIDE_EP)
    lay = layout(s)
    args = vllm_args(s, lay, "g0-0.g0.ns.svc")
    pairs = dict(zip(args, args[1:]))
    assert pairs["--data-parallel-size"] == "8" and pairs["--data-parallel-size-local"] == "4"
    assert "--data-parallel-hybrid-lb" in args
    assert pairs["--data-parallel-address"] == "g0-0.g0.ns.svc" and pairs["--data-parallel-rpc-port"] == "29550"
    assert pairs["--all2all-backend"] == "deepep_low_latency"
    assert "--enable-dbo" in args and "--enable-eplb" in args and "--headless" not in args
    assert json.loads(pairs["--eplb-config"])["num_redundant_experts"] == 32
    assert json.loads(pairs["--compilation-config"]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "--data-parallel-start-rank" not in args  # computed per pod by the wrapper
    assert command(lay)[:2] == ["/bin/sh", "-c"] and command(lay)[2] == START_RANK_SCRIPT


def test_itl_buckets_resolve_the_sla():
    b = itl_buckets(100.0)
    assert b == sorted(set(b)) and all(x > 0 for x in b)
    assert set(DEFAULT_ITL_BUCKETS) <= set(b)
    below = [x for x in b if x < 0.01]
    assert len(below) >= 5, "speeds above 100 tok/s must be resolvable"
    assert 0.0095 in b and 0.0105 in b
    s = parse_spec({"autoscaling": {"sla": {"perUserTokensPerSecond": 50}}, "engine": {"speculative": {"enabled": False}}})
    args = vllm_args(s, layout(s))
    buckets = json.loads(args[args.index("--custom-histogram-buckets") + 1])
    assert 0.02 in buckets["inter_token_latency"] and 0.019 in buckets["inter_token_latency"]


def test_itl_buckets_centre_on_the_mtp_step_latency():
    # With one MTP draft a step yields ~1.8 tokens: at 100 tok/s per user a step takes ~18 ms.
    s = parse_spec({})
    args = vllm_args(s, layout(s))
    bounds = json.loads(args[args.index("--custom-histogram-buckets") + 1])["inter_token_latency"]
    near = [b for b in bounds if 0.015 <= b <= 0.021]
    assert 0.018 in bounds and len(near) >= 5, near
    # The same bucket family holds the per-request time per output token, the autoscaler's SLA reading:
    # 10 ms at 100 tok/s whatever the MTP, resolved to ~5% around it too.
    per_token = [b for b in bounds if 0.0085 <= b <= 0.0115]
    assert {0.0095, 0.01, 0.0105} <= set(per_token) and len(per_token) >= 5, per_token


def test_extra_args_follow_managed_ones():
    s = parse_spec({"engine": {"extraArgs": ["--enable-log-requests"]}})
    assert vllm_args(s, layout(s))[-1] == "--enable-log-requests"


def test_pvc_source_points_vllm_at_the_mount():
    s = parse_spec({"model": {"source": {"pvc": {"claimName": "weights", "path": "/deepseek/flash/"}}}})
    assert vllm_args(s, layout(s))[0] == "/models/deepseek/flash"


@pytest.mark.parametrize("hostile", ['$(touch {marker})', '`touch {marker}`', '"; touch {marker}; echo "',
                                     "'; touch {marker}; '", "a\ntouch {marker}"])  # fmt: skip
def test_start_rank_wrapper_passes_user_values_as_data(tmp_path, hostile):
    marker = tmp_path / "pwned"
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    value = hostile.format(marker=marker)
    s = parse_spec({**WIDE_EP, "engine": {"extraArgs": ["--tool-call-parser", value]}})
    lay = layout(s)
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "FLASHSERVE_POD_INDEX": "1", "FLASHSERVE_DP_LOCAL": "4"}
    out = subprocess.run([*command(lay), *vllm_args(s, lay, "leader")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split("\n")
    assert not marker.exists(), "a user value was executed"
    assert value.split("\n")[0] in printed
    assert printed[printed.index("--data-parallel-start-rank") + 1] == "4"


def test_start_rank_wrapper_refuses_a_bad_pod_index(tmp_path):
    s = parse_spec(WIDE_EP)
    lay = layout(s)
    env = {"PATH": os.environ["PATH"], "FLASHSERVE_POD_INDEX": "1;reboot", "FLASHSERVE_DP_LOCAL": "4"}
    out = subprocess.run([*command(lay), "x"], env=env, capture_output=True, text=True)
    assert out.returncode == 64 and "bad pod index" in out.stderr


def _p90_of_steady(bounds: list[float], value: float) -> float:
    """histogram_quantile(0.9) (Prometheus's interpolation) of a histogram whose observations all equal `value`."""
    cumulative = [100.0 if value <= b else 0.0 for b in bounds] + [100.0]
    return bucket_quantile(0.9, tuple(bounds), cumulative)


def test_ttft_buckets_resolve_the_ttft_target():
    # vLLM's defaults jump from 1.0 to 2.5 s: a steady 1.1 s TTFT would read p90 2.35 s, above a 2 s target.
    assert _p90_of_steady(list(DEFAULT_TTFT_BUCKETS), 1.1) == pytest.approx(2.35)
    s = parse_spec({"autoscaling": {"sla": {"ttftSeconds": 2}}})
    args = vllm_args(s, layout(s))
    buckets = json.loads(args[args.index("--custom-histogram-buckets") + 1])
    ttft = buckets["time_to_first_token"]
    assert ttft == ttft_buckets(2.0) and set(DEFAULT_TTFT_BUCKETS) <= set(ttft)
    assert _p90_of_steady(ttft, 1.1) < 1.25
    # within about 5% of the target either side: 1.9 s reads below it, 2.1 s above
    assert _p90_of_steady(ttft, 1.9) <= 2.0 < _p90_of_steady(ttft, 2.1)
    assert "inter_token_latency" in buckets


def test_ttft_keeps_vllms_default_buckets_without_a_ttft_target():
    s = parse_spec({})
    args = vllm_args(s, layout(s))
    assert "time_to_first_token" not in json.loads(args[args.index("--custom-histogram-buckets") + 1])
