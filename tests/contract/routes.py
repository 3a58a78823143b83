"""The routes an engine's API port may answer, each reviewed for what any client of the serving can do with it,
and the settings that open more.

vllm-router forwards every path it does not serve itself to an engine
(tests/router/test_vllm_router.py::test_the_router_forwards_every_path_it_does_not_serve_to_a_worker), so a route
of an engine is a route of every client. The contract harness lists what vLLM 0.33's own launcher would serve
(tools/vllm-contract/harness/engine_check.py, served_routes); test_engine_contract.py holds that list to this one
both ways, and shows that each setting the operator refuses for opening routes (facts/managed.py, ROUTE_DESTS and
ROUTE_ENV) opens routes outside it."""

from __future__ import annotations

from tests.contract.pods import engine_pods

INFERENCE = "inference, what every client is for"
TOKENS = "the tokenizer and prompt rendering (cache_aware's render route): no engine state"
READ = "a read of the engine's health, load, version, model list or metrics"
DOCS = "FastAPI's API description and its pages"

REVIEWED: dict[str, str] = {
    **{f"POST {p}": INFERENCE for p in (
        "/v1/chat/completions", "/v1/completions", "/v1/chat/completions/batch", "/v1/messages",
        "/v1/messages/count_tokens", "/v1/responses", "/v1/decisions", "/v1/systemone", "/generative_scoring",
        "/invocations", "/inference/v1/generate",
    )},
    "GET /v1/responses/{response_id}": "a stored response by its id (the store is off unless "
    "VLLM_ENABLE_RESPONSES_API_STORE is set; ids are random UUIDs)",
    "POST /v1/responses/{response_id}/cancel": "cancels a background response by its id (random UUIDs)",
    "POST /inference/v1/abort_requests": "aborts requests by id (only with --enable-scale-out, i.e. cache_aware): a "
    "request's id is a random UUID unless its own client sent X-Request-Id",
    **{f"POST {p}": TOKENS for p in (
        "/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render", "/v1/messages/render",
        "/v1/responses/render", "/v1/chat/completions/derender", "/v1/completions/derender",
    )},
    "POST /scale_elastic_ep": "refused by the engine: elastic EP needs --enable-elastic-ep (the operator refuses it) "
    "and Ray data parallelism (the operator runs processes)",
    "POST /is_scaling_elastic_ep": READ,
    **{f"GET {p}": READ for p in ("/health", "/ping", "/load", "/version", "/kv_event_sources", "/metrics",
                                  "/v1/models")},
    "POST /ping": READ,
    "* /metrics": READ,
    **{f"{m} {p}": DOCS for m in ("GET", "HEAD") for p in ("/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")},
}

# Each setting the operator refuses for the routes it opens, as vLLM reads it: (environment, arguments) added to
# a rendered pod's.
OPENERS: dict[str, tuple[dict[str, str], list[str]]] = {
    "VLLM_SERVER_DEV_MODE": ({"VLLM_SERVER_DEV_MODE": "1"}, []),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": ({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}, []),
    "profiler_config": ({}, ["--profiler-config", '{"profiler": "torch", "torch_profiler_dir": "/profiles"}']),
    "tokens_only": ({}, ["--tokens-only"]),
}
OPENER_PREFIX = "opens/"


def opener_cases(cr: dict) -> list[dict]:
    """Pod 0 of `cr` with each opener added, routes listed."""
    pod = engine_pods(cr)[0]
    return [{"id": OPENER_PREFIX + name, "argv": [*pod["argv"], *args], "env": {**pod["env"], **env},
             "accelerator": pod["accelerator"], "routes": True} for name, (env, args) in OPENERS.items()]  # fmt: skip


def route_of(entry: str) -> str:
    """A served route without the harness's " (403)" mark."""
    return entry.removesuffix(" (403)")


def path_of(route: str) -> str:
    """The path of a "METHOD /path" route."""
    return route.split(" ", 1)[1]
