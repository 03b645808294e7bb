"""Signals of the memory store.

``messages_appended(session_id, messages)`` is sent right after messages are stored, inside the
caller's transaction: receivers that start work elsewhere (a Celery task) must do it in
``transaction.on_commit`` so a rolled-back append triggers nothing.
"""

from django.dispatch import Signal

messages_appended = Signal()
