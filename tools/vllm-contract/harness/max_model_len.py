"""What vLLM's own `vllm serve` parser makes of `--max-model-len VALUE`, for each value of a JSON list on stdin:
a JSON list on stdout, each {"tokens": int} (-1 is vLLM's "auto") or {"error": "the parser's message"}.

    <venv>/bin/python tools/vllm-contract/harness/max_model_len.py < values.json
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_flags import build_serve_parser  # noqa: E402


def main() -> int:
    values = json.load(sys.stdin)
    top, _ = build_serve_parser()
    out = []
    for value in values:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = top.parse_args(["serve", "model", f"--max-model-len={value}"])
            out.append({"tokens": ns.max_model_len})
        except (SystemExit, Exception) as e:  # argparse exits on a bad type
            lines = err.getvalue().strip().splitlines()
            out.append({"error": lines[-1] if lines else f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
