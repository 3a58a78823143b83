"""The mock GPU runtime of the local cluster: for every serving pod that KWOK "runs" on a simulated GPU node it
starts the pod's own command line as a local process (the mock `vllm serve`), keeps the pod's readiness
honest, and publishes them to Prometheus (file_sd); router pods run as the real vllm-router. See
docs/mock-runtime.md."""
