"""What vLLM 0.33 answers on its tokenizer and render routes, for the mock engine: `POST /tokenize` and
`POST /v1/chat/completions/render` / `POST /v1/completions/render` (the routes vllm-router asks a worker for a
prompt's token ids, to route on them; docs/vllm-router.md).

Shapes follow vLLM's own protocol models (vllm/entrypoints/serve/tokenize/protocol.py: TokenizeChatRequest,
TokenizeCompletionRequest, TokenizeResponse; vllm/entrypoints/scale_out/token_in_token_out/protocol.py:
GenerateRequest; vllm/sampling_params.py: SamplingParams, dumped with omit_defaults); tests/router checks the
mock's answers against those models in the contract venv. Pure functions: the HTTP layer is server.py.
"""

from __future__ import annotations

import uuid

from flashserve_testbed.engine import tokenizer as tok
from flashserve_testbed.engine.replica import RequestError

# vLLM 0.33 registers the render routes only with `--enable-scale-out` (or `--tokens-only`, or `vllm launch
# render`); otherwise each answers 403 with this message (vllm/entrypoints/scale_out/factories.py).
SCALE_OUT_DISABLED = ("Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable "
                      "them.")
# SamplingParams.max_tokens' default: omitted from the dump when equal (msgspec omit_defaults).
_DEFAULT_MAX_TOKENS = 16
# RequestOutputKind: DELTA for a stream, FINAL_ONLY otherwise (ChatCompletionRequest.to_sampling_params).
_OUTPUT_DELTA, _OUTPUT_FINAL_ONLY = 1, 2


def tokenize(body: dict, model: str, max_model_len: int) -> dict:
    """TokenizeResponse for a TokenizeChatRequest (`messages`) or TokenizeCompletionRequest (`prompt`)."""
    text = _tokenize_text(body)
    ids = tok.prompt_token_ids(text)
    return {
        "count": len(ids),
        "max_model_len": max_model_len,
        "tokens": ids,
        "token_strs": tok.prompt_token_strs(text) if body.get("return_token_strs") else None,
    }


def _tokenize_text(body: dict) -> str:
    if "messages" in body:
        add_generation_prompt = body.get("add_generation_prompt", True)
        continue_final = bool(body.get("continue_final_message", False))
        if continue_final and add_generation_prompt:
            raise RequestError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return chat_text(body, bool(add_generation_prompt), continue_final)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    raise RequestError(400, "a tokenize request needs `messages` (a list) or `prompt` (a string)", param="prompt")


def chat_text(body: dict, add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    try:
        return tok.render_chat(body.get("messages"), body.get("tools"), add_generation_prompt,
                               continue_final_message)
    except ValueError as e:
        raise RequestError(400, str(e), param="messages") from None


def render_chat(body: dict, model: str, max_tokens: int, request_id: str | None = None) -> dict:
    """The GenerateRequest vLLM's /v1/chat/completions/render returns: the prompt's token ids and the sampling
    parameters `to_sampling_params` resolves; `max_tokens` is what get_max_tokens gives (the request's, else
    the room left in the context)."""
    ids = tok.prompt_token_ids(chat_text(body, bool(body.get("add_generation_prompt", True)),
                                         bool(body.get("continue_final_message", False))))
    stream = bool(body.get("stream"))
    return _generate_request(
        "chatcmpl-" + (request_id or uuid.uuid4().hex), ids, sampling_params(body, max_tokens, stream), model,
        body, stream,
        parse_context={
            "tools": body.get("tools"),
            "tool_choice": body.get("tool_choice") or ("auto" if body.get("tools") else "none"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "include_reasoning": body.get("include_reasoning", True),
            "chat_template_kwargs": body.get("chat_template_kwargs") or {},
            "history_tool_call_cnt": sum(len(m.get("tool_calls") or []) for m in body.get("messages") or []
                                         if isinstance(m, dict)),
        },
    )


def render_completion(body: dict, model: str, max_tokens: int, prompt_ids: list[int],
                      request_id: str | None = None) -> list[dict]:
    """/v1/completions/render: a list of GenerateRequest, one per prompt (the mock serves one)."""
    stream = bool(body.get("stream"))
    return [_generate_request("cmpl-" + (request_id or uuid.uuid4().hex) + "-0", prompt_ids,
                              sampling_params(body, max_tokens, stream), model, body, stream, parse_context=None)]


def _generate_request(request_id: str, ids: list[int], params: dict, model: str, body: dict, stream: bool,
                      parse_context: dict | None) -> dict:
    return {
        "request_id": request_id,
        "token_ids": ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": params,
        "model": model,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": body.get("return_token_ids"),
        "output_mode": "tokens",
        "parse_context": parse_context,
        "stream": stream,
        "stream_options": _stream_options(body) if stream else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority", 0),
        "kv_transfer_params": body.get("kv_transfer_params"),
        "ec_transfer_params": body.get("ec_transfer_params"),
    }


def _stream_options(body: dict) -> dict | None:
    opts = body.get("stream_options")
    if not isinstance(opts, dict):
        return None
    return {"include_usage": opts.get("include_usage", True),
            "continuous_usage_stats": opts.get("continuous_usage_stats", False)}


def sampling_params(body: dict, max_tokens: int, stream: bool) -> dict:
    """SamplingParams as vLLM dumps it (defaults left out), for the fields the mock's clients send; a request
    with other sampling knobs (logprobs, structured outputs, logit_bias, ...) gets them ignored here."""
    out: dict = {
        "presence_penalty": float(body.get("presence_penalty") or 0.0),
        "frequency_penalty": float(body.get("frequency_penalty") or 0.0),
        "repetition_penalty": float(body.get("repetition_penalty") or 1.0),
        "temperature": float(body["temperature"]) if body.get("temperature") is not None else 1.0,
        "top_p": float(body["top_p"]) if body.get("top_p") is not None else 1.0,
    }
    top_k = body.get("top_k")
    if top_k not in (None, 0, -1):
        out["top_k"] = int(top_k)
    out["min_p"] = float(body.get("min_p") or 0.0)
    if body.get("seed") is not None:
        out["seed"] = int(body["seed"])
    stop = body.get("stop")
    out["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
    out["stop_token_ids"] = list(body.get("stop_token_ids") or [])
    if body.get("ignore_eos"):
        out["ignore_eos"] = True
    if max_tokens != _DEFAULT_MAX_TOKENS:
        out["max_tokens"] = max_tokens
    if body.get("min_tokens"):
        out["min_tokens"] = int(body["min_tokens"])
    out["output_kind"] = _OUTPUT_DELTA if stream else _OUTPUT_FINAL_ONLY
    out["skip_clone"] = True
    out["bad_words"] = list(body.get("bad_words") or [])
    out["skip_reading_prefix_cache"] = False
    return out
