"""The log's hot statements, and the one function that runs them.

On PostgreSQL the hot paths (append, last N, the pages a window reads) skip the ORM's query
compiler: their SQL is written once from the models' metadata (``Statements``) and sent with
server-side parameter binding (one fixed statement text whatever the batch size, so the server
can reuse a prepared plan when the project enables ``prepare_threshold``), on one psycopg cursor
kept per connection (``execute``). Rows come back as ``StoredMessage`` values (``message``,
``from_row``).

``execute`` is the one place that reaches past Django's public database API, to do what
Django's cursor wrapper does without paying for a new wrapper and cursor per statement (about
40 us of a single append). It uses these ``BaseDatabaseWrapper`` members, all present and
unchanged from Django 5.2 to 6.1 (CI runs the suite on both): ``queries_logged``,
``execute_wrappers``, ``make_debug_cursor``, ``make_cursor``, ``validate_no_broken_transaction``,
``wrap_database_errors``, ``errors_occurred``, ``close_if_health_check_failed`` and
``ensure_connection``. Should one change, this module is what to mend.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import fields
from functools import cache

from ..encryption import decrypt_row
from ..models import Item, Message, Session, Snapshot
from ..types import StoredMessage
from . import policies

logger = logging.getLogger(__name__)

ROW_FIELDS = (
    "seq",
    "role",
    "content",
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
    "token_count",
    "remember",
    "idempotency_key",
    "created_at",
    "id",
)


def from_row(row: Sequence) -> StoredMessage:
    # Every read of a stored row ends here: decrypted here (a no-op without encryption).
    return decrypt_row(
        StoredMessage(
            cursor=row[0],
            role=row[1],
            content=row[2],
            content_parts=row[3],
            name=row[4],
            tool_calls=row[5],
            tool_call_id=row[6],
            extra=row[7],
            metadata=row[8] or {},
            tokens=row[9],
            remember=row[10],
            idempotency_key=row[11],
            created_at=row[12],
            id=row[13],
        )
    )


def rows(queryset) -> list[StoredMessage]:
    return [from_row(r) for r in queryset.values_list(*ROW_FIELDS)]


# Empty metadata (the common case) comes back as NULL: cheaper than decoding "{}" per row.
_COLUMNS = ", ".join("NULLIF(metadata, '{}'::jsonb)" if f == "metadata" else f for f in ROW_FIELDS)


class Statements:
    """The hot statements, written once from the models' table names."""

    def __init__(self) -> None:
        session = Session._meta.db_table
        message = Message._meta.db_table
        snapshot = Snapshot._meta.db_table
        item = Item._meta.db_table
        # Named parameters: each is sent once however often the statement uses it.
        bump = f"""
            WITH bumped AS (
                UPDATE {session}
                   SET next_seq = next_seq + %(n)s,
                       message_count = message_count + %(n)s,
                       token_count = token_count + %(tokens)s,
                       tokens_since_snapshot = tokens_since_snapshot + %(tokens)s,
                       updated_at = %(now)s,
                       {policies.SLIDING_EXPIRY_SQL}
                 WHERE id = %(session)s
                   AND (%(any_owner)s OR owner_id IS NOT DISTINCT FROM %(owner)s)
             RETURNING next_seq - %(n)s AS first_seq, tokens_since_snapshot
            )
            INSERT INTO {message} (session_id, seq, role, content, content_parts, name, tool_calls,
                                   tool_call_id, extra, metadata, token_count, remember,
                                   idempotency_key)
        """
        # A single message travels as plain parameters (the cheapest plan for one row) ...
        self.append_one = (
            bump
            + """
            SELECT %(session)s, bumped.first_seq, %(role)s, %(content)s, %(content_parts)s::jsonb,
                   %(name)s, %(tool_calls)s::jsonb, %(tool_call_id)s, %(extra)s::jsonb,
                   %(metadata)s::jsonb, %(tokens)s::integer, %(remember)s::boolean,
                   %(idempotency_key)s
              FROM bumped
            RETURNING seq, created_at, id, (SELECT tokens_since_snapshot FROM bumped)
        """
        )
        # ... a batch as one JSON array of rows: one parameter, encoded by the json module's C
        # encoder and decoded by the server, whatever the batch size (so the statement text,
        # and a prepared plan, never depend on it).
        self.append_many = (
            bump
            + """
            SELECT %(session)s, bumped.first_seq + v.i, v.role, v.content, v.content_parts,
                   COALESCE(v.name, ''), v.tool_calls, COALESCE(v.tool_call_id, ''), v.extra,
                   COALESCE(v.metadata, '{}'::jsonb), v.token_count, COALESCE(v.remember, false),
                   v.idempotency_key
              FROM bumped,
                   json_to_recordset(%(rows)s::json) AS v(
                       i integer, role text, content text, content_parts jsonb, name text,
                       tool_calls jsonb, tool_call_id text, extra jsonb, metadata jsonb,
                       token_count integer, remember boolean, idempotency_key text)
            RETURNING seq, created_at, id, (SELECT tokens_since_snapshot FROM bumped)
        """
        )
        self.newest = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND seq > %s AND seq < %s
             ORDER BY seq DESC LIMIT %s
        """
        self.by_keys = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND idempotency_key = ANY(%s::text[])
        """
        self.system = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND role = 'system' ORDER BY seq
        """
        # The session's counters (to size a window's first page), its latest snapshot and
        # its system messages (a partial index): one row per system message, at least one.
        # ... and the memory blocks its window carries (services.blocks: the owner's, then the
        # session's own, as [name, text, owner-level, updated_at] rows of one JSON array).
        self.window_head = f"""
            SELECT s.message_count, s.token_count,
                   snap.version, snap.upto, snap.summary, snap.pinned, snap.model, snap.metadata,
                   snap.created_at, blk.blocks, sys.*
              FROM {session} s
              LEFT JOIN LATERAL (
                SELECT * FROM {snapshot} WHERE session_id = s.id ORDER BY version DESC LIMIT 1
              ) snap ON true
              LEFT JOIN LATERAL (
                SELECT json_agg(json_build_array(i.key, i.value -> 'text',
                                                 i.namespace = 'blocks', i.updated_at)
                                ORDER BY i.namespace = 'blocks' DESC, i.key) AS blocks
                  FROM {item} i
                 WHERE i.kind = 'block' AND i.invalid_at IS NULL
                   AND (i.expires_at IS NULL OR i.expires_at > now())
                   AND ((s.owner_id IS NOT NULL AND i.owner_id = s.owner_id
                         AND i.namespace = 'blocks')
                        OR (i.owner_id IS NOT DISTINCT FROM s.owner_id
                            AND i.namespace = 'blocks.session.' || s.id::text))
              ) blk ON true
              LEFT JOIN LATERAL (
                SELECT {_COLUMNS} FROM {message}
                 WHERE session_id = s.id AND role = 'system' ORDER BY seq
              ) sys ON true
             WHERE s.id = %s
             ORDER BY sys.seq
        """


@cache
def statements() -> Statements:
    return Statements()


def execute(connection, sql: str, params) -> list:
    """Run one of the hot statements on ``connection`` and return its rows.

    Parameters are bound server-side and results read in binary (psycopg decodes jsonb,
    timestamps and numbers in C; Django's text-format timestamp loader is Python). Django's
    own cursors bind client-side unless the project opts in (``OPTIONS["server_side_binding"]``);
    these statements always bind server-side.

    The psycopg cursor is kept on the connection and reused: a fresh cursor starts with empty
    dumper and loader caches, and a Django cursor wrapper around it adds its own layers;
    together about 40 us of a single append (a quarter of its Python time). What the wrapper
    does still happens: the statement fails inside a broken transaction, database errors
    become Django's, and when queries are logged (``DEBUG``) or an ``execute_wrapper`` is
    installed the statement goes through the wrapper itself, so they see it like any other
    query.
    """
    raw = _statement_cursor(connection)
    if connection.queries_logged or connection.execute_wrappers:
        if connection.queries_logged:
            wrapped = connection.make_debug_cursor(raw)
        else:
            wrapped = connection.make_cursor(raw)
        wrapped.execute(sql, params)
        return wrapped.fetchall()
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        prepare = prepare_for(connection.alias, raw.connection)
        try:
            raw.execute(sql, params, prepare=prepare)
        except PREPARED_STATEMENT_ERRORS:
            # Inside a transaction it is aborted: the caller's to retry. In autocommit the
            # refused statement did nothing: run it again.
            if not refused(connection.alias, prepare) or connection.in_atomic_block:
                raise
            raw.execute(sql, params, prepare=False)
        return raw.fetchall()


# ---- prepared statements ------------------------------------------------------------------------
# The hot statements are prepared on the server (PREPARE_STATEMENTS), whatever Django's
# prepare_threshold (None by default, for poolers): parsing and planning the append's CTE on
# every call costs more than the rest of it. A transaction pooler that does not keep prepared
# statements per client (PgBouncer before 1.21) answers "does not exist" or "already exists":
# then this process stops preparing on that database, says so once, and runs the statement
# again unprepared when that is safe (outside a transaction).
_unprepared: set[str] = set()


def _prepared_statement_errors() -> tuple[type[BaseException], ...]:
    from psycopg import errors

    return (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)


PREPARED_STATEMENT_ERRORS = _prepared_statement_errors()


#: psycopg ignores ``prepare=True`` on a connection whose ``prepare_threshold`` is None
#: (Django's default): such a connection gets one no query reaches by count, so only the
#: statements that ask are prepared and Django's own queries never are.
ONLY_WHEN_ASKED = 2**62


def prepare_for(alias: str, psycopg_connection) -> bool | None:
    """``prepare=`` for a hot statement on ``psycopg_connection`` (sync or async): True (the
    connection made able to); None when off (its ``prepare_threshold``, Django's OPTIONS,
    decides); False where the database refused one."""
    from ..conf import memory_settings

    if alias in _unprepared:
        return False
    if not memory_settings.PREPARE_STATEMENTS:
        return None
    if psycopg_connection.prepare_threshold is None:
        psycopg_connection.prepare_threshold = ONLY_WHEN_ASKED
    return True


def refused(alias: str, prepare: bool | None) -> bool:
    """After one of ``PREPARED_STATEMENT_ERRORS``: whether it came of our asking to prepare;
    then this process stops preparing on ``alias`` (said once) and the statement may run
    again unprepared."""
    if not prepare:
        return False
    if alias not in _unprepared:
        _unprepared.add(alias)
        logger.warning(
            "database %r refused a prepared statement (a transaction pooler such as PgBouncer "
            "before 1.21?): memory_app stops preparing its statements there; set "
            "MEMORY_APP['PREPARE_STATEMENTS'] = False to skip the first try",
            alias,
        )
    return True


def _statement_cursor(connection):
    """The binary, server-side-binding psycopg cursor for ``connection``'s current database
    session: kept on the connection while it stays open, fresh when it was reopened."""
    from psycopg import Cursor
    from psycopg.pq import Format

    if (
        connection.errors_occurred
        and connection.connection is not None
        and not connection.in_atomic_block
    ):
        # An earlier statement failed (the server may have ended the connection): check the
        # connection as Django does between requests, so that a retry reconnects instead of
        # failing again on a dead socket.
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()
    connection.close_if_health_check_failed()
    connection.ensure_connection()  # also refuses to run in an event loop (async_unsafe)
    database = connection.connection
    # A connection shared between threads (a live test server's) gets one cursor per call:
    # another thread could run a statement between this one's execute and fetch.
    shared = connection.allow_thread_sharing
    kept = None if shared else getattr(connection, "_memory_app_cursor", None)
    if kept is not None and kept.connection is database and not kept.closed:
        return kept
    with connection.wrap_database_errors:
        raw = Cursor(database)
    raw.format = Format.BINARY
    if not shared:
        connection._memory_app_cursor = raw
    return raw


_STORED_FIELDS = tuple(f.name for f in fields(StoredMessage))
_ROW_NAMES = ("cursor", *ROW_FIELDS[1:9], "tokens", *ROW_FIELDS[10:])
# Reads build thousands of StoredMessages: filling the instance dict directly costs a fraction
# of the frozen dataclass __init__ (one object.__setattr__ per field). Only while the row
# holds exactly the dataclass's fields, in order, and instances have a __dict__.
_DIRECT = _STORED_FIELDS == _ROW_NAMES and not hasattr(StoredMessage, "__slots__")


def stored(values: Sequence) -> StoredMessage:
    """A StoredMessage from its field values in ``_ROW_NAMES`` order."""
    if _DIRECT:
        message = object.__new__(StoredMessage)
        message.__dict__.update(zip(_ROW_NAMES, values, strict=True))
        return message
    return StoredMessage(**dict(zip(_ROW_NAMES, values, strict=True)))


def message(row: Sequence) -> StoredMessage:
    """A StoredMessage from a binary row in ``ROW_FIELDS`` order (jsonb already decoded)."""
    if _DIRECT:
        message = object.__new__(StoredMessage)
        values = message.__dict__
        values.update(zip(_ROW_NAMES, row, strict=True))
        if values["metadata"] is None:
            values["metadata"] = {}
        return decrypt_row(message)
    values = dict(zip(_ROW_NAMES, row, strict=True))
    if values["metadata"] is None:
        values["metadata"] = {}
    return decrypt_row(StoredMessage(**values))


def fetch(connection, sql: str, params: Sequence) -> list[StoredMessage]:
    return [message(r) for r in execute(connection, sql, params)]
