"""The append-only message log: appends that hand out gapless cursors.

On PostgreSQL an append is one statement: a CTE bumps the session's counters (taking its row
lock, which serialises concurrent appenders) and inserts the messages with the cursors it
handed out. The same UPDATE moves ``expires_at`` forward for namespaces whose retention policy
slides (``store.policies``), so a sliding TTL costs no query of its own. Other databases take
the same lock with an UPDATE, then bulk-insert, in one
transaction. A failed statement rolls both back, so a cursor is never skipped.

The statement is one of the fixed ones in ``store.statements``; concurrent appends to one
session from threads of this process share one (``store.combiner``). Reads are in
``store.reads``, the marks the after-append job clears in ``store.pending``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import F
from django.utils import timezone

from ..conf import memory_settings
from ..encryption import decrypt_row, encrypt_row
from ..exceptions import IdempotencyConflict, SessionNotFound
from ..importance import mark_important
from ..models import Embedding, Message, Session
from ..signals import messages_appended
from ..tokens import count_message
from ..types import ANY_OWNER, NewMessage, StoredMessage
from ..validation import check_message, check_messages
from . import policies, sessions, snapshots
from .combiner import AppendCombiner
from .statements import execute, fetch, rows, statements, stored


def add(session_id, message: dict[str, Any], *, owner: Any = ANY_OWNER) -> StoredMessage:
    """Check one OpenAI-format message with the rule book and append it."""
    return append(session_id, [check_message(message)], owner=owner)[0]


def add_many(
    session_id, messages: Iterable[dict[str, Any]], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """Check a batch with the rule book and append it atomically: all or none."""
    return append(session_id, check_messages(messages), owner=owner)


def append(
    session_id, messages: list[NewMessage], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """Store ``messages`` at the end of the log, all or nothing; returns them with cursors.

    ``owner``: the session must be one ``owner`` may see (``sessions.scoped``), else
    ``SessionNotFound``; the append statement checks it itself, so an append by session id
    costs no query of its own to open the session. Messages whose idempotency key is already
    stored are not stored again: the original is returned in their place.
    """
    session_id = sessions.checked_id(session_id)
    messages = mark_important(messages)
    tokens = [count_message(m.as_openai()) for m in messages]
    if not any(m.idempotency_key for m in messages):
        return _insert(session_id, messages, tokens, owner=owner)
    if owner is not ANY_OWNER:
        sessions.get(session_id, owner=owner)  # stored keys are only looked up in one's own
    for _attempt in range(3):
        try:
            with transaction.atomic(using=router.db_for_write(Message)):
                return _append_idempotent(session_id, messages, tokens)
        except IntegrityError:
            # A concurrent retry with the same key won the race: look again.
            continue
    return _append_idempotent(session_id, messages, tokens)


def _append_idempotent(session_id, messages, tokens) -> list[StoredMessage]:
    keys = [m.idempotency_key for m in messages if m.idempotency_key]
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        found = fetch(connection, statements().by_keys, [session_id, keys])
    else:
        found = rows(Message.objects.filter(session_id=session_id, idempotency_key__in=keys))
    existing = {m.idempotency_key: m for m in found}
    for index, m in enumerate(messages):
        stored = existing.get(m.idempotency_key)
        if stored is not None and not _same(m, stored):
            raise IdempotencyConflict(
                "idempotency_key",
                f"{m.idempotency_key!r} is already stored with a different message "
                f"(cursor {stored.cursor}); a retry must send the same message",
                index=index if len(messages) > 1 else None,
            )
    fresh = [
        (m, t) for m, t in zip(messages, tokens, strict=True) if m.idempotency_key not in existing
    ]
    stored = iter(
        _insert(session_id, [m for m, _ in fresh], [t for _, t in fresh]) if fresh else []
    )
    return [
        existing[m.idempotency_key] if m.idempotency_key in existing else next(stored)
        for m in messages
    ]


_COMPARED = (
    "role",
    "content",
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
)


def _same(new: NewMessage, stored: StoredMessage) -> bool:
    """A retried message is the one stored under its key (``remember`` may have been set since by
    importance scoring, so it is not compared)."""
    return all((getattr(new, f) or None) == (getattr(stored, f) or None) for f in _COMPARED)


def _insert(
    session_id, messages: list[NewMessage], tokens: list[int], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    # Every write of messages starts here: encrypted here (a no-op without encryption); tokens
    # were counted on the plaintext.
    messages = [encrypt_row(m) for m in messages]
    alias = router.db_for_write(Message)
    connection = connections[alias]
    if connection.vendor == "postgresql":

        def write(messages: list[NewMessage], tokens: list[int]):
            return _insert_postgresql(connection, session_id, messages, tokens, owner)

        if memory_settings.COMBINE_APPENDS and not connection.in_atomic_block:
            # Only appends checked against the same owner scope share a statement.
            key = (alias, session_id, *sessions.owner_check(owner))
            tokens_since, written = _combiner.append(key, messages, tokens, write)
        else:
            tokens_since, written = write(messages, tokens)
    else:
        tokens_since, written = _insert_generic(session_id, messages, tokens, owner)
    # Callers get plaintext back, however the rows above were built (a no-op when they are).
    written = [decrypt_row(m) for m in written]
    announce(session_id, written, tokens_since)
    return written


_combiner = AppendCombiner()


def announce(
    session_id, messages: list[StoredMessage], tokens_since_snapshot: int, *, committed=False
) -> None:
    """Tell ``messages_appended``'s receivers that ``messages`` were stored (an append, an
    import), inside the writer's transaction: what follows new messages is scheduled there.
    ``committed``: they are committed already (a native async append, on its own connection)."""
    messages_appended.send(
        sender=Session,
        session_id=session_id,
        messages=messages,
        tokens_since_snapshot=tokens_since_snapshot,
        committed=committed,
    )


def stored_message(
    cursor: int, m: NewMessage, tokens: int, created_at, pk: int | None
) -> StoredMessage:
    """``m`` (plaintext) as stored at ``cursor``."""
    return stored(
        (
            cursor,
            m.role,
            m.content,
            m.content_parts,
            m.name,
            m.tool_calls,
            m.tool_call_id,
            m.extra,
            m.metadata,
            tokens,
            m.remember,
            m.idempotency_key,
            created_at,
            pk,
        )
    )


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)


def _insert_postgresql(
    connection, session_id, messages: list[NewMessage], tokens, owner=ANY_OWNER
) -> tuple[int, list[StoredMessage]]:
    sql, params = append_statement(session_id, messages, tokens, owner)
    return placed(session_id, messages, tokens, execute(connection, sql, params))


def append_statement(
    session_id, messages: list[NewMessage], tokens: list[int], owner=ANY_OWNER
) -> tuple[str, dict]:
    """The PostgreSQL append statement and its parameters for ``messages`` (already checked,
    counted and encrypted): what the sync and the native async append both send."""
    n = len(messages)
    any_owner, owner_pk = sessions.owner_check(owner)
    # The namespaces' sliding TTLs travel as one parameter: the statement text stays fixed.
    params = {
        "n": n,
        "tokens": sum(tokens),
        "now": timezone.now(),
        "session": session_id,
        "ttls": policies.sliding_ttls(),
        "any_owner": any_owner,
        "owner": owner_pk,
    }
    if n == 1:
        m = messages[0]
        params.update(
            role=m.role,
            content=m.content,
            content_parts=_json(m.content_parts),
            name=m.name,
            tool_calls=_json(m.tool_calls),
            tool_call_id=m.tool_call_id,
            extra=_json(m.extra),
            metadata=json.dumps(m.metadata) if m.metadata else "{}",
            remember=m.remember,
            idempotency_key=m.idempotency_key,
        )
        return statements().append_one, params
    params["rows"] = _batch_rows(messages, tokens)
    return statements().append_many, params


def placed(
    session_id, messages: list[NewMessage], tokens: list[int], result: list
) -> tuple[int, list[StoredMessage]]:
    """``(tokens since the snapshot, the stored messages)`` from the append statement's rows;
    no row: the session does not exist (or is not the owner's)."""
    if not result:
        raise SessionNotFound(f"session {session_id} does not exist")
    n = len(messages)
    # RETURNING order is not the insertion order: place each row by its cursor.
    first = min(r[0] for r in result)
    rows_at: list = [None] * n
    for seq, created, pk, _since in result:
        rows_at[seq - first] = (seq, created, pk)
    return result[0][3], [
        stored_message(seq, m, t, created, pk)
        for m, t, (seq, created, pk) in zip(messages, tokens, rows_at, strict=True)
    ]


_OPTIONAL = (
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
    "remember",
    "idempotency_key",
)


def _batch_rows(messages: list[NewMessage], tokens: list[int]) -> str:
    """The batch as JSON rows; empty fields are left out (the statement fills them in)."""
    rows = []
    for i, (m, t) in enumerate(zip(messages, tokens, strict=True)):
        row = {"i": i, "role": m.role, "content": m.content, "token_count": t}
        for key in _OPTIONAL:
            value = getattr(m, key)
            if value:
                row[key] = value
        rows.append(row)
    return json.dumps(rows, ensure_ascii=False)


def message_row(session_id, seq: int, m: NewMessage, tokens: int) -> Message:
    """The ORM row of a message as stored (``m`` already encrypted when encryption is on)."""
    return Message(
        session_id=session_id,
        seq=seq,
        role=m.role,
        content=m.content,
        content_parts=m.content_parts,
        name=m.name,
        tool_calls=m.tool_calls,
        tool_call_id=m.tool_call_id,
        extra=m.extra,
        metadata=m.metadata,
        token_count=tokens,
        remember=m.remember,
        idempotency_key=m.idempotency_key,
    )


def _insert_generic(session_id, messages, tokens, owner=ANY_OWNER) -> list[StoredMessage]:
    n = len(messages)
    now = timezone.now()
    changes = {}
    expiry = policies.sliding_expiry(now)  # a CASE on the namespace: still one UPDATE
    if expiry is not None:
        changes["expires_at"] = expiry
    with transaction.atomic(using=router.db_for_write(Message)):
        # The UPDATE takes the session's write lock first, so appenders queue here.
        updated = (
            sessions.scoped(owner)
            .filter(pk=session_id)
            .update(
                next_seq=F("next_seq") + n,
                message_count=F("message_count") + n,
                token_count=F("token_count") + sum(tokens),
                tokens_since_snapshot=F("tokens_since_snapshot") + sum(tokens),
                updated_at=now,
                **changes,
            )
        )
        if not updated:
            raise SessionNotFound(f"session {session_id} does not exist")
        next_seq, tokens_since = (
            Session.objects.filter(pk=session_id)
            .values_list("next_seq", "tokens_since_snapshot")
            .get()
        )
        first = next_seq - n
        Message.objects.bulk_create(
            message_row(session_id, first + i, m, t)
            for i, (m, t) in enumerate(zip(messages, tokens, strict=True))
        )
        return tokens_since, rows(
            Message.objects.filter(session_id=session_id, seq__gte=first).order_by("seq")
        )


def pop_last(session_id) -> StoredMessage | None:
    """Delete the newest message and return it; ``None`` when the log is empty.

    The popped cursor is never handed out again (``next_seq`` does not move back), so a reader
    holding it sees a gap, never a different message. Counters stay exact (row lock).
    """
    with transaction.atomic(using=router.db_for_write(Message)):
        session = sessions.lock(session_id)
        newest_rows = rows(Message.objects.filter(session=session).order_by("-seq")[:1])
        if not newest_rows:
            return None
        popped = newest_rows[0]
        # Taken back, not pruned: its vectors go too (they would outlive it otherwise).
        Embedding.objects.filter(session=session, cursor=popped.cursor).delete()
        Message.objects.filter(session=session, seq=popped.cursor).delete()
        since = session.tokens_since_snapshot
        if popped.cursor > snapshots.latest_upto(session.pk):
            since = max(0, since - popped.tokens)
        Session.objects.filter(pk=session.pk).update(
            message_count=session.message_count - 1,
            token_count=session.token_count - popped.tokens,
            tokens_since_snapshot=since,
            updated_at=timezone.now(),
        )
    return popped
