"""Encryption at rest of message content (MEMORY_APP["ENCRYPTION_KEYS"], MultiFernet): the
database holds ciphertext, everything above the log reads plaintext, rows written before
encryption still read, keys rotate with memory_rotate_keys, and a missing key is a clear error."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from memory_app import Memory
from memory_app.checks import check_settings
from memory_app.encryption import ENCRYPTED_PREFIX
from memory_app.exceptions import DecryptionFailed, InvalidMessage
from memory_app.models import Message

from ..api.conftest import import_url, session_url

pytestmark = pytest.mark.django_db

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()
SECRET = "my card number is 4111 1111 1111 1111"


def keys(*k: str):
    return override_settings(MEMORY_APP={"ENCRYPTION_KEYS": list(k)})


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": SECRET, "metadata": {"lang": "en"}},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"part: {SECRET}"},
                {"type": "image_url", "image_url": {"url": "https://example.com/card.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "charge", "arguments": json.dumps({"card": SECRET})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": f"charged {SECRET}"},
        {"role": "assistant", "content": ""},
    ]


def raw_rows(session_id) -> list[tuple]:
    """The stored columns as the database has them (no decryption)."""
    return list(
        Message.objects.filter(session_id=session_id)
        .order_by("seq")
        .values_list("content", "content_parts", "tool_calls")
    )


def assert_ciphertext(session_id) -> None:
    stored = json.dumps(raw_rows(session_id))
    assert "4111" not in stored and "card.png" not in stored
    for content, parts, calls in raw_rows(session_id):
        assert content == "" or content.startswith(ENCRYPTED_PREFIX)
        assert parts is None or parts.startswith(ENCRYPTED_PREFIX)
        for call in calls or []:
            assert call["function"]["arguments"].startswith(ENCRYPTED_PREFIX)
            assert call["function"]["name"] == "charge"  # names stay readable


def test_content_parts_and_arguments_are_stored_encrypted_and_read_back(user):
    plain = Memory.create("plain", owner=user)
    plain.add_many(conversation())
    with keys(NEW):
        secret = Memory.create("secret", owner=user)
        stored = secret.add_many(conversation())
        assert_ciphertext(secret.id)

        # What the adapter returns is the plaintext, as without encryption (ids and times aside).
        def same(ms):
            return [m.as_dict() | {"created_at": None} for m in ms]

        assert same(stored) == same(plain.messages())
        assert same(secret.messages()) == same(plain.messages())
        assert same(secret.last(3)) == same(plain.last(3))
        assert secret.get_message(2).content == SECRET
        assert secret.window(max_tokens=500).messages == plain.window(max_tokens=500).messages
        # Token counts are those of the plaintext.
        assert [m.tokens for m in secret.messages()] == [m.tokens for m in plain.messages()]
        exported = secret.export()
        assert exported["messages"] == [
            {**m, "created_at": s["created_at"]}
            for m, s in zip(plain.export()["messages"], exported["messages"], strict=True)
        ]
        assert secret.pop_last().content == ""


def test_rows_written_before_encryption_still_read(user):
    memory = Memory.create("mixed", owner=user)
    memory.add({"role": "user", "content": "written in plaintext"})
    with keys(NEW):
        memory.add({"role": "user", "content": SECRET})
        contents = [c for c, _, _ in raw_rows(memory.id)]
        assert contents[0] == "written in plaintext" and contents[1].startswith(ENCRYPTED_PREFIX)
        assert [m.content for m in memory.messages()] == ["written in plaintext", SECRET]


def test_an_idempotent_retry_returns_the_original_in_plaintext(user):
    with keys(NEW):
        memory = Memory.create("retry", owner=user)
        first = memory.add({"role": "user", "content": SECRET, "idempotency_key": "k1"})
        again = memory.add({"role": "user", "content": SECRET, "idempotency_key": "k1"})
        assert (again.cursor, again.content) == (first.cursor, SECRET)
        assert memory.count() == 1


def test_import_stores_encrypted_and_the_api_answers_plaintext(api, user):
    source = Memory.create("source", owner=user, namespace="bot")
    source.add_many(conversation())
    with keys(NEW):
        response = api.post(import_url() + "?key=copy", source.export(), format="json")
        assert response.status_code == 201, response.data
        copy_id = response.json()["id"]
        assert_ciphertext(copy_id)
        body = api.get(session_url(copy_id, "messages")).json()
        assert body["messages"][1]["content"] == SECRET
        appended = api.post(
            session_url(copy_id, "messages"), {"role": "user", "content": SECRET}, format="json"
        )
        assert appended.json()["messages"][0]["content"] == SECRET
        window = api.get(session_url(copy_id, "window")).json()
        assert SECRET in json.dumps(window)


def test_rotation_moves_every_row_to_the_newest_key(user):
    before = Memory.create("before", owner=user)
    before.add_many(conversation())  # plaintext, written before encryption was turned on
    with keys(OLD):
        memory = Memory.create("rotating", owner=user)
        memory.add_many(conversation())
    with keys(NEW, OLD):
        # Both keys decrypt; new rows are written with the newest.
        assert memory.get_message(2).content == SECRET
        out = StringIO()
        call_command("memory_rotate_keys", "--batch-size", "4", "--no-progress", stdout=out)
        assert (
            "Re-encrypted 10 of 12 message(s)" in out.getvalue()
        )  # two empty contents need nothing
        again = StringIO()
        call_command("memory_rotate_keys", "--no-progress", stdout=again)
        assert "Re-encrypted 0 of 12" in again.getvalue()
    newest = Fernet(NEW)
    for session in (before, memory):
        assert_ciphertext(session.id)
        for content, parts, calls in raw_rows(session.id):
            for value in [content, parts, *[c["function"]["arguments"] for c in calls or []]]:
                if value:
                    newest.decrypt(value[len(ENCRYPTED_PREFIX) :].encode())  # raises if not NEW's
    with keys(NEW):  # the old key can go
        assert [m.content for m in memory.messages()] == [m.content for m in before.messages()]
        assert memory.get_message(2).content == SECRET


def test_a_missing_key_is_a_typed_error_and_a_500(api, user):
    with keys(OLD):
        memory = Memory.create("locked", owner=user)
        memory.add({"role": "user", "content": SECRET})
    with keys(NEW), pytest.raises(DecryptionFailed):
        memory.messages()
    with pytest.raises(DecryptionFailed):
        memory.messages()  # encryption turned off altogether
    with keys(NEW):
        response = api.get(session_url(memory.id, "messages"))
        assert response.status_code == 500
        assert response.json()["code"] == "decryption_failed"
        assert "4111" not in response.content.decode()


@pytest.mark.parametrize("encrypted", [False, True])
def test_text_that_looks_encrypted_is_refused(mem, encrypted):
    with keys(*([NEW] if encrypted else [])):
        for message, field in [
            ({"role": "user", "content": ENCRYPTED_PREFIX + "gAAAA"}, "content"),
            (
                {"role": "user", "content": [{"type": "text", "text": ENCRYPTED_PREFIX + "x"}]},
                "content",
            ),
            (
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": ENCRYPTED_PREFIX},
                        }
                    ],
                },
                "tool_calls",
            ),
        ]:
            with pytest.raises(InvalidMessage) as err:
                mem.add(message)
            assert err.value.field == field
    assert mem.count() == 0


def test_rotation_needs_a_key(db):
    with pytest.raises(CommandError, match="ENCRYPTION_KEYS"):
        call_command("memory_rotate_keys", "--no-progress")


def test_bad_keys_fail_the_system_check():
    with keys("not-a-key", NEW):
        assert [e.id for e in check_settings()] == ["memory_app.E010"]
    with override_settings(MEMORY_APP={"ENCRYPTION_KEYS": NEW}):
        assert [e.id for e in check_settings()] == ["memory_app.E010"]
    with keys(NEW, OLD):
        assert check_settings() == []


def test_rotation_drops_full_text_vectors_made_from_plaintext(
    user, django_capture_on_commit_callbacks
):
    before = Memory.create("indexed-in-plaintext", owner=user)
    with django_capture_on_commit_callbacks(execute=True):  # the after-append job runs
        before.add({"role": "user", "content": SECRET})
    rows = Message.objects.filter(session_id=before.id)
    if connection.vendor == "postgresql":
        assert rows.get().search_vector is not None  # lexemes of the plaintext
        assert [r.cursor for r in before.search("card number", mode="fulltext")] == [1]
    with keys(NEW):
        call_command("memory_rotate_keys", "--no-progress", stdout=StringIO())
        assert_ciphertext(before.id)
        assert rows.get().search_vector is None
        assert before.search("card number", mode="fulltext") == []
        assert before.get_message(1).content == SECRET


def test_search_finds_encrypted_messages_by_their_plaintext(user):
    # Embeddings are computed from the plaintext (the embedding step reads messages through the
    # log, which decrypts).
    with keys(NEW):
        memory = Memory.create("searchable", owner=user)
        memory.add_many(
            [
                {"role": "user", "content": "The quarterly report is due on Friday."},
                {"role": "user", "content": "My dog Biscuit loves the beach."},
            ]
        )
        memory.embed()
        [top] = memory.search("when is the quarterly report due?", limit=1, mode="vector")
        assert top.message.content == "The quarterly report is due on Friday."


def test_rotation_covers_the_kept_text_of_pruned_turns(user, django_capture_on_commit_callbacks):
    from memory_app.models import Embedding

    with keys(OLD):
        memory = Memory.create("pruned", owner=user)
        with django_capture_on_commit_callbacks(execute=True):
            memory.add_many([{"role": "user", "content": f"{SECRET} number {i}"} for i in range(4)])
        memory.save_snapshot("summary", upto=3, prune=True)
        kept = Embedding.objects.filter(session_id=memory.id, message__isnull=True).exclude(
            content=""
        )
        assert kept.count() == 3 and all(
            c.startswith(ENCRYPTED_PREFIX) for c in kept.values_list("content", flat=True)
        )
    with keys(NEW, OLD):
        out = StringIO()
        call_command("memory_rotate_keys", "--no-progress", stdout=out)
        assert "and 3 kept text(s) of pruned turns" in out.getvalue()
    newest = Fernet(NEW)
    for content in kept.values_list("content", flat=True):
        newest.decrypt(content[len(ENCRYPTED_PREFIX) :].encode())  # raises if not NEW's
    with keys(NEW):  # the old key can go: pruned turns are still found
        found = memory.search(f"{SECRET} number 1", limit=4, mode="vector")
        assert any(r.message.content == f"{SECRET} number 1" for r in found)
