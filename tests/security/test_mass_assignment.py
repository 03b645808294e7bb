"""Fields a client may not set (owner, ids, counters, cursors, token counts) are refused with a
400 naming them, or ignored where a format carries them (an import); never applied.

Refusals already covered elsewhere (tests/api): create with `owner` or `message_count`; PATCH
with `id`, `message_count`, `owner`, `key`, `token_count`; a snapshot with `version`.
"""

from __future__ import annotations

import uuid

import pytest

from memory_app import Memory
from memory_app.memory import MAX_IMPORTED_CURSOR
from memory_app.models import Message, Session
from memory_app.tokens import count_message

from ..api.conftest import import_url, session_url, sessions_url

pytestmark = pytest.mark.django_db

SERVER_FIELDS = [
    "id",
    "owner",
    "owner_id",
    "next_seq",
    "token_count",
    "tokens_since_snapshot",
    "created_at",
    "updated_at",
    "has_snapshot",
]


@pytest.mark.parametrize("field", SERVER_FIELDS)
def test_create_refuses_server_fields(api, other_user, field):
    value = {
        "owner": other_user.pk,
        "owner_id": other_user.pk,
        "id": str(uuid.uuid4()),
        "created_at": "2000-01-01T00:00:00Z",
        "updated_at": "2000-01-01T00:00:00Z",
        "has_snapshot": True,
    }.get(field, 10**6)
    response = api.post(sessions_url(), {"key": "k", field: value}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert not Session.objects.exists()


@pytest.mark.parametrize("field", SERVER_FIELDS)
def test_patch_refuses_server_fields(api, other_user, session, field):
    before = session.export()
    response = api.patch(
        session_url(session.id), {"title": "x", field: other_user.pk}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert session.export() == before


MESSAGE_FIELDS = [
    "cursor",
    "seq",
    "id",
    "tokens",
    "token_count",
    "session",
    "session_id",
    "owner",
    "created_at",
    "embedding",
    "vector",
]


@pytest.mark.parametrize("field", MESSAGE_FIELDS)
def test_an_appended_message_cannot_set_store_fields(api, other_user, session, field):
    url = session_url(session.id, "messages")
    one = api.post(url, {"role": "user", "content": "hi", field: 1}, format="json")
    assert one.status_code == 400
    assert (one.json()["field"], one.json()["code"]) == (field, "invalid_message")
    batch = api.post(
        url,
        {
            "messages": [
                {"role": "user", "content": "ok"},
                {"role": "user", "content": "hi", field: 1},
            ]
        },
        format="json",
    )
    assert batch.status_code == 400
    assert (batch.json()["field"], batch.json()["index"]) == (field, 1)
    assert session.count() == 3


@pytest.mark.parametrize(
    "field",
    [
        "cursor",
        "tokens",
        "created_at",
        "metadata",
        "remember",
        "idempotency_key",
        "role",
        "content",
    ],
)
def test_extra_cannot_smuggle_store_fields(api, session, field):
    response = api.post(
        session_url(session.id, "messages"),
        {"role": "user", "content": "hi", "extra": {field: 1}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["field"] == "extra"
    assert field in response.json()["detail"]
    assert session.count() == 3


def test_the_store_sets_cursor_and_tokens_itself(api, session):
    stored = api.post(
        session_url(session.id, "messages"), {"role": "user", "content": "Next?"}, format="json"
    ).json()["messages"][0]
    assert stored["cursor"] == 4
    assert stored["tokens"] == count_message({"role": "user", "content": "Next?"})


@pytest.mark.parametrize("field", ["session", "session_id", "id", "created_at", "owner"])
def test_a_snapshot_cannot_set_store_fields(api, other_user, session, field):
    response = api.post(
        session_url(session.id, "snapshot"),
        {"summary": "s", "upto": 2, field: other_user.pk},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert session.latest_snapshot() is None


def test_an_import_belongs_to_the_importer_whatever_it_claims(api, user, other_user, session):
    bobs = Memory.create("bobs", owner=other_user)
    bobs.add({"role": "user", "content": "Bob's"})
    exported = session.export()
    # Counters are not export fields: claiming them is refused, naming the field, and stores
    # nothing.
    claims = {**exported, "session": {**exported["session"], "message_count": 10**6}}
    response = api.post(import_url() + "?key=claimed", claims, format="json")
    assert (response.status_code, response.json()["field"]) == (400, "session.message_count")
    # The export's own id and owner are ignored: the import is the importer's, with a new id.
    exported["session"].update(id=str(bobs.id), owner=other_user.pk)
    response = api.post(import_url() + "?key=claimed", exported, format="json")
    assert response.status_code == 201, response.data
    body = response.json()
    assert body["id"] != str(bobs.id)
    assert (body["message_count"], body["token_count"]) == (3, session.info().token_count)
    copy = Session.objects.get(pk=body["id"])
    assert (copy.owner_id, copy.tokens_since_snapshot) == (user.pk, session.info().token_count)
    # Bob's session is untouched and still only his.
    assert [m.content for m in bobs.messages()] == ["Bob's"]
    assert Session.objects.get(pk=bobs.id).owner_id == other_user.pk


def test_an_import_recounts_token_counts(api, user, session):
    exported = session.export()
    for message in exported["messages"]:
        message["tokens"] = 2**31 - 1  # would trigger summarization at once, run after run
    response = api.post(import_url() + "?key=inflated", exported, format="json")
    assert response.status_code == 201, response.data
    copy = Memory.get(response.json()["id"], owner=user)
    assert [m.tokens for m in copy.messages()] == [m.tokens for m in session.messages()]
    assert copy.info().token_count == session.info().token_count


@pytest.mark.parametrize("where", ["next_seq", "cursor", "upto"])
def test_an_import_cannot_set_cursors_near_overflow(api, user, session, where):
    session.save_snapshot("s", upto=2)
    exported = session.export()
    huge = MAX_IMPORTED_CURSOR + 1
    if where == "next_seq":
        exported["session"]["next_seq"] = huge
    elif where == "cursor":
        exported["messages"][-1]["cursor"] = huge
        exported["session"]["next_seq"] = huge + 1
    else:
        exported["snapshots"][0]["upto"] = huge
    response = api.post(import_url() + "?key=huge", exported, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_export"
    assert not Session.objects.filter(key="huge").exists()


def test_the_largest_importable_cursor_still_takes_appends(api, user, session):
    exported = session.export()
    exported["session"]["next_seq"] = MAX_IMPORTED_CURSOR
    response = api.post(import_url() + "?key=far", exported, format="json")
    assert response.status_code == 201, response.data
    appended = api.post(
        session_url(response.json()["id"], "messages"),
        {"messages": [{"role": "user", "content": str(i)} for i in range(1000)]},
        format="json",
    )
    assert appended.status_code == 201
    assert appended.json()["messages"][-1]["cursor"] == MAX_IMPORTED_CURSOR + 999


def test_list_ordering_by_a_private_field_is_ignored(api, user, other_user, session):
    Memory.create("bobs", owner=other_user)
    for ordering in ("owner__password", "-owner__username", "next_seq", "owner"):
        response = api.get(sessions_url(), {"ordering": ordering})
        assert response.status_code == 200
        assert [r["key"] for r in response.json()["results"]] == ["chat-1"]


def test_messages_of_another_session_cannot_be_reached_by_cursor(api, other_user, session):
    bobs = Memory.create("bobs", owner=other_user)
    bobs.add_many([{"role": "user", "content": f"secret {i}"} for i in range(5)])
    body = api.get(session_url(session.id, "messages"), {"after": 0, "limit": 1000}).json()
    assert all("secret" not in (m["content"] or "") for m in body["messages"])
    assert Message.objects.filter(session_id=bobs.id).count() == 5
