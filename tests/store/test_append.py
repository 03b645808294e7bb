"""Appending: validation, gapless cursors, atomic batches, idempotency keys."""

import pytest
from django.test import override_settings

from memory_app import Memory
from memory_app.exceptions import InvalidMessage, MessageTooLarge, SessionNotFound
from memory_app.models import Message, Session
from memory_app.tokens import count_message
from tests.conftest import tool_turn


def test_cursors_are_gapless_across_single_and_batch_appends(mem):
    first = mem.add({"role": "user", "content": "one"})
    batch = mem.add_many(
        [{"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}]
    )
    last = mem.add({"role": "assistant", "content": "four"})
    assert [first.cursor, *(m.cursor for m in batch), last.cursor] == [1, 2, 3, 4]
    assert [m.content for m in mem.messages()] == ["one", "two", "three", "four"]
    session = Session.objects.get(pk=mem.id)
    assert (session.next_seq, session.message_count) == (5, 4)


def test_stored_message_keeps_every_openai_field(mem):
    call, result = tool_turn("call_9")
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]
    stored = mem.add_many(
        [
            {"role": "user", "content": parts, "name": "ada", "metadata": {"lang": "en"}},
            call,
            result,
            {"role": "assistant", "content": "", "extra": {"refusal": "no"}},
        ]
    )
    assert stored[0].as_openai() == {"role": "user", "content": parts, "name": "ada"}
    assert stored[0].content == "look" and stored[0].metadata == {"lang": "en"}
    assert stored[1].as_openai() == call
    assert stored[2].as_openai() == result
    assert stored[3].as_openai() == {"role": "assistant", "content": "", "refusal": "no"}
    assert [m.as_openai() for m in mem.messages()] == [m.as_openai() for m in stored]


def test_token_count_is_cached_and_counted_on_session(mem):
    message = {"role": "user", "content": "How many tokens is this sentence?"}
    stored = mem.add(message)
    assert stored.tokens == count_message(message) > 3
    assert Session.objects.get(pk=mem.id).token_count == stored.tokens


def test_a_message_of_more_tokens_than_the_tokenizers_chunk_limit_is_counted(mem):
    # 60,000 characters outside the tokenizer's merges (four byte tokens each): 240 KB, within
    # MAX_MESSAGE_BYTES, yet 240,000 tokens, more than bpe-openai's encode() takes at once.
    message = {"role": "user", "content": "\U00010000" * 60_000}
    stored = mem.add(message)
    assert stored.tokens == count_message(message) == 3 + 1 + 240_000
    assert Session.objects.get(pk=mem.id).token_count == stored.tokens
    assert mem.window(max_tokens=stored.tokens)[-1]["content"] == message["content"]


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("not a dict", "message"),
        ({"role": "wizard", "content": "x"}, "role"),
        ({"role": "user"}, "content"),
        ({"role": "user", "content": 5}, "content"),
        ({"role": "user", "content": []}, "content"),
        ({"role": "user", "content": [{"type": "text"}]}, "content"),
        ({"role": "user", "content": "x", "colour": "red"}, "colour"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}, "tool_calls"),
        ({"role": "assistant", "content": None, "tool_calls": "call"}, "tool_calls"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]},
            "tool_calls",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
            },
            "tool_calls",
        ),
        ({"role": "assistant", "content": None}, "content"),
        ({"role": "user", "content": "x", "name": 7}, "name"),
        ({"role": "user", "content": "x", "metadata": []}, "metadata"),
        ({"role": "user", "content": "x", "remember": "yes"}, "remember"),
        ({"role": "user", "content": "x", "idempotency_key": ""}, "idempotency_key"),
        ({"role": "user", "content": "bad\x00byte"}, "content"),
    ],
)
def test_invalid_messages_name_the_field_and_store_nothing(mem, message, field):
    with pytest.raises(InvalidMessage) as err:
        mem.add(message)
    assert err.value.field == field
    assert mem.count() == 0 and not Message.objects.exists()


def test_a_batch_with_one_bad_message_stores_none(mem):
    mem.add({"role": "user", "content": "kept"})
    with pytest.raises(InvalidMessage) as err:
        mem.add_many([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    assert err.value.index == 1 and err.value.field == "role"
    assert [m.content for m in mem.messages()] == ["kept"]
    assert mem.add({"role": "user", "content": "next"}).cursor == 2


@override_settings(MEMORY_APP={"MAX_MESSAGE_BYTES": 100})
def test_oversized_message_is_refused_not_truncated(mem):
    with pytest.raises(MessageTooLarge, match="limit is 100"):
        mem.add({"role": "user", "content": "x" * 101})
    assert mem.add({"role": "user", "content": "x" * 50}).content == "x" * 50


@override_settings(MEMORY_APP={"MAX_BATCH_SIZE": 3})
def test_batch_size_limit(mem):
    with pytest.raises(InvalidMessage, match="at most 3"):
        mem.add_many([{"role": "user", "content": str(i)} for i in range(4)])
    with pytest.raises(InvalidMessage, match="empty"):
        mem.add_many([])


def test_idempotency_key_returns_the_original(mem):
    original = mem.add({"role": "user", "content": "pay 10 EUR", "idempotency_key": "req-1"})
    retried = mem.add({"role": "user", "content": "pay 10 EUR", "idempotency_key": "req-1"})
    assert retried == original
    batch = mem.add_many(
        [
            {"role": "user", "content": "pay 10 EUR", "idempotency_key": "req-1"},
            {"role": "user", "content": "new", "idempotency_key": "req-2"},
        ]
    )
    assert batch[0] == original and batch[1].cursor == 2
    assert mem.count() == 2 and mem.add({"role": "user", "content": "x"}).cursor == 3
    with pytest.raises(InvalidMessage, match="repeated"):
        mem.add_many(
            [
                {"role": "user", "content": "a", "idempotency_key": "k"},
                {"role": "user", "content": "b", "idempotency_key": "k"},
            ]
        )


def test_idempotency_keys_are_per_session(mem, user):
    other = Memory.session("another", owner=user, namespace="tests")
    a = mem.add({"role": "user", "content": "x", "idempotency_key": "same"})
    b = other.add({"role": "user", "content": "x", "idempotency_key": "same"})
    assert a.id != b.id


def test_append_to_deleted_session_raises(mem):
    Session.objects.filter(pk=mem.id).delete()
    with pytest.raises(SessionNotFound):
        mem.add({"role": "user", "content": "lost?"})
    assert not Message.objects.exists()


def test_a_message_read_back_can_be_stored_or_pinned_again(mem):
    stored = mem.add(
        {"role": "assistant", "content": "", "extra": {"refusal": "I can't help with that."}}
    )
    again = stored.as_openai()
    assert again == {"role": "assistant", "content": "", "refusal": "I can't help with that."}
    copy = mem.add(again)  # OpenAI's own fields are accepted at the top level, kept in extra
    assert copy.extra == {"refusal": "I can't help with that."} and copy.as_openai() == again
    mem.save_snapshot("refused", upto=1, prev=None, pinned=[again])
    assert mem.latest_snapshot().pinned == [again]


@pytest.mark.django_db
def test_appending_by_id_checks_the_owner_in_the_append_itself(user, other_user):
    mine = Memory.session("by-id", owner=user)
    ownerless = Memory.session("by-id", owner=None)
    stored = Memory.add(mine.id, {"role": "user", "content": "hello"}, owner=user)
    assert stored.cursor == 1
    batch = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert [m.cursor for m in Memory.add_many(str(mine.id), batch, owner=user)] == [2, 3]
    # Another owner, the ownerless scope, a malformed id: not found, and nothing stored.
    for owner, session_id in ((other_user, mine.id), (None, mine.id), (user, "not-a-uuid")):
        with pytest.raises(SessionNotFound):
            Memory.add(session_id, {"role": "user", "content": "intruder"}, owner=owner)
    with pytest.raises(SessionNotFound):  # keyed appends are checked too
        Memory.add(mine.id, {"role": "user", "content": "x", "idempotency_key": "k"}, owner=None)
    assert mine.count() == 3 and mine.refresh().session.next_seq == 4
    assert Memory.add(ownerless.id, {"role": "user", "content": "mine"}, owner=None).cursor == 1
    with pytest.raises(SessionNotFound):
        Memory.add(ownerless.id, {"role": "user", "content": "no"}, owner=user)
