"""Context windows: budgets, system messages, tool groups, snapshots."""

import pytest
from django.test import override_settings

from memory_app.exceptions import InvalidCursor
from memory_app.services.context import SUMMARY_PREFIX
from memory_app.tokens import count_message
from tests.conftest import tool_turn


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_window_by_message_count_keeps_newest_in_order(mem):
    mem.add_many([user(f"m{i}") for i in range(10)])
    window = mem.window(max_messages=3)
    assert [m["content"] for m in window] == ["m7", "m8", "m9"]
    assert window.cursors == [8, 9, 10]


def test_system_messages_are_always_kept_and_not_counted(mem):
    mem.add({"role": "system", "content": "You are terse."})
    mem.add_many([user(f"question {i}") for i in range(5)])
    mem.add({"role": "system", "content": "Answer in French from now on."})
    mem.add_many([user(f"later {i}") for i in range(3)])
    window = mem.window(max_messages=2)
    assert [m["content"] for m in window] == [
        "You are terse.",
        "Answer in French from now on.",
        "later 1",
        "later 2",
    ]
    # A system message inside the kept range stays in its place.
    wide = mem.window(max_messages=4)
    assert [m["content"] for m in wide] == [
        "You are terse.",
        "question 4",
        "Answer in French from now on.",
        "later 0",
        "later 1",
        "later 2",
    ]


def test_token_budget_counts_everything_but_system(mem):
    system = mem.add({"role": "system", "content": "A long system prompt " * 20})
    stored = mem.add_many([user(f"message number {i}") for i in range(20)])
    per_message = stored[-1].tokens
    window = mem.window(max_tokens=per_message * 5)
    assert window.budget_tokens <= per_message * 5
    assert window.cursors[0] == system.cursor
    assert len(window) - 1 == 5 and window.cursors[-1] == stored[-1].cursor
    assert window.tokens == window.budget_tokens + system.tokens


def test_tool_call_and_results_are_kept_or_dropped_together(mem):
    mem.add(user("weather in Oslo and Bergen?"))
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Bergen"}'},
            },
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    mem.add_many([call, *results, assistant("Oslo sunny, Bergen rain.")])
    expected = {
        0: [],
        1: ["assistant"],
        2: ["assistant"],
        3: ["assistant"],
        4: ["assistant", "tool", "tool", "assistant"],
        5: ["user", "assistant", "tool", "tool", "assistant"],
    }
    for limit, roles in expected.items():
        # Never a tool result without its call, never a call without all its results.
        assert [m["role"] for m in mem.window(max_messages=limit)] == roles
    assert [m["role"] for m in mem.window(max_messages=3)] == ["assistant"]
    assert [m["role"] for m in mem.window(max_messages=4)] == [
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    group_tokens = sum(m.tokens for m in mem.messages(after=1))
    exact = mem.window(max_tokens=group_tokens)
    assert [m["role"] for m in exact] == ["assistant", "tool", "tool", "assistant"]
    short = mem.window(max_tokens=group_tokens - 1)
    assert [m["role"] for m in short] == ["assistant"]


def test_orphaned_tool_results_are_dropped(mem):
    call, result = tool_turn("c1")
    mem.add_many([user("hi"), call, result, assistant("done")])
    mem.save_snapshot("asked for weather", upto=2, prev=None)  # covers the call, not its result
    window = mem.window()
    assert [m["role"] for m in window] == ["user", "assistant"]
    assert window[0]["content"].startswith(SUMMARY_PREFIX)


def test_summary_and_pinned_come_first_and_count(mem):
    mem.add({"role": "system", "content": "sys"})
    stored = mem.add_many([user(f"old {i}") for i in range(6)] + [user("new")])
    task = {"role": "user", "content": "The task: plan a trip."}
    snapshot = mem.save_snapshot(
        "They talked about old things.", upto=stored[5].cursor, prev=None, pinned=[task]
    )
    window = mem.window(max_tokens=1000)
    assert window.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": SUMMARY_PREFIX + "They talked about old things."},
        task,
        user("new"),
    ]
    assert window.cursors == [1, None, None, stored[6].cursor]
    assert window.snapshot_version == snapshot.version
    head = count_message(window.messages[1]) + count_message(task)
    assert window.budget_tokens == head + stored[6].tokens
    # A budget that only fits the summary and pin leaves the tail out.
    assert mem.window(max_tokens=head).messages[-1] == task


def test_window_of_empty_session_and_zero_budget(mem):
    assert mem.window().messages == []
    mem.add(user("x"))
    assert mem.window(max_tokens=0).messages == []
    assert mem.window(max_messages=0).messages == []


def test_window_counts_tokens_for_another_models_encoding(mem):
    text = "Tokenizers disagree about unusual words like Brekkefossen and Rallarvegen."
    mem.add(user(text))
    default = mem.window().budget_tokens
    gpt4 = mem.window(model="gpt-4").budget_tokens  # cl100k_base
    assert default == count_message(user(text), "o200k_base")
    assert gpt4 == count_message(user(text), "cl100k_base")
    assert default != gpt4


def test_window_pages_through_long_tails(mem):
    mem.add_many([user(f"m{i}") for i in range(450)])
    with override_settings(MEMORY_APP={"WINDOW_PAGE_SIZE": 50}):
        window = mem.window(max_messages=300)
    assert window.cursors == list(range(151, 451))


def test_bad_limits_raise(mem):
    with pytest.raises(InvalidCursor):
        mem.window(max_messages=-1)
    with pytest.raises(InvalidCursor):
        mem.window(max_tokens="lots")


def test_parallel_calls_stored_one_per_message_stay_with_their_results(mem):
    def call(call_id, city):
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": city},
                }
            ],
        }

    mem.add_many(
        [
            user("weather in Oslo and Bergen?"),
            call("a", "Oslo"),
            call("b", "Bergen"),
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "rain"},
            assistant("Oslo sunny, Bergen rain."),
        ]
    )
    expected = {
        1: ["assistant"],
        4: ["assistant"],
        5: ["assistant", "assistant", "tool", "tool", "assistant"],
    }
    for limit, roles in expected.items():
        assert [m["role"] for m in mem.window(max_messages=limit)] == roles
    # Cover the first call only: the second call keeps its own result, the orphan goes.
    mem.save_snapshot("asked about weather", upto=2, prev=None)
    assert [m.get("tool_call_id") for m in mem.window().messages[1:]] == [None, "b", None]
    assert [m["role"] for m in mem.window().messages[1:]] == ["assistant", "tool", "assistant"]


def test_window_refuses_a_model_whose_encoding_is_unknown(mem):
    from memory_app.exceptions import UnknownModel

    mem.add(user("hello"))
    with pytest.raises(UnknownModel) as err:
        mem.window(model="no-such-model")
    assert err.value.field == "model" and "MODEL_ENCODINGS" in str(err.value)
    # Mapped in MODEL_ENCODINGS, the same model counts with the encoding it is given.
    with override_settings(MEMORY_APP={"MODEL_ENCODINGS": {"no-such-model": "cl100k_base"}}):
        assert mem.window(model="no-such-model").budget_tokens == count_message(
            user("hello"), "cl100k_base"
        )
