"""The memory_owner management command: export to a file, erase with --yes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from memory_app import Memory

from .test_owner_erase import owner_rows

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("memory_owner", *args, "--no-progress", stdout=out)
    return out.getvalue()


def test_export_writes_the_owners_sessions_to_a_file(tmp_path, user, alice_memory, bob_memory):
    target = tmp_path / "alice.json"
    said = run("export", "alice", "--out", str(target), "--batch-size", "2")
    assert "2 session(s), 10 message(s)" in said
    exported = json.loads(target.read_text())
    assert exported["sessions"] == [m.export() for m in alice_memory]
    assert [p.name for p in tmp_path.iterdir()] == ["alice.json"]  # no temporary file left


def test_export_by_primary_key_and_to_stdout(user, alice_memory):
    exported = json.loads(run("export", str(user.pk), "--id", "--out", "-"))
    assert len(exported["sessions"]) == 2


def test_erase_without_yes_only_reports_and_succeeds(user, alice_memory):
    said = run("erase", "alice")
    assert "Would erase 2 session(s) and 10 message(s) of alice; pass --yes" in said
    assert owner_rows(user.pk)["Message"] == 10


@pytest.mark.django_db(transaction=True)  # the command runs in another process
def test_erase_without_yes_exits_0_from_the_shell(user, alice_memory):
    from tests.conftest import database_url

    env = {**os.environ, "DATABASE_URL": database_url()}
    done = subprocess.run(
        [sys.executable, "manage.py", "memory_owner", "erase", "alice"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "Would erase 2 session(s)" in done.stdout
    assert owner_rows(user.pk)["Message"] == 10


def test_erase_with_yes_leaves_nothing_of_the_owner(user, other_user, alice_memory, bob_memory):
    said = run("erase", "alice", "--yes")
    assert "Erased 2 session(s), 10 message(s), 2 snapshot(s)" in said
    assert set(owner_rows(user.pk).values()) == {0}
    assert owner_rows(other_user.pk)["Message"] == 10


@pytest.mark.parametrize(
    "args",
    [
        ("erase", "nobody", "--yes"),
        ("export", "nobody", "--out", "-"),
        ("erase", "x", "--id", "--yes"),
    ],
)
def test_an_unknown_user_is_an_error(db, args):
    with pytest.raises(CommandError, match="no user"):
        run(*args)


def test_a_bad_batch_size_is_an_error(user):
    with pytest.raises(CommandError):
        run("export", "alice", "--out", "-", "--batch-size", "0")
    assert Memory.export_owner(user)["sessions"] == []
