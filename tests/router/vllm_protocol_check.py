"""Run in the vLLM 0.33 contract venv (tests/router/test_mock_render_contract.py): reads cases from stdin, one
JSON list of {"id", "kind", "request", "response"}, and checks each mock response against vLLM's own protocol
models. Prints one JSON verdict per case: the fields vLLM's model has and the mock lacks or adds, whether the
model validates the response, and for render cases the SamplingParams vLLM itself resolves from the request."""

import json
import sys


def main() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeResponse

    models = {"tokenize": TokenizeResponse, "render_chat": GenerateRequest, "render_completion": GenerateRequest,
              "error": ErrorResponse}
    for case in json.load(sys.stdin):
        kind, resp, req = case["kind"], case["response"], case["request"]
        doc = resp[0] if kind == "render_completion" else resp
        model = models[kind]
        fields = set(model.model_fields)
        verdict = {"id": case["id"], "missing": sorted(fields - set(doc)), "extra": sorted(set(doc) - fields)}
        try:
            model.model_validate(doc)
            verdict["valid"] = True
        except Exception as e:  # the verdict carries it to the test
            verdict["valid"] = False
            verdict["error"] = str(e)[:1000]
        if kind == "error":
            verdict["error_fields"] = sorted(doc["error"])
        if kind.startswith("render_"):
            cls = ChatCompletionRequest if kind == "render_chat" else CompletionRequest
            r = cls(**req)
            params = r.to_sampling_params(doc["sampling_params"].get("max_tokens", 16), {})
            real = GenerateRequest(token_ids=[1], sampling_params=params).model_dump()["sampling_params"]
            verdict["sampling_params"] = json.loads(json.dumps(real))
            verdict["stream_options"] = (r.stream_options.model_dump() if r.stream and r.stream_options
                                         else None)
        print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
