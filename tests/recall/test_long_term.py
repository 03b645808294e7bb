"""Long-term memory outlives working-memory pruning: a pruned message's embedding keeps what
recall needs (text, cursor, role, session, owner, vector, creation time), search and context()
still find it, and clear, delete and erase still remove everything."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.db import IntegrityError, connection, transaction

from memory_app import Memory
from memory_app.encryption import ENCRYPTED_PREFIX
from memory_app.models import Embedding, Message
from memory_app.services.embedding import embed_messages, promote_before_pruning
from memory_app.store import log
from tests.recall.conftest import add_turns

FACTS = [
    "My sister Clara lives in Vienna and teaches violin.",
    "The boiler was serviced by Nordheat on the second of June.",
    "Our trip to Lisbon is booked for late September.",
]
CHATTER = [f"Small talk turn {i} about the weather and the football scores." for i in range(6)]


@pytest.fixture
def pruned_chat(db, user, django_capture_on_commit_callbacks):
    """Facts, then chatter; a snapshot covers the facts and they are pruned from the log."""
    mem = Memory.session("long-term", owner=user, namespace="tests")
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(mem, FACTS)
        add_turns(mem, CHATTER, role="assistant")
    mem.save_snapshot("The user told us about Clara, the boiler and a trip.", upto=3)
    assert mem.prune_compacted() == 3
    assert not Message.objects.filter(session=mem.session, seq__lte=3).exists()
    return mem


@pytest.mark.parametrize("mode", ["vector", "fulltext", "hybrid"])
@pytest.mark.parametrize("scope", ["session", "owner"])
def test_search_finds_pruned_turns(pruned_chat, mode, scope):
    (top,) = pruned_chat.search("who services the boiler?", limit=1, mode=mode, scope=scope)
    assert top.session_id == pruned_chat.id and top.cursor == 2
    message = top.message
    assert message.content == FACTS[1] and message.role == "user"
    assert message.created_at is not None and message.id is None  # no log row any more
    assert (
        pruned_chat.search("Clara violin Vienna", limit=1, mode=mode, roles=["user"])[0].cursor == 1
    )
    others = pruned_chat.search(
        "Clara violin Vienna weather", limit=9, mode=mode, roles=["assistant"]
    )
    assert others and all(r.cursor > 3 and r.message.role == "assistant" for r in others)


def test_context_recalls_what_the_summary_compressed(pruned_chat):
    window = pruned_chat.context("Where does my sister Clara live?", max_tokens=400, recall_k=2)
    assert [r.cursor for r in window.recalled][:1] == [1]
    (block,) = [m for m in window.messages if m["role"] == "system"]
    assert "Clara lives in Vienna" in block["content"] and "cursor 1" in block["content"]


def test_compaction_with_pruning_keeps_recall(
    db, user, memory_settings_override, django_capture_on_commit_callbacks
):
    memory_settings_override(
        PRUNE_COMPACTED=True, SUMMARIZE_KEEP_RECENT=2, SUMMARIZE_THRESHOLD_TOKENS=None
    )
    mem = Memory.session("compacted", owner=user)
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(mem, [*FACTS, *CHATTER])
    snapshot = mem.compact()
    assert snapshot.upto == len(FACTS) + len(CHATTER) - 2 and mem.count() == 2
    (top,) = mem.search("Lisbon trip September", limit=1, mode="vector")
    assert top.cursor == 3 and top.message.content == FACTS[2]


def test_messages_not_embedded_yet_are_promoted_before_pruning(db, user):
    # The appends' embedding never ran (no commit callbacks here: the task is "still queued").
    mem = Memory.session("lagging", owner=user)
    add_turns(mem, [*FACTS, *CHATTER])
    assert not Embedding.objects.filter(session=mem.session).exists()
    mem.save_snapshot("summary", upto=3, prune=True)
    assert set(Embedding.objects.filter(session=mem.session).values_list("cursor", flat=True)) == {
        1,
        2,
        3,
    }
    assert mem.search("boiler serviced Nordheat", limit=1, mode="vector")[0].cursor == 2


def test_promotion_is_idempotent_by_session_cursor_and_model(pruned_chat):
    before = list(
        Embedding.objects.filter(session=pruned_chat.session)
        .order_by("cursor")
        .values_list("cursor", "model", "content")
    )
    assert [c for c, _, _ in before] == list(range(1, 10))
    assert promote_before_pruning(pruned_chat.id, 9) == 0
    assert embed_messages(session_ids=[pruned_chat.id]) == 0
    assert pruned_chat.prune_compacted() == 0
    after = list(
        Embedding.objects.filter(session=pruned_chat.session)
        .order_by("cursor")
        .values_list("cursor", "model", "content")
    )
    assert after == before
    # Only pruned turns carry their text: the live ones read it from the log.
    assert [bool(text) for _, _, text in after] == [True] * 3 + [False] * 6
    kept = Embedding.objects.filter(session=pruned_chat.session, cursor=1).get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Embedding.objects.create(
            session=kept.session,
            owner=kept.owner,
            cursor=1,
            role="user",
            model=kept.model,
            dimensions=kept.dimensions,
            vector=kept.vector,
        )


@pytest.mark.parametrize("how", ["clear", "delete", "erase_owner"])
def test_clear_delete_and_erase_leave_nothing(pruned_chat, user, how):
    assert Embedding.objects.filter(session=pruned_chat.session, message__isnull=True).count() == 3
    if how == "erase_owner":
        Memory.erase_owner(user)
    else:
        getattr(pruned_chat, how)()
    assert not Embedding.objects.filter(session_id=pruned_chat.id).exists()
    assert not Embedding.objects.filter(owner=user).exists()
    if how == "clear":
        assert pruned_chat.search("boiler Nordheat", mode="hybrid") == []
        assert pruned_chat.search("boiler Nordheat", mode="hybrid", scope="owner") == []


def test_a_popped_message_takes_its_vectors_with_it(mem, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(mem, ["The gate code is 1234.", "Actually, forget that."])
    assert mem.session.embeddings.count() == 2
    log.pop_last(mem.id)
    assert list(mem.session.embeddings.values_list("cursor", flat=True)) == [1]
    assert all(r.cursor == 1 for r in mem.search("forget that gate", mode="vector"))


def test_kept_text_is_encrypted_at_rest(
    db, user, memory_settings_override, django_capture_on_commit_callbacks
):
    memory_settings_override(ENCRYPTION_KEYS=[Fernet.generate_key().decode()])
    mem = Memory.session("secret", owner=user)
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(mem, [*FACTS, *CHATTER])
    mem.save_snapshot("summary", upto=3, prune=True)
    stored = list(
        Embedding.objects.filter(session=mem.session, message__isnull=True).values_list(
            "content", flat=True
        )
    )
    assert len(stored) == 3 and all(text.startswith(ENCRYPTED_PREFIX) for text in stored)
    assert not any("Clara" in text for text in stored)
    (top,) = mem.search("sister Clara Vienna violin", limit=1, mode="vector")
    assert top.cursor == 1 and top.message.content == FACTS[0]  # decrypted on read


@pytest.mark.postgres
def test_fulltext_over_pruned_turns_has_its_own_gin_index(pruned_chat):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'memory_embedding_content_fts'"
        )
        (indexdef,) = cursor.fetchone()
    assert "USING gin (to_tsvector('english'::regconfig, content))" in indexdef
    assert "WHERE (message_id IS NULL)" in indexdef
