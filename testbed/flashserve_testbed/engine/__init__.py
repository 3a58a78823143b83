"""CPU mock of a DeepSeek-V4.1-Flash vLLM 0.33 replica: a performance model of the engine (perfmodel), its
calibration profiles (profiles/*.yaml), and a drop-in `vllm serve` server (server, cli)."""
