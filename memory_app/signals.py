"""Signals of the memory store.

``messages_appended(session_id, messages, tokens_since_snapshot)`` is sent right after messages
are stored, by an append or an import (``tokens_since_snapshot``: the session's counter after
them; ``messages``: ``StoredMessage`` values, plaintext), inside the
caller's transaction: receivers that start work elsewhere (a Celery task) must do it in
``transaction.on_commit`` so a rolled-back append triggers nothing.
"""

from django.dispatch import Signal

messages_appended = Signal()
