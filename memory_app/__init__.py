"""Conversation memory for LLM agents, stored with the Django ORM.

``from memory_app import Memory`` works before Django's app registry is ready: the adapter is
imported on first attribute access.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .memory import Memory, SessionMemory

__all__ = ["Memory", "SessionMemory"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
