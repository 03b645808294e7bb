"""Fixtures for the admin tests: sessions with real conversations, stored through the adapter."""

from __future__ import annotations

import pytest

from memory_app import Memory

from .conversations import TRIP_SUMMARY, chatter, trip_conversation


def fill(memory, messages: list[dict]) -> None:
    for start in range(0, len(messages), 1000):
        memory.add_many(messages[start : start + 1000])


@pytest.fixture
def trip(db, user):
    """A travel chat with tool calls, a remembered message and snapshot v1 over its first 10."""
    memory = Memory.session(
        "trip-norway", owner=user, namespace="travel-agent", title="A week in Norway"
    )
    memory.add_many(trip_conversation())
    memory.save_snapshot(
        TRIP_SUMMARY,
        upto=10,
        model="gpt-4o-mini",
        pinned=[{"role": "user", "content": "Plan a week in Norway in June (vegetarian)."}],
    )
    return memory.refresh()


@pytest.fixture
def make_session(db):
    """A session of ``n`` chatter messages: ``make_session("key", 2000)``."""

    def make(key: str, n: int, **kwargs):
        memory = Memory.session(key, **kwargs)
        fill(memory, chatter(n))
        return memory.refresh()

    return make


@pytest.fixture
def tasks():
    """``memory_app.tasks``, run eagerly in-process so no queue is shared with anyone."""
    from memory_app import tasks as module

    missing = [n for n in ("summarize_session", "embed_session") if not hasattr(module, n)]
    if missing:
        pytest.skip(f"memory_app.tasks has no {', '.join(missing)} yet")
    from project.celery import app

    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    yield module
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved
