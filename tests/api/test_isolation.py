"""Another owner's session is a 404 on every route (never a 403 that confirms it exists);
staff see everyone's only through the documented permission class."""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings

from memory_app import Memory
from memory_app.api.views import SessionViewSet

from .conftest import api_client_for, import_url, session_url, sessions_url

pytestmark = pytest.mark.django_db

# Every route under sessions/{id}/: (method, action or None for the detail route, JSON body).
SESSION_ROUTES = [
    ("get", None, None),
    ("patch", None, {"title": "taken over"}),
    ("delete", None, None),
    ("get", "messages", None),
    ("post", "messages", {"role": "user", "content": "injected"}),
    ("get", "window", None),
    ("get", "snapshot", None),
    ("post", "snapshot", {"summary": "overwritten", "upto": 1}),
    ("get", "export", None),
    ("post", "clear", None),
    ("get", "search", {"q": "Hello", "scope": "owner"}),
    ("post", "summarize", {"keep_recent": 0}),
    ("get", "context", {"q": "Hello"}),
    ("get", "blocks", None),
    ("put", "block", {"text": "taken over"}),
    ("delete", "block", None),
]


def _call(client, method, action, body, session_id):
    return getattr(client, method)(session_url(session_id, action), body, format="json")


def test_the_route_list_covers_every_session_action():
    # A new @action on the session route must be added to SESSION_ROUTES (and so to this test).
    detail_actions = {a.url_name for a in SessionViewSet.get_extra_actions() if a.detail}
    assert detail_actions == {action for _, action, _ in SESSION_ROUTES if action}
    methods = {a.url_name: set(a.mapping) for a in SessionViewSet.get_extra_actions() if a.detail}
    for name, allowed in methods.items():
        assert allowed == {m for m, action, _ in SESSION_ROUTES if action == name}


@pytest.mark.parametrize(("method", "action", "body"), SESSION_ROUTES)
def test_another_owners_session_is_not_found(api, other_api, session, method, action, body):
    session.save_snapshot("Alice's summary", upto=2)
    before = session.export()

    response = _call(other_api, method, action, body, session.id)
    assert response.status_code == 404, response.data
    assert response.json()["code"] == "not_found"

    # The answer is the same as for an id that does not exist at all: no existence oracle.
    missing_id = uuid.uuid4()
    missing = _call(other_api, method, action, body, missing_id)
    assert missing.status_code == 404
    assert missing.json() == {
        **response.json(),
        "detail": response.json()["detail"].replace(str(session.id), str(missing_id)),
    }

    # Alice's session is untouched and still hers.
    assert session.export() == before
    assert _call(api, "get", None, None, session.id).status_code == 200


def test_lists_show_only_ones_own_sessions(api, other_api, session, other_user):
    Memory.create("bobs", owner=other_user, namespace="bot")
    assert [r["key"] for r in api.get(sessions_url()).json()["results"]] == ["chat-1"]
    assert [r["key"] for r in other_api.get(sessions_url()).json()["results"]] == ["bobs"]
    assert other_api.get(sessions_url(), {"search": "chat"}).json()["results"] == []
    assert other_api.get(sessions_url(), {"namespace": "bot"}).json()["results"][0]["key"] == "bobs"


def test_an_import_belongs_to_the_importer(api, other_api, user, other_user, session):
    exported = api.get(session_url(session.id, "export")).json()
    response = other_api.post(import_url(), exported, format="json")
    assert response.status_code == 201
    copy_id = response.json()["id"]
    assert Memory.get(copy_id, owner=other_user).count() == 3
    assert api.get(session_url(copy_id)).status_code == 404
    assert session.count() == 3


def test_ownerless_sessions_are_not_anybodys(api, db):
    service = Memory.create("service-session", owner=None)
    assert api.get(session_url(service.id)).status_code == 404
    assert api.get(sessions_url()).json()["results"] == []


@pytest.fixture
def staff_api(make_user):
    return api_client_for(make_user("root", is_staff=True))


@pytest.mark.parametrize(("method", "action", "body"), SESSION_ROUTES)
def test_staff_see_nothing_of_others_by_default(staff_api, session, method, action, body):
    assert _call(staff_api, method, action, body, session.id).status_code == 404


@override_settings(
    MEMORY_APP={"API_PERMISSION_CLASSES": ["memory_app.api.permissions.StaffSeesAllOwners"]}
)
@pytest.mark.parametrize(("method", "action", "body"), SESSION_ROUTES)
def test_staff_see_all_owners_with_the_staff_permission_class(
    staff_api, other_api, session, method, action, body
):
    if (method, action) == ("get", "snapshot"):
        session.save_snapshot("something to read", upto=1)
    if (method, action) == ("delete", "block"):
        session.learned.write_block("profile", "something to delete", scope="session")
    response = _call(staff_api, method, action, body, session.id)
    assert response.status_code in (200, 201, 202, 204), response.data
    # Everyone else is still scoped to their own sessions.
    assert _call(other_api, "get", None, None, session.id).status_code == 404


@override_settings(
    MEMORY_APP={"API_PERMISSION_CLASSES": ["memory_app.api.permissions.StaffSeesAllOwners"]}
)
def test_staff_list_everyone_and_create_their_own(staff_api, other_api, session, other_user):
    Memory.create("bobs", owner=other_user)
    assert sorted(r["key"] for r in staff_api.get(sessions_url()).json()["results"]) == [
        "bobs",
        "chat-1",
    ]
    assert [r["key"] for r in other_api.get(sessions_url()).json()["results"]] == ["bobs"]
    created = staff_api.post(sessions_url(), {"key": "staff-own"}, format="json").json()
    assert (
        Memory.get(created["id"], owner=other_user.__class__.objects.get(username="root")).key
        == "staff-own"
    )
