"""Exact OpenAI token counts, offline, with bpe-openai (tiktoken-compatible encodings built in).

A message costs what OpenAI's chat format adds around it (3 tokens, 1 more with a name) plus
the tokens of its text, and of each tool call's name and arguments.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from typing import Any

import bpe_openai

from .conf import memory_settings
from .exceptions import UnknownModel

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1


_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()


def get_encoding(name: str):
    """The encoding, built once per process: threads that start counting together (a server's
    first requests) wait for one build instead of each building its own (tens of ms each)."""
    encoding = _encodings.get(name)
    if encoding is None:
        with _encodings_lock:
            encoding = _encodings.get(name)
            if encoding is None:
                encoding = _encodings[name] = bpe_openai.get_encoding(name)
    return encoding


def encoding_name_for_model(model: str | None) -> str:
    """The encoding tokens are counted with for ``model`` (``TOKEN_ENCODING`` when none is
    given). A model neither bpe-openai nor ``MODEL_ENCODINGS`` knows is refused: counting it
    with some other encoding would silently misjudge its budget."""
    if not model:
        return memory_settings.TOKEN_ENCODING
    configured = memory_settings.MODEL_ENCODINGS.get(model)
    if configured:
        return configured
    try:
        return bpe_openai.encoding_name_for_model(model)
    except Exception:
        raise UnknownModel(
            "model", f"no known encoding for {model!r}; map it in MEMORY_APP['MODEL_ENCODINGS']"
        ) from None


#: Texts longer than this are counted piece by piece, cut at white space (the tokenizer refuses
#: very long inputs; its pre-tokenizer splits before white space anyway, so counts stay exact
#: but for a rare run of white space at a cut).
PIECE_CHARS = 100_000


def count_text(text: str, encoding: str | None = None) -> int:
    if not text:
        return 0
    encoder = get_encoding(encoding or memory_settings.TOKEN_ENCODING)
    if len(text) <= PIECE_CHARS:
        return len(encoder.encode_ordinary(text))
    total, start = 0, 0
    while start < len(text):
        end = min(start + PIECE_CHARS, len(text))
        if end < len(text):
            cut = max(
                text.rfind(" ", start + PIECE_CHARS // 2, end),
                text.rfind("\n", start + PIECE_CHARS // 2, end),
            )
            end = cut if cut > start else end
        total += len(encoder.encode_ordinary(text[start:end]))
        start = end
    return total


def first_tokens(text: str, n: int, encoding: str | None = None) -> str:
    """The longest start of ``text`` that is at most ``n`` tokens (whole tokens, cut at a
    character boundary)."""
    if n <= 0 or not text:
        return ""
    encoder = get_encoding(encoding or memory_settings.TOKEN_ENCODING)
    # No text of n tokens is longer than n * (the longest token); most are far shorter.
    tokens = encoder.encode_ordinary(text[: n * 64])
    if len(tokens) <= n:
        return text[: n * 64] if len(text) > n * 64 else text
    return encoder.decode(tokens[:n]).rstrip("\ufffd")


@lru_cache(maxsize=64)
def _role_tokens(role: str, encoding: str) -> int:
    # A handful of roles, counted on every message: once each.
    return count_text(role, encoding)


def count_message(message: dict[str, Any], encoding: str | None = None) -> int:
    """Tokens one OpenAI-format message costs in a chat request."""
    enc = encoding or memory_settings.TOKEN_ENCODING
    role = message.get("role", "")
    total = TOKENS_PER_MESSAGE + (
        _role_tokens(role, enc)
        if isinstance(role, str) and len(role) < 32
        else count_text(role, enc)
    )
    content = message.get("content")
    if isinstance(content, str):
        total += count_text(content, enc)
    elif isinstance(content, list):
        for part in content:
            if part.get("type") in ("text", "refusal"):
                total += count_text(part.get(part["type"], ""), enc)
            else:  # images, audio, files: price their JSON, a stable over-estimate
                total += count_text(json.dumps(part, sort_keys=True), enc)
    if message.get("name"):
        total += TOKENS_PER_NAME + count_text(message["name"], enc)
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        total += count_text(function.get("name", ""), enc) + count_text(
            function.get("arguments", ""), enc
        )
    if message.get("tool_call_id"):
        total += count_text(message["tool_call_id"], enc)
    return total
