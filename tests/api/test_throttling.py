"""Scoped rate limits: reads and writes counted apart, per user, configured in MEMORY_APP."""

from __future__ import annotations

import pytest
from django.test import override_settings

from .conftest import session_url, sessions_url

pytestmark = pytest.mark.django_db


@override_settings(
    MEMORY_APP={"API_THROTTLE_RATES": {"memory_write": "2/minute", "memory_read": "100/minute"}}
)
def test_writes_are_throttled_apart_from_reads(api, other_api, session):
    url = session_url(session.id, "messages")
    for _ in range(2):
        assert api.post(url, {"role": "user", "content": "x"}, format="json").status_code == 201
    throttled = api.post(url, {"role": "user", "content": "one too many"}, format="json")
    assert throttled.status_code == 429
    assert throttled.json()["code"] == "throttled"
    assert int(throttled["Retry-After"]) > 0
    assert session.count() == 5  # the throttled message was not stored

    assert api.get(url).status_code == 200  # reads have their own budget
    assert (
        other_api.post(sessions_url(), {"key": "bobs"}, format="json").status_code == 201
    )  # per user


@override_settings(MEMORY_APP={"API_THROTTLE_RATES": {"memory_read": "3/minute"}})
def test_reads_are_throttled_and_unlisted_scopes_are_not(api, session):
    for _ in range(3):
        assert api.get(session_url(session.id)).status_code == 200
    assert api.get(session_url(session.id, "window")).status_code == 429
    for _ in range(5):  # no memory_write rate configured: writes are not throttled
        assert (
            api.post(
                session_url(session.id, "messages"), {"role": "user", "content": "x"}, format="json"
            ).status_code
            == 201
        )


def test_default_rates_do_not_get_in_the_way(api, session):
    for _ in range(50):
        assert api.get(session_url(session.id, "window")).status_code == 200
