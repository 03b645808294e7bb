"""``Conversation``: the real openai SDK against the local server, the real store behind it."""

from __future__ import annotations

import openai
import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from memory_app import Memory
from memory_app.conversation import Conversation
from memory_app.exceptions import InvalidMessage, MessageTooLarge, SessionNotFound
from memory_app.models import Session
from memory_app.signals import messages_appended

LONG_REPLY = "word " * 100  # 500 bytes


def sync_client(server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, **kwargs)


def async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)


def sent_messages(server, index: int = -1) -> list[dict]:
    return server.requests_to("/chat/completions")[index]["body"]["messages"]


def stored(mem) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in mem.messages()]


def test_send_keeps_the_conversation(mem, openai_server):
    openai_server.reply_with("Hello Ada.", "You are Ada.")
    with sync_client(openai_server) as client:
        chat = Conversation(mem, client, "fake-model", system="Be brief.")
        first = chat.send("I am Ada.")
        second = chat.send("Who am I?", temperature=0)
    assert (first.reply, second.reply, str(second)) == (
        "Hello Ada.",
        "You are Ada.",
        "You are Ada.",
    )
    assert first.ok and second.error is None
    assert sent_messages(openai_server) == [
        {"role": "system", "content": "Be brief."},  # sent every time, never stored
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "Who am I?"},
    ]
    assert openai_server.requests_to("/chat/completions")[-1]["body"]["temperature"] == 0
    assert stored(mem) == [
        ("user", "I am Ada."),
        ("assistant", "Hello Ada."),
        ("user", "Who am I?"),
        ("assistant", "You are Ada."),
    ]
    reply = mem.messages()[-1]
    assert reply.metadata["model"] == "fake-model" and reply.metadata["usage"]["total_tokens"] == 2
    assert second.stored[-1] == reply


def test_context_is_the_window_with_the_snapshot_summary(mem, openai_server):
    mem.add_many([{"role": "user", "content": f"old message number {i}"} for i in range(40)])
    mem.save_snapshot("Ada likes tea.", upto=20)
    with sync_client(openai_server) as client:
        Conversation(mem, client, "fake-model", max_tokens=60).send("What do I like?")
    sent = sent_messages(openai_server)
    assert sent[0] == {
        "role": "user",
        "content": "Summary of the earlier conversation:\nAda likes tea.",
    }
    assert sent[-1] == {"role": "user", "content": "What do I like?"}
    assert "old message number 39" in [m["content"] for m in sent]
    assert "old message number 21" not in [m["content"] for m in sent]  # over the budget


def test_recall_brings_back_an_old_message_outside_the_window(mem, openai_server):
    mem.add({"role": "user", "content": "My cat is called Whiskers."})
    mem.add_many([{"role": "user", "content": f"filler about the weather {i}"} for i in range(80)])
    with sync_client(openai_server) as client:
        Conversation(mem, client, "fake-model", max_tokens=400, recall_k=2).send(
            "What is my cat called?"
        )
    sent = sent_messages(openai_server)
    recalled = [m for m in sent if m["role"] == "system"]
    assert len(recalled) == 1 and "Whiskers" in recalled[0]["content"]
    assert "untrusted" in recalled[0]["content"].lower()
    assert {
        "role": "user",
        "content": "My cat is called Whiskers.",
    } not in sent  # not in the window


def test_asend(mem, openai_server):
    openai_server.reply_with("Hello Ada.", "You are Ada.")

    async def two_turns():
        async with async_client(openai_server) as client:
            chat = Conversation(mem, client, "fake-model")
            await chat.asend("I am Ada.")
            return await chat.asend("Who am I?")

    turn = async_to_sync(two_turns)()
    assert turn.reply == "You are Ada." and turn.ok
    assert stored(mem)[-2:] == [("user", "Who am I?"), ("assistant", "You are Ada.")]
    assert len(sent_messages(openai_server)) == 3


def test_the_client_must_match_the_call(mem, openai_server):
    with sync_client(openai_server) as client, pytest.raises(TypeError, match="AsyncOpenAI"):
        async_to_sync(Conversation(mem, client, "m").asend)("hi")
    with pytest.raises(TypeError, match="openai.OpenAI"):
        Conversation(mem, async_client(openai_server), "m").send("hi")


def test_bad_input_is_refused_before_paying_for_a_model_call(mem, openai_server):
    with sync_client(openai_server) as client:
        with pytest.raises(InvalidMessage):
            Conversation(mem, client, "m").send("NUL \x00 inside")
        with pytest.raises(InvalidMessage):
            Conversation(mem, client, "m", system="   ")
    assert openai_server.requests == [] and mem.count() == 0


def test_a_failed_model_call_stores_nothing(mem, openai_server):
    openai_server.fail_next(1, status=500)
    with sync_client(openai_server) as client:
        chat = Conversation(mem, client, "fake-model")
        with pytest.raises(openai.InternalServerError):
            chat.send("Hello?")
        openai_server.fail_next(1, status=429)
        with pytest.raises(openai.RateLimitError):
            list(chat.stream("Hello?"))
    assert mem.count() == 0


def test_a_storage_failure_returns_the_reply_and_persist_stores_it_exactly_once(mem, openai_server):
    openai_server.reply_with(LONG_REPLY)
    with (
        sync_client(openai_server) as client,
        override_settings(MEMORY_APP={"MAX_MESSAGE_BYTES": 200}),
    ):
        turn = Conversation(mem, client, "fake-model").send("Tell me a lot.")
    assert turn.reply == LONG_REPLY  # paid for, handed over
    assert isinstance(turn.error, MessageTooLarge) and not turn.ok
    assert mem.count() == 0  # neither half of the turn

    stored_first = turn.persist()  # no new model call
    assert turn.error is None and turn.ok
    assert turn.persist() == stored_first  # a repeated retry stores nothing twice
    assert stored(mem) == [("user", "Tell me a lot."), ("assistant", LONG_REPLY)]
    assert len(openai_server.requests_to("/chat/completions")) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_append_receiver_is_a_storage_failure_too(user, openai_server):
    """E.g. the broker is down when a receiver of ``messages_appended`` enqueues work."""
    mem = Memory.session("flaky-broker", owner=user)
    failures = [RuntimeError("broker down")]

    def flaky_receiver(sender, **kwargs):
        if failures:
            raise failures.pop()

    messages_appended.connect(flaky_receiver)
    try:
        openai_server.reply_with("Stored anyway.")
        with sync_client(openai_server) as client:
            turn = Conversation(mem, client, "fake-model").send("Hello?")
        assert isinstance(turn.error, RuntimeError) and mem.count() == 0  # rolled back with it
        turn.persist()
        turn.persist()
    finally:
        messages_appended.disconnect(flaky_receiver)
    assert turn.ok and stored(mem) == [("user", "Hello?"), ("assistant", "Stored anyway.")]


@pytest.mark.django_db(transaction=True)
def test_a_session_deleted_while_the_model_answers(user, openai_server):
    mem = Memory.session("doomed", owner=user)

    def delete_then_answer(request):
        from django.db import connection

        Session.objects.filter(pk=mem.id).delete()  # another process deletes it meanwhile
        connection.close()  # this runs on the server's thread
        return "Too late."

    openai_server.chat_handler = delete_then_answer
    with sync_client(openai_server) as client:
        turn = Conversation(mem, client, "fake-model").send("Hello?")
    assert turn.reply == "Too late." and isinstance(turn.error, SessionNotFound)
    with pytest.raises(SessionNotFound):
        turn.persist()
    assert not Session.objects.filter(pk=mem.id).exists()


def test_stream_yields_pieces_and_stores_the_turn_at_the_end(mem, openai_server):
    openai_server.reply_with("one two three four")
    with sync_client(openai_server) as client:
        turn = Conversation(mem, client, "fake-model").stream("Count.")
        pieces = []
        for piece in turn:
            pieces.append(piece)
            assert mem.count() == 0  # nothing stored while the reply is coming
    assert pieces == ["one ", "two ", "three ", "four"]
    assert turn.completed and turn.ok and turn.reply == "one two three four"
    assert stored(mem) == [("user", "Count."), ("assistant", "one two three four")]
    assert mem.messages()[-1].metadata["finish_reason"] == "stop"


def test_a_stream_cancelled_mid_way_stores_nothing(mem, openai_server):
    openai_server.reply_with("one two three four", "five six seven")
    with sync_client(openai_server) as client:
        chat = Conversation(mem, client, "fake-model")
        turn = chat.stream("Count.")
        assert next(turn) == "one "
        turn.close()
        with chat.stream("Count on.") as other:
            assert next(iter(other)) == "five "
        never_started = chat.stream("Not sent.")
        never_started.close()
    assert not turn.completed and turn.reply == "" and not turn.ok
    assert mem.count() == 0
    assert len(openai_server.requests_to("/chat/completions")) == 2


def test_a_streamed_reply_that_cannot_be_stored_keeps_the_error(mem, openai_server):
    openai_server.reply_with(LONG_REPLY)
    with (
        sync_client(openai_server) as client,
        override_settings(MEMORY_APP={"MAX_MESSAGE_BYTES": 200}),
    ):
        turn = Conversation(mem, client, "fake-model").stream("Tell me a lot.")
        assert "".join(turn) == LONG_REPLY
    assert isinstance(turn.error, MessageTooLarge) and mem.count() == 0
    turn.persist()
    assert stored(mem) == [("user", "Tell me a lot."), ("assistant", LONG_REPLY)]


def test_astream_and_its_cancellation(mem, openai_server):
    openai_server.reply_with("alpha beta gamma", "delta epsilon")

    async def scenario():
        async with async_client(openai_server) as client:
            chat = Conversation(mem, client, "fake-model")
            full = chat.astream("Greek letters?")
            pieces = [piece async for piece in full]
            async with chat.astream("More?") as cancelled:
                first = await cancelled.__anext__()
            return full, pieces, cancelled, first

    full, pieces, cancelled, first = async_to_sync(scenario)()
    assert pieces == ["alpha ", "beta ", "gamma"] and full.ok
    assert first == "delta " and not cancelled.completed and not cancelled.ok
    assert stored(mem) == [("user", "Greek letters?"), ("assistant", "alpha beta gamma")]
