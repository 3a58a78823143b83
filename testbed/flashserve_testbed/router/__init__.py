"""vLLM's own router (`vllm-router`) in the test bed: the binary and its options, a fleet of mock engines, a
random-per-request baseline proxy and the policy benchmark (docs/vllm-router.md). On the local cluster the
mock runtime runs each serving's router pods as `vllm-router` (docs/mock-runtime.md)."""
