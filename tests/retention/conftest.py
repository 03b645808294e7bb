"""Fixtures for the retention tests: sessions with messages, made old or expired on purpose."""

from __future__ import annotations

import datetime as dt
import uuid

from django.utils import timezone

from memory_app import Memory
from memory_app.models import Session


def make_session(
    namespace: str = "tests",
    *,
    messages: int = 2,
    expires_in: dt.timedelta | None = None,
    idle_for: dt.timedelta | None = None,
    key: str | None = None,
):
    """A session with ``messages`` messages; expiring ``expires_in`` from now (negative: already
    expired), last updated ``idle_for`` ago."""
    mem = Memory.session(key or f"s-{uuid.uuid4().hex[:10]}", owner=None, namespace=namespace)
    if messages:
        mem.add_many(
            [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"note {i}"}
                for i in range(messages)
            ]
        )
    changes = {}
    if expires_in is not None:
        changes["expires_at"] = timezone.now() + expires_in
    if idle_for is not None:
        changes["updated_at"] = timezone.now() - idle_for
    if changes:
        Session.objects.filter(pk=mem.id).update(**changes)
    return mem
