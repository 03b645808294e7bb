"""Memory blocks: named, size-limited notes an agent keeps, carried by every window of the
owner's sessions (and a session's own), in one system message outside the budget."""

from __future__ import annotations

import pytest
from django.db import connection

from memory_app import Memory
from memory_app.exceptions import InvalidItem
from memory_app.services.context import BLOCKS_OPEN
from memory_app.tokens import count_message
from memory_app.tools import MemoryTools


def blocks_in(window) -> list[dict]:
    return [m for m in window.messages if BLOCKS_OPEN in str(m.get("content"))]


def test_blocks_are_written_appended_and_limited(learned, settings):
    settings.MEMORY_APP = {"MEMORY_BLOCK_MAX_CHARS": 40, "MEMORY_BLOCKS_MAX": 2}
    learned.write_block("profile", "Ada, vegetarian")
    learned.write_block("profile", "lives in Oslo", append=True)
    [profile] = learned.blocks()
    assert profile.text == "Ada, vegetarian\nlives in Oslo" and profile.limit == 40
    with pytest.raises(InvalidItem, match="MEMORY_BLOCK_MAX_CHARS") as raised:
        learned.write_block("profile", "x" * 30, append=True)  # refused whole, never cut
    assert raised.value.field == "text"
    assert learned.blocks()[0].text == "Ada, vegetarian\nlives in Oslo"
    learned.write_block("tasks", "book the train")
    with pytest.raises(InvalidItem, match="MEMORY_BLOCKS_MAX"):
        learned.write_block("third", "no room")
    for name in ("has space", "", "x" * 65, "dot.ted"):
        with pytest.raises(InvalidItem) as raised:
            learned.write_block(name, "x")
        assert raised.value.field == "name"
    assert learned.delete_block("tasks") is True and learned.delete_block("tasks") is False
    assert [b.name for b in learned.blocks()] == ["profile"]


def test_every_window_carries_the_blocks_outside_the_budget(learned, chat, user, other_user):
    chat.add_many(
        [{"role": "system", "content": "You are helpful."}]
        + [{"role": "user", "content": f"turn {i}"} for i in range(4)]
    )
    plain = chat.window(max_tokens=30)
    learned.write_block("profile", "Ada <b>likes</b> tea")
    chat.learned.write_block("task", "find a train to Bergen", scope="session")
    Memory.learned(other_user).write_block("profile", "Bob, not Ada")
    Memory.session("other", owner=user).learned.write_block(
        "task", "another chat's", scope="session"
    )

    window = chat.window(max_tokens=30)
    [block] = blocks_in(window)
    assert window.messages.index(block) == 1  # right after the stored system message
    assert window.cursors[1] is None
    text = block["content"]
    assert text.index('name="profile" scope="owner"') < text.index('name="task" scope="session"')
    assert "Bob" not in text and "another chat" not in text
    assert "<b>" not in text and "\\u003cb\\u003e" in text  # quoted: no tag of its own
    assert [b.name for b in window.blocks] == ["profile", "task"]
    # Outside the budget, inside the total; the conversation fits as before.
    assert window.budget_tokens == plain.budget_tokens
    assert window.tokens == plain.tokens + count_message(block)
    assert window.messages[2:] == plain.messages[1:]


def test_ownerless_sessions_carry_their_own_blocks_only(db):
    service = Memory.session("service", namespace="bots")
    with pytest.raises(InvalidItem):
        service.learned.write_block("persona", "a bot")  # no owner: no owner-level blocks
    service.learned.write_block("persona", "a helpful bot", scope="session")
    other = Memory.session("service-2", namespace="bots")
    service.add({"role": "user", "content": "hi"})
    other.add({"role": "user", "content": "hi"})
    assert [b.name for b in service.window().blocks] == ["persona"]
    assert [b.name for b in service.blocks()] == ["persona"]
    assert other.window().blocks == () and other.blocks() == []


def test_the_blocks_cost_the_window_no_query(learned, chat, django_assert_num_queries):
    if connection.vendor != "postgresql":
        pytest.skip("the window's two statements are PostgreSQL's")
    chat.add_many([{"role": "user", "content": f"turn {i}"} for i in range(5)])
    learned.write_block("profile", "Ada")
    with django_assert_num_queries(2):
        assert chat.window(max_tokens=1000).blocks


def test_the_agent_edits_its_blocks_with_the_memory_tool(user, chat):
    tools = MemoryTools(user, session_id=chat.id)
    said = tools.edit_memory_block("profile", "Prefers the window seat")
    assert said == "Block 'profile' saved (23 of 2000 characters)."
    tools.edit_memory_block("profile", "Vegetarian", append=True)
    [block] = blocks_in(chat.window())
    assert "Prefers the window seat\\nVegetarian" in block["content"]
    with pytest.raises(InvalidItem):
        tools.edit_memory_block("profile", "x", append="yes")


def test_a_sessions_blocks_go_with_it_and_the_owners_stay(learned, chat, user):
    learned.write_block("profile", "Ada")
    chat.learned.write_block("profile", "Ada, from this chat", scope="owner")  # the owner's
    chat.learned.write_block("task", "this chat's task", scope="session")
    fact = chat.learned.remember("Ada keeps bees")
    chat.clear()
    assert [b.name for b in learned.blocks()] == ["profile"]
    assert chat.learned.blocks(scope="session") == []
    chat.learned.write_block("task", "again", scope="session")
    erased = chat.delete()
    assert erased is None
    assert chat.learned.blocks(scope="session") == []
    assert [b.text for b in learned.blocks()] == ["Ada, from this chat"]
    # Facts learned in a session are the owner's: they outlive it, without the link.
    [kept] = learned.current()
    assert kept.key == fact.key and kept.session_id is None
    export = Memory.export_owner(user)
    assert {i["kind"] for i in export["items"]} == {"memory", "block"}
    assert Memory.erase_owner(user).items == 2
    assert learned.current() == [] and learned.blocks() == []
