"""Every error the memory store raises on purpose: one catalogue, read by every entry point.

Each class carries what its callers need to answer it, so no layer keeps a table of its own:

- ``code``: a stable machine-readable name (the API's ``code``);
- ``status_code``: the HTTP status the API answers with;
- ``client_fault``: the caller's input is at fault (the admin shows it as a form or page message,
  a command as one ``CommandError`` line) rather than the server or a provider;
- ``retryable``: the same call may succeed later (the API adds ``Retry-After``; tasks retry).

Errors about one field carry ``field`` (and ``reason``); a message of a batch also ``index``.
"""

from __future__ import annotations

from typing import Any


class MemoryStoreError(Exception):
    """Base class of every error the memory store raises on purpose."""

    code = "invalid"
    status_code = 400
    client_fault = True
    retryable = False
    #: Seconds a client should wait before retrying (``Retry-After``) when ``retryable``.
    retry_after: int | None = None
    default_detail = "The request could not be carried out."

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message or self.default_detail)


class FieldError(MemoryStoreError, ValueError):
    """One field is unacceptable: ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{field}: {reason}", field=field)


# ---- input: messages, sessions, snapshots, cursors, exports, search ----------------------------
class InvalidMessage(FieldError):
    """A message failed validation. ``field`` names the offending key, ``index`` its place in a
    batch."""

    code = "invalid_message"

    def __init__(self, field: str, reason: str, *, index: int | None = None) -> None:
        self.index = index
        super().__init__(field, reason)
        if index is not None:
            self.args = (f"message {index}: {field}: {reason}",)

    def at(self, index: int) -> InvalidMessage:
        """The same error, placed at ``index`` of a batch."""
        return type(self)(self.field, self.reason, index=index)


class MessageTooLarge(InvalidMessage):
    """A message is larger than ``MAX_MESSAGE_BYTES``; it is refused, never truncated."""

    code = "message_too_large"


class IdempotencyConflict(InvalidMessage):
    """An idempotency key already stored was sent again with a different message: a retry must
    repeat the original exactly (as payment APIs answer a reused key with other parameters)."""

    code = "idempotency_conflict"
    status_code = 422


class InvalidSession(FieldError):
    """A session field (key, namespace, title, metadata, expiry) is unacceptable."""

    code = "invalid_session"


class InvalidSnapshot(FieldError):
    """A snapshot's own content (summary, pinned messages, model, metadata) is unacceptable."""

    code = "invalid_snapshot"

    def __init__(self, field: str, reason: str | None = None) -> None:
        if reason is None:  # a sentence that names its field first: "summary must be ..."
            field, _, reason = field.partition(" ")
        super().__init__(field, reason)


class InvalidCursor(MemoryStoreError, ValueError):
    """A cursor or count is not an integer in range, does not move past the latest snapshot, or
    lies beyond the log. ``field`` names the argument at fault (``after``, ``upto``, ...)."""

    code = "invalid_cursor"


class InvalidExport(MemoryStoreError, ValueError):
    """Data given to ``Memory.import_session`` is not a session export this version accepts."""

    code = "invalid_export"


class InvalidSearch(FieldError):
    """A search argument is unacceptable. ``field`` names it."""

    code = "invalid_search"


class UnknownModel(FieldError):
    """A model whose token encoding is unknown (neither bpe-openai nor ``MODEL_ENCODINGS``
    knows it): counting it with another encoding would silently misjudge its budget."""

    code = "unknown_model"


class BudgetTooSmall(FieldError):
    """A window's token budget cannot hold what every window of the session must carry (the
    snapshot's pinned messages and the frame of its summary): a window never exceeds its
    budget, so it is refused rather than sent over it."""

    code = "budget_too_small"


class InvalidCheckpoint(FieldError):
    """A LangGraph checkpoint, pending write or its config is unacceptable (a missing
    ``thread_id``, an id too long, metadata that is not JSON...). ``field`` names it."""

    code = "invalid_checkpoint"


class InvalidItem(FieldError):
    """A store item (namespace, key, value, TTL, search filter) is unacceptable."""

    code = "invalid_item"


class InvalidOwner(MemoryStoreError, ValueError):
    """An operation on one owner's data was not given an owner (``None`` or ``ANY_OWNER``)."""

    code = "invalid_owner"


# ---- state: what is (not) there ---------------------------------------------------------------
class SessionNotFound(MemoryStoreError, LookupError):
    """No session with that key (or id) for that owner and namespace; another owner's session
    is not found either."""

    code = "not_found"
    status_code = 404


class SessionExists(MemoryStoreError):
    """A session with that key already exists for that owner and namespace."""

    code = "session_exists"
    status_code = 409


class SnapshotConflict(MemoryStoreError):
    """Compare-and-swap failed: the latest snapshot is no longer the one the caller read."""

    code = "snapshot_conflict"
    status_code = 409
    retryable = True  # after reloading the latest snapshot

    def __init__(self, expected_version: int | None, current: Any) -> None:
        self.expected_version = expected_version
        self.current = current
        current_version = current.version if current is not None else None
        super().__init__(
            f"snapshot changed: expected latest version {expected_version}, "
            f"found {current_version}; reload and retry"
        )


# ---- providers: summarizers and embedders -----------------------------------------------------
class ProviderError(MemoryStoreError):
    """A model provider (summarizer, embedder) failed: not the caller's fault."""

    code = "provider_error"
    status_code = 502
    client_fault = False


class SummarizerError(ProviderError):
    """The summarizer could not produce a summary (provider error, timeout, unusable answer).

    Nothing is saved when it is raised; the ``summarize_session`` task retries it with backoff.
    """

    code = "summarizer_error"
    retryable = True
    retry_after = 5


class EmptySummary(SummarizerError):
    """The summarizer answered with nothing usable: an error, never a summary."""

    code = "empty_summary"


class ExtractorError(ProviderError):
    """The memory extractor failed (a failed request, an answer that is not the expected
    JSON): nothing of the batch is applied, and the extraction is tried again."""

    code = "extractor_error"
    retryable = True


class EmbedderError(ProviderError):
    """The embedding provider failed, or answered something unusable. Not worth retrying."""

    code = "embedder_error"


class TransientEmbedderError(EmbedderError):
    """The provider failed in a way a retry may fix (timeout, rate limit, 5xx): tasks retry it,
    and the API answers 503 with ``Retry-After``."""

    code = "embedder_unavailable"
    status_code = 503
    retryable = True
    retry_after = 5


# ---- configuration ----------------------------------------------------------------------------
class NoEncryptionKey(MemoryStoreError):
    """Something must be encrypted (a key rotation) but ``ENCRYPTION_KEYS`` is empty."""

    code = "no_encryption_key"
    status_code = 500
    client_fault = False


class DecryptionFailed(MemoryStoreError):
    """A stored message is encrypted and none of ``ENCRYPTION_KEYS`` opens it (a key was removed
    before ``memory_rotate_keys`` ran, or the keys are wrong): a configuration error, not bad
    input."""

    code = "decryption_failed"
    status_code = 500
    client_fault = False


#: Every error class, for documentation and for tests that every one has its place.
CATALOGUE: tuple[type[MemoryStoreError], ...] = (
    MemoryStoreError,
    FieldError,
    InvalidMessage,
    MessageTooLarge,
    IdempotencyConflict,
    InvalidSession,
    InvalidSnapshot,
    InvalidCursor,
    InvalidExport,
    InvalidSearch,
    UnknownModel,
    InvalidCheckpoint,
    InvalidItem,
    InvalidOwner,
    SessionNotFound,
    SessionExists,
    SnapshotConflict,
    ProviderError,
    SummarizerError,
    EmptySummary,
    EmbedderError,
    TransientEmbedderError,
    DecryptionFailed,
)
