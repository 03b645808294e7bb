"""Bodies no endpoint can use: too large, nested too deeply, not UTF-8, not JSON. Each is refused
with a 4xx in the API's error shape, and nothing is stored or erased."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from django.urls import reverse

from memory_app import Memory
from memory_app.exceptions import InvalidMessage, InvalidSession, InvalidSnapshot

from ..api.conftest import import_url, session_url, sessions_url
from .test_owner_erase import all_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(user, alice_memory):
    return alice_memory[0]


def body_routes(memory) -> list[tuple[str, str, dict]]:
    """(method, url, a good body) of every endpoint that reads a JSON body."""
    return [
        ("post", sessions_url(), {"key": "new"}),
        ("patch", session_url(memory.id), {"title": "renamed"}),
        ("post", session_url(memory.id, "messages"), {"role": "user", "content": "hi"}),
        (
            "post",
            session_url(memory.id, "snapshot"),
            {"summary": "s", "upto": 4, "prev_version": 1},
        ),
        ("post", import_url() + "?key=copy", memory.export()),
        ("post", reverse("memory_api:owner-erase"), {"confirm": "erase"}),
    ]


def send(api, method: str, url: str, raw: bytes | str, content_type: str = "application/json"):
    return getattr(api, method)(url, raw, content_type=content_type)


def assert_refused(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["detail"] and body["code"]
    if code:
        assert body["code"] == code, body
    return body


def test_every_body_route_works_with_a_good_body(api, user, target):
    # The bad-body tests below are only meaningful if the same routes accept good bodies.
    for method, url, good in body_routes(target):
        response = send(api, method, url, json.dumps(good))
        assert response.status_code in (200, 201), (url, response.content[:300])


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=50_000)
def test_a_body_over_the_upload_limit_is_413(api, user, target):
    unchanged = all_rows()
    for method, url, good in body_routes(target):
        padded = {**good, "metadata": {"padding": "x" * 60_000}} if isinstance(good, dict) else good
        body = assert_refused(send(api, method, url, json.dumps(padded)), 413, "request_too_large")
        assert "too large" in body["detail"]
    assert all_rows() == unchanged


def test_the_default_upload_limit_applies(api, target):
    # Django's default DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), on the busiest route.
    big = json.dumps({"role": "user", "content": "hi", "metadata": {"x": "a" * 3_000_000}})
    assert_refused(
        send(api, "post", session_url(target.id, "messages"), big), 413, "request_too_large"
    )
    assert target.count() == 5


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_nested_beyond_the_parser_is_400(api, user, target, depth):
    """Past what Python's JSON parser follows (100,000 levels, on every Python) the body is a
    parse error; 1,000 levels parse on some Pythons (3.12 and later) and are then refused by the
    rule book: a 400 either way, nothing stored."""
    nested = "[" * depth + "]" * depth
    unchanged = all_rows()
    for method, url, good in body_routes(target):
        raw = json.dumps({**good, "metadata": "NESTED"}).replace('"NESTED"', nested)
        body = assert_refused(send(api, method, url, raw), 400)
        if depth == 100_000 or body["code"] == "parse_error":
            assert body["code"] == "parse_error" and "nested too deeply" in body["detail"]
        else:
            assert body.get("field") == "metadata", body
    assert all_rows() == unchanged


def nested(levels: int):
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("make_body", "route"),
    [
        (lambda deep: {"role": "user", "content": "hi", "metadata": {"x": deep}}, "messages"),
        (lambda deep: {"role": "user", "content": "hi", "extra": {"audio": deep}}, "messages"),
        (
            lambda deep: {"messages": [{"role": "user", "content": "hi", "metadata": {"x": deep}}]},
            "messages",
        ),
        (lambda deep: {"metadata": {"x": deep}}, None),
        (
            lambda deep: {"summary": "s", "upto": 4, "prev_version": 1, "metadata": {"x": deep}},
            "snapshot",
        ),
    ],
)
def test_json_the_parser_reads_but_nested_beyond_max_json_depth_is_400(
    api, target, make_body, route
):
    # 64 levels (MAX_JSON_DEPTH) are fine; 65 are refused with the field at fault.
    url = session_url(target.id, route)
    method = "patch" if route is None else "post"
    before = target.export()
    too_deep = getattr(api, method)(url, make_body({"x": nested(64)}), format="json")
    body = assert_refused(too_deep, 400)
    assert "nested more than 64 levels" in json.dumps(body)
    assert target.export() == before
    fine = getattr(api, method)(url, make_body(nested(63)), format="json")
    assert fine.status_code in (200, 201), fine.content[:300]


def test_the_adapter_refuses_deep_json_with_typed_errors(user, target):
    deep = {"x": nested(64)}
    with pytest.raises(InvalidMessage) as err:
        target.add({"role": "user", "content": "hi", "metadata": deep})
    assert err.value.field == "metadata"
    with pytest.raises(InvalidSession):
        Memory.create("deep", owner=user, metadata=deep)
    with pytest.raises(InvalidSession):
        target.set_meta("deep", deep)
    with pytest.raises(InvalidSnapshot):
        target.save_snapshot("s", upto=5, prev=1, metadata=deep)
    assert target.count() == 5


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        pytest.param(
            '{"role": "user", "content": "café"}'.encode("latin-1"),
            "application/json",
            id="latin-1",
        ),
        pytest.param(
            '{"role": "user", "content": "x"}'.encode("utf-16"), "application/json", id="utf-16"
        ),
        pytest.param(
            b'{"role": "user", "content": "\xff\xfe\xfa"}', "application/json", id="invalid bytes"
        ),
        pytest.param(
            b'{"role": "user", "content": "\xed\xa0\x80"}',
            "application/json",
            id="encoded surrogate",
        ),
        pytest.param(b"\x00\x01\x02", "application/json", id="binary"),
    ],
)
def test_bodies_that_are_not_utf8_are_400(api, target, raw, content_type):
    unchanged = all_rows()
    for method, url, _good in body_routes(target):
        assert_refused(send(api, method, url, raw, content_type), 400, "parse_error")
    assert all_rows() == unchanged


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param('{"role": "user", "content": "hi"', id="truncated"),
        pytest.param('{"role": "user", "content": "hi"} trailing', id="trailing garbage"),
        pytest.param("{'role': 'user'}", id="single quotes"),
        pytest.param('{"role": "user", "content": "hi", "metadata": {"a": NaN}}', id="NaN"),
        pytest.param(
            '{"role": "user", "content": "hi", "metadata": {"a": -Infinity}}', id="Infinity"
        ),
        pytest.param(
            '{"role": "user", "content": "hi", "metadata": {"a": ' + "9" * 5000 + "}}",
            id="huge integer",
        ),
        pytest.param("", id="empty with a JSON content type"),
        pytest.param("null", id="null"),
        pytest.param('"a string"', id="a string"),
        pytest.param("[1, 2, 3]", id="a list"),
    ],
)
def test_bodies_that_are_not_usable_json_are_400(api, target, raw):
    unchanged = all_rows()
    for method, url, _good in body_routes(target):
        if raw == "" and method == "patch":
            continue  # an empty PATCH changes nothing, rightly: it is not an error
        assert_refused(send(api, method, url, raw), 400)
    assert all_rows() == unchanged


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
    ],
)
def test_bodies_that_are_not_json_are_415(api, target, content_type):
    unchanged = all_rows()
    for method, url, _good in body_routes(target):
        assert_refused(send(api, method, url, "role=user&content=hi", content_type), 415)
    assert all_rows() == unchanged
