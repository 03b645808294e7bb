"""Signals of the memory store.

``messages_appended(session_id, messages, tokens_since_snapshot, committed)`` is sent right
after messages are stored, by an append or an import (``tokens_since_snapshot``: the session's
counter after them; ``messages``: ``StoredMessage`` values, plaintext), inside the
caller's transaction: receivers that start work elsewhere (a Celery task) must do it in
``transaction.on_commit`` so a rolled-back append triggers nothing. ``committed`` is true when
the messages are committed already: a native async append (``store.async_log``), which sends
the signal on a worker thread, or from its event loop when every receiver has a
``runs_in_event_loop()`` that returns true (it must then not block or use the ORM).
"""

from django.dispatch import Signal

messages_appended = Signal()
