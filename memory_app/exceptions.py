"""Typed errors of the memory store. Everything raised on purpose derives from ``MemoryStoreError``."""

from __future__ import annotations

from typing import Any


class MemoryStoreError(Exception):
    """Base class of every error the memory store raises on purpose."""


class InvalidMessage(MemoryStoreError, ValueError):
    """A message failed validation. ``field`` names the offending key, ``index`` its place in a batch."""

    def __init__(self, field: str, reason: str, *, index: int | None = None) -> None:
        self.field = field
        self.reason = reason
        self.index = index
        where = f"message {index}: " if index is not None else ""
        super().__init__(f"{where}{field}: {reason}")

    def at(self, index: int) -> InvalidMessage:
        """The same error, placed at ``index`` of a batch."""
        err = type(self)(self.field, self.reason, index=index)
        return err


class MessageTooLarge(InvalidMessage):
    """A message is larger than ``MAX_MESSAGE_BYTES``; it is refused, never truncated."""


class SnapshotConflict(MemoryStoreError):
    """Compare-and-swap failed: the latest snapshot is no longer the one the caller read."""

    def __init__(self, expected_version: int | None, current: Any) -> None:
        self.expected_version = expected_version
        self.current = current
        current_version = current.version if current is not None else None
        super().__init__(
            f"snapshot changed: expected latest version {expected_version}, "
            f"found {current_version}; reload and retry"
        )


class InvalidSnapshot(MemoryStoreError, ValueError):
    """A snapshot's own content is unacceptable (e.g. an empty summary)."""


class InvalidCursor(MemoryStoreError, ValueError):
    """A cursor is not an integer, does not move past the latest snapshot, or lies beyond the log.

    ``field`` names the argument at fault (``after``, ``upto``, ...) when it is known.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class SessionNotFound(MemoryStoreError, LookupError):
    """No session with that key (or id) for that owner and namespace."""


class SessionExists(MemoryStoreError):
    """A session with that key already exists for that owner and namespace."""


class InvalidExport(MemoryStoreError, ValueError):
    """Data given to ``Memory.import_session`` is not a session export this version understands."""


class InvalidSession(MemoryStoreError, ValueError):
    """A session field (key, namespace, title, metadata) is unacceptable."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


# ---- summarization (compaction) --------------------------------------------------------------
class SummarizerError(MemoryStoreError):
    """The summarizer could not produce a summary (provider error, timeout, unusable answer).

    Nothing is saved when it is raised; the ``summarize_session`` task retries it with backoff.
    """


class EmptySummary(SummarizerError):
    """The summarizer answered with nothing usable: an error, never a summary."""
