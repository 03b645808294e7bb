"""owner/export/ and owner/erase/: the requesting user's memory as a whole, and only theirs."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from memory_app import Memory

from ..api.conftest import api_client_for
from .test_owner_erase import everything_but, owner_rows

pytestmark = pytest.mark.django_db

EXPORT, ERASE = "memory_api:owner-export", "memory_api:owner-erase"


def test_export_streams_the_requesters_sessions_only(api, user, alice_memory, bob_memory):
    response = api.get(reverse(EXPORT))
    assert response.status_code == 200
    assert response.streaming and response["Content-Type"] == "application/json"
    assert "attachment" in response["Content-Disposition"]
    body = json.loads(b"".join(response.streaming_content))
    assert body["owner"] == {"id": user.pk}
    assert body["sessions"] == [m.export() for m in alice_memory]
    assert str(bob_memory[0].id) not in json.dumps(body)


def test_an_exported_session_imports_through_the_api(api, user, alice_memory):
    body = json.loads(b"".join(api.get(reverse(EXPORT)).streaming_content))
    response = api.post(
        reverse("memory_api:session-import") + "?namespace=restored",
        body["sessions"][0],
        format="json",
    )
    assert response.status_code == 201, response.data
    assert response.json()["message_count"] == 5


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        {"confirm": True},
        {"confirm": "yes"},
        {"confirm": "ERASE"},
        {"confirm": "erase", "owner": 2},
        ["erase"],
    ],
)
def test_erase_without_the_confirmation_erases_nothing(api, user, alice_memory, body):
    before = owner_rows(user.pk)
    response = api.post(reverse(ERASE), body, format="json")
    assert response.status_code == 400, response.data
    assert response.json()["code"] in ("invalid", "parse_error")
    assert owner_rows(user.pk) == before


def test_erase_removes_every_row_of_the_requester_and_nothing_else(
    api, user, other_user, alice_memory, bob_memory
):
    expected = owner_rows(user.pk)
    others = everything_but(user.pk)
    response = api.post(reverse(ERASE), {"confirm": "erase"}, format="json")
    assert response.status_code == 200, response.data
    assert response.json() == {
        "sessions": 2,
        "messages": 10,
        "snapshots": 2,
        "embeddings": expected.get("Embedding", 0),
        "checkpoints": 0,
        "checkpoint_blobs": 0,
        "checkpoint_writes": 0,
        "items": 0,
    }
    assert owner_rows(user.pk) == dict.fromkeys(expected, 0)
    assert everything_but(user.pk) == others
    assert api.get(reverse("memory_api:session-list")).json()["results"] == []


@override_settings(
    MEMORY_APP={"API_PERMISSION_CLASSES": ["memory_app.api.permissions.StaffSeesAllOwners"]}
)
def test_staff_erase_only_their_own_memory(make_user, user, alice_memory):
    staff = make_user("root", is_staff=True)
    Memory.create("staff-own", owner=staff)
    client = api_client_for(staff)
    assert client.post(reverse(ERASE), {"confirm": "erase"}, format="json").json()["sessions"] == 1
    body = json.loads(b"".join(client.get(reverse(EXPORT)).streaming_content))
    assert body["sessions"] == []
    assert owner_rows(user.pk)["Session"] == 2


def test_anonymous_requests_are_refused(db, alice_memory, user):
    anonymous = APIClient()
    assert anonymous.get(reverse(EXPORT)).status_code in (401, 403)
    assert anonymous.post(reverse(ERASE), {"confirm": "erase"}, format="json").status_code in (
        401,
        403,
    )
    assert owner_rows(user.pk)["Session"] == 2


def test_erase_is_not_a_get(api, user, alice_memory):
    assert api.get(reverse(ERASE)).status_code == 405
    assert api.post(reverse(EXPORT)).status_code == 405
    assert owner_rows(user.pk)["Session"] == 2
