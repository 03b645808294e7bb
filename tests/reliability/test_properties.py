"""Property-based tests (hypothesis) of the message validator and of the window rules.

Pure functions: no database.
"""

from __future__ import annotations

from operator import attrgetter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_app.exceptions import BudgetTooSmall, InvalidMessage
from memory_app.services.context import (
    SUMMARY_CUT_MARKER,
    SUMMARY_PREFIX,
    assemble_window,
    summary_message,
    tool_groups_newest_first,
)
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


def dict_cost(message: dict) -> int:
    """A stand-in tokenizer: a quarter of the text, plus what tool calls add."""
    return (
        3 + len(str(message.get("content") or "")) // 4 + 5 * len(message.get("tool_calls") or ())
    )


def cut_text(text: str, n: int) -> str:
    return text[: 4 * n]


@st.composite
def logs(draw) -> list[StoredMessage]:
    """A session's log: system prompts, user and assistant turns, tool calls with some or all
    of their results, and stray tool results whose call is gone. A stored message costs at least
    what its OpenAI form costs (``dict_cost``), as real counts do."""
    messages: list[StoredMessage] = []

    def add(role, **fields):
        content = fields.pop("content", f"{role} {len(messages) + 1}")
        openai = StoredMessage(cursor=0, role=role, content=content, tokens=0, **fields)
        messages.append(
            StoredMessage(
                cursor=len(messages) + 1,
                role=role,
                content=content,
                tokens=dict_cost(openai.as_openai()) + draw(st.integers(0, 30)),
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
                content=draw(st.sampled_from(["", "Let me look."])),
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


def openai_accepts(messages: list[dict]) -> bool:
    """Every tool call of the window has its result after it, every result a call before it."""
    called: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            if message["tool_call_id"] not in called - answered:
                return False
            answered.add(message["tool_call_id"])
        called |= {c["id"] for c in message.get("tool_calls") or ()}
    return called == answered


@PROPERTY_SETTINGS
@given(
    log=logs(),
    snapshot_at=st.none() | st.floats(0, 1),
    summary=st.sampled_from(["what happened", "a long story " * 40]),
    pinned=st.lists(
        st.sampled_from(
            [{"role": "user", "content": "the task"}, {"role": "system", "content": "pinned rules"}]
        ),
        max_size=2,
    ),
    max_tokens=st.none() | st.integers(0, 400),
    max_messages=st.none() | st.integers(0, 30),
)
def test_window_invariants(log, snapshot_at, summary, pinned, max_tokens, max_messages):
    snapshot = None
    if snapshot_at is not None and log:
        snapshot = SnapshotView(
            version=1,
            upto=max(1, round(snapshot_at * len(log))),
            summary=summary,
            pinned=pinned,
        )
    after = snapshot.upto if snapshot else 0
    system = [m for m in log if m.role == "system"]
    pinned_counted = [p for p in pinned if p["role"] != "system"] if snapshot else []
    try:
        window = assemble_window(
            snapshot=snapshot,
            system_messages=system,
            newest_first=reversed([m for m in log if m.cursor > after]),
            max_messages=max_messages,
            max_tokens=max_tokens,
            cost=attrgetter("tokens"),
            cost_of_dict=dict_cost,
            cut_text=cut_text,
        )
    except BudgetTooSmall:
        # Only when not even the pinned messages and the summary's frame fit.
        frame = dict_cost(summary_message(snapshot, SUMMARY_CUT_MARKER))
        assert sum(map(dict_cost, pinned_counted)) + frame > max_tokens
        return
    by_cursor = {m.cursor: m for m in log}
    assert len(window.messages) == len(window.cursors)
    assert openai_accepts(window.messages)

    # The budget is never exceeded; the summary is cut only when it must be.
    if max_tokens is not None:
        assert window.budget_tokens <= max_tokens
    summaries = [
        m
        for m, c in zip(window.messages, window.cursors, strict=True)
        if c is None and str(m.get("content")).startswith(SUMMARY_PREFIX)
    ]
    head_cost = sum(map(dict_cost, pinned_counted + summaries))
    if snapshot:
        whole = summary_message(snapshot)
        fits = max_tokens is None or dict_cost(whole) + sum(map(dict_cost, pinned_counted)) <= (
            max_tokens
        )
        assert window.summary_truncated == (not fits)
        [shown] = summaries
        assert shown == whole if fits else shown["content"].endswith(SUMMARY_CUT_MARKER)
    else:
        assert not window.summary_truncated and summaries == []

    # System messages are always kept, covered by the snapshot or not, as stored.
    for message in system:
        index = window.cursors.index(message.cursor)
        assert window.messages[index] == message.as_openai()

    # Order is preserved: cursors rise through the window. A message is shown as stored, or
    # with only its answered tool calls (the ids left out are said).
    cursors = [c for c in window.cursors if c is not None]
    assert cursors == sorted(set(cursors))
    unanswered = set(window.unanswered_tool_calls)
    for cursor, message in zip(window.cursors, window.messages, strict=True):
        if cursor is None:
            continue
        stored = by_cursor[cursor].as_openai()
        if message != stored:
            calls = [c for c in stored["tool_calls"] if c["id"] not in unanswered]
            expected = {k: v for k, v in stored.items() if k != "tool_calls"}
            assert message == ({**expected, "tool_calls": calls} if calls else expected)

    # Selected: what the window shows, and the assistant messages left out whole because none
    # of their calls was answered (and they said nothing else).
    kept = {c for c in cursors if by_cursor[c].role != "system"}
    dropped = {
        m.cursor
        for m in log
        if m.cursor > after
        and m.tool_calls
        and m.cursor not in kept
        and {c["id"] for c in m.tool_calls} <= unanswered
    }
    assert not {by_cursor[c].content for c in dropped} - {""}
    selected = kept | dropped

    # Tool groups are whole: every kept result answers a call kept before it, and every
    # selected call keeps all of its results (call ids are unique in these logs).
    call_at = {
        call["id"]: m.cursor
        for m in log
        if m.role == "assistant" and m.tool_calls
        for call in m.tool_calls
    }
    for cursor in selected:
        message = by_cursor[cursor]
        if message.role == "tool":
            assert call_at.get(message.tool_call_id) in kept
            assert call_at[message.tool_call_id] < cursor
        elif message.role == "assistant" and message.tool_calls:
            ids = {call["id"] for call in message.tool_calls}
            results = {
                m.cursor
                for m in log
                if m.role == "tool" and m.cursor > after and m.tool_call_id in ids
            }
            assert results <= kept
            answered = {by_cursor[r].tool_call_id for r in results}
            assert ids - answered <= unanswered

    # What is selected is the newest groups, newest first, as the grouping forms them.
    groups = list(tool_groups_newest_first(reversed([m for m in log if m.cursor > after])))
    chosen = [g for g in groups if {m.cursor for m in g} & selected]
    for group in chosen:
        assert {m.cursor for m in group} <= selected
    assert selected == {m.cursor for g in chosen for m in g}
    assert chosen == groups[: len(chosen)]

    # The next older group would not have fitted (priced as stored, before calls are left out).
    selected_tokens = sum(by_cursor[c].tokens for c in selected)
    room = None if max_tokens is None else max(0, max_tokens - head_cost)
    if room is not None:
        assert selected_tokens <= room
    if max_messages is not None:
        assert len(selected) <= max_messages
    if len(groups) > len(chosen):
        nxt = groups[len(chosen)]
        too_many_tokens = room is not None and selected_tokens + sum(m.tokens for m in nxt) > room
        too_many_messages = max_messages is not None and len(selected) + len(nxt) > max_messages
        assert too_many_tokens or too_many_messages
    assert window.first_cursor == (min(selected) if selected else None)


# -- the token count ------------------------------------------------------------------------------

# Text the tokenizer splits in unusual places: runs of white space, contractions, digits,
# scripts of several byte lengths, characters outside its merges, and lone surrogates.
token_texts = st.text(max_size=300) | st.lists(
    st.sampled_from(
        ["  ", "\n", "\n\n ", "\t", "'s", "'LL", "123456", "hello", " world", "ÅÄÖ", "日本語"]
        + ["😀", "\U00010000", "!!", "…", "a" * 40, " " * 17, "\ud800", "\udfff"]
    ),
    max_size=40,
).map("".join)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@given(text=token_texts)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_count_is_the_number_of_token_ids_the_tokenizer_gives(encoding, text):
    from memory_app.tokens import count_text, get_encoding

    assert count_text(text, encoding) == len(get_encoding(encoding).encode_ordinary(text))


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@given(
    words=st.lists(token_texts.filter(lambda w: w and not w[-1].isspace()), min_size=1, max_size=5),
    repeat=st.integers(200, 600),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_long_text_is_counted_in_pieces_as_one_text(encoding, words, repeat):
    # Longer than PIECE_CHARS, so counted in pieces. Words end in other than white space: the
    # text has the spaces the pieces are cut at.
    from memory_app.tokens import PIECE_CHARS, count_text, get_encoding

    text = " ".join(words * repeat)
    text = ((text + " ") * (3 * PIECE_CHARS // max(len(text), 1) + 1))[: 3 * PIECE_CHARS]
    assert len(text) > PIECE_CHARS
    # The tokenizer's own count of the whole text at once (its encode() refuses more than
    # 200,000 tokens, which 150,000 characters may be), lone surrogates replaced as it does.
    encoder = get_encoding(encoding)
    assert count_text(text, encoding) == encoder._backend.count(encoder._sanitize_text(text))
