"""The REST API of learned memory: an owner's facts (with history and as-of reads), memory
blocks (the owner's and a session's), recall filters and context with facts; never another
owner's, and bad input a 400 naming the field."""

from __future__ import annotations

import json

from django.utils import timezone

from memory_app import Memory

MEMORIES = "/api/memory/memories/"
BLOCKS = "/api/memory/blocks/"


def test_facts_are_kept_read_updated_and_forgotten(api, other_api, user):
    made = api.post(MEMORIES, {"text": "Ada keeps bees", "topic": "hobby"}, format="json")
    assert made.status_code == 201, made.content
    key = made.json()["key"]
    again = api.post(MEMORIES, {"text": "Ada keeps bees"}, format="json")
    assert again.status_code == 200 and again.json()["confirmations"] == 1
    before = timezone.now().isoformat()
    changed = api.patch(f"{MEMORIES}{key}/", {"text": "Ada keeps bees and hens"}, format="json")
    assert changed.status_code == 200 and changed.json()["key"] == key
    listed = api.get(MEMORIES).json()
    assert [m["text"] for m in listed] == ["Ada keeps bees and hens"]
    assert listed[0]["topic"] == "hobby" and listed[0]["invalid_at"] is None
    then = api.get(MEMORIES, {"as_of": before}).json()
    assert [m["text"] for m in then] == ["Ada keeps bees"]
    ranked = api.get(MEMORIES, {"q": "hens"}).json()
    assert ranked[0]["text"] == "Ada keeps bees and hens" and ranked[0]["score"] is not None
    history = api.get(f"{MEMORIES}{key}/").json()
    assert [(m["text"], m["ended"]) for m in history] == [
        ("Ada keeps bees", "superseded"),
        ("Ada keeps bees and hens", ""),
    ]
    # Bob sees none of it, and cannot touch it.
    assert other_api.get(MEMORIES).json() == []
    assert other_api.get(f"{MEMORIES}{key}/").status_code == 404
    assert other_api.patch(f"{MEMORIES}{key}/", {"text": "x"}, format="json").status_code == 404
    assert other_api.delete(f"{MEMORIES}{key}/").status_code == 404
    assert api.delete(f"{MEMORIES}{key}/").status_code == 204
    assert api.get(MEMORIES).json() == []
    assert api.delete(f"{MEMORIES}{key}/").status_code == 404


def test_bad_input_is_a_400_naming_the_field(api):
    for body, field in [
        ({"text": ""}, "text"),
        ({"text": "x", "importance": 2}, "importance"),
        ({"text": "x", "owner": 5}, "owner"),
        ({"text": 5}, "text"),
    ]:
        response = api.post(MEMORIES, body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert response.json()["field"] == field, response.json()
    bad_filters = api.get(MEMORIES, {"filters": '{"metadata": {"a": {"$near": 1}}}'})
    assert bad_filters.status_code == 400 and bad_filters.json()["field"] == "filters.metadata"
    not_json = api.get(MEMORIES, {"filters": "{nope"})
    assert not_json.status_code == 400 and not_json.json()["field"] == "filters"
    assert api.get(MEMORIES, {"as_of": "yesterday"}).json()["field"] == "as_of"
    assert api.get(MEMORIES).json() == []


def test_blocks_of_the_owner_and_of_a_session(api, other_api, session):
    written = api.put(f"{BLOCKS}profile/", {"text": "Ada, vegetarian"}, format="json")
    assert written.status_code == 200 and written.json()["scope"] == "owner"
    api.put(f"{BLOCKS}profile/", {"text": "lives in Oslo", "append": True}, format="json")
    url = f"/api/memory/sessions/{session.id}/blocks/"
    own = api.put(f"{url}task/", {"text": "plan the trip"}, format="json")
    assert own.status_code == 200 and own.json()["scope"] == "session"
    blocks = api.get(url).json()
    assert [(b["name"], b["scope"], b["text"]) for b in blocks] == [
        ("profile", "owner", "Ada, vegetarian\nlives in Oslo"),
        ("task", "session", "plan the trip"),
    ]
    window = api.get(f"/api/memory/sessions/{session.id}/window/").json()
    assert any("memory_blocks" in str(m.get("content")) for m in window["messages"])
    assert other_api.get(url).status_code == 404
    assert other_api.get(BLOCKS).json() == []
    too_long = api.put(f"{BLOCKS}profile/", {"text": "x" * 5000}, format="json")
    assert too_long.status_code == 400 and too_long.json()["field"] == "text"
    assert api.delete(f"{url}task/").status_code == 204
    assert api.delete(f"{url}task/").status_code == 404
    assert api.delete(f"{BLOCKS}profile/").status_code == 204
    assert api.get(BLOCKS).json() == []


def test_search_filters_and_context_with_facts(
    api, session, user, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        session.add_many(
            [
                {"role": "user", "content": "the red invoice is paid", "metadata": {"n": 1}},
                {"role": "user", "content": "the blue invoice is late", "metadata": {"n": 2}},
            ]
        )
    base = f"/api/memory/sessions/{session.id}/"
    filters = json.dumps({"metadata": {"n": {"$gt": 1}}})
    hits = api.get(f"{base}search/", {"q": "invoice", "filters": filters}).json()["results"]
    assert [h["message"]["content"] for h in hits] == ["the blue invoice is late"]
    bad = api.get(f"{base}search/", {"q": "invoice", "filters": '{"colour": 1}'})
    assert bad.status_code == 400 and bad.json()["field"] == "filters"
    Memory.learned(user).remember("Ada pays invoices on Fridays")
    context = api.get(f"{base}context/", {"q": "when are invoices paid", "memories": 2}).json()
    assert [m["text"] for m in context["memories"]] == ["Ada pays invoices on Fridays"]
    assert any("remembered fact" in str(m.get("content")) for m in context["messages"])
