"""sessions/{id}/export/, sessions/import/ and sessions/{id}/clear/."""

from __future__ import annotations

import pytest

from memory_app import Memory

from ..conftest import tool_turn
from .conftest import import_url, session_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def rich_session(session):
    session.add_many(
        [
            {
                "role": "user",
                "content": "Weather?",
                "idempotency_key": "q1",
                "metadata": {"lang": "en"},
            },
            *tool_turn("call_1"),
        ]
    )
    session.add(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Sunny"}],
            "extra": {"refusal": "no"},
        }
    )
    session.save_snapshot(
        "Greeted, asked about weather.", upto=4, pinned=[{"role": "user", "content": "Task"}]
    )
    session.set_meta("topic", "weather")
    return session


def test_export_is_the_adapters_export(api, rich_session):
    response = api.get(session_url(rich_session.id, "export"))
    assert response.status_code == 200
    body = response.json()
    assert body["format"] == "memory_app.session" and body["version"] == 1
    assert [m["cursor"] for m in body["messages"]] == [1, 2, 3, 4, 5, 6, 7]
    assert body["snapshots"][0]["upto"] == 4
    assert body["session"]["metadata"] == {"topic": "weather"}


def test_export_then_import_round_trips(api, user, rich_session):
    exported = api.get(session_url(rich_session.id, "export")).json()
    response = api.post(f"{import_url()}?key=copy", exported, format="json")
    assert response.status_code == 201, response.data
    body = response.json()
    assert (body["key"], body["namespace"], body["message_count"], body["has_snapshot"]) == (
        "copy",
        "bot",
        7,
        True,
    )

    copy = Memory.get(body["id"], owner=user)
    assert [m.as_dict() | {"created_at": None} for m in copy.messages()] == [
        m.as_dict() | {"created_at": None} for m in rich_session.messages()
    ]
    assert copy.snapshots()[0].summary == "Greeted, asked about weather."
    again = api.get(session_url(copy.id, "export")).json()
    assert again["messages"] == exported["messages"]
    assert again["snapshots"] == exported["snapshots"]


def test_importing_under_a_taken_key_is_409(api, rich_session):
    exported = api.get(session_url(rich_session.id, "export")).json()
    response = api.post(import_url(), exported, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "session_exists"


def test_import_into_another_namespace(api, rich_session):
    exported = api.get(session_url(rich_session.id, "export")).json()
    response = api.post(f"{import_url()}?namespace=archive", exported, format="json")
    assert response.status_code == 201
    assert (response.json()["key"], response.json()["namespace"]) == ("chat-1", "archive")


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda d: d.update(format="something-else"), "invalid_export"),
        (lambda d: d.update(version=99), "invalid_export"),
        (lambda d: d["messages"][0].update(cursor=-4), "invalid_export"),
        (lambda d: d["messages"].reverse(), "invalid_export"),
        (lambda d: d["messages"][1].update(role="wizard"), "invalid_export"),
        (lambda d: d["snapshots"][0].update(upto=999), "invalid_export"),
        (lambda d: d["session"].update(key=""), "invalid_export"),  # field session.key
        (lambda d: d["session"].update(expires_at="soon"), "invalid_export"),
    ],
)
def test_a_bad_export_is_400_and_creates_nothing(api, user, rich_session, change, code):
    exported = api.get(session_url(rich_session.id, "export")).json()
    change(exported)
    response = api.post(f"{import_url()}?namespace=restored", exported, format="json")
    assert response.status_code == 400, response.data
    assert response.json()["code"] == code
    assert not Memory.sessions_queryset(user, namespace="restored").exists()


def test_import_of_something_that_is_not_an_export(api):
    for body in ([1, 2, 3], "text", {"hello": "world"}):
        response = api.post(import_url(), body, format="json")
        assert response.status_code == 400
        assert response.json()["code"] == "invalid_export"


def test_clear_empties_the_session_and_cursors_go_on(api, rich_session):
    response = api.post(session_url(rich_session.id, "clear"))
    assert response.status_code == 200
    body = response.json()
    assert (body["message_count"], body["has_snapshot"], body["metadata"]) == (0, False, {})
    assert rich_session.messages() == []
    assert api.get(session_url(rich_session.id, "snapshot")).status_code == 404

    after = api.post(
        session_url(rich_session.id, "messages"),
        {"role": "user", "content": "again"},
        format="json",
    )
    assert after.json()["messages"][0]["cursor"] == 8  # never reused
