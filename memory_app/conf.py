"""The app's settings, read from one dict in the host project's settings::

    MEMORY_APP = {"TOKEN_ENCODING": "cl100k_base", "PRUNE_COMPACTED": True}

Read them through ``memory_settings.NAME``. As with DRF's ``api_settings``, dotted paths listed in
``IMPORT_STRINGS`` are imported lazily, and ``override_settings(MEMORY_APP=...)`` takes effect at
once because the cache is dropped on ``setting_changed``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

SETTINGS_NAME = "MEMORY_APP"

DEFAULTS: dict[str, Any] = {
    # Tokenizer (a bpe-openai encoding name) used to count and cache message tokens.
    "TOKEN_ENCODING": "o200k_base",
    # Per-model encodings for window(model=...): {"gpt-4": "cl100k_base"}. Models bpe-openai
    # knows are resolved by it; this dict wins.
    "MODEL_ENCODINGS": {},
    # A message whose JSON (content, tool_calls, extra) is larger than this is refused.
    "MAX_MESSAGE_BYTES": 256 * 1024,
    # Most messages accepted in one add_many() call.
    "MAX_BATCH_SIZE": 1000,
    # Delete the messages a snapshot stands for when it is saved (per-call override exists).
    "PRUNE_COMPACTED": False,
    # Namespace used when none is given.
    "DEFAULT_NAMESPACE": "default",
    # Messages fetched per query while filling a window from the newest backwards.
    "WINDOW_PAGE_SIZE": 200,
    # Keyword arguments for openai.OpenAI() used by the OpenAI providers: api_key, base_url,
    # timeout, max_retries. Unset keys fall back to the SDK's environment variables.
    "OPENAI": {},

    # ---- recall: embeddings and search ----------------------------------------------------
    # Dotted path of the embedding provider class (see memory_app/providers/embeddings.py).
    "EMBEDDER": "memory_app.providers.embeddings.LexicalEmbedder",
    # Keyword arguments for the embedder's constructor (model, dimensions, batch_size...).
    "EMBEDDER_OPTIONS": {},
    # Embed new messages in a background task after each append commits.
    "EMBED_ON_APPEND": True,

    # ---- summarization (compaction) --------------------------------------------------------
    # Dotted path of the summarizer class (see memory_app/providers/summarizers.py).
    "SUMMARIZER": "memory_app.providers.summarizers.ExtractiveSummarizer",
    # Keyword arguments for the summarizer's constructor (model, prompt, max_tokens...).
    "SUMMARIZER_OPTIONS": {},
    # Enqueue summarization once the tokens after the latest snapshot exceed this (None: never).
    "SUMMARIZE_THRESHOLD_TOKENS": 8000,
    # Messages left unsummarized at the end of the log by compaction.
    "SUMMARIZE_KEEP_RECENT": 20,
    # Most tokens of messages given to the summarizer in one run (None: no limit). The rest is
    # covered by the next run; a single tool group larger than this still goes whole.
    "SUMMARIZE_MAX_INPUT_TOKENS": 30000,
    # Times compaction reloads and tries again when another snapshot was saved meanwhile.
    "SUMMARIZE_MAX_ATTEMPTS": 3,
    # Redis URL of the "one summarization per session at a time" lock; None: the Celery broker
    # URL when it is a Redis one (with another broker and no URL, enqueues are not deduplicated).
    "SUMMARIZE_LOCK_URL": None,
    # Lifetime of that lock: it is released when the task ends, and expires after this many
    # seconds if the task is lost, so a session is never blocked for good.
    "SUMMARIZE_LOCK_SECONDS": 900,
    # Prefix of the lock keys in Redis (followed by the session id).
    "SUMMARIZE_LOCK_PREFIX": "memory_app:summarize:",

    # --- REST API (memory_app.api) ----------------------------------------------------------
    # Permission classes of the API views (dotted paths). Each user sees only their own
    # sessions; "memory_app.api.permissions.StaffSeesAllOwners" lets staff see everyone's.
    "API_PERMISSION_CLASSES": ["memory_app.api.permissions.OwnerScoped"],
    # Throttle classes of the API views (dotted paths) and their per-user rates by scope:
    # "memory_read" for GETs, "memory_write" for the rest; an action may name its own scope.
    # A scope missing here (or None) is not throttled. The defaults only stop runaway loops.
    "API_THROTTLE_CLASSES": ["memory_app.api.throttling.MemoryScopedRateThrottle"],
    "API_THROTTLE_RATES": {"memory_read": "6000/minute", "memory_write": "3000/minute"},
    # Messages per page of GET sessions/{id}/messages/ when no limit is given, and the most
    # a client may ask for.
    "API_MESSAGES_PAGE_SIZE": 100,
    "API_MESSAGES_MAX_PAGE_SIZE": 1000,
    # Sessions per page of GET sessions/ (the client may ask for up to API_SESSIONS_MAX_PAGE_SIZE).
    "API_SESSIONS_PAGE_SIZE": 50,
    "API_SESSIONS_MAX_PAGE_SIZE": 500,
}

# Settings given as dotted paths and imported on first use.
IMPORT_STRINGS: tuple[str, ...] = ("EMBEDDER", "SUMMARIZER")


class MemorySettings:
    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        self.defaults = defaults or DEFAULTS
        self._cached: set[str] = set()

    @property
    def user_settings(self) -> dict[str, Any]:
        if not hasattr(self, "_user_settings"):
            self._user_settings = getattr(settings, SETTINGS_NAME, {}) or {}
        return self._user_settings

    def __getattr__(self, attr: str) -> Any:
        if attr not in self.defaults:
            raise AttributeError(f"Invalid {SETTINGS_NAME} setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        if attr in IMPORT_STRINGS and isinstance(value, str):
            value = import_string(value)
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()
        if hasattr(self, "_user_settings"):
            delattr(self, "_user_settings")


memory_settings = MemorySettings(DEFAULTS)


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTINGS_NAME:
        memory_settings.reload()


setting_changed.connect(_reload)
