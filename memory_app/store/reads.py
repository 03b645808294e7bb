"""Reading the log by cursor: the newest messages, pages newest-first, what a window is built
from, and plain ranges. The hot reads run fixed statements on PostgreSQL (``statements``);
elsewhere the ORM."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from django.db import connections, router
from django.db.models import Max, Min
from django.utils.dateparse import parse_datetime

from ..conf import memory_settings
from ..exceptions import InvalidCursor
from ..models import Message
from ..types import MemoryBlock, SnapshotView, StoredMessage
from ..validation import check_count, check_cursor
from .statements import execute, fetch, message, rows, statements

#: ``(latest snapshot, system messages, newest messages after it, memory blocks)``.
WindowSource = tuple[SnapshotView | None, list[StoredMessage], Iterator[StoredMessage], list]

_NO_END = 2**63 - 1


def newest(session_id, n: int) -> list[StoredMessage]:
    """The newest ``n`` messages, newest first (one backward index scan)."""
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        return fetch(connection, statements().newest, [session_id, 0, _NO_END, n])
    return rows(Message.objects.filter(session_id=session_id).order_by("-seq")[:n])


def system_messages(session_id) -> list[StoredMessage]:
    """Every stored system message of the session, in log order (a partial index serves it)."""
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        return fetch(connection, statements().system, [session_id])
    return rows(Message.objects.filter(session_id=session_id, role="system").order_by("seq"))


def newest_first(
    session_id,
    *,
    after: int,
    page_size: Callable[[int, int], int],
    before: int | None = None,
    fetched: int = 0,
    tokens: int = 0,
) -> Iterator[StoredMessage]:
    """Messages with cursor > ``after`` (and < ``before``), newest first, fetched a page at a
    time (index scans).

    ``page_size(rows_so_far, tokens_so_far)`` sizes each page, so a caller filling a token
    budget can ask for about as many rows as it still needs; ``fetched`` and ``tokens`` say
    what was read before (by ``window_source``).
    """
    connection = connections[router.db_for_read(Message)]
    while True:
        size = max(1, page_size(fetched, tokens))
        if connection.vendor == "postgresql":
            chunk = fetch(
                connection,
                statements().newest,
                [session_id, after, _NO_END if before is None else before, size],
            )
        else:
            qs = Message.objects.filter(session_id=session_id, seq__gt=after)
            if before is not None:
                qs = qs.filter(seq__lt=before)
            chunk = rows(qs.order_by("-seq")[:size])
        yield from chunk
        if len(chunk) < size:
            return
        before = chunk[-1].cursor
        fetched += len(chunk)
        tokens += sum(m.tokens for m in chunk)


def window_source(
    session_id,
    *,
    page_size: Callable[[int, int], int],
    max_tokens: int | None,
) -> WindowSource | None:
    """What a window is built from: ``(latest snapshot, system messages, newest messages after
    the snapshot, memory blocks)``, the newest messages lazy (pages after the first are read
    only if the window asks).

    Two short index reads on PostgreSQL. With a token budget (``max_tokens``, counted with
    the stored token counts) the first page holds what the session's average message size
    says will fit, with a margin for tool groups straddling the edge, so one page usually
    does. ``None`` on other databases (the caller reads the parts through the ORM).
    """
    connection = connections[router.db_for_read(Message)]
    if connection.vendor != "postgresql":
        return None
    hot = statements()
    head = execute(connection, hot.window_head, [session_id])
    if not head:  # the session is gone: nothing to send
        return None, [], iter(()), []
    (message_count, token_count, version, upto, summary, pinned, model, metadata, created) = head[
        0
    ][:9]
    blocks = [
        MemoryBlock(
            name=name,
            text=str(text or ""),
            scope="owner" if owner_level else "session",
            limit=int(memory_settings.MEMORY_BLOCK_MAX_CHARS),
            updated_at=parse_datetime(updated) if isinstance(updated, str) else updated,
        )
        for name, text, owner_level, updated in head[0][9] or ()
    ]
    system = [message(row[10:]) for row in head if row[10] is not None]
    snapshot = None
    if version is not None:
        snapshot = SnapshotView(
            version=version,
            upto=upto,
            summary=summary,
            pinned=list(pinned or []),
            model=model,
            metadata=dict(metadata or {}),
            created_at=created,
        )
    first = max(1, page_size(0, 0))
    if max_tokens is not None and message_count and token_count:
        first = min(
            memory_settings.WINDOW_PAGE_SIZE * 10,
            16 + math.ceil(1.1 * max_tokens * message_count / token_count),
        )
    after = snapshot.upto if snapshot else 0
    first_page = execute(connection, hot.newest, [session_id, after, _NO_END, first])

    def newest() -> Iterator[StoredMessage]:
        # Built as the window walks back: rows past its budget never become objects.
        for row in first_page:
            yield message(row)
        if len(first_page) == first:
            yield from newest_first(
                session_id,
                after=after,
                page_size=page_size,
                before=first_page[-1][0],
                fetched=first,
                tokens=sum(row[9] for row in first_page),
            )

    return snapshot, system, newest(), blocks


def messages(
    session_id, after: int | None = None, limit: int | None = None, *, before: int | None = None
) -> list[StoredMessage]:
    """Messages with cursor greater than ``after`` (and less than ``before``), oldest first.

    ``limit`` keeps the first ones after ``after``; when only ``before`` is given it keeps the
    last ones before ``before`` instead, which is how a reader pages backwards.
    """
    qs = Message.objects.filter(session_id=session_id)
    if after is not None:
        qs = qs.filter(seq__gt=check_cursor(after, "after"))
    if before is not None:
        qs = qs.filter(seq__lt=check_cursor(before, "before"))
    backwards = before is not None and after is None and limit is not None
    qs = qs.order_by("-seq" if backwards else "seq")
    if limit is not None:
        qs = qs[: check_count(limit, "limit")]
    found = rows(qs)
    if backwards:
        found.reverse()
    return found


def last(session_id, n: int) -> list[StoredMessage]:
    """The newest ``n`` messages, oldest first."""
    found = newest(session_id, check_count(n, "n"))
    found.reverse()
    return found


def get(session_id, cursor: int) -> StoredMessage:
    cursor = check_cursor(cursor)
    found = rows(Message.objects.filter(session_id=session_id, seq=cursor))
    if not found:
        raise InvalidCursor(f"no message at cursor {cursor}", field="cursor")
    return found[0]


def cursor_range(session_id) -> tuple[int, int] | None:
    """``(first, last)`` cursor of the messages stored now, or ``None`` when there are none."""
    bounds = Message.objects.filter(session_id=session_id).aggregate(
        first=Min("seq"), last=Max("seq")
    )
    if bounds["first"] is None:
        return None
    return bounds["first"], bounds["last"]
