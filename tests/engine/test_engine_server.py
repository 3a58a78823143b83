"""The mock `vllm serve` over HTTP: start-up, the OpenAI API with the official client, metrics, flags."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
from flashserve_testbed.engine.tokenizer import count_tokens, render_chat

from .conftest import mock_env

pytestmark = pytest.mark.timeout(90)

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"
SPEC = '{"method":"dspark","num_speculative_tokens":1}'
FAST = {"FLASHSERVE_MOCK_STARTUP_SECONDS": "0", "FLASHSERVE_MOCK_TIME_SCALE": "10", "FLASHSERVE_MOCK_SEED": "7"}


def series(text: str, name: str) -> dict[str, float]:
    """label-string -> value for one metric name."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def test_health_is_503_until_weights_are_loaded_then_200(mock_server):
    # 6 engine seconds at 4x = 1.5 s of wall time
    srv = mock_server([MODEL], FLASHSERVE_MOCK_STARTUP_SECONDS="6", FLASHSERVE_MOCK_TIME_SCALE="4")
    t0 = time.monotonic()
    assert srv.get("/health")[0] == 503
    assert srv.get("/v1/models")[0] == 503
    srv.wait_ready()
    waited = time.monotonic() - t0
    assert 1.0 < waited < 6.0
    assert srv.get("/health") == (200, "")
    assert srv.get("/ping")[0] == 200
    status, body = srv.get("/version")
    assert status == 200 and json.loads(body)["version"] == "0.33.0"


def test_openai_client_streaming_chat_and_plain_completion(mock_server):
    srv = mock_server([MODEL, "--served-model-name", "dsv4", "flash", "--speculative-config", SPEC], **FAST)
    srv.wait_ready()
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["dsv4", "flash"]

    messages = [{"role": "system", "content": "You are a coding agent. " * 200},
                {"role": "user", "content": "Fix the failing test in repo/foo.py"}]
    chunks = list(client.chat.completions.create(
        model="dsv4", messages=messages, max_tokens=40, stream=True, stream_options={"include_usage": True},
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert finish == ["length"]
    assert usage.completion_tokens == 40 and count_tokens(text) == 40
    assert usage.prompt_tokens == count_tokens(render_chat(messages))
    assert usage.prompt_tokens_details.cached_tokens == 0
    # Really streamed: more than one content chunk. (How many depends on how far the real-time driver runs
    # behind on a loaded machine, when it emits several engine steps in one chunk.)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1

    # next turn: the whole first turn is reused from the prefix cache
    messages2 = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "run the tests"}]
    r2 = client.chat.completions.create(model="flash", messages=messages2, max_tokens=10)
    assert r2.usage.prompt_tokens == count_tokens(render_chat(messages2))
    first_turn = count_tokens(render_chat(messages)) + 40
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # every full 64-token block of prompt + answer (the last token's KV is not computed yet, so the block
    # holding it may be missing)
    assert cached % 64 == 0 and (first_turn // 64 - 1) * 64 <= cached <= first_turn
    assert r2.choices[0].message.role == "assistant"

    done = client.completions.create(model="dsv4", prompt="def add(a, b):", max_tokens=12)
    assert done.usage.completion_tokens == 12 and done.choices[0].finish_reason == "length"
    assert count_tokens(done.choices[0].text) == 12

    free = client.completions.create(model="dsv4", prompt="x" * 400, max_tokens=4000)
    assert free.choices[0].finish_reason in ("stop", "length") and 1 <= free.usage.completion_tokens <= 4000

    exact = client.completions.create(model="dsv4", prompt=[1, 2, 3, 4], max_tokens=30, extra_body={"ignore_eos": True})
    assert exact.usage.completion_tokens == 30 and exact.usage.prompt_tokens == 4

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="dsv4", prompt="hi", max_tokens=10_000_000)


def test_streamed_speed_follows_the_model(mock_server):
    srv = mock_server([MODEL, "--speculative-config", SPEC], **{**FAST, "FLASHSERVE_MOCK_TIME_SCALE": "5"})
    srv.wait_ready()
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused")
    t0 = time.monotonic()
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=300, stream=True,
        extra_body={"ignore_eos": True},
    )
    first = None
    for c in stream:
        if first is None and c.choices and c.choices[0].delta.content:
            first = time.monotonic()
    wall = time.monotonic() - first
    # ~150 tok/s per user at low concurrency, 5x time scale: 299 tokens in ~0.4 s of wall time
    speed = 299 / (wall * 5)
    assert 110 < speed < 170, speed
    _, text = srv.get("/metrics")
    itl = series(text, "vllm:inter_token_latency_seconds_count")
    gen = series(text, "vllm:generation_tokens_total")
    assert list(gen.values()) == [300.0]
    # one ITL observation per decode step, each step yielding 1 + accepted MTP tokens
    assert 299 / 2 < list(itl.values())[0] < 299 / 1.5


def test_metrics_names_types_labels_and_buckets(mock_server):
    buckets = {"inter_token_latency": [0.005, 0.008, 0.01, 0.0125, 0.02], "time_to_first_token": [0.1, 1, 10]}
    srv = mock_server(
        [MODEL, "--served-model-name", "dsv4", "--data-parallel-size", "4", "--enable-expert-parallel",
         "--speculative-config", SPEC, "--custom-histogram-buckets", json.dumps(buckets)],
        **FAST,
    )
    srv.wait_ready()
    body = json.dumps({"model": "dsv4", "prompt": "hello " * 50, "max_tokens": 20}).encode()
    for _ in range(6):
        req = urllib.request.Request(srv.base + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
    status, text = srv.get("/metrics")
    assert status == 200
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens_total": "counter",
        "vllm:generation_tokens_total": "counter",
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
        "vllm:request_success_total": "counter",
        "vllm:num_preemptions_total": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
    }
    for name, kind in expected.items():
        assert types.get(name) == kind, name
    assert "vllm:gpu_cache_usage_perc" not in types and "vllm:time_per_output_token_seconds" not in types

    running = series(text, "vllm:num_requests_running")
    # label names sorted within a series, as prometheus_client writes them
    assert sorted(running) == [f'{{engine="{i}",model_name="dsv4"}}' for i in range(4)]
    gen = series(text, "vllm:generation_tokens_total")
    assert sum(gen.values()) == 6 * 20
    assert sum(series(text, "vllm:prompt_tokens_total").values()) == 6 * count_tokens("hello " * 50)
    ok = series(text, "vllm:request_success_total")
    assert sum(v for k, v in ok.items() if 'finished_reason="length"' in k) == 6
    # vLLM pre-creates a child per FinishReason: every reason shows, at 0 until counted
    reasons = {re.search(r'finished_reason="(\w+)"', k).group(1) for k in ok}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert sum(v for k, v in ok.items() if 'finished_reason="repetition"' in k) == 0
    # every request had 20 tokens: none in request_generation_tokens' le=1 bucket, so no zero TPOT
    assert sum(v for k, v in series(text, "vllm:request_generation_tokens_bucket").items() if 'le="1.0"' in k) == 0

    def les(name):
        return [m for m in re.findall(rf'^{name}_bucket{{engine="0",le="([^"]+)",model_name="dsv4"}}', text, re.M)]

    assert les("vllm:inter_token_latency_seconds") == ["0.005", "0.008", "0.01", "0.0125", "0.02", "+Inf"]
    assert les("vllm:request_time_per_output_token_seconds") == les("vllm:inter_token_latency_seconds")
    assert les("vllm:time_to_first_token_seconds") == ["0.1", "1.0", "10.0", "+Inf"]
    assert les("vllm:e2e_request_latency_seconds") == [
        "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0",
        "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"]
    ttft_count = series(text, "vllm:time_to_first_token_seconds_count")
    assert sum(ttft_count.values()) == 6
    # buckets are cumulative and end at the count
    inf = series(text, "vllm:time_to_first_token_seconds_bucket")
    assert sum(v for k, v in inf.items() if 'le="+Inf"' in k) == 6


def test_default_buckets_are_vllms(mock_server):
    from flashserve.facts.vllm_flags import DEFAULT_ITL_BUCKETS, DEFAULT_TTFT_BUCKETS

    srv = mock_server([MODEL], **FAST)
    srv.wait_ready()
    _, text = srv.get("/metrics")

    def bounds(name):
        les = re.findall(rf'^{name}_bucket{{engine="0",le="([^"]+)",model_name="{re.escape(MODEL)}"}}', text, re.M)
        return [float(x) for x in les[:-1]]

    assert bounds("vllm:time_to_first_token_seconds") == list(DEFAULT_TTFT_BUCKETS)
    assert bounds("vllm:inter_token_latency_seconds") == list(DEFAULT_ITL_BUCKETS)
    assert "vllm:spec_decode_num_drafts_total" not in text  # no --speculative-config, no MTP


def test_engine_label_follows_data_parallel_start_rank(mock_server):
    srv = mock_server([MODEL, "-dp", "8", "-dpl", "4", "--data-parallel-start-rank", "4",
                       "--data-parallel-address", "leader.example", "-ep"], **FAST)
    srv.wait_ready()
    _, text = srv.get("/metrics")
    assert sorted(series(text, "vllm:num_requests_waiting")) == [
        f'{{engine="{i}",model_name="{MODEL}"}}' for i in range(4, 8)]


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashserve_testbed.engine.cli", *args], capture_output=True,
                          text=True, timeout=30, env=mock_env(**env))


def test_unknown_flag_is_rejected_with_exit_code_2():
    r = run_cli("serve", MODEL, "--port", "0", "--enable-magic", "--max-num-seqs", "8")
    assert r.returncode == 2
    assert "unrecognized arguments: --enable-magic" in r.stderr
    bad = run_cli("serve", MODEL, "--custom-histogram-buckets", '{"latency": [1, 2]}')
    assert bad.returncode == 2 and "unknown bucket family 'latency'" in bad.stderr
    assert run_cli("serve").returncode == 2
    assert run_cli("serve", "--help").returncode == 0


def test_non_loopback_host_still_binds_loopback(mock_server):
    srv = mock_server([MODEL, "--host", "0.0.0.0", "--all2all-backend", "deepep_low_latency",
                       "--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'], **FAST)
    log = "".join(srv.log)
    assert "binding 127.0.0.1 instead of 0.0.0.0" in log
    assert "ignoring flags it does not model --all2all-backend --compilation-config" in log
    srv.wait_ready()


def test_client_going_away_aborts_the_request(mock_server):
    srv = mock_server([MODEL], **FAST)
    srv.wait_ready()
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long answer please"}], max_tokens=5000, stream=True,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, text = srv.get("/metrics")
        aborted = sum(v for k, v in series(text, "vllm:request_success_total").items() if "abort" in k)
        if aborted == 1:
            break
        time.sleep(0.05)
    assert aborted == 1
    assert list(series(text, "vllm:num_requests_running").values()) == [0.0]
    assert 0 < list(series(text, "vllm:generation_tokens_total").values())[0] < 5000


def test_data_parallel_rank_header_pins_the_local_engine(mock_server):
    """vllm-router's DP-aware routing sends `X-data-parallel-rank`; vLLM 0.33 under --data-parallel-hybrid-lb
    reads it as an index into the pod's local engines, refuses one out of range, ignores a non-integer."""
    srv = mock_server([MODEL, "-dp", "8", "-dpl", "4", "--data-parallel-start-rank", "4",
                       "--data-parallel-address", "leader.example", "-ep", "--data-parallel-hybrid-lb"], **FAST)
    srv.wait_ready()

    def post(rank: str | None) -> tuple[int, dict]:
        headers = {"content-type": "application/json"} | ({"X-data-parallel-rank": rank} if rank else {})
        body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 2}).encode()
        req = urllib.request.Request(srv.base + "/v1/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    for _ in range(3):
        assert post("2")[0] == 200
    _, text = srv.get("/metrics")
    done = series(text, "vllm:request_success_total")
    per_engine = {k: v for k, v in done.items() if 'finished_reason="length"' in k}
    assert {k.split('engine="')[1].split('"')[0]: v for k, v in per_engine.items() if v} == {"6": 3.0}

    status, err = post("4")
    assert status == 400 and "data_parallel_rank 4 is out of range [0, 4)." in err["error"]["message"]
    assert post("two")[0] == 200  # ignored, as vLLM ignores it: the balancer chooses
