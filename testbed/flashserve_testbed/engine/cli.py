"""`flashserve mock-engine serve MODEL [vllm flags]` and the `vllm` entry point of the mock engine image.

Both read the same command line as `vllm serve`; mock-only settings come from FLASHSERVE_MOCK_* environment
variables (see docs/engine-model.md).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from flashserve_testbed.engine.args import USAGE, ArgsError, HelpRequested, parse

ENV_HELP = """mock-only environment:
  FLASHSERVE_MOCK_PROFILE          profile name (profiles/*.yaml) or path; default gb200-4gpu
  FLASHSERVE_MOCK_STARTUP_SECONDS  engine seconds until /health is 200; default drawn from the profile
  FLASHSERVE_MOCK_TIME_SCALE       engine seconds per wall second (10 runs ten times faster); default 1
  FLASHSERVE_MOCK_SEED             seed of every random draw; default --seed or 0
  FLASHSERVE_MOCK_DP_ROUTING       prefix (default) or load: how requests are spread over DP engines
  FLASHSERVE_MOCK_BIND_ANY         1 to honour a non-loopback --host (container images only)
  FLASHSERVE_MOCK_TICK_MS          streaming delivery tick in wall milliseconds; default 5"""


def _serve(argv: list[str], prog: str) -> int:
    from flashserve_testbed.engine.server import MockSettings, serve

    try:
        args = parse(argv)
        settings = MockSettings.from_env()
    except HelpRequested:
        print(f"{USAGE}\n\n{ENV_HELP}")
        return 0
    except (ArgsError, ValueError) as e:
        print(f"{USAGE}\n{prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        return _run(serve(args, settings))
    except ValueError as e:  # profile or KV sizing the model cannot serve
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{prog}: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1


def _run(coro) -> int:
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, task.cancel)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        pass
    finally:
        loop.close()
    if task.cancelled():
        return 0
    exc = task.exception()
    if exc is not None:
        raise exc
    return 0


def main(argv: list[str]) -> int:
    """`flashserve mock-engine serve MODEL [flags]`."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"usage: flashserve mock-engine serve MODEL [vllm serve flags...]\n\n{ENV_HELP}")
        return 0
    if argv[0] != "serve":
        print(f"flashserve mock-engine: unknown subcommand {argv[0]!r} (expected: serve)", file=sys.stderr)
        return 2
    return _serve(argv[1:], "flashserve mock-engine serve")


def vllm_main(argv: list[str] | None = None) -> int:
    """Console entry point named `vllm` in the mock engine image: accepts `vllm serve MODEL ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-v", "--version", "version"):
        from flashserve_testbed.engine.server import VLLM_VERSION

        print(VLLM_VERSION)
        return 0
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options]   (FlashServe CPU mock of vLLM: only `serve` exists)",
              file=sys.stderr)
        return 2
    return _serve(argv[1:], "vllm serve")


if __name__ == "__main__":
    sys.exit(vllm_main())
