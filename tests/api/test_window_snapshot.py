"""sessions/{id}/window/ and sessions/{id}/snapshot/ (compare-and-swap over HTTP)."""

from __future__ import annotations

import pytest

from ..conftest import tool_turn
from .conftest import session_url

pytestmark = pytest.mark.django_db


def test_window_is_what_the_adapter_returns(api, session):
    session.add_many(
        [
            {"role": "user", "content": "Weather?"},
            *tool_turn("call_1"),
            {"role": "assistant", "content": "Sunny."},
        ]
    )
    for params in (
        {},
        {"max_messages": 3},
        {"max_tokens": 30},
        {"max_messages": 2, "model": "gpt-4o"},
    ):
        response = api.get(session_url(session.id, "window"), params)
        assert response.status_code == 200, response.data
        expected = session.window(**params)
        body = response.json()
        assert body["messages"] == expected.messages
        assert body["cursors"] == expected.cursors
        assert (body["tokens"], body["budget_tokens"]) == (expected.tokens, expected.budget_tokens)


def test_window_keeps_the_system_message_and_whole_tool_groups(api, session):
    session.add_many(
        [
            {"role": "user", "content": "Weather?"},
            *tool_turn("call_1"),
            {"role": "assistant", "content": "Sunny."},
        ]
    )
    body = api.get(session_url(session.id, "window"), {"max_messages": 2}).json()
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "system"
    assert "tool" not in roles  # the tool result would need its call, which does not fit
    assert body["cursors"][-1] == 7


def test_window_starts_with_the_snapshot_summary(api, session):
    session.save_snapshot(
        "They said hello.", upto=3, pinned=[{"role": "user", "content": "The task"}]
    )
    session.add({"role": "user", "content": "And now?"})
    body = api.get(session_url(session.id, "window")).json()
    assert body["snapshot_version"] == 1
    contents = [m["content"] for m in body["messages"]]
    assert any("They said hello." in c for c in contents)
    assert "The task" in contents and contents[-1] == "And now?"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_tokens": "-1"}, "max_tokens"),
        ({"max_tokens": "lots"}, "max_tokens"),
        ({"max_messages": "-3"}, "max_messages"),
        ({"max_messages": "2.5"}, "max_messages"),
        ({"model": "m\x00"}, "model"),
    ],
)
def test_bad_window_budgets_are_400(api, session, params, field):
    response = api.get(session_url(session.id, "window"), params)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_no_snapshot_yet_is_404(api, session):
    response = api.get(session_url(session.id, "snapshot"))
    assert response.status_code == 404
    assert response.json()["code"] == "no_snapshot"


def test_save_and_read_snapshots(api, session):
    first = api.post(
        session_url(session.id, "snapshot"),
        {
            "summary": "Greetings.",
            "upto": 2,
            "pinned": [{"role": "user", "content": "Task: be nice"}],
            "model": "gpt-4o-mini",
            "metadata": {"by": "test"},
        },
        format="json",
    )
    assert first.status_code == 201, first.data
    assert {k: first.json()[k] for k in ("version", "upto", "summary", "model", "metadata")} == {
        "version": 1,
        "upto": 2,
        "summary": "Greetings.",
        "model": "gpt-4o-mini",
        "metadata": {"by": "test"},
    }
    assert first.json()["pinned"] == [{"role": "user", "content": "Task: be nice"}]

    second = api.post(
        session_url(session.id, "snapshot"),
        {"summary": "All of it.", "upto": 3, "prev_version": 1},
        format="json",
    )
    assert second.status_code == 201
    latest = api.get(session_url(session.id, "snapshot")).json()
    assert (latest["version"], latest["upto"], latest["summary"]) == (2, 3, "All of it.")
    assert session.latest_snapshot().version == 2
    assert api.get(session_url(session.id)).json()["has_snapshot"] is True


def test_a_stale_prev_version_is_409_with_the_current_snapshot(api, session):
    url = session_url(session.id, "snapshot")
    assert api.post(url, {"summary": "v1", "upto": 1}, format="json").status_code == 201
    assert (
        api.post(url, {"summary": "v2", "upto": 2, "prev_version": 1}, format="json").status_code
        == 201
    )

    # A writer that read version 1 (and one that read nothing) lose the race: nothing is written.
    for stale in ({"prev_version": 1}, {}):
        response = api.post(url, {"summary": "late", "upto": 3, **stale}, format="json")
        assert response.status_code == 409
        body = response.json()
        assert body["code"] == "snapshot_conflict"
        assert body["expected_version"] == stale.get("prev_version")
        assert body["current_version"] == 2
        assert (body["current"]["version"], body["current"]["summary"]) == (2, "v2")
        assert "reload" in body["detail"]
    assert [s.version for s in session.snapshots()] == [1, 2]


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"summary": "s", "upto": 99}, "invalid_cursor", "upto"),  # beyond the log
        ({"summary": "s", "upto": 0}, "invalid_cursor", "upto"),  # does not move past nothing
        ({"summary": "s", "upto": -1}, "invalid", "upto"),
        ({"summary": "s", "upto": "three"}, "invalid", "upto"),
        ({"summary": "", "upto": 2}, "invalid", "summary"),
        ({"upto": 2}, "invalid", "summary"),
        ({"summary": "s", "upto": 2, "prev_version": "one"}, "invalid", "prev_version"),
        ({"summary": "s", "upto": 2, "version": 7}, "invalid", "version"),
        (
            {"summary": "s", "upto": 2, "pinned": [{"role": "nobody", "content": "x"}]},
            "invalid_snapshot",
            "pinned[0].role",
        ),
        ({"summary": "s", "upto": 2, "pinned": "the task"}, "invalid", "pinned"),
    ],
)
def test_bad_snapshots_are_400_and_nothing_is_saved(api, session, body, code, field):
    response = api.post(session_url(session.id, "snapshot"), body, format="json")
    assert response.status_code == 400, response.data
    assert (response.json()["code"], response.json()["field"]) == (code, field)
    assert session.latest_snapshot() is None


def test_upto_must_move_past_the_previous_snapshot(api, session):
    url = session_url(session.id, "snapshot")
    api.post(url, {"summary": "v1", "upto": 2}, format="json")
    response = api.post(url, {"summary": "v2", "upto": 2, "prev_version": 1}, format="json")
    assert response.status_code == 400
    assert (response.json()["code"], response.json()["field"]) == ("invalid_cursor", "upto")
