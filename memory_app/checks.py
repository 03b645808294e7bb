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
    return errors
