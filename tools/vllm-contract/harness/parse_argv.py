"""Parses command lines with the real `vllm serve` parser (built as gen_flags.py builds it) and says what each
one sets. Reads a JSON list on stdin, each item {"argv": [...], "model": true|false} (whether to put a model
positional first); writes a JSON list on stdout, each {"sets": [the dests of the options argparse applied, and
model_tag when the model changed]} or {"error": "the parser's message"} (argparse errors, vLLM's own
ValueErrors and --help's exit alike). The options are watched where argparse calls them, so a value that
happens to equal the default still counts.

    <venv>/bin/python tools/vllm-contract/harness/parse_argv.py < in.json
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_flags import build_serve_parser  # noqa: E402


class _Watched:
    """Mixed into each option's action class: logs the dest whenever argparse applies the option."""

    _log: list[str]

    def __call__(self, parser, namespace, values, option_string=None):
        self._log.append(self.dest)
        return super().__call__(parser, namespace, values, option_string)


def main() -> int:
    requests = json.load(sys.stdin)
    top, serve = build_serve_parser()
    applied: list[str] = []
    for action in serve._actions:
        if action.option_strings:
            action.__class__ = type(action.__class__.__name__, (_Watched, action.__class__), {"_log": applied})
    out = []
    for req in requests:
        argv = ["serve", *(["model"] if req.get("model", True) else []), *req["argv"]]
        err = io.StringIO()
        applied.clear()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = vars(top.parse_args(argv))
        except (SystemExit, Exception) as e:  # argparse exits; FlexibleArgumentParser raises
            message = err.getvalue().strip().splitlines()[-1:] or [f"{type(e).__name__}: {e}"]
            out.append({"error": message[0]})
            continue
        model = ["model_tag"] if ns.get("model_tag") != ("model" if req.get("model", True) else None) else []
        out.append({"sets": sorted(set(applied) | set(model))})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
