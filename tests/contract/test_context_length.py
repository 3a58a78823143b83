"""spec.engine.maxModelLen against vLLM's own `--max-model-len` parser, both ways: every value the API admits
vLLM reads as the same number of tokens, and every value vLLM refuses the API refuses. The API is stricter
only where it says so in flashserve/api/context_length.py (bounds; signs, blanks, digit separators and other
spellings Python's int() tolerates)."""

from __future__ import annotations

import json
import random

from flashserve.api import context_length

from tests.contract.conftest import run_in_vllm

HANDWRITTEN = [
    "auto", "AUTO", "Auto", "-1", "0", "1", "131072", "1048576", "1048577", "32k", "32K", "25.6k", "25.6K", "1.5K",
    "2.5M", "1m", "1M", "2M", "1e5", "inf", "nan", "", " ", "32 k", " 32k", "32k ", "+5", "1_000", "0x10", "k",
    "K", ".5k", "5.k", "0.0001k", "1.0001k", "3g", "1t", "1T", "0.001m", "١٢٣", "12ｋ", "10kk", "1,000",
]
STRICTER = ("auto-spelling", "blank", "sign", "separator", "non-ascii", "bound")


def _generated(n: int = 600) -> list[str]:
    rng = random.Random(16)
    alphabet = "0123456789" * 3 + ".kKmMgGtT-+_ ae"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def _why_stricter(value: str, tokens: int) -> str | None:
    if value.strip().lower() == "auto" or value.strip() == "-1":
        return "auto-spelling"
    if value != value.strip():
        return "blank"
    if value[:1] in "+-":
        return "sign"
    if "_" in value:
        return "separator"
    if not value.isascii():
        return "non-ascii"
    if tokens < 1 or tokens > context_length.MAX_TOKENS:
        return "bound"
    return None


def test_max_model_len_grammar_is_vllms(vllm_python):
    values = list(dict.fromkeys(HANDWRITTEN + _generated()))
    theirs = json.loads(run_in_vllm(vllm_python, "max_model_len.py", input=json.dumps(values)))
    accepted = unexplained = 0
    problems = []
    for value, verdict in zip(values, theirs):
        try:
            ours = context_length.tokens(value)
        except ValueError:
            ours = "refused"
        if ours != "refused":
            accepted += 1
            expected = -1 if ours is None else ours
            if verdict.get("tokens") != expected:
                problems.append(f"{value!r}: the API reads {ours}, vLLM {verdict}")
        elif "tokens" in verdict and _why_stricter(value, verdict["tokens"]) is None:
            unexplained += 1
            problems.append(f"{value!r}: vLLM reads {verdict['tokens']} tokens, the API refuses it for no stated reason")
    assert not problems, "\n".join(problems)
    assert accepted >= 20 and unexplained == 0
    print(f"\nmaxModelLen: {len(values)} values, {accepted} admitted, all read alike by vLLM")
