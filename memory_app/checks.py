"""System checks: say clearly when the database cannot do what the app needs."""

from __future__ import annotations

import importlib.util

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from .conf import NOT_A_DICT, UNKNOWN_KEY, memory_settings

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
    """Every value of ``MEMORY_APP`` against its rule (``conf.RULES``), dotted paths that do not
    import, unknown keys (a warning naming the closest key), then the checks that need more
    than the value: retention policies, encryption keys, and the extras configured parts need."""
    errors = []
    problems = memory_settings.problems()
    for problem in problems:
        kind = Warning if problem.id == UNKNOWN_KEY else Error
        hint = _HINTS.get(problem.setting, "Every setting, its type and default: docs/settings.md.")
        errors.append(kind(problem.message, hint=hint, id=problem.id))
    if any(p.id == NOT_A_DICT for p in problems):
        return errors
    bad = {p.setting for p in problems if p.id != UNKNOWN_KEY}
    if "ENCRYPTION_KEYS" not in bad:
        errors += _check_encryption_keys()
    if "RETENTION" not in bad:
        errors += _check_retention()
    if not bad & {"EMBEDDER", "SUMMARIZER"}:
        errors += check_extras()
    return errors


_HINTS = {
    "RETENTION": "See memory_app/store/policies.py.",
    "ENCRYPTION_KEYS": "Make one with cryptography.fernet.Fernet.generate_key().",
    **dict.fromkeys(
        ("FUSION", "FUSION_NORMALISATION", "FUSION_VECTOR_WEIGHT", "RRF_K", "NEIGHBOUR_BOOST"),
        "See docs/recall.md.",
    ),
}


def _check_retention() -> list:
    """``memory_app.E020``: a namespace's retention policy that ``store.policies`` refuses."""
    from .store import policies

    try:
        policies.parse(memory_settings.RETENTION)
    except ValueError as err:
        return [
            Error(
                f"MEMORY_APP: {err}", hint="See memory_app/store/policies.py.", id="memory_app.E020"
            )
        ]
    return []


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
