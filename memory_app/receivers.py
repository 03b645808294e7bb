"""The receiver of the append signal: what follows new messages, scheduled once they commit.

An append and an import (the store sends ``messages_appended`` for both) leave their messages
marked ``index_pending`` in the rows they write; once the transaction commits (a rolled-back
write starts nothing), ``services.background`` schedules the
session's after-append job: full text and vectors for recall, then the summarize threshold. The
append itself only hands the session id to a background thread (``AFTER_APPEND``), which queues
at most one task per session at a time; a failure to schedule never fails an append that has
already committed (the sweep finds what is still marked).
"""

from __future__ import annotations

from .conf import memory_settings
from .services import background
from .signals import messages_appended


def schedule_after_append(sender, session_id, messages, committed=False, **kwargs) -> None:
    """Once the write commits, schedule the session's after-append job."""
    if not messages:
        return
    if committed:  # a native async append: committed on its own connection
        background.schedule_after_append(session_id)  # never raises
    else:
        background.schedule_after_append_on_commit(session_id)


def _runs_in_event_loop() -> bool:
    # Deferred (the default), scheduling hands the session id to a thread: no query, nothing
    # that blocks, so a native async append may send the signal from its event loop.
    return memory_settings.AFTER_APPEND == "deferred"


schedule_after_append.runs_in_event_loop = _runs_in_event_loop


def connect() -> None:
    """Connect the receiver (called from the app's ``ready()``)."""
    messages_appended.connect(
        schedule_after_append, dispatch_uid="memory_app.receivers.schedule_after_append"
    )
