"""Recall with filters on messages (metadata operators, time, namespace, session) in every
mode and scope, and context() with the owner's facts and where they came from."""

from __future__ import annotations

import pytest
from django.utils import timezone

from memory_app import Memory
from memory_app.models import Message

MODES = ["hybrid", "vector", "fulltext"]


@pytest.fixture
def bills(db, user, django_capture_on_commit_callbacks):
    """Two sessions of Ada's about bills, messages with metadata, indexed for recall."""
    home = Memory.session("home", owner=user, namespace="household")
    work = Memory.session("work", owner=user, namespace="office")
    with django_capture_on_commit_callbacks(execute=True):
        home.add_many(
            [
                {
                    "role": "user",
                    "content": "The electricity bill is 120 this month",
                    "metadata": {"amount": 120, "due": "2024-03-01", "kind": "energy"},
                },
                {
                    "role": "user",
                    "content": "The water bill is 40 this month",
                    "metadata": {"amount": 40, "due": "2024-02-10", "kind": "water"},
                },
                {
                    "role": "user",
                    "content": "The gas bill is 75 this month",
                    "metadata": {"amount": 75, "due": "2024-04-20", "kind": "energy"},
                },
            ]
        )
        work.add(
            {
                "role": "user",
                "content": "The phone bill is 30 this month",
                "metadata": {"amount": 30, "due": "2024-03-05", "kind": "phone"},
            }
        )
    return home, work


def found(mem, query="which bill", **kwargs):
    return sorted(r.message.content.split()[1] for r in mem.search(query, limit=10, **kwargs))


@pytest.mark.parametrize("mode", MODES)
def test_metadata_conditions_keep_only_matching_messages(bills, mode):
    home, _work = bills
    assert found(home, mode=mode, filters={"metadata": {"kind": "energy"}}) == [
        "electricity",
        "gas",
    ]
    assert found(home, mode=mode, filters={"metadata": {"amount": {"$gt": 50}}}) == [
        "electricity",
        "gas",
    ]
    assert found(home, mode=mode, filters={"metadata": {"amount": {"$lte": 75, "$ne": 40}}}) == [
        "gas"
    ]
    assert found(home, mode=mode, filters={"metadata": {"kind": {"$in": ["water", "gas"]}}}) == [
        "water"
    ]
    assert found(home, mode=mode, filters={"metadata": {"due": {"$lt": "2024-03-02"}}}) == [
        "electricity",
        "water",
    ]
    assert found(home, mode=mode, filters={"metadata": {"missing": 1}}) == []


@pytest.mark.parametrize("mode", MODES)
def test_owner_scope_filters_by_namespace_session_and_time(bills, mode):
    home, work = bills
    everything = found(home, mode=mode, scope="owner")
    assert everything == ["electricity", "gas", "phone", "water"]
    assert found(home, mode=mode, scope="owner", filters={"namespace": "office"}) == ["phone"]
    assert found(home, mode=mode, scope="owner", filters={"session": str(work.id)}) == ["phone"]
    Message.objects.filter(session_id=home.id, seq=2).update(
        created_at=timezone.now() - timezone.timedelta(days=10)
    )
    recent = {"created_after": (timezone.now() - timezone.timedelta(days=1)).isoformat()}
    assert found(home, mode=mode, scope="owner", filters=recent) == ["electricity", "gas", "phone"]
    old = {"created_before": (timezone.now() - timezone.timedelta(days=1)).isoformat()}
    assert found(home, mode=mode, scope="owner", filters=old) == ["water"]


def test_context_includes_the_owners_facts_with_their_source(bills, user):
    home, work = bills
    work.learned.remember("Ada pays the phone bill from the shared account", cursors=[1])
    window = home.context("who pays the phone bill", max_tokens=2000, recall_k=0, memories=3)
    [fact] = window.memories
    assert fact.text == "Ada pays the phone bill from the shared account"
    block = next(m["content"] for m in window.messages if "UNTRUSTED" in str(m["content"]))
    assert "remembered fact, learned" in block and 'in conversation "work" (cursor 1)' in block
    assert '"Ada pays the phone bill from the shared account"' in block
    assert window.recalled == () and window.recall_tokens > 0
    # Facts and messages together, facts first; a filter narrows both.
    both = home.context("phone bill", max_tokens=2000, recall_k=2, memories=2, scope="owner")
    assert both.memories and both.recalled
    text = next(m["content"] for m in both.messages if "UNTRUSTED" in str(m["content"]))
    assert text.index("remembered fact") < text.index("user in")
    narrowed = home.context(
        "phone bill", max_tokens=2000, memories=2, scope="owner", filters={"namespace": "household"}
    )
    assert narrowed.memories == () and all(r.session_id == home.id for r in narrowed.recalled)
    # Without an owner there is no one to remember facts of.
    service = Memory.session("svc", namespace="household")
    service.add({"role": "user", "content": "phone bill?"})
    assert service.context("phone bill", max_tokens=500, memories=3).memories == ()
