"""System checks: say clearly when the database cannot do what the app needs."""

from __future__ import annotations

import importlib.util

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from .conf import memory_settings

PGVECTOR_HELP = (
    "Install pgvector on the PostgreSQL server (Debian/Ubuntu: apt-get install "
    "postgresql-<version>-pgvector; see https://github.com/pgvector/pgvector#installation), "
    "then run migrate. Without DATABASE_URL the demo project starts an embedded PostgreSQL "
    "that ships pgvector."
)


def pgvector_available(connection) -> bool | None:
    """True/False on PostgreSQL, None elsewhere. Raises if the database cannot be reached."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        return cursor.fetchone() is not None


@register(Tags.database)
def check_pgvector(app_configs=None, databases=None, **kwargs):
    errors = []
    for alias in databases or ():
        connection = connections[alias]
        try:
            available = pgvector_available(connection)
        except Exception as err:  # unreachable database: other checks report that
            errors.append(
                Warning(f"Could not look for pgvector on {alias!r}: {err}", id="memory_app.W002")
            )
            continue
        if available is False:
            errors.append(
                Error(
                    f"The PostgreSQL server behind database {alias!r} has no pgvector extension.",
                    hint=PGVECTOR_HELP,
                    id="memory_app.E001",
                )
            )
    return errors


@register()
def check_settings(app_configs=None, **kwargs):
    errors = []
    from .tokens import get_encoding

    try:
        get_encoding(memory_settings.TOKEN_ENCODING)
    except Exception as err:
        errors.append(
            Error(
                f"MEMORY_APP['TOKEN_ENCODING'] is not a known encoding: {err}", id="memory_app.E002"
            )
        )
    if (
        not isinstance(memory_settings.MAX_MESSAGE_BYTES, int)
        or memory_settings.MAX_MESSAGE_BYTES <= 0
    ):
        errors.append(
            Error(
                "MEMORY_APP['MAX_MESSAGE_BYTES'] must be a positive integer", id="memory_app.E003"
            )
        )
    errors += _check_encryption_keys()
    errors += _check_retention()
    errors += _check_fusion()
    errors += _check_after_append()
    errors += check_extras()
    return errors


def _check_after_append() -> list:
    """``memory_app.E031``: ``AFTER_APPEND`` is not ``"deferred"`` or ``"immediate"``, or one of
    its millisecond settings is not a non-negative number."""
    errors = []
    if memory_settings.AFTER_APPEND not in ("deferred", "immediate"):
        errors.append(
            Error(
                "MEMORY_APP['AFTER_APPEND'] must be 'deferred' or 'immediate', not "
                f"{memory_settings.AFTER_APPEND!r}",
                id="memory_app.E031",
            )
        )
    for name in ("AFTER_APPEND_DELAY_MS", "AFTER_APPEND_DEBOUNCE_MS"):
        value = getattr(memory_settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            errors.append(
                Error(
                    f"MEMORY_APP[{name!r}] must be a non-negative number of milliseconds, not "
                    f"{value!r}",
                    id="memory_app.E031",
                )
            )
    return errors


def _check_fusion() -> list:
    """``memory_app.E030``: a hybrid search setting (``FUSION``, ``FUSION_NORMALISATION``,
    ``FUSION_VECTOR_WEIGHT``, ``RRF_K``, ``NEIGHBOUR_BOOST``) has a value search would refuse."""
    from django.core.exceptions import ImproperlyConfigured

    from .services.recall import fusion_config

    try:
        fusion_config()
    except ImproperlyConfigured as err:
        return [Error(str(err), hint="See docs/recall.md.", id="memory_app.E030")]
    return []


def _check_retention() -> list:
    """``memory_app.E020``: ``RETENTION`` is not a dict of valid per-namespace policies;
    ``memory_app.E021``: ``TASK_QUEUES`` is not a dict of queue names."""
    from .store import policies

    errors = []
    try:
        policies.parse(memory_settings.RETENTION)
    except ValueError as err:
        errors.append(
            Error(
                f"MEMORY_APP: {err}", hint="See memory_app/store/policies.py.", id="memory_app.E020"
            )
        )
    queues = memory_settings.TASK_QUEUES
    if queues is not None and (
        not isinstance(queues, dict)
        or any(
            kind not in ("embed", "summarize", "maintenance")
            or not (queue is None or (isinstance(queue, str) and queue))
            for kind, queue in queues.items()
        )
    ):
        errors.append(
            Error(
                "MEMORY_APP['TASK_QUEUES'] must map 'embed', 'summarize' and "
                "'maintenance' to queue names (or None: the default queue)",
                id="memory_app.E021",
            )
        )
    return errors


# ---- optional parts and the extra each needs -----------------------------------------------------


def package_installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found by the import system, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing_extra(what: str, module: str, extra: str, id: str) -> Error:
    return Error(
        f"{what} needs the {module!r} package, which is not installed",
        hint=f"pip install 'django-memory-app[{extra}]'",
        id=id,
    )


def _provider_needs(setting: str) -> tuple[str, str] | None:
    """``(module, extra)`` the configured provider of ``setting`` needs, or None."""
    from .conf import memory_settings
    from .providers.embeddings import OpenAIEmbedder, SentenceTransformerEmbedder
    from .providers.summarizers import OpenAISummarizer

    try:
        provider = getattr(memory_settings, setting)
    except Exception:  # a bad dotted path: the provider's own loading reports it
        return None
    cls = provider if isinstance(provider, type) else type(provider)
    if issubclass(cls, (OpenAIEmbedder, OpenAISummarizer)):
        return "openai", "openai"
    if issubclass(cls, SentenceTransformerEmbedder):
        return "sentence_transformers", "local-embeddings"
    return None


def check_extras() -> list:
    """Each configured optional part whose extra is not installed is an error naming the extra.

    ``memory_app.E012``: an OpenAI embedder or summarizer without ``[openai]``;
    ``memory_app.E013``: the sentence-transformers embedder without ``[local-embeddings]``;
    ``memory_app.E014``: a Celery broker configured without ``[tasks]`` (celery, redis).
    (``memory_app.E011``, encryption keys without ``[encryption]``, is checked with the keys.)
    """
    errors = []
    for setting in ("EMBEDDER", "SUMMARIZER"):
        needs = _provider_needs(setting)
        if needs and not package_installed(needs[0]):
            module, extra = needs
            id = "memory_app.E012" if extra == "openai" else "memory_app.E013"
            errors.append(_missing_extra(f"MEMORY_APP[{setting!r}]", module, extra, id))
    broker = getattr(settings, "CELERY_BROKER_URL", None)
    if broker:
        needed = ["celery"] + (
            ["redis"] if str(broker).startswith(("redis://", "rediss://")) else []
        )
        for module in needed:
            if not package_installed(module):
                errors.append(
                    _missing_extra(
                        f"CELERY_BROKER_URL ({broker.split(':', 1)[0]})",
                        module,
                        "tasks",
                        "memory_app.E014",
                    )
                )
    return errors


def _check_encryption_keys() -> list:
    keys = memory_settings.ENCRYPTION_KEYS
    if not keys:
        return []
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        return [
            Error(
                "MEMORY_APP['ENCRYPTION_KEYS'] must be a list of Fernet keys, newest first",
                id="memory_app.E010",
            )
        ]
    try:
        from cryptography.fernet import Fernet
    except ImportError:
        return [
            Error(
                "MEMORY_APP['ENCRYPTION_KEYS'] is set but the cryptography package is not "
                "installed",
                hint="pip install 'django-memory-app[encryption]'",
                id="memory_app.E011",
            )
        ]
    errors = []
    for index, key in enumerate(keys):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            errors.append(
                Error(
                    f"MEMORY_APP['ENCRYPTION_KEYS'][{index}] is not a Fernet key "
                    "(32 url-safe base64-encoded bytes)",
                    hint="Make one with cryptography.fernet.Fernet.generate_key().",
                    id="memory_app.E010",
                )
            )
    return errors
