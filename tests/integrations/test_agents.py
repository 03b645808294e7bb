"""The OpenAI Agents SDK ``Session`` over the memory store, driven by the SDK's own ``Runner``."""

from __future__ import annotations

import copy

import pytest
from asgiref.sync import async_to_sync

pytest.importorskip("agents")

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory import Session as SessionProtocol  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from memory_app import Memory  # noqa: E402
from memory_app.exceptions import InvalidMessage  # noqa: E402
from memory_app.integrations.agents import CompactingMemorySession, MemorySession  # noqa: E402
from tests.integrations.conftest import run_example  # noqa: E402
from tests.openai_server import tool_call_reply  # noqa: E402

set_tracing_disabled(True)

#: A tool-using turn as the SDK records it, with the awkward parts: multi-part input, an image,
#: provider data, a reasoning item with encrypted content, a structured tool output, a refusal,
#: a hosted tool call without a call id, and a custom tool call.
SDK_ITEMS = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Answer in English."},
    {"content": "What is the weather in Oslo?", "role": "user"},
    {
        "role": "user",
        "type": "message",
        "content": [
            {"type": "input_text", "text": "And this picture?"},
            {
                "type": "input_image",
                "image_url": "data:image/png;base64,iVBORw0KGgo=",
                "detail": "low",
            },
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Need the tool."}],
        "encrypted_content": "gAAAAB-opaque",
        "content": [{"type": "reasoning_text", "text": "think"}],
    },
    {
        "arguments": '{"city": "Oslo"}',
        "call_id": "call_1",
        "name": "weather",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
        "provider_data": {"model": "m", "response_id": "r1"},
    },
    {
        "arguments": '{"city": "Bergen"}',
        "call_id": "call_2",
        "name": "weather",
        "type": "function_call",
    },
    {"call_id": "call_1", "output": "sunny, 21 °C", "type": "function_call_output"},
    {
        "call_id": "call_2",
        "type": "function_call_output",
        "output": [{"type": "input_text", "text": "rain"}, {"type": "input_text", "text": "12 °C"}],
    },
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "oslo weather"},
    },
    {"type": "custom_tool_call", "call_id": "call_3", "name": "sql", "input": "SELECT 1"},
    {"type": "custom_tool_call_output", "call_id": "call_3", "output": "1"},
    {
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "type": "message",
        "content": [
            {
                "type": "output_text",
                "text": "Sunny in Oslo, rain in Bergen.",
                "annotations": [],
                "logprobs": [],
            },
            {"type": "refusal", "refusal": "I cannot describe the picture."},
        ],
    },
]


def sdk_model(openai_server) -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(
        model="fake-model",
        openai_client=AsyncOpenAI(base_url=openai_server.base_url, api_key="test"),
    )


@function_tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"It is sunny and 21 °C in {city}."


def test_it_is_an_agents_sdk_session(mem):
    session = MemorySession(mem, session_settings={"limit": 3})
    assert isinstance(session, SessionProtocol)
    assert session.session_id == str(mem.id)
    assert session.session_settings.limit == 3


def test_items_round_trip_losslessly_and_read_as_a_chat_transcript(mem):
    session = MemorySession(mem)
    items = copy.deepcopy(SDK_ITEMS)
    async_to_sync(session.add_items)(items)
    assert items == SDK_ITEMS  # the caller's items are not changed
    reopened = MemorySession.open(mem.key, owner=mem.session.owner, namespace=mem.namespace)
    assert async_to_sync(reopened.get_items)() == SDK_ITEMS

    # What the admin and the API show: the closest chat messages, one per item.
    transcript = [m.as_openai() for m in mem.messages()]
    assert transcript == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "user", "content": "And this picture?"},
        {"role": "assistant", "content": ""},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Bergen"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 °C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain\n12 °C"},
        {"role": "assistant", "content": ""},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "sql", "arguments": "SELECT 1"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "1"},
        {
            "role": "assistant",
            "content": "Sunny in Oslo, rain in Bergen.\nI cannot describe the picture.",
        },
    ]
    # Text already in the message is not stored twice in the kept item.
    assert "output" not in mem.messages()[7].metadata["agents_item"]["item"]


def test_limit_pop_and_clear(mem):
    session = MemorySession(mem, session_settings={"limit": 2})
    async_to_sync(session.add_items)(copy.deepcopy(SDK_ITEMS))
    assert async_to_sync(session.get_items)() == SDK_ITEMS[-2:]  # the settings' default limit
    assert async_to_sync(session.get_items)(4) == SDK_ITEMS[-4:]
    assert async_to_sync(session.get_items)(0) == []
    assert async_to_sync(session.get_items)(-1) == SDK_ITEMS

    last_cursor = mem.messages()[-1].cursor
    assert async_to_sync(session.pop_item)() == SDK_ITEMS[-1]
    assert async_to_sync(session.get_items)(100) == SDK_ITEMS[:-1]
    async_to_sync(session.add_items)([{"role": "user", "content": "again"}])
    assert mem.messages()[-1].cursor == last_cursor + 1  # the popped cursor is not reused

    async_to_sync(session.clear_session)()
    assert async_to_sync(session.get_items)() == []
    assert async_to_sync(session.pop_item)() is None


def test_bad_items_store_nothing(mem):
    session = MemorySession(mem)
    with pytest.raises(InvalidMessage):
        async_to_sync(session.add_items)([{"role": "user", "content": "fine"}, "not an item"])
    with pytest.raises(InvalidMessage):
        async_to_sync(session.add_items)([{"role": "user", "content": "NUL \x00 inside"}])
    assert mem.count() == 0


def test_messages_stored_by_other_means_become_items(mem, openai_server):
    mem.add_many(
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "c9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c9", "content": "sunny"},
        ]
    )
    session = MemorySession(mem)
    assert async_to_sync(session.get_items)() == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "c9",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call_output", "call_id": "c9", "output": "sunny"},
    ]
    # ... which the SDK accepts as history for its next run.
    agent = Agent(name="a", instructions="Be brief.", model=sdk_model(openai_server))
    async_to_sync(Runner.run)(agent, "Thanks!", session=session)
    sent = openai_server.requests_to("/chat/completions")[-1]["body"]["messages"]
    # The SDK sends the reply's text and its tool call as two assistant messages, in order.
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "assistant", "tool", "user"]
    assert sent[2]["content"] == "Checking." and sent[3]["tool_calls"][0]["id"] == "c9"


def test_runner_tool_loop_is_stored_losslessly(mem, openai_server):
    openai_server.reply_with(
        {
            **tool_call_reply("get_weather", {"city": "Oslo"}, call_id="call_w"),
            "reasoning_content": "Use the tool.",
        },
        "Sunny in Oslo.",
    )
    agent = Agent(
        name="a", instructions="Be brief.", model=sdk_model(openai_server), tools=[get_weather]
    )
    session = MemorySession(mem)
    result = async_to_sync(Runner.run)(agent, "Weather in Oslo?", session=session)
    assert result.final_output == "Sunny in Oslo."
    items = async_to_sync(session.get_items)()
    assert [i.get("type") or i.get("role") for i in items] == [
        "user",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[1]["summary"] == [{"type": "summary_text", "text": "Use the tool."}]
    assert items[3] == {
        "call_id": "call_w",
        "output": "It is sunny and 21 °C in Oslo.",
        "type": "function_call_output",
    }
    assert [m.role for m in mem.messages()] == [
        "user",
        "assistant",
        "assistant",
        "tool",
        "assistant",
    ]
    assert mem.messages()[-1].content == "Sunny in Oslo."


@pytest.mark.django_db(transaction=True)
def test_a_second_process_resumes_the_conversation(openai_server):
    """First turn here, second turn in a new Python process running the example script."""
    session = MemorySession.open("agents-demo", namespace="examples")
    openai_server.reply_with(
        tool_call_reply("get_weather", {"city": "Oslo"}, call_id="call_o"),
        "Hello Ada, it is sunny in Oslo.",
    )
    agent = Agent(
        name="assistant", instructions="x", model=sdk_model(openai_server), tools=[get_weather]
    )
    async_to_sync(Runner.run)(agent, "My name is Ada. Weather in Oslo?", session=session)
    first_turn = async_to_sync(session.get_items)()
    assert len(first_turn) == 4

    openai_server.requests.clear()
    openai_server.reply_with("Your name is Ada.")
    out = run_example(
        "agents_session.py",
        "What is my name?",
        "--session",
        "agents-demo",
        openai_server=openai_server,
    )
    assert "Your name is Ada." in out.stdout

    # The other process sent this process's history to the model...
    sent = openai_server.requests_to("/chat/completions")[0]["body"]["messages"]
    assert [m.get("content") for m in sent if m["role"] == "user"] == [
        "My name is Ada. Weather in Oslo?",
        "What is my name?",
    ]
    assert any(m.get("tool_calls") for m in sent) and any(m["role"] == "tool" for m in sent)
    # ... and stored its own turn after it.
    items = async_to_sync(session.get_items)()
    assert items[:4] == first_turn
    assert items[4:] == [
        {"content": "What is my name?", "role": "user"},
        {
            "id": items[5]["id"],
            "content": [
                {
                    "annotations": [],
                    "text": "Your name is Ada.",
                    "type": "output_text",
                    "logprobs": [],
                }
            ],
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "provider_data": items[5]["provider_data"],
        },
    ]
    assert Memory.session("agents-demo", namespace="examples").count() == 6


# ---- compaction through the store's snapshots ------------------------------------------------
SUMMARY_START = "Summary of the earlier conversation:\n"


@pytest.fixture
def summarizing_server(openai_server, settings):
    """The test server answers the agent as "Noted N." and the store's summarizer with a summary."""
    settings.MEMORY_APP = {
        "OPENAI": {
            "base_url": openai_server.base_url,
            "api_key": "test",
            "max_retries": 0,
            "timeout": 20,
        },
        "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
        "SUMMARIZER_OPTIONS": {"model": "test-summarizer", "max_tokens": 200},
        "SUMMARIZE_THRESHOLD_TOKENS": None,  # only the session's own budget asks for compaction
    }
    summaries = []

    def answer(request):
        if request["model"] == "test-summarizer":
            summaries.append(f"Ada is planning a trip (summary {len(summaries) + 1}).")
            return summaries[-1]
        return f"Noted {len(openai_server.requests_to('/chat/completions'))}."

    openai_server.chat_handler = answer
    openai_server.summaries = summaries
    return openai_server


def agent_requests(server) -> list[list[dict]]:
    return [
        r["body"]["messages"]
        for r in server.requests_to("/chat/completions")
        if r["body"]["model"] == "fake-model"
    ]


def test_a_long_runner_conversation_is_summarized_and_the_model_input_stays_bounded(
    mem, summarizing_server
):
    session = CompactingMemorySession(mem, max_messages=6, keep_recent=2)
    agent = Agent(name="a", instructions="Be brief.", model=sdk_model(summarizing_server))

    async def conversation():  # one event loop for the agent's HTTP client
        for turn in range(1, 13):
            await Runner.run(agent, f"Turn {turn}: tell me about stop {turn}.", session=session)

    async_to_sync(conversation)()

    sent = agent_requests(summarizing_server)
    assert len(sent) == 12
    # Turns 1-4 see the whole history. Storing turn 4's input overflows the window (7 messages),
    # so the store folds everything but the newest 2 messages into a summary before turn 5.
    assert [len(m) for m in sent[:4]] == [2, 4, 6, 8]
    assert sent[4][0] == {"role": "system", "content": "Be brief."}
    assert sent[4][1] == {
        "role": "user",
        "content": SUMMARY_START + "Ada is planning a trip (summary 1).",
    }
    assert [m["content"] for m in sent[4][2:]] == [
        "Noted 3.",
        "Turn 4: tell me about stop 4.",
        "Noted 5.",
        "Turn 5: tell me about stop 5.",
    ]  # request 4 was the summary
    # From then on every request is instructions + summary + at most 6 messages + the new input,
    # however long the conversation grows, and starts with the latest summary.
    for messages in sent[4:]:
        assert len(messages) <= 1 + 1 + 6 + 1
        assert messages[1]["content"].startswith(SUMMARY_START)
    latest = summarizing_server.summaries[-1]
    assert len(summarizing_server.summaries) > 1
    assert sent[-1][1]["content"] == SUMMARY_START + latest
    assert sent[-1][-1]["content"] == "Turn 12: tell me about stop 12."
    # The summarizer updated the previous summary with the newly covered messages.
    last_summarizer_request = [
        r["body"]
        for r in summarizing_server.requests_to("/chat/completions")
        if r["body"]["model"] == "test-summarizer"
    ][-1]
    assert (
        "Current summary:\nAda is planning a trip"
        in last_summarizer_request["messages"][1]["content"]
    )

    # The log keeps every item (the admin and the API show the whole conversation) ...
    assert mem.count() == 24
    assert mem.latest_snapshot().version == len(summarizing_server.summaries)
    # ... and the session hands the SDK the window: summary item first, items after it.
    items = async_to_sync(session.get_items)()
    assert items[0] == {"role": "user", "content": SUMMARY_START + latest}
    assert len(items) <= 1 + 6
    assert items[-1]["role"] == "assistant" and items[-1]["type"] == "message"
    # An explicit limit reads the log's tail, as the SDK does to check its own writes.
    assert async_to_sync(session.get_items)(2) == async_to_sync(MemorySession(mem).get_items)()[-2:]


def test_run_compaction_forces_a_summary_and_a_token_budget_bounds_the_window(
    mem, summarizing_server
):
    session = CompactingMemorySession(mem, max_tokens=400, keep_recent=2)
    items = [{"role": "user", "content": f"Message {n} " + "word " * 20} for n in range(1, 7)]
    async_to_sync(session.add_items)(items)
    assert async_to_sync(session.get_items)() == items  # within budget: nothing summarized
    assert mem.latest_snapshot() is None

    async_to_sync(session.run_compaction)({"force": True})
    snapshot = mem.latest_snapshot()
    assert snapshot.upto == mem.messages()[-3].cursor  # all but keep_recent=2
    assert async_to_sync(session.get_items)() == [
        {"role": "user", "content": SUMMARY_START + summarizing_server.summaries[-1]},
        *items[-2:],
    ]
    assert mem.count() == 6  # nothing is lost from the log

    # Without force, run_compaction (the Runner's hook) only compacts when the window overflows.
    async_to_sync(session.run_compaction)({"response_id": "resp_1", "force": False})
    assert mem.latest_snapshot().version == snapshot.version
    more = [{"role": "user", "content": f"Later {n} " + "word " * 60} for n in range(1, 6)]
    async_to_sync(session.add_items)(more)  # overflows 400 tokens: compacted after the append
    assert mem.latest_snapshot().version == snapshot.version + 1
    window = async_to_sync(session.get_items)()
    assert window[0]["content"].startswith(SUMMARY_START) and window[1:] == more[-2:]
    assert mem.window(max_tokens=400).budget_tokens <= 400


def test_compacting_session_options_are_checked(mem):
    with pytest.raises(ValueError, match="max_tokens must be a non-negative integer"):
        CompactingMemorySession(mem, max_tokens=-1)
    with pytest.raises(ValueError, match="keep_recent"):
        CompactingMemorySession(mem, keep_recent="2")
    with pytest.raises(TypeError, match="^Unknown session settings: limitt$"):
        CompactingMemorySession.open("other", session_settings={"limitt": 1}, max_messages=4)
    opened = CompactingMemorySession.open(
        mem.key, owner=mem.session.owner, namespace=mem.namespace, max_messages=4, keep_recent=1
    )
    assert (opened.max_messages, opened.keep_recent, opened.memory.id) == (4, 1, mem.id)
