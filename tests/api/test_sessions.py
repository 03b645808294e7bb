"""sessions/ and sessions/{id}/: create, list, read, update, delete, and authentication."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from memory_app import Memory

from .conftest import session_url, sessions_url

pytestmark = pytest.mark.django_db


def test_create_returns_the_session(api, user):
    response = api.post(
        sessions_url(),
        {
            "key": "k1",
            "namespace": "bot",
            "title": "T",
            "metadata": {"lang": "en"},
            "expires_at": "2031-01-01T00:00:00Z",
        },
        format="json",
    )
    assert response.status_code == 201, response.data
    body = response.json()
    assert {
        k: body[k]
        for k in ("key", "namespace", "title", "metadata", "message_count", "has_snapshot")
    } == {
        "key": "k1",
        "namespace": "bot",
        "title": "T",
        "metadata": {"lang": "en"},
        "message_count": 0,
        "has_snapshot": False,
    }
    assert body["expires_at"].startswith("2031-01-01T00:00:00")
    stored = Memory.get(body["id"], owner=user)
    assert (stored.key, stored.namespace) == ("k1", "bot")


def test_create_uses_the_default_namespace(api):
    response = api.post(sessions_url(), {"key": "k1"}, format="json")
    assert response.status_code == 201
    assert response.json()["namespace"] == "default"


def test_a_taken_key_is_409_unless_get_or_create(api):
    first = api.post(sessions_url(), {"key": "k1", "namespace": "bot"}, format="json").json()
    again = api.post(sessions_url(), {"key": "k1", "namespace": "bot"}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "session_exists"

    found = api.post(
        sessions_url(),
        {"key": "k1", "namespace": "bot", "get_or_create": True, "title": "x"},
        format="json",
    )
    assert found.status_code == 200
    assert found.json()["id"] == first["id"]
    assert found.json()["title"] == ""  # the existing session is returned unchanged


def test_the_same_key_for_two_users_is_two_sessions(api, other_api):
    a = api.post(sessions_url(), {"key": "shared"}, format="json")
    b = other_api.post(sessions_url(), {"key": "shared"}, format="json")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "key"),
        ({"key": ""}, "key"),
        ({"key": "k" * 256}, "key"),
        ({"key": "k", "namespace": ""}, "namespace"),
        ({"key": "k", "metadata": ["not", "an", "object"]}, "metadata"),
        ({"key": "k", "metadata": {"x": "nul\x00"}}, "metadata"),
        ({"key": "k", "expires_at": "tomorrow"}, "expires_at"),
        ({"key": "k", "owner": 1}, "owner"),
        ({"key": "k", "message_count": 5}, "message_count"),
    ],
)
def test_bad_create_input_is_400_with_the_field(api, body, field):
    response = api.post(sessions_url(), body, format="json")
    assert response.status_code == 400, response.data
    assert response.json()["field"] == field
    assert field in response.json()["errors"]
    assert not Memory.sessions_queryset(None).exists()


def test_a_body_that_is_not_json_is_refused(api):
    assert (
        api.post(
            sessions_url(), "key=k", content_type="application/x-www-form-urlencoded"
        ).status_code
        == 415
    )
    response = api.post(sessions_url(), "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


def test_list_shows_counts_titles_and_snapshot_flags(api, user, session):
    session.save_snapshot("greeted", upto=3)
    Memory.create("chat-2", owner=user, namespace="other", title="Second")
    response = api.get(sessions_url())
    assert response.status_code == 200
    rows = {row["key"]: row for row in response.json()["results"]}
    assert set(rows) == {"chat-1", "chat-2"}
    assert (rows["chat-1"]["message_count"], rows["chat-1"]["has_snapshot"]) == (3, True)
    assert (rows["chat-2"]["message_count"], rows["chat-2"]["has_snapshot"]) == (0, False)
    assert rows["chat-1"]["title"] == "First chat"
    assert "updated_at" in rows["chat-1"]


def test_list_filters_by_namespace_and_searches_title_and_key(api, user):
    Memory.create("alpha", owner=user, namespace="a", title="Trip to Oslo")
    Memory.create("beta", owner=user, namespace="b", title="Groceries")
    Memory.create("oslo-notes", owner=user, namespace="b")

    def keys(**params):
        response = api.get(sessions_url(), params)
        assert response.status_code == 200
        return sorted(row["key"] for row in response.json()["results"])

    assert keys(namespace="b") == ["beta", "oslo-notes"]
    assert keys(search="oslo") == ["alpha", "oslo-notes"]
    assert keys(search="oslo", namespace="b") == ["oslo-notes"]
    assert keys(namespace="nothing-here") == []


def test_list_orders_and_pages_with_a_cursor(api, user):
    for i in range(5):
        Memory.create(f"s{i}", owner=user)  # created (and updated) in this order

    def walk(**params):
        seen, url = [], None
        response = api.get(sessions_url(), {"page_size": 2, **params})
        while True:
            assert response.status_code == 200
            body = response.json()
            seen += [row["key"] for row in body["results"]]
            url = body["next"]
            if not url:
                return seen
            response = api.get(url)

    assert walk() == ["s4", "s3", "s2", "s1", "s0"]
    assert walk(ordering="created_at") == ["s0", "s1", "s2", "s3", "s4"]


def test_a_malformed_list_cursor_is_400(api):
    response = api.get(sessions_url(), {"cursor": "not-a-cursor"})
    assert response.status_code == 400
    assert response.json()["field"] == "cursor"


def test_retrieve(api, session):
    response = api.get(session_url(session.id))
    assert response.status_code == 200
    assert response.json()["id"] == str(session.id)
    assert response.json()["message_count"] == 3


@pytest.mark.parametrize("bad_id", [str(uuid.uuid4()), "not-a-uuid", "1", "a.b"])
def test_an_unknown_or_malformed_id_is_404(api, bad_id):
    response = api.get(session_url(bad_id))
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_patch_changes_title_metadata_and_expiry(api, session):
    response = api.patch(
        session_url(session.id),
        {"title": "Renamed", "metadata": {"a": 1}, "expires_at": "2030-05-01T12:00:00Z"},
        format="json",
    )
    assert response.status_code == 200, response.data
    assert (response.json()["title"], response.json()["metadata"]) == ("Renamed", {"a": 1})
    session.refresh()
    assert session.title == "Renamed"
    assert session.meta == {"a": 1}
    assert session.session.expires_at.year == 2030

    cleared = api.patch(session_url(session.id), {"expires_at": None}, format="json")
    assert cleared.status_code == 200
    assert cleared.json()["expires_at"] is None
    assert cleared.json()["title"] == "Renamed"  # untouched fields stay


@pytest.mark.parametrize(
    "body",
    [
        {"id": str(uuid.uuid4())},
        {"message_count": 0},
        {"owner": 2},
        {"key": "other-key"},
        {"colour": "blue"},
        {"title": "ok", "token_count": 1},
    ],
)
def test_patch_refuses_read_only_and_unknown_fields(api, session, body):
    response = api.patch(session_url(session.id), body, format="json")
    assert response.status_code == 400
    field = next(k for k in body if k != "title")
    assert response.json()["field"] == field
    session.refresh()
    assert (session.key, session.title) == ("chat-1", "First chat")  # nothing half applied


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": "t" * 256}, "title"),
        ({"metadata": "x"}, "metadata"),
        ({"title": "nul\x00"}, "title"),
    ],
)
def test_patch_refuses_bad_values(api, session, body, field):
    response = api.patch(session_url(session.id), body, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_put_is_not_allowed(api, session):
    assert api.put(session_url(session.id), {"title": "x"}, format="json").status_code == 405


def test_delete(api, user, session):
    assert api.delete(session_url(session.id)).status_code == 204
    assert not Memory.sessions_queryset(user).exists()
    assert api.get(session_url(session.id)).status_code == 404


def test_anonymous_requests_are_refused(db, session):
    anonymous = APIClient()
    assert anonymous.get(sessions_url()).status_code in (401, 403)
    assert anonymous.get(session_url(session.id, "messages")).status_code in (401, 403)
    assert anonymous.post(sessions_url(), {"key": "x"}, format="json").status_code in (401, 403)


def test_a_bad_token_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    response = client.get(sessions_url())
    # 401 when the first authentication class is token-based, 403 when it is the session cookie
    # (DRF answers with the first class's WWW-Authenticate challenge, which sessions lack).
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "authentication_failed"


def test_session_authentication_works_with_csrf(db, user, session):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(session_url(session.id)).status_code == 200
    # A cookie-authenticated write without the CSRF token is refused.
    response = client.post(
        session_url(session.id, "messages"), {"role": "user", "content": "x"}, format="json"
    )
    assert response.status_code == 403
    assert session.count() == 3
