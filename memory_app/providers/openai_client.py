"""The ``openai`` SDK client shared by the OpenAI embedding and summarizer providers.

Any OpenAI-compatible server works: set ``MEMORY_APP["OPENAI"]["base_url"]``. Keys fall back to
the SDK's own environment variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``).
"""

from __future__ import annotations

from typing import Any

from ..conf import memory_settings


def openai_client(**overrides: Any):
    """A configured ``openai.OpenAI``; ``overrides`` win over ``MEMORY_APP["OPENAI"]``."""
    import openai

    options = {k: v for k, v in {**memory_settings.OPENAI, **overrides}.items() if v is not None}
    return openai.OpenAI(**options)
