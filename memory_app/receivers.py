"""The receiver of the append signal: what follows an append, scheduled once it commits.

An append leaves its messages marked ``index_pending`` in the rows it writes; once its
transaction commits (a rolled-back append starts nothing), ``services.background`` schedules the
session's after-append job: full text and vectors for recall, then the summarize threshold. At
most one job per session is queued at a time, so this costs an append one Redis round trip
with a broker, and nothing but a queue entry without one. ``robust=True``: a failure to schedule
never fails an append that has already committed (the sweep finds what is still marked).
"""

from __future__ import annotations

from django.db import router, transaction

from .models import Message
from .services import background
from .signals import messages_appended


def schedule_after_append(sender, session_id, messages, **kwargs) -> None:
    """Once the append commits, schedule the session's after-append job."""
    if not messages:
        return

    def schedule() -> None:  # a plain function: robust on_commit logs callbacks by __qualname__
        background.schedule_after_append(session_id)

    transaction.on_commit(schedule, using=router.db_for_write(Message), robust=True)


def connect() -> None:
    """Connect the receiver (called from the app's ``ready()``)."""
    messages_appended.connect(
        schedule_after_append, dispatch_uid="memory_app.receivers.schedule_after_append"
    )
