"""Every path under the API prefix answers JSON: unknown routes and a missing trailing slash are
404s in the API's error shape, never Django's HTML pages or a 500 (APPEND_SLASH on a POST)."""

from __future__ import annotations

import pytest

from memory_app.models import Session

from .conftest import session_url, sessions_url
from .test_schema import OPERATIONS

pytestmark = pytest.mark.django_db

PREFIX = "/api/memory/"


def assert_json_404(response, *, says: str) -> dict:
    assert response.status_code == 404, response.content[:300]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"detail", "code"} and body["code"] == "not_found"
    assert says in body["detail"]
    return body


@pytest.mark.parametrize("debug", [False, True])
def test_a_post_without_the_trailing_slash_is_a_json_404_naming_the_right_url(api, settings, debug):
    # Under DEBUG, CommonMiddleware raises RuntimeError for this (it cannot redirect a POST body).
    settings.DEBUG = debug
    before = Session.objects.count()
    response = api.post(sessions_url().rstrip("/"), {"key": "k"}, format="json")
    assert_json_404(response, says=f"end with a slash; use http://testserver{sessions_url()}.")
    assert Session.objects.count() == before


def test_a_get_without_the_trailing_slash_names_the_url_with_its_query(api, session):
    url = session_url(session.id, "window")
    response = api.get(url.rstrip("/") + "?max_tokens=100")
    assert_json_404(response, says=f"use http://testserver{url}?max_tokens=100.")
    assert api.get(url + "?max_tokens=100").status_code == 200  # the right URL works


@pytest.mark.parametrize(
    "path", ["nope/", "nope", "sessions/x/y/z/", "owner/", "owner/export/more/", ""]
)
@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete", "options"])
def test_unknown_routes_are_json_404s_for_every_method(api, path, method):
    response = getattr(api, method)(PREFIX + path, {}, format="json")
    assert_json_404(response, says="No endpoint at")


def test_unknown_routes_are_404_without_credentials_too(client):
    assert_json_404(client.get(PREFIX + "nope/"), says="No endpoint at /api/memory/nope/.")
    assert_json_404(client.post(PREFIX + "sessions"), says="end with a slash")
    # A real route still asks for credentials.
    assert client.get(sessions_url()).status_code in (401, 403)


def test_real_routes_are_untouched(api, session):
    assert api.get(sessions_url()).status_code == 200
    missing = api.get(session_url("00000000-0000-0000-0000-000000000000"))
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert api.put(sessions_url(), {}, format="json").status_code == 405


def test_the_catch_all_is_not_in_the_schema(client):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    assert {p for p in paths if p.startswith(PREFIX)} == {path for path, _ in OPERATIONS}
