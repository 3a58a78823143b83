"""The `flashserve` command. Each subcommand lives in its own module and is imported only when used,
so `flashserve render` stays fast and does not load the controller or the engine."""

from __future__ import annotations

import importlib
import sys

# name -> (module:function taking argv, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("flashserve.commands.render:main", "render a DeepSeekServing into Kubernetes objects (offline)"),
    "crd": ("flashserve.commands.crd:main", "print the generated CustomResourceDefinition"),
    "validate": ("flashserve.commands.render:validate_main", "check a DeepSeekServing file; exit 2 with the field on error"),
    "run": ("flashserve.controller.main:main", "run the operator (kopf) against the current kubeconfig"),
    "cluster": ("flashserve.localcluster.cli:main", "bring the local control plane with KWOK Blackwell nodes up or down"),
    "mock-engine": ("flashserve.engine.cli:main", "run the CPU mock of `vllm serve` (API, metrics, speed model)"),
    "mock-runtime": ("flashserve.runtime.cli:main", "run mock engines for pods on simulated nodes (local cluster)"),
    "load": ("flashserve.loadgen.cli:main", "drive agentic multi-turn load against an OpenAI endpoint"),
    "bench": ("flashserve.bench.cli:main", "benchmarks (autoscale)"),
    "demo": ("flashserve.demo:main", "local cluster + operator + mock engines + autoscaling under agentic load"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: flashserve COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `flashserve COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version", "version"):
        from flashserve import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"flashserve: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    target, _ = COMMANDS[name]
    module, func = target.split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
