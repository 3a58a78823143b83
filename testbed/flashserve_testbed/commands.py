"""The test bed's `flashserve` subcommands: name -> (module:function taking argv, one-line help). The product's
command line (flashserve/cli.py) adds them through the `flashserve.commands` entry point, so they exist only
where the test bed is installed, and listing them imports nothing."""

COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("flashserve_testbed.localcluster.cli:main", "bring the local control plane with KWOK Blackwell nodes up or down"),
    "mock-engine": ("flashserve_testbed.engine.cli:main", "run the CPU mock of `vllm serve` (API, metrics, speed model)"),
    "mock-runtime": ("flashserve_testbed.runtime.cli:main", "run mock engines for pods on simulated nodes (local cluster)"),
    "load": ("flashserve_testbed.loadgen.cli:main", "drive agentic multi-turn load against an OpenAI endpoint"),
    "bench": ("flashserve_testbed.bench.cli:main", "benchmarks (autoscale)"),
    "demo": ("flashserve_testbed.demo:main", "local cluster + operator + mock engines + autoscaling under agentic load"),
}
