"""Fixtures of the security and bad-input tests: owners with something in every table."""

from __future__ import annotations

import pytest
from django.db import connection

from memory_app import Memory
from memory_app.models import Embedding

from ..api.conftest import (  # noqa: F401
    _fast_password_hashing,
    _fresh_throttle_counts,
    api,
    other_api,
    session,
)
from ..conftest import tool_turn


def fill_owner(owner, *, sessions: int = 2, prefix: str = "chat") -> list:
    """Sessions of ``owner`` with messages (a tool turn, multi-part content), a snapshot,
    metadata everywhere and, on PostgreSQL, an embedding per message."""
    memories = []
    for i in range(sessions):
        memory = Memory.create(
            f"{prefix}-{i}",
            owner=owner,
            namespace="bot",
            title=f"Chat {i}",
            metadata={"customer": f"c-{i}"},
        )
        memory.add_many(
            [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": f"Weather in Oslo? ({i})",
                    "metadata": {"lang": "en"},
                    "idempotency_key": f"q-{i}",
                },
                *tool_turn(f"call_{i}"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Sunny."}],
                    "remember": True,
                },
            ]
        )
        memory.save_snapshot(
            f"Asked about the weather ({i}).",
            upto=2,
            pinned=[{"role": "user", "content": "Task"}],
            metadata={"by": "test"},
        )
        if connection.vendor == "postgresql":
            Embedding.objects.bulk_create(
                Embedding(
                    message_id=m.id,
                    session_id=memory.id,
                    owner_id=memory.owner_id,
                    cursor=m.cursor,
                    role=m.role,
                    model="test-model",
                    dimensions=3,
                    vector=[0.1, 0.2, float(m.cursor)],
                )
                for m in memory.messages()
            )
        memories.append(memory)
    return memories


@pytest.fixture
def alice_memory(user):
    return fill_owner(user)


@pytest.fixture
def bob_memory(other_user):
    return fill_owner(other_user)
