"""Shared start-up of the examples: the demo project's settings, a migrated database, and the
``openai`` client settings from the environment.

Run the examples from the repository root, e.g. ``python examples/conversation.py "Hello"``.
Against a real key: ``OPENAI_API_KEY=sk-...``. Against any OpenAI-compatible server (vLLM,
Ollama, llama.cpp, LM Studio...): also ``OPENAI_BASE_URL=http://127.0.0.1:8000/v1``.
``OPENAI_MODEL`` picks the model (default ``gpt-4o-mini``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(migrate: bool = True) -> None:
    """Configure Django with the demo project (``DATABASE_URL`` or the embedded PostgreSQL)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def model_name() -> str:
    return os.environ.get("OPENAI_MODEL", "gpt-4o-mini")


def uses_openai_platform() -> bool:
    """Whether requests go to OpenAI itself (then the Agents SDK may upload its traces there)."""
    return not os.environ.get("OPENAI_BASE_URL")
