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
from memory_app.integrations.agents import MemorySession  # noqa: E402
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
    {"role": "user", "type": "message", "content": [
        {"type": "input_text", "text": "And this picture?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}]},
    {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Need the tool."}],
     "encrypted_content": "gAAAAB-opaque", "content": [{"type": "reasoning_text", "text": "think"}]},
    {"arguments": '{"city": "Oslo"}', "call_id": "call_1", "name": "weather", "type": "function_call",
     "id": "fc_1", "status": "completed", "provider_data": {"model": "m", "response_id": "r1"}},
    {"arguments": '{"city": "Bergen"}', "call_id": "call_2", "name": "weather", "type": "function_call"},
    {"call_id": "call_1", "output": "sunny, 21 °C", "type": "function_call_output"},
    {"call_id": "call_2", "type": "function_call_output",
     "output": [{"type": "input_text", "text": "rain"}, {"type": "input_text", "text": "12 °C"}]},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "oslo weather"}},
    {"type": "custom_tool_call", "call_id": "call_3", "name": "sql", "input": "SELECT 1"},
    {"type": "custom_tool_call_output", "call_id": "call_3", "output": "1"},
    {"id": "msg_1", "role": "assistant", "status": "completed", "type": "message", "content": [
        {"type": "output_text", "text": "Sunny in Oslo, rain in Bergen.", "annotations": [], "logprobs": []},
        {"type": "refusal", "refusal": "I cannot describe the picture."}]},
]


def sdk_model(openai_server) -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(
        model="fake-model", openai_client=AsyncOpenAI(base_url=openai_server.base_url, api_key="test"))


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
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_2", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 °C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain\n12 °C"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_3", "type": "function", "function": {
            "name": "sql", "arguments": "SELECT 1"}}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "1"},
        {"role": "assistant", "content": "Sunny in Oslo, rain in Bergen.\nI cannot describe the picture."},
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
    mem.add_many([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c9", "content": "sunny"},
    ])
    session = MemorySession(mem)
    assert async_to_sync(session.get_items)() == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c9", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
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
        {**tool_call_reply("get_weather", {"city": "Oslo"}, call_id="call_w"), "reasoning_content": "Use the tool."},
        "Sunny in Oslo.",
    )
    agent = Agent(name="a", instructions="Be brief.", model=sdk_model(openai_server), tools=[get_weather])
    session = MemorySession(mem)
    result = async_to_sync(Runner.run)(agent, "Weather in Oslo?", session=session)
    assert result.final_output == "Sunny in Oslo."
    items = async_to_sync(session.get_items)()
    assert [i.get("type") or i.get("role") for i in items] == [
        "user", "reasoning", "function_call", "function_call_output", "message"]
    assert items[1]["summary"] == [{"type": "summary_text", "text": "Use the tool."}]
    assert items[3] == {"call_id": "call_w", "output": "It is sunny and 21 °C in Oslo.",
                        "type": "function_call_output"}
    assert [m.role for m in mem.messages()] == ["user", "assistant", "assistant", "tool", "assistant"]
    assert mem.messages()[-1].content == "Sunny in Oslo."


@pytest.mark.django_db(transaction=True)
def test_a_second_process_resumes_the_conversation(openai_server):
    """First turn here, second turn in a new Python process running the example script."""
    session = MemorySession.open("agents-demo", namespace="examples")
    openai_server.reply_with(tool_call_reply("get_weather", {"city": "Oslo"}, call_id="call_o"),
                             "Hello Ada, it is sunny in Oslo.")
    agent = Agent(name="assistant", instructions="x", model=sdk_model(openai_server), tools=[get_weather])
    async_to_sync(Runner.run)(agent, "My name is Ada. Weather in Oslo?", session=session)
    first_turn = async_to_sync(session.get_items)()
    assert len(first_turn) == 4

    openai_server.requests.clear()
    openai_server.reply_with("Your name is Ada.")
    out = run_example("agents_session.py", "What is my name?", "--session", "agents-demo",
                      openai_server=openai_server)
    assert "Your name is Ada." in out.stdout

    # The other process sent this process's history to the model...
    sent = openai_server.requests_to("/chat/completions")[0]["body"]["messages"]
    assert [m.get("content") for m in sent if m["role"] == "user"] == [
        "My name is Ada. Weather in Oslo?", "What is my name?"]
    assert any(m.get("tool_calls") for m in sent) and any(m["role"] == "tool" for m in sent)
    # ... and stored its own turn after it.
    items = async_to_sync(session.get_items)()
    assert items[:4] == first_turn
    assert items[4:] == [
        {"content": "What is my name?", "role": "user"},
        {"id": items[5]["id"], "content": [{"annotations": [], "text": "Your name is Ada.",
                                            "type": "output_text", "logprobs": []}],
         "role": "assistant", "status": "completed", "type": "message",
         "provider_data": items[5]["provider_data"]},
    ]
    assert Memory.session("agents-demo", namespace="examples").count() == 6
