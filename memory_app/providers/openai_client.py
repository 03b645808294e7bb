"""The ``openai`` SDK client shared by the OpenAI embedding and summarizer providers.

Any OpenAI-compatible server works: set ``MEMORY_APP["OPENAI"]["base_url"]``. Keys fall back to
the SDK's own environment variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``).
"""

from __future__ import annotations

from typing import Any

from ..conf import memory_settings


def openai_client(**overrides: Any):
    """A configured ``openai.OpenAI``; ``overrides`` that are not ``None`` win over
    ``MEMORY_APP["OPENAI"]`` (a ``None`` override leaves the setting in force)."""
    import openai

    given = {k: v for k, v in overrides.items() if v is not None}
    options = {k: v for k, v in {**memory_settings.OPENAI, **given}.items() if v is not None}
    return openai.OpenAI(**options)
