"""LangChain's chat history over the memory store, used by LangChain's own runnables."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

pytest.importorskip("langchain_core")

import openai  # noqa: E402
from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_openai_messages  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.runnables.history import RunnableWithMessageHistory  # noqa: E402

from memory_app import Memory  # noqa: E402
from memory_app.exceptions import InvalidMessage  # noqa: E402
from memory_app.integrations.langchain import DjangoChatMessageHistory  # noqa: E402
from tests.conftest import tool_turn  # noqa: E402
from tests.integrations.conftest import RowLock, cancel_in_flight  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::langchain_core._api.deprecation.LangChainDeprecationWarning"
)

TOOL_CONVERSATION = [
    SystemMessage(content="You are terse.", id="sys-1"),
    HumanMessage(
        content="Weather in Oslo and Rome?",
        name="ada",
        id="h-1",
        additional_kwargs={"client": {"ip": "127.0.0.1"}},
    ),
    AIMessage(
        content="",
        id="run-1",
        tool_calls=[
            {"name": "weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"},
            {
                "name": "weather",
                "args": {"city": "Rome", "units": ["C", "F"]},
                "id": "call_2",
                "type": "tool_call",
            },
        ],
        invalid_tool_calls=[
            {
                "name": "weather",
                "args": "{not json",
                "id": "call_3",
                "error": "bad json",
                "type": "invalid_tool_call",
            }
        ],
        additional_kwargs={"refusal": None, "system_fingerprint": "fp_1"},
        response_metadata={"model_name": "gpt-x", "finish_reason": "tool_calls", "logprobs": None},
        usage_metadata={"input_tokens": 12, "output_tokens": 7, "total_tokens": 19},
    ),
    ToolMessage(content="sunny", tool_call_id="call_1", name="weather", artifact={"raw": [1, 2]}),
    ToolMessage(content=[{"type": "text", "text": "rain"}], tool_call_id="call_2", status="error"),
    AIMessage(
        content=[
            {"type": "thinking", "thinking": "both known"},
            {"type": "text", "text": "Oslo sunny, Rome rain."},
        ],
        id="run-2",
        response_metadata={"model_name": "gpt-x"},
    ),
    HumanMessage(
        content=[
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ]
    ),
    ChatMessage(content="Be careful.", role="developer"),
    FunctionMessage(content="42", name="legacy_fn"),
    AIMessage(content="I can't help with that.", additional_kwargs={"refusal": "policy"}),
]


def test_it_is_a_langchain_chat_history(mem):
    assert isinstance(DjangoChatMessageHistory(mem), BaseChatMessageHistory)


def test_tool_call_conversation_round_trips_losslessly(mem):
    DjangoChatMessageHistory(mem).add_messages(TOOL_CONVERSATION)
    reopened = DjangoChatMessageHistory(mem.key, owner=mem.session.owner, namespace=mem.namespace)
    read = reopened.messages
    assert read == TOOL_CONVERSATION
    assert [type(m) for m in read] == [type(m) for m in TOOL_CONVERSATION]
    assert read[3].artifact == {"raw": [1, 2]} and read[4].status == "error"

    # The stored transcript is ordinary OpenAI chat: what the admin, API and windows see.
    transcript = [m.as_openai() for m in mem.messages()]
    assert transcript[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "type": "function",
                "id": "call_1",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            },
            {
                "type": "function",
                "id": "call_2",
                "function": {
                    "name": "weather",
                    "arguments": '{"city": "Rome", "units": ["C", "F"]}',
                },
            },
        ],
    }
    assert transcript[3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "weather",
        "content": "sunny",
    }
    assert transcript[5] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Oslo sunny, Rome rain."}],
    }
    assert transcript[7] == {"role": "system", "content": "Be careful."}
    assert transcript[8] == {"role": "user", "name": "legacy_fn", "content": "42"}
    assert transcript[9] == {
        "role": "assistant",
        "content": "I can't help with that.",
        "refusal": "policy",
    }
    # Windows built from it keep the tool group whole (calls and both results) or leave it out.
    assert [m["role"] for m in mem.window(max_messages=7).messages][:4] == [
        "system",
        "assistant",
        "tool",
        "tool",
    ]
    assert "tool" not in [m["role"] for m in mem.window(max_messages=6).messages]


def test_async_methods(mem):
    history = DjangoChatMessageHistory(mem)

    async def scenario():
        await history.aadd_messages(TOOL_CONVERSATION[:4])
        first = await history.aget_messages()
        await history.aclear()
        return first, await history.aget_messages()

    first, after_clear = async_to_sync(scenario)()
    assert first == TOOL_CONVERSATION[:4]
    assert after_clear == [] and mem.count() == 0


def test_a_bad_message_stores_nothing_of_the_batch(mem):
    history = DjangoChatMessageHistory(mem)
    with pytest.raises(InvalidMessage):
        history.add_messages([HumanMessage(content="fine"), {"role": "user", "content": "a dict"}])
    with pytest.raises(InvalidMessage):
        history.add_messages(
            [
                HumanMessage(content="fine"),
                AIMessage(content="x", additional_kwargs={"x": object()}),
            ]
        )
    assert mem.count() == 0


def test_messages_stored_by_other_means_are_converted(mem):
    mem.add_many([{"role": "user", "content": "Weather?"}, *tool_turn("call_9", result="sunny")])
    read = DjangoChatMessageHistory(mem).messages
    assert isinstance(read[0], HumanMessage) and read[0].content == "Weather?"
    assert read[1].tool_calls == [
        {"name": "weather", "args": {"city": "Oslo"}, "id": "call_9", "type": "tool_call"}
    ]
    assert isinstance(read[2], ToolMessage) and read[2].tool_call_id == "call_9"


def test_window_mode_reads_what_the_model_should_see(mem):
    mem.add_many(
        [{"role": "system", "content": "Be terse."}]
        + [{"role": "user", "content": f"message {i}"} for i in range(6)]
    )
    mem.save_snapshot("The user counted to three.", upto=4)
    read = DjangoChatMessageHistory(mem, max_messages=2).messages
    assert [type(m) for m in read] == [SystemMessage, HumanMessage, HumanMessage, HumanMessage]
    assert read[1].content.endswith("The user counted to three.")
    assert [m.content for m in read[2:]] == ["message 4", "message 5"]


def open_connections() -> int | None:
    """Client connections to the test database (autovacuum workers, which the server starts on
    its own after many writes, are listed there too and not counted)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def connections_settle_to(expected: int | None, timeout: float = 10) -> int | None:
    """The count of client connections once it is ``expected`` or ``timeout`` has passed: the
    server ends a backend moments after its client closed the connection."""
    deadline = time.monotonic() + timeout
    while (count := open_connections()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


# LangChain reads the history on its own worker threads (``RunnableParallel``), with their own
# database connections: the test's data must be committed for them to see it.
@pytest.mark.django_db(transaction=True)
def test_runnable_with_message_history_over_a_fake_chat_model(user):
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": "weather",
                            "args": {"city": "Oslo"},
                            "id": "c1",
                            "type": "tool_call",
                        }
                    ],
                ),
                AIMessage(content="Nice to meet you, Ada."),
            ]
        )
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be terse."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: DjangoChatMessageHistory(session_id, owner=user, namespace="lc"),
        input_messages_key="question",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "chat-1"}}
    before = open_connections()
    chain.invoke({"question": "Weather in Oslo?"}, config=config)
    chain.invoke({"question": "I am Ada."}, config=config)
    assert connections_settle_to(before) == before  # the worker threads' connections closed
    stored = Memory.session("chat-1", owner=user, namespace="lc").messages()
    assert [(m.role, m.content) for m in stored] == [
        ("user", "Weather in Oslo?"),
        ("assistant", ""),
        ("user", "I am Ada."),
        ("assistant", "Nice to meet you, Ada."),
    ]
    assert stored[1].tool_calls[0]["id"] == "c1"


def test_runnable_with_message_history_async_over_the_openai_sdk(db, user, openai_server):
    """A RunnableLambda calling a real AsyncOpenAI client; the second turn must carry the first."""
    openai_server.reply_with("Hello Ada.", "You are Ada.")
    config = {"configurable": {"session_id": "chat-2"}}

    async def two_turns():
        async with openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="test") as client:

            async def call_model(messages):
                reply = await client.chat.completions.create(
                    model="fake-model", messages=convert_to_openai_messages(messages.to_messages())
                )
                return AIMessage(
                    content=reply.choices[0].message.content,
                    id=reply.id,
                    response_metadata={"model_name": reply.model},
                )

            prompt = ChatPromptTemplate.from_messages(
                [MessagesPlaceholder("history"), ("human", "{question}")]
            )
            chain = RunnableWithMessageHistory(
                prompt | RunnableLambda(call_model),
                # Built inside the event loop: the history opens its session lazily, off the loop.
                lambda session_id: DjangoChatMessageHistory(session_id, owner=user, namespace="lc"),
                input_messages_key="question",
                history_messages_key="history",
            )
            await chain.ainvoke({"question": "I am Ada."}, config=config)
            return await chain.ainvoke({"question": "Who am I?"}, config=config)

    answer = async_to_sync(two_turns)()
    assert answer.content == "You are Ada."
    second_request = openai_server.requests_to("/chat/completions")[1]["body"]["messages"]
    assert second_request == [
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "Who am I?"},
    ]
    history = DjangoChatMessageHistory("chat-2", owner=user, namespace="lc").messages
    assert history[1] == AIMessage(
        content="Hello Ada.", id="chatcmpl-fake", response_metadata={"model_name": "fake-model"}
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("succeed", [True, False], ids=["write-lands", "write-fails"])
def test_a_cancelled_async_add_waits_for_its_outcome(succeed):
    """A cancelled ``aadd_messages`` raises ``CancelledError`` only once its write has ended."""
    history = DjangoChatMessageHistory(Memory.session("lc-cancel", namespace="tests"))
    history.add_messages([HumanMessage(content="first")])
    new = [HumanMessage(content="second"), AIMessage(content="third")]

    async def scenario():
        pending = await cancel_in_flight(
            lambda: history.aadd_messages(new), RowLock(history.memory.id), succeed=succeed
        )
        return pending, [m.content for m in await history.aget_messages()]

    pending, contents = async_to_sync(scenario)()
    assert pending, "the cancelled task was done while its write was still on its way"
    assert contents == (["first", "second", "third"] if succeed else [])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancelled_async_clear_waits_for_its_outcome():
    history = DjangoChatMessageHistory(Memory.session("lc-cancel", namespace="tests"))
    history.add_messages([HumanMessage(content="first")])

    async def scenario():
        return await cancel_in_flight(history.aclear, RowLock(history.memory.id))

    assert async_to_sync(scenario)()
    assert history.messages == []
