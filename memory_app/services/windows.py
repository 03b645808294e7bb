"""Reading a context window: the log's rows, arranged by the rules of ``context``."""

from __future__ import annotations

from operator import attrgetter

from ..conf import memory_settings
from ..models import Session
from ..store import reads, snapshots
from ..tokens import count_message, encoding_name_for_model, first_tokens
from ..types import StoredMessage, Window
from ..validation import check_count
from . import blocks as memory_blocks
from .context import assemble_window, page_sizer


def window(
    session_id,
    max_messages: int | None = None,
    max_tokens: int | None = None,
    *,
    model: str | None = None,
) -> Window:
    """What to send the model next: snapshot summary and pinned messages, system messages,
    then the newest whole tool groups that fit ``max_messages`` / ``max_tokens``.

    Tokens are counted for ``model`` (its encoding), by default with ``TOKEN_ENCODING``.
    """
    if max_messages is not None:
        max_messages = check_count(max_messages, "max_messages")
    if max_tokens is not None:
        max_tokens = check_count(max_tokens, "max_tokens")
    encoding = encoding_name_for_model(model)
    stored_counts = encoding == memory_settings.TOKEN_ENCODING
    sizer = page_sizer(max_messages, max_tokens)
    # Snapshot, system messages (every stored one, covered by the snapshot or not: they are
    # always kept) and the first page of the tail: fixed SQL where possible, with a first page
    # sized from the session's counters when the stored counts are the cost.
    source = reads.window_source(
        session_id,
        page_size=sizer,
        max_tokens=max_tokens if max_messages is None and stored_counts else None,
    )
    if source is not None:
        snapshot, system, newest, blocks = source
    else:
        snapshot = snapshots.latest(session_id)
        system = reads.system_messages(session_id)
        newest = reads.newest_first(
            session_id, after=snapshot.upto if snapshot else 0, page_size=sizer
        )
        owner = Session.objects.filter(pk=session_id).values_list("owner_id", flat=True)
        blocks = memory_blocks.for_session(owner.first(), session_id)
    if stored_counts:
        cost = attrgetter("tokens")  # the count cached at append
    else:

        def cost(m: StoredMessage) -> int:
            return count_message(m.as_openai(), encoding)

    return assemble_window(
        snapshot=snapshot,
        system_messages=system,
        newest_first=newest,
        max_messages=max_messages,
        max_tokens=max_tokens,
        cost=cost,
        cost_of_dict=lambda d: count_message(d, encoding),
        cut_text=lambda text, n: first_tokens(text, n, encoding),
        blocks=blocks,
    )
