"""The mock engine's tokenizer and render routes (what vllm-router asks a worker for) against vLLM 0.33's own
protocol models, imported in the contract venv: the same fields, valid for vLLM's pydantic models, and the
SamplingParams vLLM resolves from the same request."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from flashserve_testbed.engine.tokenizer import count_tokens, render_chat

from tests.engine.conftest import start_mock

pytestmark = pytest.mark.timeout(300)

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"
CHECK = Path(__file__).with_name("vllm_protocol_check.py")
FAST = {"FLASHSERVE_MOCK_STARTUP_SECONDS": "0"}
MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix foo.py"}]
CASES = [
    ("tokenize chat", "tokenize", "/tokenize", {"model": "dsv4", "messages": MESSAGES}),
    ("tokenize chat strs", "tokenize", "/tokenize",
     {"model": "dsv4", "messages": MESSAGES, "return_token_strs": True, "add_generation_prompt": False}),
    ("tokenize prompt", "tokenize", "/tokenize", {"prompt": "def foo():\n    return 1\n"}),
    ("render chat", "render_chat", "/v1/chat/completions/render", {"model": "dsv4", "messages": MESSAGES}),
    ("render chat knobs", "render_chat", "/v1/chat/completions/render",
     {"model": "dsv4", "messages": MESSAGES, "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
      "ignore_eos": True, "seed": 3, "temperature": 0.7, "top_p": 0.9, "min_tokens": 2, "stop": ["x"], "user": "u1"}),
    ("render completion", "render_completion", "/v1/completions/render", {"model": "dsv4", "prompt": "hi there"}),
    ("render completion knobs", "render_completion", "/v1/completions/render",
     {"model": "dsv4", "prompt": "hi", "max_tokens": 4, "stream": True, "ignore_eos": True, "top_k": 5,
      "presence_penalty": 0.5}),
]


def _post(base: str, path: str, body: dict) -> tuple[int, object]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def answers():
    on = start_mock([MODEL, "--served-model-name", "dsv4", "--enable-scale-out"], **FAST)
    off = start_mock([MODEL, "--served-model-name", "dsv4"], **FAST)
    try:
        on.wait_ready()
        off.wait_ready()
        got = {name: (kind, body, *_post(on.base, path, body)) for name, kind, path, body in CASES}
        got["render disabled"] = ("error", CASES[3][3], *_post(off.base, "/v1/chat/completions/render", CASES[3][3]))
        got["tokenize disabled scale-out"] = ("tokenize", CASES[0][3], *_post(off.base, "/tokenize", CASES[0][3]))
        got["unknown model"] = ("error", {}, *_post(on.base, "/tokenize", {"model": "nope", "prompt": "x"}))
        yield got
    finally:
        on.stop()
        off.stop()


def test_mock_answers_match_vllm_protocol_models(answers, vllm_python):
    cases = [{"id": name, "kind": kind, "request": body, "response": resp}
             for name, (kind, body, status, resp) in answers.items()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(vllm_python), str(CHECK)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    verdicts = {v["id"]: v for v in map(json.loads, proc.stdout.splitlines())}
    assert set(verdicts) == set(answers)
    for name, v in verdicts.items():
        assert v["valid"], (name, v.get("error"))
        assert v["missing"] == [] and v["extra"] == [], (name, v)
        kind, _body, _status, resp = answers[name]
        if kind == "error":
            assert v["error_fields"] == ["code", "message", "param", "type"]
        if kind.startswith("render_"):
            doc = resp[0] if kind == "render_completion" else resp
            assert doc["sampling_params"] == v["sampling_params"], name
            assert doc["stream_options"] == v["stream_options"], name


def test_statuses_follow_vllm(answers):
    assert {name: status for name, (_, _, status, _) in answers.items()} == {
        **{name: 200 for name, *_ in CASES}, "tokenize disabled scale-out": 200,
        # vLLM 0.33 registers the render routes only with --enable-scale-out; without it they answer 403
        "render disabled": 403, "unknown model": 404,
    }
    err = answers["render disabled"][3]["error"]
    assert err["type"] == "PermissionDeniedError" and "--enable-scale-out" in err["message"]


def test_token_ids_follow_the_chat_template_and_are_prefix_stable(answers):
    text = render_chat(MESSAGES)
    tok = answers["tokenize chat"][3]
    assert tok["count"] == len(tok["tokens"]) == count_tokens(text)
    assert tok["max_model_len"] == 131072
    assert answers["render chat"][3]["token_ids"] == tok["tokens"]
    strs = answers["tokenize chat strs"][3]
    assert "".join(strs["token_strs"]) == render_chat(MESSAGES, add_generation_prompt=False)
    # without the generation prompt the chat is a prefix of the one with it: so are its full tokens
    full = len(render_chat(MESSAGES, add_generation_prompt=False)) // 4
    assert strs["tokens"][:full] == tok["tokens"][:full]
    assert tok["token_strs"] is None


def test_render_max_tokens_is_the_room_left_unless_given(answers):
    room = 131072 - answers["tokenize chat"][3]["count"]
    assert answers["render chat"][3]["sampling_params"]["max_tokens"] == room
    assert answers["render chat knobs"][3]["sampling_params"]["max_tokens"] == 7
    assert answers["render chat knobs"][3]["request_id"].startswith("chatcmpl-")
    assert answers["render completion"][3][0]["request_id"].startswith("cmpl-")
