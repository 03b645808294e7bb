"""Settings of the demo project that hosts ``memory_app``.

Everything is read from the environment with defaults that work on a fresh clone.
"""

import os
from pathlib import Path

from .database import database_config

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-demo-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver"
).split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served locally (works offline)
    "memory_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {"default": database_config(BASE_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "admin:login"

# Celery: Redis when a broker is configured, eager in-process execution otherwise.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or ""
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "memory")
CELERY_RESULT_BACKEND = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Embedding and summarization on queues of their own (MEMORY_APP["TASK_QUEUES"]: memory_embed,
# memory_summarize), so a backlog of one never starves the other. `celery -A project worker`
# consumes every queue below; `-Q memory_embed` makes a worker that only embeds. (Eager runs
# without a broker need no routing.)
if CELERY_BROKER_URL:
    CELERY_TASK_ROUTES = ["memory_app.tasks.route_task"]
# Celery beat (`celery -A project beat`): retention and the catch-up sweeps run themselves.
# Each is safe to run twice at once. MEMORY_BEAT_SECONDS runs them all at that interval instead.
CELERY_BEAT_SCHEDULE = {
    "memory-prune-expired": {"task": "memory_app.prune_expired", "schedule": 5 * 60},
    "memory-apply-retention": {"task": "memory_app.apply_retention", "schedule": 60 * 60},
    "memory-sweep-summaries": {"task": "memory_app.sweep_summaries", "schedule": 10 * 60},
    "memory-sweep-embeddings": {"task": "memory_app.sweep_embeddings", "schedule": 30 * 60},
}
if os.environ.get("MEMORY_BEAT_SECONDS"):
    for _entry in CELERY_BEAT_SCHEDULE.values():
        _entry["schedule"] = float(os.environ["MEMORY_BEAT_SECONDS"])

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "memory_app API",
    "DESCRIPTION": "Conversation memory for LLM agents.",
    "VERSION": "0.2.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # --- REST API (memory_app.api) ---
    # Separate request/response components, so read-only fields are not asked of clients.
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI's files come from drf-spectacular-sidecar: no CDN needed.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# The app's own settings: one namespace, documented in docs/settings.md. The demo learns facts
# from what its users ask it to remember (no model needed).
MEMORY_APP: dict = {"MEMORY_EXTRACTOR": "memory_app.providers.extractors.OfflineExtractor"}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "memory_app": {"handlers": ["console"], "level": os.environ.get("MEMORY_LOG_LEVEL", "INFO")}
    },
}


# ---- settings given as JSON in the environment (worker processes, containers) -----------------
# CELERY_BROKER_TRANSPORT_OPTIONS: Redis transport options, e.g. {"visibility_timeout": 3600}:
# an unacknowledged task is redelivered after that many seconds (a killed worker's task).
# MEMORY_APP_JSON: the MEMORY_APP dict, for processes that have no settings module of their own
# (README: Settings). Either one that is not a JSON object stops the process with one line.
def _json_object_from_env(name: str) -> dict | None:
    import json
    import sys

    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        sys.exit(f"{name} is not valid JSON ({err}); it must be a JSON object such as {{}}")
    if not isinstance(value, dict):
        kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        kind = kinds.get(type(value), "a number")
        sys.exit(f"{name} must be a JSON object such as {{}}, not {kind}")
    return value


if (_transport := _json_object_from_env("CELERY_BROKER_TRANSPORT_OPTIONS")) is not None:
    CELERY_BROKER_TRANSPORT_OPTIONS = _transport
if (_memory_json := _json_object_from_env("MEMORY_APP_JSON")) is not None:
    MEMORY_APP = _memory_json

# The queues a worker started without -Q consumes: the default one and the app's own.
try:
    from kombu import Queue
except ImportError:  # no [tasks] extra: everything runs inline
    Queue = None
if Queue is not None:
    from memory_app.conf import DEFAULTS as _MEMORY_DEFAULTS

    _MEMORY_QUEUES = {**_MEMORY_DEFAULTS["TASK_QUEUES"], **(MEMORY_APP.get("TASK_QUEUES") or {})}
    CELERY_TASK_QUEUES = [
        Queue(name)
        for name in dict.fromkeys(
            [CELERY_TASK_DEFAULT_QUEUE, *(q for q in _MEMORY_QUEUES.values() if q)]
        )
    ]

# ---- a read replica (opt-in): REPLICA_DATABASE_URL names a hot standby of DATABASE_URL ----------
# Stale-tolerant reads (admin lists, owner-scope search, exports of idle sessions) go there; the
# agent path reads the primary (memory_app.routers; docs/scaling.md).
if os.environ.get("REPLICA_DATABASE_URL"):
    import dj_database_url

    DATABASES["replica"] = dj_database_url.parse(os.environ["REPLICA_DATABASE_URL"])
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["memory_app.routers.MemoryRouter"]
    MIDDLEWARE.append("memory_app.routers.ReplicaReadsMiddleware")
    MEMORY_APP = {**MEMORY_APP, "READ_REPLICAS": ["replica"]}

# Through a transaction pooler (DB_TRANSACTION_POOLER=1, project/database.py) the app prepares
# no statements: PgBouncer before 1.21 keeps none per client.
if os.environ.get("DB_TRANSACTION_POOLER", "0") == "1":
    MEMORY_APP = {"PREPARE_STATEMENTS": False, **MEMORY_APP}
