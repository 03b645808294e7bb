"""Extraction: what is learned from new messages, batched per session, applied once under
concurrency and redelivery, nothing of a failed batch kept; offline and through an
OpenAI-compatible model (the real SDK against the test server)."""

from __future__ import annotations

import json
import threading

import pytest

from memory_app import Memory
from memory_app.exceptions import ExtractorError
from memory_app.models import Item, Session
from memory_app.services import extraction
from memory_app.types import MemoryOp

pytestmark = pytest.mark.django_db(transaction=True)

FACT = "Remember that my daughter is called Mia."


def extracted_upto(mem) -> int:
    return Session.objects.get(pk=mem.id).extracted_upto


def turns(*texts):
    return [{"role": "user", "content": text} for text in texts]


def test_the_offline_extractor_learns_remembered_messages_after_the_append(offline, chat):
    chat.add_many(turns("hello there", FACT, "what is the weather?"))
    [memory] = chat.learned.current()
    assert memory.text == FACT and memory.session_id == chat.id
    assert memory.source_cursors == (2,) and memory.importance >= 0.5
    assert extracted_upto(chat) == 3
    # The same fact said again later is confirmed, not stored twice.
    chat.add_many(turns("ok", FACT, "thanks"))
    [again] = chat.learned.current()
    assert again.key == memory.key and again.confirmations == 1
    assert extracted_upto(chat) == 6


def test_extraction_waits_for_a_batch_unless_something_was_remembered(offline, chat):
    chat.add_many(turns("one", "two"))
    assert extracted_upto(chat) == 0  # two of three: waits
    chat.add(turns("three")[0])
    assert extracted_upto(chat) == 3 and chat.learned.current() == []
    chat.add(turns(FACT)[0])  # remembered: does not wait for the batch
    assert extracted_upto(chat) == 4 and len(chat.learned.current()) == 1


def test_ownerless_sessions_teach_nothing(offline, db):
    service = Memory.session("service", namespace="tests")
    service.add_many(turns(FACT, "a", "b", "c"))
    assert extracted_upto(service) == 0
    assert service.extract_memories() is None
    assert not Item.objects.exists()


class GatedExtractor:
    """Finds one fact per message; both runs extract before either applies."""

    name = "gated"
    gate = threading.Barrier(2, timeout=10)
    calls = 0

    def extract(self, messages, memories):
        GatedExtractor.calls += 1
        GatedExtractor.gate.wait()
        return [
            MemoryOp("add", f"fact of #{m.cursor}: {m.content}", 0.6, (m.cursor,)) for m in messages
        ]


def test_two_runs_of_one_batch_apply_it_once(settings, chat):
    settings.MEMORY_APP = {
        "MEMORY_EXTRACTOR": "tests.memories.test_extraction.GatedExtractor",
        "MEMORY_EXTRACT_BATCH": 1000,  # no run after the appends: the two below race
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    chat.add_many(turns("the boiler is in the attic", "the cat is called Pixel"))
    results = []

    def run():
        try:
            results.append(extraction.extract(chat.id))
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert GatedExtractor.calls == 2  # both read the batch...
    assert sorted(r["batches"] for r in results) == [0, 1]  # ...one applied it
    assert sorted(m.text for m in chat.learned.current()) == [
        "fact of #1: the boiler is in the attic",
        "fact of #2: the cat is called Pixel",
    ]
    assert extracted_upto(chat) == 2
    # A redelivered task finds the cursor moved: nothing to do.
    assert extraction.extract(chat.id) == {
        "read": 0,
        "added": 0,
        "updated": 0,
        "confirmed": 0,
        "batches": 0,
    }


class FailingExtractor:
    name = "failing"
    fail = True

    def extract(self, messages, memories):
        if FailingExtractor.fail:
            raise ExtractorError("the model is down")
        return [MemoryOp("add", m.content, 0.5, (m.cursor,)) for m in messages]


def test_a_failed_batch_keeps_nothing_and_is_read_again(settings, chat):
    settings.MEMORY_APP = {
        "MEMORY_EXTRACTOR": "tests.memories.test_extraction.FailingExtractor",
        "MEMORY_EXTRACT_BATCH": 1000,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    chat.add_many(turns("Ada moved to Bergen"))
    with pytest.raises(ExtractorError):
        chat.extract_memories()
    assert extracted_upto(chat) == 0 and chat.learned.current() == []
    FailingExtractor.fail = False
    try:
        assert chat.extract_memories()["added"] == 1
    finally:
        FailingExtractor.fail = True
    assert [m.text for m in chat.learned.current()] == ["Ada moved to Bergen"]


def test_the_openai_extractor_adds_and_updates_with_one_call_per_batch(
    settings, chat, openai_server
):
    settings.MEMORY_APP = {
        "MEMORY_EXTRACTOR": "memory_app.providers.extractors.OpenAIExtractor",
        "MEMORY_EXTRACTOR_OPTIONS": {"model": "test-extract"},
        "MEMORY_EXTRACT_BATCH": 1000,
        "OPENAI": {"base_url": openai_server.base_url, "api_key": "test", "max_retries": 0},
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    job = chat.learned.remember("Ada works at the bakery")
    chat.add_many(
        turns("I quit the bakery, I work at the library now.", "Also I adopted a dog, Rex.")
    )
    openai_server.reply_with(
        json.dumps(
            {
                "operations": [
                    {
                        "action": "update",
                        "key": job.key,
                        "text": "Ada works at the library",
                        "importance": 0.8,
                        "cursors": [1],
                    },
                    {
                        "action": "add",
                        "key": None,
                        "text": "Ada has a dog called Rex",
                        "importance": 0.7,
                        "cursors": [2],
                    },
                    # Invented by the model: a cursor not in the batch, an unknown key.
                    {
                        "action": "add",
                        "key": None,
                        "text": "Ada likes jazz",
                        "importance": 0.5,
                        "cursors": [99],
                    },
                    {
                        "action": "update",
                        "key": "nope",
                        "text": "Ada is 30",
                        "importance": 0.5,
                        "cursors": [2],
                    },
                ]
            }
        )
    )
    done = chat.extract_memories()
    assert done == {"read": 2, "added": 2, "updated": 1, "confirmed": 0, "batches": 1}
    requests = openai_server.requests_to("/chat/completions")
    assert len(requests) == 1
    request = requests[0]["body"]
    assert request["model"] == "test-extract"
    assert request["response_format"]["type"] == "json_schema"
    sent = json.loads(request["messages"][1]["content"])
    assert {"key": job.key, "text": "Ada works at the bakery"} in sent["memories"]
    assert [m["cursor"] for m in sent["messages"]] == [1, 2]
    assert sorted(m.text for m in chat.learned.current()) == [
        "Ada has a dog called Rex",
        "Ada is 30",
        "Ada works at the library",
    ]
    assert [v.text for v in chat.learned.history(job.key)] == [
        "Ada works at the bakery",
        "Ada works at the library",
    ]
    assert extracted_upto(chat) == 2


def test_an_answer_that_is_not_the_schema_fails_the_batch(settings, chat, openai_server):
    settings.MEMORY_APP = {
        "MEMORY_EXTRACTOR": "memory_app.providers.extractors.OpenAIExtractor",
        "MEMORY_EXTRACT_BATCH": 1000,
        "OPENAI": {"base_url": openai_server.base_url, "api_key": "test", "max_retries": 0},
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    chat.add_many(turns("Ada moved to Bergen"))
    openai_server.reply_with("Sure! Ada moved.")
    with pytest.raises(ExtractorError, match="no operations"):
        chat.extract_memories()
    openai_server.fail_next(status=503)
    with pytest.raises(ExtractorError, match="failed"):
        chat.extract_memories()
    assert extracted_upto(chat) == 0 and chat.learned.current() == []


def test_the_task_is_idempotent_under_redelivery(offline, chat, settings):
    from memory_app import tasks
    from tests.memories.conftest import OFFLINE

    settings.MEMORY_APP = {**settings.MEMORY_APP, "MEMORY_EXTRACTOR": None}
    chat.add_many(turns(FACT, "the tap drips", "call the plumber"))
    settings.MEMORY_APP = {**settings.MEMORY_APP, "MEMORY_EXTRACTOR": OFFLINE}
    first = tasks.extract_memories.apply(args=[str(chat.id)], task_id="task-1").get()
    again = tasks.extract_memories.apply(args=[str(chat.id)], task_id="task-1").get()
    assert first["added"] == 1 and first["batches"] == 1
    assert again["batches"] == 0 and again["added"] == 0
    assert [m.text for m in chat.learned.current()] == [FACT]
