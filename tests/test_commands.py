"""The demo command and the settings checks."""

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings

from memory_app import Memory
from memory_app.checks import check_settings


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


def test_memory_demo_creates_api_users(db, capsys):
    call_command("memory_demo", "--user", "alice")
    call_command("memory_demo", "--user", "alice", "--user", "bob")
    users = get_user_model().objects.filter(username__in=["alice", "bob"])
    assert sorted(u.username for u in users) == ["alice", "bob"]
    assert not any(u.has_usable_password() or u.is_staff for u in users)
    out = capsys.readouterr().out
    assert "User alice created." in out and "User alice exists." in out


def test_settings_check_reports_bad_values():
    assert check_settings() == []
    with override_settings(MEMORY_APP={"TOKEN_ENCODING": "no_such_encoding", "MAX_MESSAGE_BYTES": 0}):
        ids = {e.id for e in check_settings()}
    assert ids == {"memory_app.E002", "memory_app.E003"}
