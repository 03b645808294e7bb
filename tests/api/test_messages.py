"""sessions/{id}/messages/: append (one or a batch, atomically), read by cursor, bad input."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import override_settings

from ..conftest import tool_turn
from .conftest import session_url

pytestmark = pytest.mark.django_db


def test_append_one_message_returns_it_with_its_cursor(api, session):
    response = api.post(
        session_url(session.id, "messages"), {"role": "user", "content": "Next?"}, format="json"
    )
    assert response.status_code == 201, response.data
    [stored] = response.json()["messages"]
    assert (stored["cursor"], stored["role"], stored["content"]) == (4, "user", "Next?")
    assert stored["tokens"] > 0
    assert "created_at" in stored
    assert [m.content for m in session.messages(after=3)] == ["Next?"]


def test_append_a_batch_with_a_tool_turn(api, session):
    batch = [
        {"role": "user", "content": "Weather in Oslo?"},
        *tool_turn("call_9"),
        {"role": "assistant", "content": "Sunny.", "extra": {"refusal": "none"}},
    ]
    response = api.post(session_url(session.id, "messages"), {"messages": batch}, format="json")
    assert response.status_code == 201, response.data
    stored = response.json()["messages"]
    assert [m["cursor"] for m in stored] == [4, 5, 6, 7]
    assert stored[1]["tool_calls"][0]["id"] == "call_9" and stored[1]["content"] is None
    assert stored[2]["tool_call_id"] == "call_9"
    assert stored[3]["refusal"] == "none"  # extra OpenAI fields come back as they went in
    assert session.count() == 7


def test_a_retried_append_with_an_idempotency_key_is_stored_once(api, session):
    message = {"role": "user", "content": "once", "idempotency_key": "req-1"}
    first = api.post(session_url(session.id, "messages"), message, format="json").json()[
        "messages"
    ][0]
    again = api.post(session_url(session.id, "messages"), message, format="json")
    assert again.status_code == 201
    assert again.json()["messages"][0]["cursor"] == first["cursor"]
    assert session.count() == 4


BAD_MESSAGES = [
    pytest.param({"role": "wizard", "content": "hi"}, "role", id="wrong role"),
    pytest.param({"content": "hi"}, "role", id="no role"),
    pytest.param({"role": "user"}, "content", id="missing content"),
    pytest.param({"role": "user", "content": None}, "content", id="null content"),
    pytest.param({"role": "user", "content": 42}, "content", id="content not text"),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": "weather()"},
        "tool_calls",
        id="tool_calls not a list",
    ),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]},
        "tool_calls",
        id="tool call without id",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],
        },
        "tool_calls",
        id="tool call without function name",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
        "tool_calls",
        id="arguments not a JSON string",
    ),
    pytest.param(
        {
            "role": "user",
            "content": "x",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
        },
        "tool_calls",
        id="tool calls on a user",
    ),
    pytest.param({"role": "tool", "content": "sunny"}, "tool_call_id", id="tool without call id"),
    pytest.param({"role": "user", "content": "hi", "colour": "red"}, "colour", id="unknown field"),
    pytest.param({"role": "user", "content": "nul \x00 inside"}, "content", id="NUL character"),
    pytest.param(
        {"role": "user", "content": "hi", "metadata": "x"}, "metadata", id="metadata not an object"
    ),
    pytest.param(["role", "user"], "message", id="not an object"),
]


@pytest.mark.parametrize(("message", "field"), BAD_MESSAGES)
def test_a_bad_message_is_400_with_the_field_and_nothing_is_stored(api, session, message, field):
    response = api.post(session_url(session.id, "messages"), message, format="json")
    assert response.status_code == 400, response.data
    body = response.json()
    assert (body["code"], body["field"]) == ("invalid_message", field)
    assert body["errors"][field]
    assert "index" not in body
    assert session.count() == 3


@pytest.mark.parametrize(("message", "field"), BAD_MESSAGES[:6])
def test_one_bad_message_in_a_batch_stores_none(api, session, message, field):
    batch = [
        {"role": "user", "content": "fine"},
        {"role": "assistant", "content": "also fine"},
        message,
    ]
    response = api.post(session_url(session.id, "messages"), {"messages": batch}, format="json")
    assert response.status_code == 400, response.data
    body = response.json()
    assert (body["field"], body["index"]) == (field, 2)
    assert session.count() == 3
    assert session.info().message_count == 3
    # The next good append gets the next cursor: no gap was left by the refused batch.
    ok = api.post(
        session_url(session.id, "messages"), {"role": "user", "content": "later"}, format="json"
    )
    assert ok.json()["messages"][0]["cursor"] == 4


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
    ],
)
def test_bad_batches_are_400(api, session, body, field):
    response = api.post(session_url(session.id, "messages"), body, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert session.count() == 3


@override_settings(MEMORY_APP={"MAX_MESSAGE_BYTES": 1000})
def test_an_oversized_message_is_refused_not_truncated(api, session):
    response = api.post(
        session_url(session.id, "messages"), {"role": "user", "content": "x" * 1001}, format="json"
    )
    assert response.status_code == 400
    assert (response.json()["code"], response.json()["field"]) == ("message_too_large", "content")
    assert session.count() == 3


@override_settings(MEMORY_APP={"MAX_BATCH_SIZE": 2})
def test_a_batch_over_the_limit_is_refused(api, session):
    batch = [{"role": "user", "content": str(i)} for i in range(3)]
    response = api.post(session_url(session.id, "messages"), {"messages": batch}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "messages"
    assert session.count() == 3


def test_read_messages_after_a_cursor_with_a_limit(api, session):
    response = api.get(session_url(session.id, "messages"), {"after": 1, "limit": 1})
    assert response.status_code == 200
    body = response.json()
    assert [(m["cursor"], m["content"]) for m in body["messages"]] == [(2, "Hello")]
    assert "after=2" in body["next"] and "limit=1" in body["next"]
    last = api.get(body["next"]).json()
    assert [m["cursor"] for m in last["messages"]] == [3]
    assert last["next"] is None


def test_get_and_post_answer_one_shape(api, session):
    appended = api.post(
        session_url(session.id, "messages"), {"role": "user", "content": "More"}, format="json"
    ).json()
    page = api.get(session_url(session.id, "messages"), {"after": 3}).json()
    assert set(appended) == set(page) == {"messages", "next"}
    assert appended["next"] is None
    assert appended["messages"] == page["messages"]


def test_read_backwards_with_before(api, session):
    session.add_many([{"role": "user", "content": f"m{i}"} for i in range(4, 8)])  # cursors 4..7
    body = api.get(session_url(session.id, "messages"), {"before": 7, "limit": 2}).json()
    assert [m["cursor"] for m in body["messages"]] == [5, 6]  # oldest first
    assert "before=5" in body["next"] and "limit=2" in body["next"] and "after" not in body["next"]
    seen = [m["cursor"] for m in body["messages"]]
    while body["next"]:
        body = api.get(body["next"]).json()
        seen = [m["cursor"] for m in body["messages"]] + seen
    assert seen == [1, 2, 3, 4, 5, 6]


def test_after_and_before_bound_a_range(api, session):
    session.add_many([{"role": "user", "content": f"m{i}"} for i in range(4, 8)])  # cursors 4..7
    body = api.get(
        session_url(session.id, "messages"), {"after": 1, "before": 6, "limit": 2}
    ).json()
    assert [m["cursor"] for m in body["messages"]] == [2, 3]
    assert "after=3" in body["next"] and "before=6" in body["next"]
    last = api.get(body["next"]).json()
    assert [m["cursor"] for m in last["messages"]] == [4, 5]
    assert last["next"] is None


def test_next_carries_only_the_parameters_the_server_used(api, session):
    body = api.get(
        session_url(session.id, "messages") + "?limit=1&page=9&cursor=abc&bogus=1"
    ).json()
    query = parse_qs(urlsplit(body["next"]).query)
    assert query == {"after": ["1"], "limit": ["1"]}


@override_settings(MEMORY_APP={"API_MESSAGES_MAX_PAGE_SIZE": 5})
def test_limit_maximum_follows_the_setting(api, session):
    assert api.get(session_url(session.id, "messages"), {"limit": 5}).status_code == 200
    response = api.get(session_url(session.id, "messages"), {"limit": 6})
    assert response.status_code == 400 and response.json()["field"] == "limit"


def test_read_all_messages_by_default(api, session):
    body = api.get(session_url(session.id, "messages")).json()
    assert [m["content"] for m in body["messages"]] == ["You are terse.", "Hello", "Hi."]
    assert body["next"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"after": "abc"}, "after"),
        ({"after": "-1"}, "after"),
        ({"after": "1.5"}, "after"),
        ({"after": "0.0"}, "after"),
        ({"after": "1e3"}, "after"),
        ({"after": str(2**63)}, "after"),
        ({"limit": "0"}, "limit"),
        ({"limit": "-5"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"before": "x"}, "before"),
        ({"before": "-1"}, "before"),
    ],
)
def test_bad_cursors_and_limits_are_400(api, session, params, field):
    response = api.get(session_url(session.id, "messages"), params)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_paging_through_thousands_of_messages_has_no_gaps_or_repeats(api, session):
    total_before = session.count()
    for start in range(0, 3000, 1000):
        session.add_many(
            [
                {"role": "user" if i % 2 else "assistant", "content": f"m{start + i}"}
                for i in range(1000)
            ]
        )
    expected = list(range(1, total_before + 3001))

    seen: list[int] = []
    response = api.get(session_url(session.id, "messages"), {"limit": 700})
    pages = 0
    while True:
        assert response.status_code == 200
        body = response.json()
        seen += [m["cursor"] for m in body["messages"]]
        pages += 1
        if body["next"] is None:
            break
        if pages == 2:
            # Appends while paging land after the walk's position and are reached too.
            session.add({"role": "user", "content": "late arrival"})
            expected.append(expected[-1] + 1)
        response = api.get(body["next"])
    assert seen == expected
    assert pages == -(-len(expected) // 700)
