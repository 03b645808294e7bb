"""Read replicas: stale-tolerant reads to a replica, the agent path on the primary.

Opt in with::

    DATABASES = {"default": {...primary...},
                 "replica": {...hot standby..., "TEST": {"MIRROR": "default"}}}
    DATABASE_ROUTERS = ["memory_app.routers.MemoryRouter"]
    MEMORY_APP = {"READ_REPLICAS": ["replica"]}
    MIDDLEWARE = [..., "memory_app.routers.ReplicaReadsMiddleware"]   # admin lists on the replica

The rules, in order:

1. Writes, migrations and every read not marked stale-tolerant go to the primary. An agent's
   window, ``last()``, ``messages()``, session-scope search and everything the API answers after
   a write therefore read their own writes, across requests too (an agent that appends in one
   HTTP request and asks for the window in the next must see its message; a replica a few
   milliseconds behind would not show it).
2. A read marked stale-tolerant goes to a replica: inside ``with stale_reads():``, or with the
   router hint ``stale_ok=True`` (``router.db_for_read(Message, stale_ok=True)``). The app marks
   the admin's change lists (``ReplicaReadsMiddleware``), owner-scope search, and exports of
   sessions idle for ``REPLICA_IDLE_SECONDS`` (nothing was written to them for longer than any
   plausible lag, so the replica has all of them).
3. A write pins the current context (a request, a task, a thread or an asyncio task: a
   ``ContextVar``) to the primary: after it, even stale-tolerant reads in the same context read
   the primary, so an admin action or an agent turn that writes never reads back an older state.
   ``ReplicaReadsMiddleware`` starts every request unpinned; ``unpinned()`` does the same for a
   task body. A pin that outlives its request only sends reads to the primary: never stale.

Only this app's models are routed; other apps' models get ``None`` (Django's default routing),
except that migrations never run on a replica alias.
"""

from __future__ import annotations

import contextvars
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .conf import memory_settings

APP_LABEL = "memory_app"

_stale_ok: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "memory_app_stale_ok", default=False
)
_pinned: contextvars.ContextVar[bool] = contextvars.ContextVar("memory_app_pinned", default=False)


@contextmanager
def stale_reads() -> Iterator[None]:
    """Reads of this app's models inside the block may go to a replica (unless pinned)."""
    token = _stale_ok.set(True)
    try:
        yield
    finally:
        _stale_ok.reset(token)


@contextmanager
def unpinned() -> Iterator[None]:
    """A fresh context for one unit of work (a request, a task): not pinned to the primary
    by writes made before it; writes inside pin only the block."""
    token = _pinned.set(False)
    try:
        yield
    finally:
        _pinned.reset(token)


def pin_to_primary() -> None:
    """Send the rest of this context's reads to the primary (what every write does)."""
    _pinned.set(True)


def is_pinned() -> bool:
    return _pinned.get()


def replicas() -> list[str]:
    return list(memory_settings.READ_REPLICAS or ())


def primary() -> str:
    return DEFAULT_DB_ALIAS


def stale_read_alias(hints: dict[str, Any] | None = None) -> str | None:
    """The replica a stale-tolerant read may use now, or ``None`` for the primary."""
    choices = replicas()
    if not choices or _pinned.get():
        return None
    if not (_stale_ok.get() or (hints or {}).get("stale_ok")):
        return None
    return choices[0] if len(choices) == 1 else random.choice(choices)


class MemoryRouter:
    """Django database router for ``memory_app`` with read replicas (see the module docstring)."""

    def db_for_read(self, model, **hints: Any) -> str | None:
        if model._meta.app_label != APP_LABEL:
            return None
        return stale_read_alias(hints) or primary()

    def db_for_write(self, model, **hints: Any) -> str | None:
        if model._meta.app_label != APP_LABEL:
            return None
        pin_to_primary()
        return primary()

    def allow_relation(self, obj1, obj2, **hints: Any) -> bool | None:
        # A replica holds the primary's rows: an object read there may relate to one read on
        # the primary.
        aliases = {primary(), *replicas()}
        if obj1._state.db in aliases and obj2._state.db in aliases:
            return True
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if db in replicas():
            return False  # a hot standby is read-only; it replays the primary's migrations
        return None


class ReplicaReadsMiddleware:
    """Each request starts unpinned; GET/HEAD requests to the views named in
    ``REPLICA_READ_VIEWS`` (the admin's change lists by default) read stale-tolerantly."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        with unpinned():
            request._memory_stale_token = None
            try:
                return self.get_response(request)
            finally:
                if request._memory_stale_token is not None:
                    _stale_ok.reset(request._memory_stale_token)

    def process_view(self, request, view_func, view_args, view_kwargs) -> None:
        match = getattr(request, "resolver_match", None)
        if request.method not in ("GET", "HEAD") or match is None:
            return None
        if match.view_name in set(memory_settings.REPLICA_READ_VIEWS or ()):
            request._memory_stale_token = _stale_ok.set(True)
        return None
