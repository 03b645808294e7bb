"""The facade of learned memory: ``OwnerMemory`` is what was learned about one owner.

    learned = Memory.learned(request.user)          # or mem.learned, for a session's owner
    learned.remember("Prefers replies in French", topic="language")
    learned.search("which language?")               # current facts, best first
    learned.search("job", as_of="2024-01-01")       # what was known then
    learned.history(key)                            # every version of one fact
    learned.write_block("profile", "Ada, vegetarian, lives in Oslo")   # always in the window

It composes ``services.memories`` (facts with provenance and time), ``services.blocks`` (memory
blocks) and ``services.extraction`` (learning from a session's messages); every method has an
async twin prefixed with ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .aio import twin
from .services import blocks, memories
from .store.sessions import owner_id
from .types import MemoryBlock, MemoryView


class OwnerMemory:
    """Facts learned about ``owner`` and the owner's memory blocks. Opened for a session
    (``SessionMemory.learned``), what it remembers names that session as its source, and
    its blocks may be the session's own (``scope="session"``)."""

    def __init__(self, owner: Any, *, session_id: Any = None) -> None:
        self.owner = owner
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"<OwnerMemory owner={owner_id(self.owner)!r} session={self.session_id}>"

    # -- facts ---------------------------------------------------------------------------------
    def remember(
        self,
        text: str,
        *,
        metadata: dict | None = None,
        topic: str | None = None,
        importance: float | None = None,
        cursors: Sequence[int] = (),
    ) -> MemoryView:
        """Keep a fact (importance 1 unless given); the same fact already kept is confirmed."""
        memory, _new = memories.remember(
            self.owner,
            text,
            metadata=metadata,
            topic=topic,
            importance=importance,
            session_id=self.session_id,
            cursors=cursors,
        )
        return memory

    def update(self, key: str, text: str, **changes: Any) -> MemoryView:
        """Supersede memory ``key`` with ``text``; the old version stays in its history."""
        return memories.update(self.owner, key, text, session_id=self.session_id, **changes)

    def forget(self, key: str) -> bool:
        """End memory ``key`` (its history stays readable); ``False`` when none was current."""
        return memories.forget(self.owner, key) > 0

    def current(
        self, *, as_of: Any = None, filters: Any = None, limit: int = 100, offset: int = 0
    ) -> list[MemoryView]:
        """The facts in force now (or at ``as_of``), newest first."""
        return memories.current(
            self.owner, as_of=as_of, filters=filters, limit=limit, offset=offset
        )

    def search(
        self,
        query: str,
        limit: int = 5,
        *,
        as_of: Any = None,
        filters: Any = None,
        mode: str | None = None,
    ) -> list[MemoryView]:
        """The facts in force now (or at ``as_of``) that best match ``query``."""
        return memories.search(
            self.owner, query, limit=limit, as_of=as_of, filters=filters, mode=mode
        )

    def history(self, key: str) -> list[MemoryView]:
        """Every version of memory ``key``, oldest first."""
        return memories.history(self.owner, key)

    def count(self) -> int:
        """How many facts are in force."""
        return memories.count(self.owner)

    aremember = twin(remember, write=True)
    aupdate = twin(update, write=True)
    aforget = twin(forget, write=True)
    acurrent = twin(current)
    asearch = twin(search)
    ahistory = twin(history)
    acount = twin(count)

    # -- memory blocks -------------------------------------------------------------------------
    def blocks(self, *, scope: str = "owner") -> list[MemoryBlock]:
        """The owner's blocks (or this session's own, ``scope="session"``), by name."""
        return blocks.get(self.owner, scope=scope, session_id=self.session_id)

    def write_block(
        self, name: str, text: str, *, scope: str = "owner", append: bool = False
    ) -> MemoryBlock:
        """Replace a block's text (or ``append`` a line), creating the block if needed."""
        return blocks.write(
            self.owner, name, text, scope=scope, session_id=self.session_id, append=append
        )

    def delete_block(self, name: str, *, scope: str = "owner") -> bool:
        return blocks.delete(self.owner, name, scope=scope, session_id=self.session_id)

    ablocks = twin(blocks)
    awrite_block = twin(write_block, write=True)
    adelete_block = twin(delete_block, write=True)
