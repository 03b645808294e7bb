"""memory_embed: embeds what is missing, in batches, with progress; a second run resumes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from memory_app import Memory
from memory_app.models import Embedding
from tests.recall.conftest import add_turns


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("memory_embed", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def unembedded(db, user, memory_settings_override, django_capture_on_commit_callbacks):
    memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
    sessions = [Memory.session(f"old-{i}", owner=user) for i in range(2)]
    with django_capture_on_commit_callbacks(execute=True):
        for mem in sessions:
            add_turns(
                mem, [f"note {n} of {mem.key}: the tide table for pier {n}" for n in range(30)]
            )
    assert not Embedding.objects.exists()
    return sessions


def test_backfill_reports_progress_and_resumes(unembedded):
    out, err = run("--batch-size", "10", "--limit", "25")
    assert "lexical-hash-v1-512 (512 dimensions): 25 messages to embed" in out
    assert "25/25" in err  # the progress bar
    assert "Stored 25 vectors." in out
    assert Embedding.objects.count() == 25

    # Interrupted there; the next run continues with what is still missing.
    out, err = run("--batch-size", "10")
    assert "35 messages to embed" in out and "35/35" in err and "Stored 35 vectors." in out
    assert Embedding.objects.count() == 60
    assert Embedding.objects.values("message").distinct().count() == 60

    out, _ = run()
    assert "0 messages to embed" in out and "Stored 0 vectors." in out


def test_backfill_of_one_session_and_reembedding(unembedded):
    first, second = unembedded
    out, _ = run("--session", str(first.id), "--no-progress")
    assert "Stored 30 vectors." in out
    assert set(Embedding.objects.values_list("session_id", flat=True)) == {first.id}
    old_ids = set(Embedding.objects.values_list("id", flat=True))
    out, _ = run("--session", str(first.id), "--reembed", "--no-progress")
    assert "30 messages to embed" in out and "Stored 30 vectors." in out
    assert Embedding.objects.count() == 30 and old_ids.isdisjoint(
        Embedding.objects.values_list("id", flat=True)
    )


def test_backfill_failure_keeps_finished_batches(unembedded, openai_embedder):
    out, _ = run("--batch-size", "4", "--limit", "4", "--no-progress")
    assert "Stored 4 vectors." in out
    openai_embedder.fail_next(10, status=500)  # then the provider goes down
    with pytest.raises(CommandError, match="run again to resume"):
        run("--batch-size", "4", "--no-progress")
    assert Embedding.objects.count() == 4
    openai_embedder.reset()
    out, _ = run("--batch-size", "8", "--no-progress")
    assert "56 messages to embed" in out and "Stored 56 vectors." in out
    assert Embedding.objects.filter(model="test-embed@64").count() == 60


def test_bad_options(db):
    with pytest.raises(CommandError):
        run("--batch-size", "0")


def test_messages_never_embedded_are_not_pending(
    db, user, memory_settings_override, django_capture_on_commit_callbacks
):
    """Empty, image-only, bare tool calls and acknowledgements are never embedded, so the
    backfill does not count them as pending, before or after a run."""
    from memory_app.services.embedding import count_missing
    from tests.conftest import tool_turn

    memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
    mem = Memory.session("mixed", owner=user)
    with django_capture_on_commit_callbacks(execute=True):
        mem.add_many(
            [
                {"role": "user", "content": "The boiler service is booked for the second of June."},
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                    ],
                },
                {"role": "user", "content": "   "},
                {"role": "assistant", "content": "ok, thanks!"},
                *tool_turn(result="boiler: serviced 2023"),
            ]
        )
    assert count_missing(session_ids=[mem.id]) == 2  # the booking and the tool's result
    out, err = run("--session", str(mem.id))
    assert "2 messages to embed" in out and "2/2" in err and "Stored 2 vectors." in out
    out, _ = run("--session", str(mem.id))
    assert "0 messages to embed" in out and "Stored 0 vectors." in out
    assert count_missing(session_ids=[mem.id]) == 0
