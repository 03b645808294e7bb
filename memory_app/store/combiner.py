"""Concurrent appends to one session, written together.

The session's row lock serialises appends to one session: each waits for the one before it to
commit. Threads of this process that append to the same session at the same time are combined
instead: the first writes its messages alone; those that arrive while its statement runs queue
up, and when it is done the first of them writes the whole queue in one statement (one lock, one
commit, cursors in arrival order) on its own connection and hands every caller its messages.
Only appends outside a transaction are combined (each caller's messages commit before its call
returns, as they would alone); an error fails every caller of that statement, and none of their
messages is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


class _Append:
    __slots__ = ("messages", "tokens", "done", "lead", "result", "error")

    def __init__(self, messages, tokens) -> None:
        self.messages = messages
        self.tokens = tokens
        self.done: threading.Event | None = None  # only a caller that queues waits on it
        self.lead: list[_Append] | None = None  # the appends this caller is to write
        self.result = None
        self.error: BaseException | None = None


#: ``write(messages, tokens) -> (tokens_since_snapshot, stored messages)``: one statement.
Write = Callable[[list, list[int]], tuple[int, list]]


class AppendCombiner:
    """Appends to one key (a database and a session, checked for one owner scope) that arrive
    while a write is under way queue behind it and are written together by the next write."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, list[_Append]] = {}  # appends queued behind a write
        self._lock = threading.Lock()

    def append(self, key: Hashable, messages: list, tokens: list[int], write: Write) -> Any:
        """``write(messages, tokens)``, or this caller's part of one written with others."""
        me = _Append(messages, tokens)
        with self._lock:
            queue = self._waiting.get(key)
            if queue is None:
                self._waiting[key] = []  # a write is under way; later arrivals queue behind it
                me.lead = [me]
            else:
                me.done = threading.Event()
                queue.append(me)
        if me.lead is None:
            me.done.wait()
            if me.lead is None:  # written by another caller's statement
                if me.error is not None:
                    raise me.error
                return me.result
        batch = me.lead
        try:
            if len(batch) == 1:
                result = write(messages, tokens)
            else:
                since, stored = write(
                    [m for a in batch for m in a.messages], [t for a in batch for t in a.tokens]
                )
                start = 0
                for a in batch:
                    a.result = (since, stored[start : start + len(a.messages)])
                    start += len(a.messages)
                result = me.result
        except BaseException as err:
            for a in batch:
                a.error = err
            raise
        finally:
            with self._lock:
                queue = self._waiting.pop(key)
                if queue:
                    self._waiting[key] = []
                    queue[0].lead = queue
            if queue:
                queue[0].done.set()
            for a in batch:
                if a is not me:
                    a.done.set()
        return result
