"""The fake server speaks the protocol the real openai SDK expects."""

import openai
import pytest


def client(server, **kwargs):
    return openai.OpenAI(base_url=server.base_url, api_key="test", **kwargs)


def test_chat_completion_and_embeddings(openai_server):
    c = client(openai_server)
    reply = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello there"}]
    )
    assert reply.choices[0].message.content == "Digest: hello there"
    emb = c.embeddings.create(model="e", input=["red apple", "red apple pie", "quantum physics"])
    a, b, q = (d.embedding for d in emb.data)
    dot = lambda x, y: sum(i * j for i, j in zip(x, y, strict=True))  # noqa: E731
    assert dot(a, b) > dot(a, q)


def test_streaming_and_failures(openai_server):
    openai_server.reply_with("one two three")
    chunks = client(openai_server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "one two three"
    openai_server.fail_next(1, status=500)
    with pytest.raises(openai.InternalServerError):
        client(openai_server, max_retries=0).embeddings.create(model="e", input="x")
    # The SDK's own retry gets through once the failure is spent.
    openai_server.fail_next(1, status=500)
    assert client(openai_server, max_retries=1).embeddings.create(model="e", input="x").data


def test_canned_tool_call_replies_plain_and_streamed(openai_server):
    from tests.openai_server import tool_call_reply

    openai_server.reply_with(
        tool_call_reply("weather", {"city": "Oslo"}, call_id="c1"),
        tool_call_reply("weather", {"city": "Rome"}, call_id="c2"),
    )
    msg = client(openai_server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    assert msg.choices[0].finish_reason == "tool_calls"
    call = msg.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == (
        "c1",
        "weather",
        '{"city": "Oslo"}',
    )
    chunks = list(
        client(openai_server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(tc.id, tc.function.arguments) for tc in calls] == [("c2", '{"city": "Rome"}')]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
