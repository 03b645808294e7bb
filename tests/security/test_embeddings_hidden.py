"""No endpoint returns embeddings, and the schema promises none (tests/api checks the session
GET routes; this covers every route, writes included, and the owner export)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from memory_app.models import Embedding

from ..api.conftest import import_url, session_url, sessions_url

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

# Vector components no real payload contains, so finding one means a vector leaked.
MARKERS = [0.1234567, 0.7654321, 0.3456789]


def leaks(text: str) -> list[str]:
    # Seven decimals survive float32 storage, and no timestamp (six decimals) holds them.
    found = [str(m) for m in MARKERS if str(m) in text]
    found += re.findall(r'"(?:embeddings?|vectors?|dimensions)"\s*:', text, re.I)
    return found


def test_no_response_of_any_route_carries_embeddings(api, user, alice_memory):
    memory = alice_memory[0]
    Embedding.objects.filter(owner=user).update(vector=MARKERS, model="leak-model")
    assert Embedding.objects.filter(owner=user, model="leak-model").count() == 10
    exported = memory.export()
    responses = {
        "list": api.get(sessions_url()),
        "detail": api.get(session_url(memory.id)),
        "messages": api.get(session_url(memory.id, "messages")),
        "window": api.get(session_url(memory.id, "window")),
        "snapshot": api.get(session_url(memory.id, "snapshot")),
        "export": api.get(session_url(memory.id, "export")),
        "append": api.post(
            session_url(memory.id, "messages"), {"role": "user", "content": "x"}, format="json"
        ),
        "patch": api.patch(session_url(memory.id), {"title": "t"}, format="json"),
        "save snapshot": api.post(
            session_url(memory.id, "snapshot"),
            {"summary": "s", "upto": 3, "prev_version": 1},
            format="json",
        ),
        "import": api.post(import_url() + "?key=copy", exported, format="json"),
        "owner export": api.get(reverse("memory_api:owner-export")),
        "clear": api.post(session_url(alice_memory[1].id, "clear")),
        "search": api.get(
            session_url(memory.id, "search"), {"q": "weather Oslo", "scope": "owner"}
        ),
        "context": api.get(
            session_url(memory.id, "context"), {"q": "weather Oslo", "max_tokens": 40}
        ),
        "summarize": api.post(
            session_url(memory.id, "summarize"), {"keep_recent": 1}, format="json"
        ),
    }
    assert responses["search"].json()["results"], "the search must find something to check"
    for name, response in responses.items():
        assert response.status_code in (200, 201, 202), (name, response.status_code)
        text = (
            b"".join(response.streaming_content) if response.streaming else response.content
        ).decode()
        assert leaks(text) == [], name
        assert "leak-model" not in text, name


def test_the_schema_describes_no_embedding(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    properties: dict[str, list] = {}

    def walk(node):
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                properties.setdefault(name, []).append(prop)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert "cursor" in properties and "metadata" in properties  # the walk sees the components
    suspicious = {
        name: props
        for name, props in properties.items()
        if re.search(r"embed|vector|dimension", name, re.I)
    }
    # The one such name is owner/erase/'s count of deleted embeddings: a number, not a vector.
    assert suspicious == {"embeddings": [{"type": "integer", "description": "Embeddings deleted."}]}
