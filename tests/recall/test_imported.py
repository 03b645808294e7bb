"""Imported sessions are embedded once the import commits: searchable without a backfill."""

from __future__ import annotations

import pytest
from django.db import transaction

from memory_app import Memory
from memory_app.models import Embedding
from memory_app.services.embedding import count_missing
from tests.recall.conftest import add_turns


def test_an_imported_session_is_searchable_after_the_import(
    garden_chat, other_user, django_capture_on_commit_callbacks
):
    data = garden_chat.export()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        copy = Memory.import_session(data, owner=other_user)
    assert len(callbacks) == 1
    assert Embedding.objects.filter(session_id=copy.id).count() == 6
    assert count_missing(session_ids=[copy.id]) == 0
    for mode in ("vector", "fulltext", "hybrid"):
        (top,) = copy.search("when is the quarterly report due?", limit=1, mode=mode)
        assert top.session_id == copy.id and top.cursor == 3
    # Owner scope finds it too, under the new owner only.
    (top,) = copy.search("golden retriever beach", limit=1, scope="owner", mode="vector")
    assert top.session_id == copy.id and top.message.content.startswith("My dog Biscuit")


def test_an_import_rolled_back_embeds_nothing(
    garden_chat, other_user, django_capture_on_commit_callbacks
):
    data = garden_chat.export()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            Memory.import_session(data, owner=other_user)
            raise RuntimeError("the caller's transaction fails")
    assert callbacks == [] and not Embedding.objects.filter(owner=other_user).exists()


def test_embed_on_append_off_embeds_only_remembered_imported_messages(
    db, user, other_user, memory_settings_override, django_capture_on_commit_callbacks
):
    memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
    mem = Memory.session("notes", owner=user)
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(mem, ["The alarm code is 4417.", "We talked about the weather."])
        add_turns(mem, ["My passport expires in August 2027."], remember=True)
    with django_capture_on_commit_callbacks(execute=True):
        copy = Memory.import_session(mem.export(), owner=other_user)
    assert list(
        Embedding.objects.filter(session_id=copy.id).values_list("message__seq", flat=True)
    ) == [3]
