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


# ---- windows OpenAI accepts ---------------------------------------------------------------
def calls(*ids, content=None):
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            for i in ids
        ],
    }


def result(call_id, text="ok"):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def openai_accepts(messages: list[dict]) -> bool:
    """OpenAI's rule for a history: every tool call is answered by the tool messages right
    after its assistant message, and every tool message answers such a call."""
    index = 0
    while index < len(messages):
        message = messages[index]
        if message["role"] == "tool":
            return False  # a result not right after its call
        index += 1
        wanted = {c["id"] for c in message.get("tool_calls") or ()}
        while index < len(messages) and messages[index]["role"] == "tool":
            if messages[index]["tool_call_id"] not in wanted:
                return False
            wanted.discard(messages[index]["tool_call_id"])
            index += 1
        if wanted:
            return False
    return True


def test_a_call_still_being_answered_is_left_out_and_said(mem):
    mem.add(user("weather?"))
    mem.add(calls("w1"))  # the agent stored its call and is running the tool now
    window = mem.window()
    assert [m["role"] for m in window] == ["user"]
    assert window.unanswered_tool_calls == ("w1",)
    assert window.tokens == mem.messages()[0].tokens
    assert openai_accepts(window.messages)
    mem.add(result("w1", "sunny"))
    answered = mem.window()
    assert [m["role"] for m in answered] == ["user", "assistant", "tool"]
    assert answered.unanswered_tool_calls == ()


def test_a_call_whose_result_never_came_keeps_the_text_and_the_answered_calls(mem):
    mem.add_many(
        [
            user("weather in Oslo and Bergen?"),
            calls("a", "b", content="Let me look both up."),
            result("a", "sunny"),
            user("and?"),
        ]
    )
    window = mem.window()
    assistant_message = window.messages[1]
    assert assistant_message["content"] == "Let me look both up."
    assert [c["id"] for c in assistant_message["tool_calls"]] == ["a"]
    assert window.unanswered_tool_calls == ("b",)
    assert openai_accepts(window.messages)
    assert window.tokens == sum(count_message(m) for m in window.messages)
    mem.add(calls("c", content="Checking."))
    newest = mem.window()
    assert newest.messages[-1] == {"role": "assistant", "content": "Checking."}
    assert newest.unanswered_tool_calls == ("b", "c")


def test_a_tool_call_without_arguments_is_refused(mem):
    from memory_app.exceptions import InvalidMessage

    bad = calls("x")
    del bad["tool_calls"][0]["function"]["arguments"]
    with pytest.raises(InvalidMessage, match="function.arguments") as raised:
        mem.add(bad)
    assert raised.value.field == "tool_calls"
    assert mem.count() == 0


def test_a_summary_larger_than_the_budget_is_cut_to_fit_and_flagged(mem):
    from memory_app.services.context import SUMMARY_CUT_MARKER

    stored = mem.add_many([user(f"turn {i} " * 20) for i in range(4)])
    long_summary = " ".join(f"Fact {i}: the user likes item number {i}." for i in range(3000))
    mem.save_snapshot(long_summary, upto=stored[2].cursor, prev=None)
    for budget in (100, 37, 2000):
        window = mem.window(max_tokens=budget)
        assert window.budget_tokens <= budget
        assert window.tokens == sum(count_message(m) for m in window.messages)
        assert window.summary_truncated
        summary = window.messages[0]["content"]
        assert summary.startswith(SUMMARY_PREFIX + "Fact 0:")
        assert summary.endswith(SUMMARY_CUT_MARKER)
        assert budget - window.budget_tokens < 10  # cut to the budget, not far below it
    whole = mem.window()
    assert not whole.summary_truncated
    assert whole.messages[0]["content"] == SUMMARY_PREFIX + long_summary


def test_a_summary_of_more_tokens_than_the_tokenizer_encodes_at_once_is_cut(mem):
    # 60,000 characters of four byte tokens each: within MAX_MESSAGE_BYTES, yet 240,000 tokens;
    # cutting it to a budget of 5,000 tokens encodes all of it (up to 64 characters a token).
    from memory_app.services.context import SUMMARY_CUT_MARKER

    stored = mem.add_many([user("one"), user("two")])
    summary = "\U00010000" * 60_000
    mem.save_snapshot(summary, upto=stored[0].cursor, prev=None)
    window = mem.window(max_tokens=5_000)
    assert window.summary_truncated
    assert window.budget_tokens <= 5_000 and 5_000 - window.budget_tokens < 10
    shown = window.messages[0]["content"]
    assert shown.startswith(SUMMARY_PREFIX + "\U00010000") and shown.endswith(SUMMARY_CUT_MARKER)
    assert mem.window().messages[0]["content"] == SUMMARY_PREFIX + summary


def test_a_budget_that_cannot_hold_the_pinned_messages_is_refused(mem):
    from memory_app.exceptions import BudgetTooSmall

    stored = mem.add_many([user("the task: " + "plan the trip " * 40), user("ok")])
    mem.save_snapshot("summary", upto=stored[0].cursor, prev=None, pinned=[stored[0]])
    pinned_tokens = count_message(stored[0].as_openai())
    with pytest.raises(BudgetTooSmall) as raised:
        mem.window(max_tokens=pinned_tokens)
    assert raised.value.field == "max_tokens" and raised.value.status_code == 400
    assert mem.window(max_tokens=pinned_tokens + 40).budget_tokens <= pinned_tokens + 40


def test_threads_that_count_at_once_share_one_encoding(monkeypatch):
    """A server's first requests count tokens together: one build of the encoding, not one
    per thread (each build costs tens of milliseconds)."""
    import threading

    import bpe_openai

    from memory_app import tokens

    builds = []
    real = bpe_openai.get_encoding

    def counted(name):
        builds.append(name)
        return real(name)

    monkeypatch.setattr(tokens, "_encodings", {})
    monkeypatch.setattr(bpe_openai, "get_encoding", counted)
    start = threading.Barrier(8)
    seen = []

    def count():
        start.wait()
        seen.append(tokens.get_encoding("o200k_base"))

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert builds == ["o200k_base"]
    assert len(seen) == 8 and all(encoding is seen[0] for encoding in seen)
