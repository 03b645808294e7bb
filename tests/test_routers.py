"""The rules of ``memory_app.routers.MemoryRouter`` (no database needed; the real replica is in
``tests/test_replica.py``)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from memory_app.models import Message, Session
from memory_app.routers import MemoryRouter, is_pinned, stale_reads, unpinned

router = MemoryRouter()


@pytest.fixture
def replica(settings):
    settings.MEMORY_APP = {"READ_REPLICAS": ["replica"]}


def test_reads_go_to_the_primary_unless_marked_stale_tolerant(replica):
    with unpinned():
        assert router.db_for_read(Message) == "default"
        assert router.db_for_read(Message, stale_ok=True) == "replica"
        with stale_reads():
            assert router.db_for_read(Session) == "replica"
        assert router.db_for_read(Session) == "default"


def test_a_write_pins_the_context_until_it_ends(replica):
    with unpinned():
        with stale_reads():
            assert router.db_for_write(Message) == "default"
            assert is_pinned()
            assert router.db_for_read(Message) == "default"
            assert router.db_for_read(Message, stale_ok=True) == "default"
        with unpinned():
            assert router.db_for_read(Message, stale_ok=True) == "replica"


def test_without_replicas_everything_reads_the_primary(settings):
    settings.MEMORY_APP = {}
    with unpinned(), stale_reads():
        assert router.db_for_read(Message) == "default"


def test_other_apps_and_migrations(replica):
    with unpinned(), stale_reads():
        assert router.db_for_read(get_user_model()) is None
        assert router.db_for_write(get_user_model()) is None
    assert router.allow_migrate("replica", "memory_app") is False
    assert router.allow_migrate("replica", "auth") is False
    assert router.allow_migrate("default", "memory_app") is None
