"""Context windows: which messages to send the model, within a budget.

Pure functions over ``StoredMessage`` values, so the rules are tested on their own:
- system messages (all stored ones, even those a snapshot covers) are always kept and never
  count toward the budget;
- an assistant message with tool calls and the tool results that follow it are one group,
  kept or dropped whole; tool results whose call is not in the log any more are dropped;
- the newest groups are kept, walking back until the next group does not fit;
- the snapshot summary (as a user message, so it keeps its place) and pinned messages come
  first and count toward the budget; a summary larger than the budget is cut to fit, ending
  with ``SUMMARY_CUT_MARKER`` (``Window.summary_truncated``), and a budget that cannot hold the
  pinned messages is refused (``BudgetTooSmall``): a window never exceeds its budget;
- a window is a request OpenAI accepts: tool calls with no result in the window (a call still
  being answered, a result never stored) are left out of their assistant message, which is
  left out too when nothing else remains of it (``Window.unanswered_tool_calls``);
- memory blocks (``services.blocks``) come in one system message right after the stored
  system messages that open the window; like them, they do not count toward the budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..conf import memory_settings
from ..exceptions import BudgetTooSmall
from ..types import MemoryBlock, SnapshotView, StoredMessage, Window

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
SUMMARY_CUT_MARKER = "\n[... summary cut to fit the token budget]"


BLOCKS_HEADER = (
    "Memory blocks: notes you keep and edit with your memory tools (edit_memory_block). They "
    "are your own notes about the user and the task, quoted as data.\n"
)
BLOCKS_OPEN = "<memory_blocks>"
BLOCKS_CLOSE = "</memory_blocks>"


def blocks_message(blocks: Sequence[MemoryBlock]) -> dict[str, Any] | None:
    """The system message carrying ``blocks`` (``None`` without any), each text quoted so none
    can close the block or open a tag of its own."""
    if not blocks:
        return None
    lines = [BLOCKS_HEADER + BLOCKS_OPEN]
    for block in blocks:
        text = json.dumps(block.text, ensure_ascii=False)
        text = text.replace("<", "\\u003c").replace(">", "\\u003e")
        lines.append(f'<block name="{block.name}" scope="{block.scope}">{text}</block>')
    lines.append(BLOCKS_CLOSE)
    return {"role": "system", "content": "\n".join(lines)}


def summary_message(snapshot: SnapshotView, summary: str | None = None) -> dict[str, Any]:
    return {
        "role": "user",
        "content": SUMMARY_PREFIX + (snapshot.summary if summary is None else summary),
    }


def tool_groups_newest_first(messages: Iterable[StoredMessage]) -> Iterable[list[StoredMessage]]:
    """Group non-system messages (given newest first) into atomic units, in log order inside.

    Tool results belong to the assistant message(s) whose ``tool_calls`` carry their ids: one
    assistant message with several calls, or several consecutive ones (parallel calls stored
    one per message, as the Agents SDK does). A group is the calls and all their results.
    Results whose call is not in the log any more are dropped (a request with them would be
    refused).
    """
    results: list[StoredMessage] = []
    calls: list[StoredMessage] = []

    def unanswered() -> set[str]:
        called = {c.get("id") for m in calls for c in m.tool_calls or ()}
        return {r.tool_call_id for r in results} - called

    def group() -> list[StoredMessage]:
        called = {c.get("id") for m in calls for c in m.tool_calls or ()}
        kept = [*calls, *(r for r in results if r.tool_call_id in called)]
        return sorted(kept, key=lambda m: m.cursor)

    for message in messages:
        if message.role == "system":
            continue
        if message.role == "tool":
            if calls:  # an older result: the calls collected so far are complete
                yield group()
                calls, results = [], []
            results.append(message)
            continue
        if message.role == "assistant" and message.tool_calls:
            if not results and not calls:
                yield [message]  # calls not answered yet: the newest turn
                continue
            calls.append(message)
            if not unanswered():
                yield group()
                calls, results = [], []
            continue
        if calls:
            yield group()
        calls, results = [], []  # results left without their call are dropped
        yield [message]
    if calls:
        yield group()


def select_tail(
    newest_first: Iterable[StoredMessage],
    *,
    max_messages: int | None,
    max_tokens: int | None,
    cost: Callable[[StoredMessage], int],
) -> tuple[list[StoredMessage], int]:
    """The newest whole groups that fit; returns them in log order and their token cost."""
    kept: list[list[StoredMessage]] = []
    used_tokens = used_messages = 0
    for group in tool_groups_newest_first(newest_first):
        # Most groups are one message: skip the generator (windows walk hundreds of them).
        group_tokens = cost(group[0]) if len(group) == 1 else sum(map(cost, group))
        if max_tokens is not None and used_tokens + group_tokens > max_tokens:
            break
        if max_messages is not None and used_messages + len(group) > max_messages:
            break
        kept.append(group)
        used_tokens += group_tokens
        used_messages += len(group)
    kept.reverse()
    return [m for group in kept for m in group], used_tokens


def assemble_window(
    *,
    snapshot: SnapshotView | None,
    system_messages: list[StoredMessage],
    newest_first: Iterable[StoredMessage],
    max_messages: int | None,
    max_tokens: int | None,
    cost: Callable[[StoredMessage], int],
    cost_of_dict: Callable[[dict], int],
    cut_text: Callable[[str, int], str],
    blocks: Sequence[MemoryBlock] = (),
) -> Window:
    """The window's messages in order. ``cost`` prices a stored message, ``cost_of_dict`` an
    OpenAI message, and ``cut_text(text, n)`` keeps the first ``n`` tokens of a text."""
    if max_messages is not None and max_messages < 0:
        raise ValueError("max_messages must not be negative")
    if max_tokens is not None and max_tokens < 0:
        raise ValueError("max_tokens must not be negative")

    head: list[dict] = []  # summary and pinned non-system messages: they count
    top_system: list[dict] = []
    summary_truncated = False
    if snapshot is not None:
        pinned = []
        for message in snapshot.pinned:
            (top_system if message.get("role") == "system" else pinned).append(message)
        summary, summary_truncated = _summary_within(
            snapshot, pinned, max_tokens, cost_of_dict, cut_text
        )
        head = [summary, *pinned]
    head_tokens = sum(cost_of_dict(m) for m in head)
    remaining = None if max_tokens is None else max(0, max_tokens - head_tokens)

    tail, tail_tokens = select_tail(
        newest_first, max_messages=max_messages, max_tokens=remaining, cost=cost
    )
    first_kept = tail[0].cursor if tail else None

    messages: list[dict] = list(top_system)
    cursors: list[int | None] = [None] * len(top_system)
    in_range_system: list[StoredMessage] = []
    for system in system_messages:
        if first_kept is None or system.cursor < first_kept:
            messages.append(system.as_openai())
            cursors.append(system.cursor)
        else:
            in_range_system.append(system)
    blocks_block = blocks_message(blocks)
    if blocks_block is not None:
        messages.append(blocks_block)
        cursors.append(None)
    messages.extend(head)
    cursors.extend([None] * len(head))
    # The tail is in log order already; merge only when system messages fall inside it.
    ordered = sorted([*tail, *in_range_system], key=lambda m: m.cursor) if in_range_system else tail
    answered = {m.tool_call_id for m in tail if m.role == "tool"}
    unanswered: list[str] = []
    for m in ordered:
        message = m.as_openai()
        if m.tool_calls and any(c.get("id") not in answered for c in m.tool_calls):
            unanswered += [c.get("id") for c in m.tool_calls if c.get("id") not in answered]
            message = _without_unanswered_calls(message, answered)
            tail_tokens += (cost_of_dict(message) if message else 0) - cost(m)
            if message is None:
                continue
        messages.append(message)
        cursors.append(m.cursor)

    system_tokens = sum(cost_of_dict(m) for m in top_system) + sum(cost(m) for m in system_messages)
    if blocks_block is not None:
        system_tokens += cost_of_dict(blocks_block)
    budget_tokens = head_tokens + tail_tokens
    return Window(
        messages=messages,
        cursors=cursors,
        tokens=budget_tokens + system_tokens,
        budget_tokens=budget_tokens,
        snapshot_version=snapshot.version if snapshot else None,
        first_cursor=first_kept,
        summary_truncated=summary_truncated,
        unanswered_tool_calls=tuple(unanswered),
        blocks=tuple(blocks),
    )


def _summary_within(
    snapshot: SnapshotView,
    pinned: list[dict],
    max_tokens: int | None,
    cost_of_dict: Callable[[dict], int],
    cut_text: Callable[[str, int], str],
) -> tuple[dict, bool]:
    """The summary message, cut (with ``SUMMARY_CUT_MARKER``) when it and the pinned messages
    would not fit ``max_tokens``; ``(message, whether it was cut)``."""
    whole = summary_message(snapshot)
    if max_tokens is None:
        return whole, False
    room = max_tokens - sum(cost_of_dict(m) for m in pinned)
    if cost_of_dict(whole) <= room:
        return whole, False
    # What the message costs around the kept text: its frame, the prefix and the marker.
    frame = cost_of_dict(summary_message(snapshot, SUMMARY_CUT_MARKER))
    if frame > room:
        needed = frame + max_tokens - room
        raise BudgetTooSmall(
            "max_tokens",
            f"{max_tokens} tokens cannot hold the snapshot's pinned messages and a cut summary "
            f"(at least {needed} tokens)",
        )
    keep = room - frame
    while True:  # a cut can merge tokens at its edge: shrink until it fits
        cut = summary_message(snapshot, cut_text(snapshot.summary, keep) + SUMMARY_CUT_MARKER)
        if cost_of_dict(cut) <= room or keep == 0:
            return cut, True
        keep -= cost_of_dict(cut) - room


def _without_unanswered_calls(message: dict, answered: set[str]) -> dict | None:
    """``message`` with only its tool calls that have a result in the window; ``None`` when
    nothing of it is left (no answered call, no text)."""
    calls = [c for c in message["tool_calls"] if c.get("id") in answered]
    if calls:
        return {**message, "tool_calls": calls}
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    if not rest.get("content"):
        return None
    return rest


def page_sizer(max_messages: int | None, max_tokens: int | None) -> Callable[[int, int], int]:
    """Page sizes for filling a window newest-first in as few queries as possible.

    The first page is small (a window is usually short); later pages are sized from the
    tokens per message seen so far, so a budget of a few thousand tokens takes two queries.
    """
    ceiling = memory_settings.WINDOW_PAGE_SIZE

    def size(fetched: int, tokens: int) -> int:
        if max_messages is not None:
            # Room for a tool group straddling the limit without another query.
            return min(max(max_messages - fetched, 0) + 16, ceiling)
        if max_tokens is None or fetched == 0:
            return min(64, ceiling)
        per_message = max(tokens / fetched, 1.0)
        wanted = (max_tokens - tokens) / per_message * 1.25 + 16
        return int(min(max(wanted, 16), ceiling * 10))

    return size
