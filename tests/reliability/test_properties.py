"""Property-based tests (hypothesis) of the message validator and of the window rules.

Pure functions: no database.
"""

from __future__ import annotations

from operator import attrgetter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_app.exceptions import InvalidMessage
from memory_app.services.context import assemble_window, summary_message, tool_groups_newest_first
from memory_app.types import SnapshotView, StoredMessage
from memory_app.validation import (
    ALLOWED_KEYS,
    PART_TYPES,
    ROLES,
    check_message,
    check_messages,
)

PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- the validator --------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

tool_calls_like = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.text(max_size=8) | json_values,
            "type": st.sampled_from(["function", "custom"]) | json_values,
            "function": st.fixed_dictionaries(
                {},
                optional={
                    "name": st.text(max_size=8) | json_values,
                    "arguments": st.text(max_size=20) | json_values,
                },
            )
            | json_values,
        },
    )
    | json_values,
    max_size=3,
)
content_parts_like = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(PART_TYPES) + ["video"]) | json_values},
        optional={
            "text": st.text(max_size=20) | json_values,
            "refusal": st.text(max_size=20) | json_values,
            "image_url": json_values,
        },
    )
    | json_values,
    max_size=3,
)
# Near-valid messages reach deep into the validator; arbitrary JSON covers the rest.
message_like = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(sorted(ROLES) + ["developer"]) | json_values,
        "content": st.text(max_size=40) | content_parts_like | json_values,
        "name": st.text(max_size=10) | json_values,
        "tool_calls": tool_calls_like,
        "tool_call_id": st.text(max_size=10) | json_values,
        "metadata": st.dictionaries(st.text(max_size=8), json_values, max_size=3) | json_values,
        "remember": st.booleans() | json_values,
        "idempotency_key": st.text(max_size=10) | json_values,
        "extra": st.dictionaries(
            st.sampled_from(["refusal", "audio", "role"]), json_values, max_size=2
        )
        | json_values,
        "unknown": json_values,
    },
)


@pytest.mark.parametrize(
    "data",
    [
        {"role": ["user"], "content": "hi"},
        {"role": "user", "content": [{"type": ["text"], "text": "hi"}]},
    ],
)
def test_validator_refuses_unhashable_role_or_part_type(data):
    # Found by the property below: a list where a role or part type goes once raised TypeError.
    with pytest.raises(InvalidMessage):
        check_message(data)


@PROPERTY_SETTINGS
@given(message_like | json_values)
def test_validator_accepts_or_refuses_with_invalid_message_only(data):
    try:
        message = check_message(data)
    except InvalidMessage as err:
        assert isinstance(err.field, str) and err.reason
        return
    assert set(data) <= ALLOWED_KEYS
    if message.extra:
        # Other OpenAI fields ride along losslessly in the OpenAI form (which the validator
        # would refuse as unknown top-level keys, so it is not fed back here).
        openai_form = message.as_openai()
        assert all(openai_form[key] is value for key, value in message.extra.items())
        return
    # What it accepts round-trips: the OpenAI form validates to the same message.
    again = check_message(message.as_openai())
    assert (
        again.role,
        again.content,
        again.content_parts,
        again.name,
        again.tool_calls,
        again.tool_call_id,
    ) == (
        message.role,
        message.content,
        message.content_parts,
        message.name,
        message.tool_calls,
        message.tool_call_id,
    )


@PROPERTY_SETTINGS
@given(st.lists(message_like, max_size=4) | json_values)
def test_batch_validator_accepts_or_refuses_with_invalid_message_only(batch):
    try:
        validated = check_messages(batch)
    except InvalidMessage as err:
        assert isinstance(err.field, str) and err.reason
        return
    assert len(validated) == len(batch) > 0


# -- windows --------------------------------------------------------------------------------------


@st.composite
def logs(draw) -> list[StoredMessage]:
    """A session's log: system prompts, user and assistant turns, tool calls with some or all
    of their results, and stray tool results whose call is gone."""
    messages: list[StoredMessage] = []

    def add(role, **fields):
        messages.append(
            StoredMessage(
                cursor=len(messages) + 1,
                role=role,
                content=fields.pop("content", f"{role} {len(messages) + 1}"),
                tokens=draw(st.integers(1, 40)),
                **fields,
            )
        )

    for kind in draw(
        st.lists(st.sampled_from(["system", "user", "assistant", "tools", "stray"]), max_size=30)
    ):
        if kind == "tools":
            ids = [f"call_{len(messages)}_{i}" for i in range(draw(st.integers(1, 3)))]
            add(
                "assistant",
                content="",
                tool_calls=[
                    {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    for i in ids
                ],
            )
            for call_id in ids[: draw(st.integers(0, len(ids)))]:
                if draw(st.booleans()) and draw(st.booleans()):
                    add("system")  # a system message in the middle of a tool group
                add("tool", tool_call_id=call_id)
        elif kind == "stray":
            add("tool", tool_call_id="call_gone")
        else:
            add(kind)
    return messages


def dict_cost(message: dict) -> int:
    return 3 + len(str(message.get("content") or "")) // 4


@PROPERTY_SETTINGS
@given(
    log=logs(),
    snapshot_at=st.none() | st.floats(0, 1),
    pinned=st.lists(
        st.sampled_from(
            [{"role": "user", "content": "the task"}, {"role": "system", "content": "pinned rules"}]
        ),
        max_size=2,
    ),
    max_tokens=st.none() | st.integers(0, 400),
    max_messages=st.none() | st.integers(0, 30),
)
def test_window_invariants(log, snapshot_at, pinned, max_tokens, max_messages):
    snapshot = None
    if snapshot_at is not None and log:
        snapshot = SnapshotView(
            version=1,
            upto=max(1, round(snapshot_at * len(log))),
            summary="what happened",
            pinned=pinned,
        )
    after = snapshot.upto if snapshot else 0
    system = [m for m in log if m.role == "system"]
    window = assemble_window(
        snapshot=snapshot,
        system_messages=system,
        newest_first=reversed([m for m in log if m.cursor > after]),
        max_messages=max_messages,
        max_tokens=max_tokens,
        cost=attrgetter("tokens"),
        cost_of_dict=dict_cost,
    )
    by_cursor = {m.cursor: m for m in log}
    assert len(window.messages) == len(window.cursors)

    # System messages are always kept, covered by the snapshot or not, as stored.
    for message in system:
        index = window.cursors.index(message.cursor)
        assert window.messages[index] == message.as_openai()

    # Order is preserved: cursors rise through the window.
    cursors = [c for c in window.cursors if c is not None]
    assert cursors == sorted(set(cursors))
    for cursor, message in zip(window.cursors, window.messages, strict=True):
        if cursor is not None:
            assert message == by_cursor[cursor].as_openai()

    # The summary and pinned messages come once each, and count toward the budget.
    head = []
    if snapshot:
        head = [summary_message(snapshot), *[p for p in pinned if p["role"] != "system"]]
        assert window.messages.count(summary_message(snapshot)) == 1
    head_tokens = sum(dict_cost(m) for m in head)

    # Tool groups are whole: every kept result answers a call kept before it, and every kept
    # call keeps all of its results (call ids are unique in these logs).
    kept = {c for c in cursors if by_cursor[c].role != "system"}
    call_at = {
        call["id"]: m.cursor
        for m in log
        if m.role == "assistant" and m.tool_calls
        for call in m.tool_calls
    }
    for cursor in kept:
        message = by_cursor[cursor]
        if message.role == "tool":
            assert call_at.get(message.tool_call_id) in kept
            assert call_at[message.tool_call_id] < cursor
        elif message.role == "assistant" and message.tool_calls:
            ids = {call["id"] for call in message.tool_calls}
            assert {
                m.cursor
                for m in log
                if m.role == "tool" and m.cursor > after and m.tool_call_id in ids
            } <= kept

    # What is kept is the newest groups, newest first, as the grouping forms them.
    groups = list(tool_groups_newest_first(reversed([m for m in log if m.cursor > after])))
    kept_groups = [g for g in groups if {m.cursor for m in g} & kept]
    for group in kept_groups:
        assert {m.cursor for m in group} <= kept
    assert kept == {m.cursor for g in kept_groups for m in g}
    assert kept_groups == groups[: len(kept_groups)]

    # The budget holds, and the next older group would not have fitted.
    tail_tokens = sum(by_cursor[c].tokens for c in kept)
    assert window.budget_tokens == head_tokens + tail_tokens
    system_tokens = sum(m.tokens for m in system) + sum(
        dict_cost(p) for p in (snapshot.pinned if snapshot else []) if p["role"] == "system"
    )
    assert window.tokens == window.budget_tokens + system_tokens
    room = None if max_tokens is None else max(0, max_tokens - head_tokens)
    if room is not None:
        assert tail_tokens <= room
    if max_messages is not None:
        assert len(kept) <= max_messages
    if len(groups) > len(kept_groups):
        nxt = groups[len(kept_groups)]
        too_many_tokens = room is not None and tail_tokens + sum(m.tokens for m in nxt) > room
        too_many_messages = max_messages is not None and len(kept) + len(nxt) > max_messages
        assert too_many_tokens or too_many_messages
    assert window.first_cursor == (min(kept) if kept else None)
