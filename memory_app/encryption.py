"""Optional encryption at rest of message content, with ``cryptography``'s MultiFernet.

Turn it on with a list of Fernet keys, newest first::

    MEMORY_APP = {"ENCRYPTION_KEYS": [os.environ["MEMORY_KEY_2025"], os.environ["MEMORY_KEY_2024"]]}

(make a key with
``python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"``).
The first key encrypts; every key decrypts. ``python manage.py memory_rotate_keys`` re-encrypts
stored rows with the first key (and encrypts rows written before encryption was turned on), after
which an old key can be dropped from the list.

What is encrypted: a message's text (``content``), its content parts (``content_parts``, as one
encrypted JSON document) and the ``arguments`` of its tool calls. Each becomes
``ENCRYPTED_PREFIX`` + a Fernet token, so rows written before encryption was turned on (which
lack the prefix) still read as they are. Empty values stay empty. What is not: roles, names, tool
call ids and function names, metadata, ``extra`` fields, token counts, snapshot summaries and
pinned messages, and embeddings (vectors computed from the plaintext, which they partly reveal).
The text an embedding keeps of a pruned message (long-term memory) is the log's stored value,
copied as it is: ciphertext when the message was encrypted.

The log encrypts in ``encrypt_row`` just before a message is written and decrypts in
``decrypt_row`` as a stored row becomes a ``StoredMessage``: everything above the log (windows,
exports, the API, summarization, embedding) sees plaintext. The database cannot see it: SQL
that looks into content (full-text search, the admin's message search) finds nothing in
encrypted rows.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from .conf import memory_settings
from .exceptions import DecryptionFailed

if TYPE_CHECKING:
    from cryptography.fernet import Fernet, MultiFernet

    from .types import NewMessage, StoredMessage

#: Marks an encrypted value; what follows is a Fernet token. Stored text never starts with it
#: otherwise (validation refuses such content), so a value is ciphertext exactly when it does.
ENCRYPTED_PREFIX = "enc:fernet:"

_cached: tuple[tuple, MultiFernet | None, Fernet | None] = ((), None, None)


def _keys() -> tuple:
    return tuple(memory_settings.ENCRYPTION_KEYS or ())


def _load() -> tuple[tuple, MultiFernet | None, Fernet | None]:
    global _cached
    keys = _keys()
    if keys != _cached[0]:
        if not keys:
            _cached = (keys, None, None)
        else:
            from cryptography.fernet import Fernet, MultiFernet

            fernets = [Fernet(k) for k in keys]
            _cached = (keys, MultiFernet(fernets), fernets[0])
    return _cached


def fernet() -> MultiFernet | None:
    """The MultiFernet of ``ENCRYPTION_KEYS`` (first key encrypts), or ``None`` when it is empty."""
    return _load()[1]


def enabled() -> bool:
    return bool(_keys())


def is_encrypted(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(ENCRYPTED_PREFIX)


def encrypt_text(text: str, box: MultiFernet | None = None) -> str:
    """``text`` encrypted with the newest key (unchanged when empty or encryption is off)."""
    box = box or fernet()
    if box is None or not text:
        return text
    return ENCRYPTED_PREFIX + box.encrypt(text.encode("utf-8")).decode("ascii")


def decrypt_text(value: str) -> str:
    """The plaintext of a stored value; a value without the prefix is returned as it is."""
    if not is_encrypted(value):
        return value
    try:
        return _decrypt(value[len(ENCRYPTED_PREFIX) :].encode("ascii")).decode("utf-8")
    except UnicodeError as err:
        raise _undecryptable() from err


def encrypt_bytes(data: bytes | None) -> bytes | None:
    """Opaque bytes (a LangGraph channel value or pending write) encrypted with the newest key,
    as ``ENCRYPTED_PREFIX`` + a Fernet token; unchanged when empty or encryption is off."""
    box = fernet()
    if box is None or not data:
        return data
    return _PREFIX_BYTES + box.encrypt(bytes(data))


def decrypt_bytes(data: bytes | memoryview | None) -> bytes | None:
    """The plaintext of stored bytes; bytes without the prefix are returned as they are."""
    if data is None:
        return None
    data = bytes(data)
    if not data.startswith(_PREFIX_BYTES):
        return data
    return _decrypt(data[len(_PREFIX_BYTES) :])


_PREFIX_BYTES = ENCRYPTED_PREFIX.encode("ascii")


def _undecryptable() -> DecryptionFailed:
    return DecryptionFailed(
        "an encrypted value cannot be decrypted with any of MEMORY_APP['ENCRYPTION_KEYS'] "
        "(was the key it was written with removed?)"
    )


def _decrypt(token: bytes) -> bytes:
    box = fernet()
    if box is None:
        raise DecryptionFailed(
            "an encrypted value was read but MEMORY_APP['ENCRYPTION_KEYS'] is empty"
        )
    from cryptography.fernet import InvalidToken

    try:
        return box.decrypt(token)
    except InvalidToken as err:
        raise _undecryptable() from err


# -- rows -------------------------------------------------------------------------------------


def encrypt_row(message: NewMessage) -> NewMessage:
    """The message as it is stored: content, content parts and tool call arguments encrypted
    with the newest key. The same message when encryption is off."""
    box = fernet()
    if box is None:
        return message
    return dataclasses.replace(
        message,
        content=encrypt_text(message.content, box),
        content_parts=(
            None
            if message.content_parts is None
            else encrypt_text(json.dumps(message.content_parts, ensure_ascii=False), box)
        ),
        tool_calls=_map_arguments(message.tool_calls, lambda a: encrypt_text(a, box)),
    )


def decrypt_row(message: StoredMessage) -> StoredMessage:
    """A stored message with its encrypted fields decrypted; the same object when none is."""
    parts_encrypted = is_encrypted(message.content_parts)
    if not (
        is_encrypted(message.content)
        or parts_encrypted
        or _has_encrypted_arguments(message.tool_calls)
    ):
        return message
    return dataclasses.replace(
        message,
        content=decrypt_text(message.content),
        content_parts=json.loads(decrypt_text(message.content_parts))
        if parts_encrypted
        else message.content_parts,
        tool_calls=_map_arguments(message.tool_calls, decrypt_text),
    )


def stored_values(content: str, content_parts: Any, tool_calls: Any) -> tuple | None:
    """New stored values of the three fields under the newest key, or ``None`` when they are
    already encrypted with it (used by ``memory_rotate_keys``; encryption must be on)."""
    _, box, newest = _load()
    if box is None:
        raise DecryptionFailed(
            "MEMORY_APP['ENCRYPTION_KEYS'] is empty: there is no key to encrypt with"
        )
    changed = False

    def current(value: str) -> str:
        nonlocal changed
        if not value:
            return value
        if is_encrypted(value):
            token = value[len(ENCRYPTED_PREFIX) :].encode("ascii")
            try:
                newest.decrypt(token)
                return value
            except Exception:
                changed = True
                return ENCRYPTED_PREFIX + box.rotate(token).decode("ascii")
        changed = True
        return encrypt_text(value, box)

    new_content = current(content)
    if content_parts is None:
        new_parts = None
    elif isinstance(content_parts, str):
        new_parts = current(content_parts)
    else:  # plaintext parts, written before encryption was turned on
        changed = True
        new_parts = encrypt_text(json.dumps(content_parts, ensure_ascii=False), box)
    new_calls = _map_arguments(tool_calls, current)
    return (new_content, new_parts, new_calls) if changed else None


def _map_arguments(tool_calls: list | None, change) -> list | None:
    if not tool_calls:
        return tool_calls
    mapped = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str) and arguments:
            call = {**call, "function": {**function, "arguments": change(arguments)}}
        mapped.append(call)
    return mapped


def _has_encrypted_arguments(tool_calls: list | None) -> bool:
    if not tool_calls:
        return False
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and is_encrypted(function.get("arguments")):
            return True
    return False
