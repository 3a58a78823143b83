"""`spec.engine.maxModelLen`: the context-length grammar of vLLM's `--max-model-len`, and its bounds.

vLLM 0.33 parses the flag with `vllm.utils.argparse_utils.human_readable_int_or_auto`: `auto` (or -1), a plain
integer, a number with a decimal suffix (`k m g t`: powers of 1000, decimals allowed, the product truncated)
or a whole number with a binary suffix (`K M G T`: powers of 1024). Anything else (`1.5K`, `1e5`, `inf`) makes
the engine exit at start-up, so the API admits only what that parser reads, spelled plainly: no sign,
whitespace or digit separators (which Python's int() would also take), lower-case `auto`. The contract tests
hold this module to the real parser in both directions.

The upper bound is DeepSeek V4.1's context (1M tokens): vLLM refuses a longer max_model_len than the
checkpoint's max_position_embeddings. The grammar, the bound and the CEL rule all come from the constants here.
"""

from __future__ import annotations

import re

MAX_TOKENS = 1_048_576
MAX_LENGTH = 16  # characters of the string form

DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

# Digit counts are bounded so that no admitted string overflows CEL's 64-bit integers.
_PLAIN = r"[0-9]{1,7}"
_DECIMAL = r"[0-9]{1,7}(\.[0-9]{1,6})?[kmgt]"
_BINARY = r"[0-9]{1,7}[KMGT]"
PATTERN = rf"^(auto|{_PLAIN}|{_DECIMAL}|{_BINARY})$"
_RE = re.compile(PATTERN)

HINT = "use an integer, a size such as 32k (32000), 25.6k or 32K (32768), or auto"


def tokens(value: int | str) -> int | None:
    """The context length vLLM will use for this value: None for `auto`. Raises ValueError with the reason
    (and the fix) for anything vLLM would refuse or the API does not admit."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a context length: {HINT}")
    if isinstance(value, int):
        n = value
    else:
        if not _RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a context length vLLM reads: {HINT}")
        if value == "auto":
            return None
        suffix = value[-1]
        if suffix in DECIMAL:
            n = int(float(value[:-1]) * DECIMAL[suffix])
        elif suffix in BINARY:
            n = int(value[:-1]) * BINARY[suffix]
        else:
            n = int(value)
    if n < 1:
        raise ValueError(f"{value!r} is {n} tokens: the context length must be at least 1")
    if n > MAX_TOKENS:
        raise ValueError(f"{value!r} is {n} tokens, above DeepSeek V4.1's context of {MAX_TOKENS}: use at most 1M")
    return n


def _cel_string_tokens() -> str:
    """CEL for the token count of a string that matched PATTERN (not `auto`), as a double."""
    body = "self.substring(0, size(self) - 1)"
    cases = [f"self.endsWith('{s}') ? double({body}) * {float(m)!r}" for s, m in DECIMAL.items()]
    cases += [f"self.endsWith('{s}') ? double(int({body})) * {float(m)!r}" for s, m in BINARY.items()]
    return "(" + " : ".join(cases) + " : double(int(self)))"


def cel_rules() -> list[dict[str, str]]:
    """The same grammar and bounds for the API server (x-kubernetes-validations of the int-or-string field).
    Truncation as vLLM does it: a decimal size below 1 token (`0.0001k`) is refused by the `>= 1.0` test, and one
    that truncates to the maximum (`1048.5765k`) is admitted by the `< max + 1` test."""
    string_ok = (
        f"self.matches('{PATTERN.replace(chr(92), chr(92) * 2)}') && "
        f"(self == 'auto' || ({_cel_string_tokens()} >= 1.0 && {_cel_string_tokens()} < {float(MAX_TOKENS + 1)!r}))"
    )
    return [
        {
            "rule": f"type(self) == int ? (self >= 1 && self <= {MAX_TOKENS}) : (size(self) <= {MAX_LENGTH} && {string_ok})",
            "message": f"maxModelLen must be 1 to {MAX_TOKENS} tokens: {HINT}",
        }
    ]


MAX_MODEL_LEN_JSON_SCHEMA = {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": cel_rules()}
