"""The OpenAPI schema documents every endpoint and its errors; Swagger UI is served locally."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command

from memory_app import Memory
from memory_app.models import Embedding

from .conftest import session_url

pytestmark = pytest.mark.django_db

OPERATIONS = {
    ("/api/memory/sessions/", "get"),
    ("/api/memory/sessions/", "post"),
    ("/api/memory/sessions/import/", "post"),
    ("/api/memory/sessions/{id}/", "get"),
    ("/api/memory/sessions/{id}/", "patch"),
    ("/api/memory/sessions/{id}/", "delete"),
    ("/api/memory/sessions/{id}/messages/", "get"),
    ("/api/memory/sessions/{id}/messages/", "post"),
    ("/api/memory/sessions/{id}/window/", "get"),
    ("/api/memory/sessions/{id}/snapshot/", "get"),
    ("/api/memory/sessions/{id}/snapshot/", "post"),
    ("/api/memory/sessions/{id}/export/", "get"),
    ("/api/memory/sessions/{id}/clear/", "post"),
    # recall and summarization
    ("/api/memory/sessions/{id}/search/", "get"),
    ("/api/memory/sessions/{id}/summarize/", "post"),
    ("/api/memory/sessions/{id}/context/", "get"),
    # per owner (memory_app.owners)
    ("/api/memory/owner/export/", "get"),
    ("/api/memory/owner/erase/", "post"),
    # learned memory: facts and memory blocks
    ("/api/memory/memories/", "get"),
    ("/api/memory/memories/", "post"),
    ("/api/memory/memories/{key}/", "get"),
    ("/api/memory/memories/{key}/", "patch"),
    ("/api/memory/memories/{key}/", "delete"),
    ("/api/memory/blocks/", "get"),
    ("/api/memory/blocks/{name}/", "put"),
    ("/api/memory/blocks/{name}/", "delete"),
    ("/api/memory/sessions/{id}/blocks/", "get"),
    ("/api/memory/sessions/{id}/blocks/{name}/", "put"),
    ("/api/memory/sessions/{id}/blocks/{name}/", "delete"),
}


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


def test_every_endpoint_and_its_errors_are_documented(schema):
    documented = {
        (path, method)
        for path, item in schema["paths"].items()
        for method in item
        if path.startswith("/api/memory/")
    }
    assert documented == OPERATIONS
    for path, method in OPERATIONS:
        operation = schema["paths"][path][method]
        codes = set(operation["responses"])
        assert {"401", "403", "429"} <= codes, (path, method)
        if "{id}" in path:
            assert "404" in codes, (path, method)
            [id_param] = [p for p in operation["parameters"] if p["name"] == "id"]
            assert (id_param["in"], id_param["schema"]) == (
                "path",
                {"type": "string", "format": "uuid"},
            )
        if method in ("post", "patch", "put") and not path.endswith("/clear/"):
            assert "400" in codes, (path, method)
        assert operation.get("summary"), (path, method)
    snapshot_conflict = schema["paths"]["/api/memory/sessions/{id}/snapshot/"]["post"]["responses"][
        "409"
    ]
    assert snapshot_conflict["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SnapshotConflict"
    )
    assert {"cookieAuth", "tokenAuth"} <= set(schema["components"]["securitySchemes"])


def test_schema_is_valid_and_warning_free(tmp_path):
    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )


def test_swagger_ui_is_served_without_a_cdn(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "swagger-ui" in page and "/api/schema/" in page
    assert "cdn.jsdelivr" not in page and "unpkg" not in page
    assert "drf_spectacular_sidecar" in page
    # Every script and stylesheet the page names is a static file of this installation.
    static_refs = re.findall(r'(?:src|href)="/static/([^"]+)"', page)
    assert any(ref.endswith("swagger-ui-bundle.js") for ref in static_refs)
    for ref in static_refs:
        assert finders.find(ref), ref


@pytest.mark.postgres
def test_no_response_carries_embeddings(api, session):
    message = session.messages()[1]
    Embedding.objects.create(
        message_id=message.id,
        session_id=session.id,
        owner=session.session.owner,
        cursor=message.cursor,
        role=message.role,
        model="test-model",
        dimensions=3,
        # Seven decimals: no timestamp (six) or token count can hold one by chance.
        vector=[0.1234567, 0.7654321, 0.3456789],
    )
    session.save_snapshot("s", upto=1)
    urls = [session_url(session.id, a) for a in ("messages", "window", "snapshot", "export")]
    for url in [*urls, session_url(session.id)]:
        body = api.get(url).content.decode()
        assert not re.search(r"0\.1234567|0\.7654321|0\.3456789", body), body
        assert "test-model" not in body and "vector" not in body
        assert "embedding" not in body.lower()
    assert Memory.get(session.id, owner=session.session.owner).count() == 3


def _messages_parameters(schema) -> dict:
    operation = schema["paths"]["/api/memory/sessions/{id}/messages/"]["get"]
    return {p["name"]: p["schema"] for p in operation["parameters"]}


def test_the_schema_tells_the_truth_about_reading_messages(schema):
    from memory_app.conf import memory_settings

    params = _messages_parameters(schema)
    assert {"after", "before", "limit"} <= set(params)
    assert params["limit"]["maximum"] == memory_settings.API_MESSAGES_MAX_PAGE_SIZE
    get = schema["paths"]["/api/memory/sessions/{id}/messages/"]["get"]["responses"]["200"]
    post = schema["paths"]["/api/memory/sessions/{id}/messages/"]["post"]["responses"]["201"]
    components = schema["components"]["schemas"]

    def fields(response):
        ref = response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        return set(components[ref]["properties"])

    assert fields(get) == fields(post) == {"messages", "next"}


def test_the_limit_maximum_in_the_schema_follows_the_setting(client, settings):
    settings.MEMORY_APP = {"API_MESSAGES_MAX_PAGE_SIZE": 250}
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert _messages_parameters(schema)["limit"]["maximum"] == 250
