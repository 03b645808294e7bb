"""Migration operations."""

from django.core.exceptions import ImproperlyConfigured
from pgvector.django import VectorExtension

from .checks import PGVECTOR_HELP, pgvector_available


class CreateVectorExtension(VectorExtension):
    """``CREATE EXTENSION vector`` on PostgreSQL (a no-op elsewhere), failing with instructions
    instead of a bare SQL error when the server has no pgvector."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor == "postgresql" and not pgvector_available(connection):
            raise ImproperlyConfigured(
                f"memory_app needs the pgvector extension, which database "
                f"{connection.alias!r} does not have. {PGVECTOR_HELP}"
            )
        super().database_forwards(app_label, schema_editor, from_state, to_state)
