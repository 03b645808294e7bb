"""System checks: say clearly when the database cannot do what the app needs."""

from __future__ import annotations

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
            errors.append(Warning(f"Could not look for pgvector on {alias!r}: {err}", id="memory_app.W002"))
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
        errors.append(Error(f"MEMORY_APP['TOKEN_ENCODING'] is not a known encoding: {err}",
                            id="memory_app.E002"))
    if not isinstance(memory_settings.MAX_MESSAGE_BYTES, int) or memory_settings.MAX_MESSAGE_BYTES <= 0:
        errors.append(Error("MEMORY_APP['MAX_MESSAGE_BYTES'] must be a positive integer", id="memory_app.E003"))
    errors += _check_encryption_keys()
    return errors


def _check_encryption_keys() -> list:
    keys = memory_settings.ENCRYPTION_KEYS
    if not keys:
        return []
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        return [Error("MEMORY_APP['ENCRYPTION_KEYS'] must be a list of Fernet keys, newest first",
                      id="memory_app.E010")]
    try:
        from cryptography.fernet import Fernet
    except ImportError:
        return [Error("MEMORY_APP['ENCRYPTION_KEYS'] is set but the cryptography package is not "
                      "installed", hint="pip install 'django-memory-app[encryption]'", id="memory_app.E011")]
    errors = []
    for index, key in enumerate(keys):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            errors.append(Error(f"MEMORY_APP['ENCRYPTION_KEYS'][{index}] is not a Fernet key "
                                "(32 url-safe base64-encoded bytes)",
                                hint="Make one with cryptography.fernet.Fernet.generate_key().",
                                id="memory_app.E010"))
    return errors
