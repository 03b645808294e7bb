"""A page of a session's log, arranged for people to read (the admin's transcript).

The adapter hands out a page of messages by cursor; this module only arranges them: it pairs
each tool call with its result, folds long content, reads multi-part content, and marks which
snapshot version stands for each message. It never queries the database itself.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .types import SnapshotView, StoredMessage

#: Content longer than this (characters or lines) is folded behind a "show all" toggle.
FOLD_CHARS = 1200
FOLD_LINES = 40
#: How much of folded content stays visible.
PREVIEW_CHARS = 480
PREVIEW_LINES = 8


@dataclass
class Text:
    """Text that may be folded: ``preview`` is shown until the reader opens it."""

    text: str
    folded: bool = False
    preview: str = ""
    is_json: bool = False

    @property
    def size(self) -> int:
        return len(self.text)


@dataclass
class Part:
    """One part of multi-part content: text, or a placeholder for media we do not load."""

    kind: str
    text: Text | None = None
    label: str = ""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: Text
    #: The arguments on one line, as a call would read: ``city="Oslo", days=3``.
    signature: str = ""
    result: Entry | None = None


@dataclass
class Entry:
    """One message as shown: its role, readable content, tool calls and their results."""

    message: StoredMessage
    parts: list[Part]
    tool_calls: list[ToolCall] = field(default_factory=list)
    covered_by: int | None = None
    orphan_result: bool = False
    extra: Text | None = None
    meta: Text | None = None
    kind: str = "message"

    @property
    def inline(self) -> str:
        """The content on one line (compact JSON for JSON results), for previews."""
        texts = []
        for part in self.parts:
            if part.text is None:
                texts.append(f"[{part.label or part.kind}]")
            elif part.text.is_json:
                texts.append(json.dumps(json.loads(part.text.text), ensure_ascii=False))
            else:
                texts.append(part.text.text)
        return " ".join(" ".join(texts).split())

    @property
    def cursor(self) -> int:
        return self.message.cursor

    @property
    def role(self) -> str:
        return self.message.role


@dataclass
class Divider:
    """The end of what a snapshot stands for, placed after the last message it covers."""

    snapshot: SnapshotView
    first: int
    kind: str = "divider"


@dataclass
class Range:
    """What one snapshot version stands for: cursors ``first`` to ``snapshot.upto``."""

    snapshot: SnapshotView
    first: int
    summary: Text
    pinned: list[Entry]
    link: str = ""


@dataclass
class Page:
    """One page of the transcript: entries and snapshot dividers in log order."""

    items: list[Entry | Divider]
    first: int | None
    last: int | None
    previous: int | None
    next: int | None
    missing_before: int | None = None

    @property
    def has_older(self) -> bool:
        return self.previous is not None

    @property
    def has_newer(self) -> bool:
        return self.next is not None

    @property
    def is_empty(self) -> bool:
        return self.first is None


def fold(text: str, *, pretty_json: bool = False) -> Text:
    """Wrap ``text`` for display, folding it when long; JSON is indented when asked."""
    is_json = False
    if pretty_json and text and text.lstrip()[:1] in "{[":
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            is_json = True
        except ValueError:
            pass
    lines = text.count("\n") + 1
    if len(text) <= FOLD_CHARS and lines <= FOLD_LINES:
        return Text(text, is_json=is_json)
    preview = "\n".join(text[:PREVIEW_CHARS].split("\n")[:PREVIEW_LINES]).rstrip()
    return Text(text, folded=True, preview=preview, is_json=is_json)


def _json_text(value: Any) -> Text | None:
    if not value:
        return None
    return fold(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def content_parts(message: StoredMessage | dict) -> list[Part]:
    """Readable parts of a message's content (string or OpenAI content parts)."""
    if isinstance(message, StoredMessage):
        raw, role = (
            (message.content_parts if message.content_parts is not None else message.content),
            message.role,
        )
    else:
        raw, role = message.get("content"), message.get("role")
    pretty = role == "tool"
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        return [Part("text", fold(raw, pretty_json=pretty))]
    parts = []
    for part in raw:
        kind = part.get("type", "text") if isinstance(part, dict) else "text"
        if kind in ("text", "refusal"):
            value = part.get(kind, "") if isinstance(part, dict) else str(part)
            parts.append(Part(kind, fold(value, pretty_json=pretty)))
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if url.startswith("data:"):
                label = f"inline image, {len(url) * 3 // 4 // 1024:,} KB"
            else:
                label = url
            parts.append(Part("image", label=label))
        elif kind == "input_audio":
            fmt = (part.get("input_audio") or {}).get("format", "audio")
            parts.append(Part("audio", label=f"audio ({fmt})"))
        elif kind == "file":
            file = part.get("file") or {}
            parts.append(Part("file", label=file.get("filename") or file.get("file_id") or "file"))
        else:
            parts.append(Part("other", label=kind))
    return parts


def signature(arguments: str) -> str:
    """JSON arguments as a call reads them: ``{"city": "Oslo"}`` → ``city="Oslo"``."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return " ".join(arguments.split())
    if not isinstance(parsed, dict):
        return json.dumps(parsed, ensure_ascii=False)
    return ", ".join(
        f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in parsed.items()
    )


def _tool_calls(message: StoredMessage) -> list[ToolCall]:
    calls = []
    for call in message.tool_calls or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        calls.append(
            ToolCall(
                id=call.get("id", ""),
                name=function.get("name") or call.get("type", "tool"),
                arguments=fold(arguments, pretty_json=True),
                signature=signature(arguments),
            )
        )
    return calls


def _entry(message: StoredMessage, covered_by: int | None) -> Entry:
    return Entry(
        message=message,
        parts=content_parts(message),
        tool_calls=_tool_calls(message),
        covered_by=covered_by,
        extra=_json_text(message.extra),
        meta=_json_text(message.metadata),
    )


def coverage(
    snapshots: Sequence[SnapshotView], every: Sequence[tuple[int, int]] | None = None
) -> list[Range]:
    """Each snapshot version with the cursors it stands for, oldest first.

    A range starts after the previous version's ``upto``; ``every`` (``(version, upto)`` of all
    versions) supplies it when ``snapshots`` holds only the latest few.
    """
    floors, previous = {}, 0
    for version, upto in sorted(
        every if every is not None else [(s.version, s.upto) for s in snapshots]
    ):
        floors[version] = previous + 1
        previous = upto
    return [
        Range(
            snapshot=snapshot,
            first=floors.get(snapshot.version, 1),
            summary=fold(snapshot.summary),
            pinned=[
                Entry(message=_pinned_message(p), parts=content_parts(p)) for p in snapshot.pinned
            ],
        )
        for snapshot in sorted(snapshots, key=lambda s: s.version)
    ]


def _pinned_message(data: dict) -> StoredMessage:
    return StoredMessage(
        cursor=0, role=data.get("role", "user"), content="", name=data.get("name", "")
    )


def arrange(
    messages: Sequence[StoredMessage],
    snapshots: Sequence[SnapshotView],
    *,
    previous: int | None = None,
    next: int | None = None,
) -> Page:
    """Arrange one page of ``messages`` (oldest first) for reading.

    ``previous`` and ``next`` are the cursors of the stored messages just outside the page
    (``None`` at either end of the log). A snapshot's divider goes after the last message it
    covers, on the page holding the first message it does not (or at the very end). A tool
    result is shown inside the call it answers when both are on the page; one whose call is on
    an earlier page stands alone, marked as such.
    """
    ordered = sorted(snapshots, key=lambda s: s.version)
    uptos = [s.upto for s in ordered]
    floor = {s.version: (ordered[i - 1].upto if i else 0) + 1 for i, s in enumerate(ordered)}

    def covered_by(cursor: int) -> int | None:
        index = bisect.bisect_left(uptos, cursor)
        return ordered[index].version if index < len(ordered) else None

    items: list[Entry | Divider] = []

    def dividers(low: int | None, high: int | None) -> None:
        # Boundaries of snapshots with low <= upto < high (an open end when None).
        for snapshot in ordered:
            if (low is None or snapshot.upto >= low) and (high is None or snapshot.upto < high):
                items.append(Divider(snapshot=snapshot, first=floor[snapshot.version]))

    if messages:
        dividers(previous, messages[0].cursor)
    pending: dict[str, ToolCall] = {}
    for index, message in enumerate(messages):
        if index:
            dividers(messages[index - 1].cursor, message.cursor)
        if message.role == "tool" and message.tool_call_id in pending:
            call = pending.pop(message.tool_call_id)
            call.result = _entry(message, covered_by(message.cursor))
            continue
        entry = _entry(message, covered_by(message.cursor))
        if message.role == "tool":
            entry.orphan_result = True
        for call in entry.tool_calls:
            if call.id:
                pending[call.id] = call
        items.append(entry)
    if messages and next is None:
        dividers(messages[-1].cursor, None)

    first = messages[0].cursor if messages else None
    return Page(
        items=items,
        first=first,
        last=messages[-1].cursor if messages else None,
        previous=previous,
        next=next,
        missing_before=first - 1 if first is not None and previous is None and first > 1 else None,
    )
