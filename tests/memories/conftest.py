"""Fixtures of the learned-memory tests: an owner, a session of theirs, an extractor."""

from __future__ import annotations

import pytest

from memory_app import Memory

OFFLINE = "memory_app.providers.extractors.OfflineExtractor"


@pytest.fixture
def learned(db, user):
    return Memory.learned(user)


@pytest.fixture
def chat(db, user):
    return Memory.session("chat", owner=user, namespace="tests")


@pytest.fixture
def offline(settings):
    """The offline extractor, extracting once three messages wait."""
    settings.MEMORY_APP = {
        **(getattr(settings, "MEMORY_APP", None) or {}),
        "MEMORY_EXTRACTOR": OFFLINE,
        "MEMORY_EXTRACT_BATCH": 3,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    return settings
