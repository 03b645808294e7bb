"""The examples run as their own processes and pick up a conversation stored before them."""

from __future__ import annotations

import pytest

from memory_app import Memory
from tests.integrations.conftest import run_example


@pytest.mark.django_db(transaction=True)
def test_conversation_example_resumes_and_streams(openai_server):
    Memory.session("conversation-demo", namespace="examples").add_many(
        [
            {"role": "user", "content": "Hi, I am Ada."},
            {"role": "assistant", "content": "Hello Ada!"},
        ]
    )
    openai_server.reply_with("Your name is Ada.")
    out = run_example("conversation.py", "What is my name?", openai_server=openai_server)
    assert out.stdout.startswith("Your name is Ada.\n")
    sent = openai_server.requests_to("/chat/completions")[0]["body"]
    assert sent["stream"] is True
    assert [m["content"] for m in sent["messages"][1:]] == [
        "Hi, I am Ada.",
        "Hello Ada!",
        "What is my name?",
    ]
    assert Memory.session("conversation-demo", namespace="examples").count() == 4


@pytest.mark.django_db(transaction=True)
def test_langchain_example_resumes(openai_server):
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage

    from memory_app.integrations.langchain import DjangoChatMessageHistory

    DjangoChatMessageHistory("langchain-demo", namespace="examples").add_messages(
        [HumanMessage(content="Hi, I am Ada."), AIMessage(content="Hello Ada!")]
    )
    openai_server.reply_with("Your name is Ada.")
    out = run_example("langchain_history.py", "What is my name?", openai_server=openai_server)
    assert out.stdout.startswith("Your name is Ada.\n")
    sent = openai_server.requests_to("/chat/completions")[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    history = DjangoChatMessageHistory("langchain-demo", namespace="examples").messages
    assert [m.content for m in history] == [
        "Hi, I am Ada.",
        "Hello Ada!",
        "What is my name?",
        "Your name is Ada.",
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_langgraph_example_resumes_in_a_new_process(openai_server):
    from memory_app.models import Checkpoint

    started = run_example("langgraph_thread.py", "start", openai_server=openai_server)
    assert started.stdout == "paused: Book it?\n"
    done = run_example("langgraph_thread.py", "approve", openai_server=openai_server)
    assert done.stdout == "planned (diet: vegetarian) -> human said yes -> booked\n"
    history = run_example("langgraph_thread.py", "history", openai_server=openai_server)
    assert len(history.stdout.splitlines()) == Checkpoint.objects.count() >= 4
