"""The mock engine's tokenizer, chat template and synthetic output text.

Counting rule, which load generators can target exactly: text is cut into tokens of 4 characters from its
start (so `ceil(len(text) / 4)` tokens); a chat request is first rendered with the template below. The
synthetic output is made of 4-character words, so n output tokens are exactly 4n characters and re-tokenise to
n tokens when a client sends them back in the next turn.

The template renders each message as `<|role|>content<|end|>` and ends with `<|assistant|>`, so a
conversation's next request starts with this request's prompt followed by its answer. Block hashes are chained
over fixed 4*block_size-character slices of that text; a later turn therefore hits the prefix cache on every
full block of the earlier prompt *and* answer, as it would on vLLM.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence

CHARS_PER_TOKEN = 4
WORDS: tuple[str, ...] = tuple(
    w + " "
    for w in (
        "the and for you are not but can all use new get set run add fix log map key row "
        "let var def int str max min sum len out end top now see way may say one two old big"
    ).split()
)


def count_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                else:
                    parts.append(f"<|{part.get('type', 'media')}|>")
            else:
                parts.append(str(part))
        return "".join(parts)
    return json.dumps(content, sort_keys=True)


def render_chat(messages: Sequence[dict], tools: object = None, add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    """Deterministic, prefix-stable chat template. `continue_final_message` leaves the last message open (no
    `<|end|>`), as vLLM's template option of that name does."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    if tools:
        out.append("<|tools|>" + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "<|end|>")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("each message needs a role")
        body = _content_text(m.get("content"))
        if m.get("tool_calls"):
            body += json.dumps(m["tool_calls"], sort_keys=True, separators=(",", ":"))
        out.append(f"<|{m['role']}|>{body}<|end|>")
    if continue_final_message:
        out[-1] = out[-1].removesuffix("<|end|>")
    elif add_generation_prompt:
        out.append("<|assistant|>")
    return "".join(out)


# DeepSeek-V3's vocabulary size (its config.json); the mock's ids only need to be stable and in range.
VOCAB_SIZE = 129280


def prompt_token_strs(text: str) -> list[str]:
    """The mock's tokens of `text`: 4-character slices from its start (the last may be shorter)."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def prompt_token_ids(text: str) -> list[int]:
    """One id per token, fixed by the token's characters alone, so two prompts sharing a prefix share the ids
    of its full tokens (what a prefix-aware router matches on)."""
    return [zlib.crc32(t.encode("utf-8", "surrogatepass")) % VOCAB_SIZE for t in prompt_token_strs(text)]


def output_offset(prompt_key: str | Sequence[int]) -> int:
    """Where in the word cycle an answer starts: fixed by the prompt, so a repeated request repeats its answer."""
    if isinstance(prompt_key, str):
        data = prompt_key[-4096:].encode("utf-8", "surrogatepass")
    else:
        data = ",".join(map(str, prompt_key[-1024:])).encode()
    return zlib.crc32(data) % len(WORDS)


def output_text(offset: int, start: int, end: int) -> str:
    """Text of output tokens [start, end)."""
    n = len(WORDS)
    return "".join(WORDS[(offset + i) % n] for i in range(start, end))


def output_token_ids(offset: int, count: int) -> list[int]:
    n = len(WORDS)
    return [(offset + i) % n for i in range(count)]


def text_block_hashes(text: str, block_tokens: int) -> list[int]:
    """Chain hashes of the full blocks of `text` (each block is block_tokens * 4 characters)."""
    width = block_tokens * CHARS_PER_TOKEN
    prev = 0
    out = []
    for j in range(len(text) // width):
        prev = hash((prev, text[j * width : (j + 1) * width]))
        out.append(prev)
    return out


def id_block_hashes(token_ids: Sequence[int], block_tokens: int) -> list[int]:
    prev = 0
    out = []
    for j in range(len(token_ids) // block_tokens):
        prev = hash((prev, tuple(token_ids[j * block_tokens : (j + 1) * block_tokens])))
        out.append(prev)
    return out
