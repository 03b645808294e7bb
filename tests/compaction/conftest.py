"""Fixtures for the compaction tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def llm_settings(settings, openai_server):
    """MEMORY_APP with the OpenAI summarizer pointed at the test server (no SDK retries)."""
    settings.MEMORY_APP = {
        "OPENAI": {
            "base_url": openai_server.base_url,
            "api_key": "test",
            "max_retries": 0,
            "timeout": 20,
        },
        "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
        "SUMMARIZER_OPTIONS": {"model": "test-summarizer", "max_tokens": 200},
        "SUMMARIZE_KEEP_RECENT": 2,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    return settings.MEMORY_APP


def turns(n: int, start: int = 1, prefix: str = "msg") -> list[dict]:
    """``n`` alternating user/assistant messages with unique, findable texts."""
    return [
        {
            "role": "user" if i % 2 else "assistant",
            "content": f"{prefix}-{i:03d} says hello. And more.",
        }
        for i in range(start, start + n)
    ]
