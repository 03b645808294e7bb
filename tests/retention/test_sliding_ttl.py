"""A sliding TTL moves expires_at forward on each append, inside the append's own statement."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from memory_app import Memory
from memory_app.models import Session
from memory_app.store import log
from memory_app.tokens import count_message
from memory_app.validation import check_message

pytestmark = pytest.mark.django_db

RETENTION = {
    "RETENTION": {
        "support-bot": {"ttl": "14d", "sliding": True},
        "fixed": {"ttl": "1d"},
        "*": {"ttl": "2d", "sliding": True},
    }
}
DAY = dt.timedelta(days=1)


def expiry(mem) -> dt.datetime | None:
    return Session.objects.values_list("expires_at", flat=True).get(pk=mem.id)


def push_expiry(mem, when) -> None:
    Session.objects.filter(pk=mem.id).update(expires_at=when)


def appended_within(mem, ttl, add) -> None:
    """``add()`` moves the session's expiry to ``now + ttl`` (now: while it ran)."""
    soon = timezone.now() + dt.timedelta(hours=1)
    push_expiry(mem, soon)
    before = timezone.now()
    add()
    after = timezone.now()
    assert before + ttl <= expiry(mem) <= after + ttl


def test_a_new_session_expires_after_its_namespaces_ttl(settings):
    settings.MEMORY_APP = RETENTION
    before = timezone.now()
    mem = Memory.session("a", namespace="fixed")
    assert before + DAY <= expiry(mem) <= timezone.now() + DAY
    given = timezone.now() + dt.timedelta(days=300)
    own = Memory.create("b", namespace="fixed", expires_at=given)
    assert expiry(own) == given  # an expiry given by the caller wins
    settings.MEMORY_APP = {}
    assert expiry(Memory.session("c", namespace="fixed")) is None


def test_sliding_ttl_moves_on_every_append(settings):
    settings.MEMORY_APP = RETENTION
    mem = Memory.session("chat", namespace="support-bot")
    appended_within(mem, 14 * DAY, lambda: mem.add({"role": "user", "content": "one"}))
    appended_within(
        mem,
        14 * DAY,
        lambda: mem.add_many(
            [{"role": "user", "content": "two"}, {"role": "assistant", "content": "three"}]
        ),
    )
    # The "*" entry slides every namespace without an entry of its own ...
    other = Memory.session("chat", namespace="unnamed")
    appended_within(other, 2 * DAY, lambda: other.add({"role": "user", "content": "hi"}))


def test_a_namespace_whose_own_policy_does_not_slide_keeps_its_expiry(settings):
    settings.MEMORY_APP = RETENTION
    mem = Memory.session("chat", namespace="fixed")  # ... but not one whose own entry is fixed
    when = timezone.now() + dt.timedelta(hours=5)
    push_expiry(mem, when)
    mem.add({"role": "user", "content": "one"})
    mem.add_many([{"role": "user", "content": "two"}, {"role": "user", "content": "three"}])
    assert expiry(mem) == when


def test_no_policy_no_change(settings):
    settings.MEMORY_APP = {}
    mem = Memory.session("chat", namespace="support-bot")
    mem.add({"role": "user", "content": "one"})
    assert expiry(mem) is None


def _append_queries(mem, settings, memory_app) -> list[str]:
    settings.MEMORY_APP = {**memory_app, "IMPORTANCE_SCORER": None}
    with CaptureQueriesContext(connection) as captured:
        mem.add({"role": "user", "content": "counted"})
        mem.add_many([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    return [q["sql"] for q in captured.captured_queries]


@pytest.mark.postgres
def test_the_postgresql_append_is_still_one_statement(settings):
    mem = Memory.session("chat", namespace="support-bot")
    without = _append_queries(mem, settings, {})
    sliding = _append_queries(mem, settings, RETENTION)
    assert len(sliding) == len(without) == 2  # one statement per append, policy or not
    assert all("expires_at = COALESCE" in sql and "INSERT INTO" in sql for sql in sliding)
    assert sliding == without  # the same statement text: a prepared plan is reused
    assert expiry(mem) > timezone.now() + 13 * DAY


def test_the_generic_append_moves_it_in_its_update_too(settings):
    settings.MEMORY_APP = {**RETENTION, "IMPORTANCE_SCORER": None}
    mem = Memory.session("chat", namespace="support-bot")
    other = Memory.session("chat", namespace="fixed")
    when = timezone.now() + dt.timedelta(hours=5)
    push_expiry(other, when)
    message = check_message({"role": "user", "content": "generic"})

    def insert(session) -> None:
        log._insert_generic(session.id, [message], [count_message(message.as_openai())])

    with CaptureQueriesContext(connection) as captured:
        appended_within(mem, 14 * DAY, lambda: insert(mem))
    updates = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 2 and '"expires_at" = CASE' in updates[1]  # push_expiry, then the append
    insert(other)
    assert expiry(other) == when
