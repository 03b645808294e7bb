"""Memory blocks: named, size-limited texts an agent keeps and edits, always in its window.

A block (Letta's "core memory") is a persona, the user's profile, a task list: a few hundred
words the agent rewrites as it learns, rather than facts it searches for. Blocks belong to an
owner (every session of the owner carries them) or to one session; a session's window carries
both, the owner's first, in one system message after the stored system messages (it does not
count toward the window's budget, as system messages do not; ``MEMORY_BLOCKS_MAX`` blocks of at
most ``MEMORY_BLOCK_MAX_CHARS`` characters bound its size). Ownerless sessions have session
blocks only: their owner-level blocks would be every service's.

Blocks are store items of kind ``block``: under ``("blocks",)`` for the owner, under
``("blocks", "session", <session id>)`` for a session; the key is the block's name.
"""

from __future__ import annotations

from typing import Any

from django.db import router, transaction
from django.db.models import Q, QuerySet

from ..conf import memory_settings
from ..exceptions import InvalidItem
from ..models import Item
from ..store import items
from ..types import MemoryBlock
from ..validation import BLOCK_SCOPES, check_block

KIND = Item.BLOCK
OWNER_NAMESPACE = ("blocks",)


def namespace(scope: str, session_id: Any = None) -> tuple[str, ...]:
    if scope not in BLOCK_SCOPES:
        raise InvalidItem("scope", f"must be one of {', '.join(BLOCK_SCOPES)}, not {scope!r}")
    if scope == "owner":
        return OWNER_NAMESPACE
    if session_id is None:
        raise InvalidItem("scope", "session blocks need a session")
    return (*OWNER_NAMESPACE, "session", str(session_id))


def _view(item: Item) -> MemoryBlock:
    scope = "owner" if item.namespace == items.joined(OWNER_NAMESPACE) else "session"
    return MemoryBlock(
        name=item.key,
        text=str((item.value or {}).get("text", "")),
        scope=scope,
        limit=int(memory_settings.MEMORY_BLOCK_MAX_CHARS),
        updated_at=item.updated_at,
    )


def _in(owner: Any, scope: str, session_id: Any) -> QuerySet:
    if scope == "owner" and owner is None:
        raise InvalidItem("scope", "ownerless sessions have session blocks only")
    where = items.joined(namespace(scope, session_id))
    return items.owned(owner).filter(kind=KIND, namespace=where)


def for_session(owner_id: Any, session_id: Any) -> list[MemoryBlock]:
    """The blocks a session's window carries: its owner's, then its own, each by name."""
    owner_level = items.joined(OWNER_NAMESPACE)
    own = items.joined(namespace("session", session_id))
    where = Q(namespace=own)
    if owner_id is not None:
        where |= Q(namespace=owner_level)
    found = items.owned(owner_id).filter(where, kind=KIND)
    return sorted((_view(i) for i in found), key=lambda b: (b.scope != "owner", b.name))


def get(owner: Any, *, scope: str = "owner", session_id: Any = None) -> list[MemoryBlock]:
    """The blocks of the owner (or of one session), by name."""
    return [_view(i) for i in _in(owner, scope, session_id).order_by("key")]


def write(
    owner: Any,
    name: Any,
    text: Any,
    *,
    scope: str = "owner",
    session_id: Any = None,
    append: bool = False,
) -> MemoryBlock:
    """Replace the block's text (or ``append`` a line to it), creating the block if needed.
    A text past ``MEMORY_BLOCK_MAX_CHARS`` is refused whole, never cut; so is a new block past
    ``MEMORY_BLOCKS_MAX``."""
    name, text = check_block(name, text)
    ns = namespace(scope, session_id)
    with transaction.atomic(using=router.db_for_write(Item)):
        existing = _in(owner, scope, session_id)
        current = existing.filter(key=name).select_for_update().first()
        if current is None and existing.count() >= int(memory_settings.MEMORY_BLOCKS_MAX):
            raise InvalidItem(
                "name",
                f"there are {memory_settings.MEMORY_BLOCKS_MAX} blocks already "
                "(MEMORY_BLOCKS_MAX): write one of them or delete one",
            )
        if append and current is not None:
            before = str(current.value.get("text", ""))
            name, text = check_block(name, f"{before}\n{text}" if before else text)
        item = items.put(
            owner,
            ns,
            name,
            {"text": text},
            ttl_minutes=None,
            text=None,
            vector=None,
            model="",
            kind=KIND,
            # Only a session's own block is tied to it (deleted and cleared with it).
            session_id=session_id if scope == "session" else None,
        )
    return _view(item)


def delete(owner: Any, name: Any, *, scope: str = "owner", session_id: Any = None) -> bool:
    name, _ = check_block(name)
    return items.delete(owner, namespace(scope, session_id), name) > 0
