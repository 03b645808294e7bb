"""Exact OpenAI token counts, offline, with bpe-openai (tiktoken-compatible encodings built in).

A message costs what OpenAI's chat format adds around it (3 tokens, 1 more with a name) plus
the tokens of its text, and of each tool call's name and arguments.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
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


#: Texts longer than this are tokenized piece by piece: bpe-openai refuses to encode more than
#: 200,000 tokens at once, and a character is at most four (one per UTF-8 byte).
PIECE_CHARS = 50_000

_counters: dict[str, Callable[[str], int]] = {}


def _counter(name: str) -> Callable[[str], int]:
    """How ``name`` counts a text: bpe-openai's native count where its build has one (it builds
    no list of token ids: a fifth of the time, on every append), else the ids' length."""
    count = _counters.get(name)
    if count is None:
        encoder = get_encoding(name)
        native = getattr(getattr(encoder, "_backend", None), "count", None)

        def count(text: str) -> int:
            if native is not None:
                try:
                    return native(text)
                except UnicodeEncodeError:
                    pass  # a lone surrogate: encode_ordinary replaces it first
            return len(encoder.encode_ordinary(text))

        _counters[name] = count
    return count


def _pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of at most ``PIECE_CHARS`` that tokenize as it does: each cut falls
    before a space that follows a character other than white space, where the pre-tokenizer
    always starts a new piece (OpenAI's patterns never carry a space on the end of a piece).
    A stretch of half a piece with no such space (text without spaces) is cut where it ends,
    which may move a token."""
    start = 0
    while start < len(text):
        end = min(start + PIECE_CHARS, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + PIECE_CHARS // 2, end)
            while cut > start and text[cut - 1].isspace():
                cut = text.rfind(" ", start + PIECE_CHARS // 2, cut)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


def count_text(text: str, encoding: str | None = None) -> int:
    if not text:
        return 0
    count = _counter(encoding or memory_settings.TOKEN_ENCODING)
    if len(text) <= PIECE_CHARS:
        return count(text)
    return sum(count(piece) for piece in _pieces(text))


def first_tokens(text: str, n: int, encoding: str | None = None) -> str:
    """The longest start of ``text`` that is at most ``n`` tokens (whole tokens, cut at a
    character boundary)."""
    if n <= 0 or not text:
        return ""
    encoder = get_encoding(encoding or memory_settings.TOKEN_ENCODING)
    # No text of n tokens is longer than n * (the longest token); most are far shorter.
    head = text[: n * 64]
    tokens: list[int] = []
    for piece in _pieces(head):
        tokens += encoder.encode_ordinary(piece)
        if len(tokens) > n:
            return encoder.decode(tokens[:n]).rstrip("\ufffd")
    return head


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
