"""The management commands (the demo, bad arguments of every ``memory_*`` command) and the
settings checks."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command, get_commands, load_command_class
from django.test import override_settings
from django.utils import timezone

from memory_app import Memory
from memory_app.checks import check_settings
from memory_app.management.base import MemoryCommand
from memory_app.models import Embedding, Message, Session, Snapshot
from tests.conftest import database_url


def test_memory_demo_is_idempotent(db, capsys):
    call_command("memory_demo")
    call_command("memory_demo")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin")
    [info] = Memory.sessions(owner=admin, namespace="travel-agent")
    assert info.message_count == 10 and info.has_snapshot
    window = Memory.get(info.id, owner=admin).window(max_tokens=2000)
    roles = [m["role"] for m in window]
    assert roles[0] == "system" and "tool" not in roles[:3]
    assert "Demo ready" in capsys.readouterr().out


def test_demo_admin_password_changes_an_existing_admin(db, monkeypatch, client):
    call_command("memory_demo")  # admin / admin
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "secret")
    call_command("memory_demo")
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password("secret") and not admin.check_password("admin")
    assert client.login(username="admin", password="secret")
    assert not client.login(username="admin", password="admin")
    monkeypatch.delenv("DEMO_ADMIN_PASSWORD")
    call_command("memory_demo")  # no password chosen: the one set before stays
    admin.refresh_from_db()
    assert admin.check_password("secret")


def test_memory_demo_creates_api_users_with_a_session_of_their_own(db, capsys):
    call_command("memory_demo", "--user", "alice")
    call_command("memory_demo", "--user", "alice", "--user", "bob")
    users = get_user_model().objects.filter(username__in=["alice", "bob"])
    assert sorted(u.username for u in users) == ["alice", "bob"]
    assert not any(u.has_usable_password() or u.is_staff for u in users)
    out = capsys.readouterr().out
    alice = get_user_model().objects.get(username="alice")
    [session] = Memory.sessions(owner=alice)
    assert session.message_count == 10 and session.has_snapshot
    # What is printed for alice is her session, which her API token can read.
    assert f"User alice created; their session {session.id} has 10 messages." in out
    assert f"User alice exists; their session {session.id}" in out
    admin = get_user_model().objects.get(username="admin")
    [admins] = Memory.sessions(owner=admin)
    assert admins.id != session.id and f"session {admins.id} has 10 messages" in out


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "'' is not a user name"),
        ("a b", "'a b' is not a user name: Enter a valid username"),
        ("x" * 300, "at most 150 characters"),
        ("bad\x00name", "is not a user name"),
    ],
)
def test_memory_demo_refuses_a_user_name_the_admin_could_not_edit(db, name, says):
    with pytest.raises(CommandError, match=says) as raised:
        call_command("memory_demo", "--user", name)
    assert "\n" not in str(raised.value)
    assert not get_user_model().objects.exclude(username="admin").exists()


def test_settings_check_reports_bad_values():
    assert check_settings() == []
    with override_settings(
        MEMORY_APP={"TOKEN_ENCODING": "no_such_encoding", "MAX_MESSAGE_BYTES": 0}
    ):
        ids = {e.id for e in check_settings()}
    assert ids == {"memory_app.E002", "memory_app.E003"}


# ---- every memory_* command: a bad argument is one clear line, and nothing changes -----------
MEMORY_COMMANDS = sorted(name for name, app in get_commands().items() if app == "memory_app")


def test_every_memory_command_is_a_memory_command():
    assert MEMORY_COMMANDS == [
        "memory_demo",
        "memory_embed",
        "memory_mcp",
        "memory_owner",
        "memory_prune",
        "memory_rotate_keys",
        "memory_summarize",
    ]
    for name in MEMORY_COMMANDS:
        assert isinstance(load_command_class("memory_app", name), MemoryCommand), name


def run(name: str, *args, **options) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


@pytest.fixture
def stored(db, user, settings):
    """Two sessions of alice's, one expired; the state every refused command must leave."""
    settings.MEMORY_APP = {
        **getattr(settings, "MEMORY_APP", {}),
        "EMBED_ON_APPEND": False,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    live = Memory.session("live", owner=user)
    live.add_many([{"role": "user", "content": f"note {n}"} for n in range(6)])
    old = Memory.session("old", owner=user, expires_at=timezone.now() - timezone.timedelta(days=1))
    old.add({"role": "user", "content": "gone soon"})
    Session.objects.filter(pk=live.id).update(
        updated_at=timezone.now() - timezone.timedelta(days=3)
    )
    return live, old


def state() -> tuple:
    return (
        sorted(Session.objects.values_list("key", "message_count", "metadata")),
        Message.objects.count(),
        Snapshot.objects.count(),
        Embedding.objects.count(),
    )


UNKNOWN = str(uuid.UUID(int=7))

BAD_ARGUMENTS = [
    # (command and arguments, what the one line must say)
    (("memory_embed", "--session", "not-a-uuid"), "--session: is a session id"),
    (("memory_embed", "--session", UNKNOWN), f"--session: no session {UNKNOWN}"),
    (("memory_embed", "--batch-size", "0"), "--batch-size: must be at least 1"),
    (("memory_embed", "--limit", "-1"), "--limit: must not be negative"),
    (("memory_embed", "--limit", "ten"), "--limit: must be a whole number"),
    (("memory_summarize", "--session", "not-a-uuid"), "--session: is a session id"),
    (("memory_summarize", "--session", UNKNOWN, "--sync"), f"--session: no session {UNKNOWN}"),
    (
        ("memory_summarize", "--over-threshold", "--threshold", "-1"),
        "--threshold: must not be negative",
    ),
    (
        ("memory_summarize", "--all", "--sync", "--keep-recent", "-1"),
        "--keep-recent: must not be negative",
    ),
    (("memory_summarize", "--all", "--keep-recent", str(2**40)), "--keep-recent: must be at most"),
    (("memory_prune", "--idle", "0d"), "--idle: must be longer than zero"),
    (("memory_prune", "--idle", "90"), "--idle: takes a duration like 30d"),
    (("memory_prune", "--idle", "99999999999999d"), "--idle: must be at most 36500d"),
    (("memory_prune", "--batch-size", "0"), "--batch-size: must be at least 1"),
    (("memory_rotate_keys", "--batch-size", "-5"), "--batch-size: must be at least 1"),
    (
        ("memory_owner", "export", "alice", "--out", "/nonexistent/x.json"),
        "--out: no folder '/nonexistent'",
    ),
    (
        ("memory_owner", "export", "alice", "--out", "-", "--batch-size", "0"),
        "--batch-size: must be at least 1",
    ),
    (("memory_owner", "erase", "nobody", "--yes"), "no user 'nobody'"),
    (("memory_mcp", "--token", "not-a-token"), "that API token is unknown"),
    (("memory_mcp", "--transport", "http", "--port", "0"), "--port: must be at least 1"),
    (("memory_mcp", "--transport", "http", "--port", "70000"), "--port: must be at most 65535"),
    (("memory_mcp", "--namespace", " ", "--token", "x"), "--namespace: must be a non-empty"),
]


@pytest.mark.parametrize(
    ("args", "says"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS]
)
def test_a_bad_argument_is_one_command_error_line_and_changes_nothing(stored, args, says):
    before = state()
    with pytest.raises(CommandError) as raised:
        run(*args)
    message = str(raised.value)
    assert says in message and "\n" not in message and "Traceback" not in message
    assert state() == before
    for memory in stored:  # every session still readable
        assert memory.refresh().window(max_tokens=1000) is not None and memory.export()


KEYWORD_OPTIONS = [
    ("memory_prune", {"idle": "0d"}, "--idle: must be longer than zero"),
    ("memory_prune", {"batch_size": 0}, "--batch-size: must be at least 1"),
    ("memory_embed", {"sessions": ["not-a-uuid"]}, "--session: is a session id"),
    ("memory_embed", {"limit": -1}, "--limit: must not be negative"),
    ("memory_summarize", {"all": True, "keep_recent": -1}, "--keep-recent: must not be negative"),
    ("memory_summarize", {"sessions": [UNKNOWN]}, f"--session: no session {UNKNOWN}"),
]


@pytest.mark.parametrize(
    ("name", "options", "says"), KEYWORD_OPTIONS, ids=[f"{n} {o}" for n, o, _ in KEYWORD_OPTIONS]
)
def test_keyword_options_of_call_command_are_refused_alike(stored, name, options, says):
    # call_command's keyword options bypass argparse; MemoryCommand applies the types itself.
    before = state()
    with pytest.raises(CommandError, match=says):
        run(name, **options)
    assert state() == before


def test_an_unwritable_out_file_is_refused_before_anything_is_read(stored, tmp_path):
    (tmp_path / "locked").mkdir(mode=0o500)
    cases = [
        (str(tmp_path / "missing" / "x.json"), "no folder"),
        (str(tmp_path), "is not a file name"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((str(tmp_path / "locked" / "x.json"), "is not writable"))
    for out, says in cases:
        with pytest.raises(CommandError, match=f"--out: .*{says}"):
            run("memory_owner", "export", "alice", "--out", out, "--no-progress")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["locked"]
    target = tmp_path / "alice.json"
    assert "Exported 2 session(s), 7 message(s)" in run(
        "memory_owner", "export", "alice", "--out", str(target), "--no-progress"
    )
    assert target.stat().st_size > 0


def test_good_arguments_still_work(stored):
    live, old = stored
    assert (
        run("memory_prune", "--idle", "2d", "--dry-run")
        == "2 session(s) would be deleted (dry run).\n"
    )
    assert (
        run("memory_prune", idle="5d", batch_size=1, no_progress=True) == "Deleted 1 session(s).\n"
    )
    assert list(Session.objects.values_list("key", flat=True)) == ["live"]
    assert run(
        "memory_summarize",
        "--session",
        str(live.id),
        "--sync",
        "--keep-recent",
        "2",
        "--no-progress",
    ).startswith("1 compacted")
    assert live.latest_snapshot().upto == 4


def test_without_tqdm_the_progress_is_a_counter_line(stored, monkeypatch, capsys):
    # tqdm is optional: a host without it gets a plain counter on standard error.
    monkeypatch.setitem(sys.modules, "tqdm", None)  # what ``import tqdm`` sees when not installed
    assert run("memory_prune", "--idle", "2d") == "Deleted 2 session(s).\n"
    assert capsys.readouterr().err.strip().endswith("2/2 session")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("memory_embed", "--session", "not-a-uuid"), "argument --session: is a session id"),
        (("memory_prune", "--idle", "0d"), "argument --idle: must be longer than zero"),
        (
            ("memory_summarize", "--all", "--keep-recent", "-1"),
            "argument --keep-recent: must not be negative",
        ),
        # A value that starts with a dash reaches its option's type (argparse alone said only
        # "expected one argument").
        (("memory_prune", "--idle", "-5d"), "argument --idle: must be longer than zero, not '-5d'"),
        (("memory_demo", "--user", "-a b"), "argument --user: '-a b' is not a user name"),
        (("memory_demo", "--user", ""), "argument --user: '' is not a user name"),
    ],
)
def test_from_the_shell_a_bad_argument_is_a_usage_error_not_a_traceback(db, args, says):
    manage = Path(django_settings.BASE_DIR) / "manage.py"
    env = {**os.environ, "DATABASE_URL": database_url()}
    done = subprocess.run(
        [sys.executable, str(manage), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=manage.parent,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[0].startswith("usage: manage.py")
