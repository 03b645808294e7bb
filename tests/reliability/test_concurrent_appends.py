"""Many processes appending to one session at once: gapless cursors, nothing lost, and
idempotency keys that hold under races."""

from __future__ import annotations

import random

import pytest

from memory_app import Memory
from memory_app.models import Message, Session

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROCESSES = 16


def test_sixteen_processes_get_gapless_cursors_and_lose_nothing(run_appenders):
    mem = Memory.session("hot-session", namespace="reliability")
    # Each process: single appends and batches of three, interleaved.
    plans = [
        [
            [{"role": "user", "content": f"p{p} s{s} m{i}"} for i in range(1 if s % 2 else 3)]
            for s in range(12)
        ]
        for p in range(PROCESSES)
    ]
    results = run_appenders(mem.id, plans)

    expected = sorted(m["content"] for plan in plans for step in plan for m in step)
    total = len(expected)
    stored = list(
        Message.objects.filter(session_id=mem.id).order_by("seq").values_list("seq", "content")
    )
    assert [seq for seq, _ in stored] == list(range(1, total + 1))  # gapless, from 1
    assert sorted(content for _, content in stored) == expected  # nothing lost or doubled
    by_cursor = dict(stored)
    for plan, steps in zip(plans, results, strict=True):
        for step, returned in zip(plan, steps, strict=True):
            cursors = [cursor for cursor, _, _ in returned]
            # What each caller was told is what the log holds, and a batch is contiguous.
            assert [by_cursor[c] for c in cursors] == [m["content"] for m in step]
            assert cursors == list(range(cursors[0], cursors[0] + len(step)))
        # One process's appends keep their order.
        firsts = [returned[0][0] for returned in steps]
        assert firsts == sorted(firsts)
    session = Session.objects.get(pk=mem.id)
    assert (session.next_seq, session.message_count) == (total + 1, total)
    assert session.token_count == sum(
        Message.objects.filter(session_id=mem.id).values_list("token_count", flat=True)
    )


def test_a_retried_append_with_the_same_key_stores_one_message():
    mem = Memory.session("retries", namespace="reliability")
    first = mem.add({"role": "user", "content": "charge the card", "idempotency_key": "pay-1"})
    retried = mem.add({"role": "user", "content": "charge the card", "idempotency_key": "pay-1"})
    assert retried == first
    # A batch retried after a partial failure of the caller: known keys come back as stored.
    batch = [
        {"role": "user", "content": f"line {i}", "idempotency_key": f"line-{i}"} for i in range(4)
    ]
    stored = mem.add_many(batch[:2])
    again = mem.add_many(batch)
    assert again[:2] == stored
    assert [m.cursor for m in again] == [2, 3, 4, 5]
    assert mem.count() == 5
    assert list(
        Message.objects.filter(session_id=mem.id).values_list("seq", flat=True).order_by("seq")
    ) == [1, 2, 3, 4, 5]


def test_processes_racing_with_the_same_keys_store_each_message_once(run_appenders):
    mem = Memory.session("racing-retries", namespace="reliability")
    keyed = [
        {"role": "user", "content": f"order {i}", "idempotency_key": f"order-{i}"}
        for i in range(24)
    ]
    plans = []
    for p in range(8):
        order = keyed[:]
        random.Random(p).shuffle(order)
        # Singles and pairs, so batches mixing new and already stored keys race too.
        plan, i = [], 0
        while i < len(order):
            size = 1 + (i + p) % 2
            plan.append(order[i : i + size])
            i += size
        plans.append(plan)
    results = run_appenders(mem.id, plans)

    stored = list(
        Message.objects.filter(session_id=mem.id)
        .order_by("seq")
        .values_list("seq", "content", "idempotency_key")
    )
    assert [seq for seq, _, _ in stored] == list(
        range(1, len(keyed) + 1)
    )  # no gaps from lost races
    assert sorted(key for _, _, key in stored) == sorted(m["idempotency_key"] for m in keyed)
    original = {key: (seq, content) for seq, content, key in stored}
    for steps in results:
        for cursor, content, key in (row for step in steps for row in step):
            assert original[key] == (cursor, content)  # every caller got the original back
    assert mem.count() == len(keyed)
