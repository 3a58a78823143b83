"""The `flashserve` command. Each subcommand lives in its own module and is imported only when used,
so `flashserve render` stays fast and does not load the controller.

The product's commands are below. Packages installed beside it add theirs through the `flashserve.commands`
entry point group (a dict like COMMANDS): the test bed (testbed/) adds `cluster`, `demo`, `load`, `bench` and
the mocks that way, so the operator image, which installs the product alone, has none of them."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

# name -> (module:function taking argv, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("flashserve.commands.render:main", "render a DeepSeekServing into Kubernetes objects (offline)"),
    "crd": ("flashserve.commands.crd:main", "print the generated CustomResourceDefinition"),
    "validate": ("flashserve.commands.render:validate_main", "check a DeepSeekServing file; exit 2 with the field on error"),
    "status": ("flashserve.commands.status:main", "servings as the operator reports them: groups, SLA, scaling"),
    "run": ("flashserve.controller.main:main", "run the operator (kopf) against the current kubeconfig"),
}


def commands() -> dict[str, tuple[str, str]]:
    """The product's commands, then those of installed extensions (which cannot replace a product command)."""
    found = dict(COMMANDS)
    for ep in entry_points(group="flashserve.commands"):
        for name, entry in ep.load().items():
            found.setdefault(name, entry)
    return found


def usage(found: dict[str, tuple[str, str]]) -> str:
    width = max(map(len, found))
    lines = ["usage: flashserve COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in found.items()]
    if len(found) == len(COMMANDS):
        lines += ["", "(the test bed's commands: cluster, demo, load, bench, mock-engine, mock-runtime, need",
                  " `pip install ./testbed`; `make install` installs it)"]  # fmt: skip
    lines += ["", "Run `flashserve COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(found))
        return 0
    if argv[0] in ("-V", "--version", "version"):
        from flashserve import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in found:
        print(f"flashserve: unknown command {name!r}\n\n{usage(found)}", file=sys.stderr)
        return 2
    target, _ = found[name]
    module, func = target.split(":")
    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    try:
        code = int(getattr(importlib.import_module(module), func)(rest) or 0)
        sys.stdout.flush()
        sys.stdout = stdout
    except _OutputFailed as failed:
        sys.stdout = None  # type: ignore[assignment]  # no second failure when Python flushes it at exit
        if isinstance(failed.__cause__, BrokenPipeError):
            return 0  # `flashserve render ... | head`: the reader has what it wanted
        print(f"error: cannot write the output: {failed.__cause__.strerror or failed.__cause__}", file=sys.stderr)
        return 2
    return code


class _OutputFailed(Exception):
    """Standard output could not be written (a full disk, a closed pipe): the command's output, not its work,
    failed, so it is reported in one line instead of a traceback."""


class _Output:
    """sys.stdout, with its write errors told apart from every other OSError a command may meet."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _OutputFailed() from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _OutputFailed() from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


if __name__ == "__main__":
    sys.exit(main())
