"""A GIN index for full-text search over message content (PostgreSQL only).

The expression is the one ``memory_app.search`` queries with,
``to_tsvector('english'::regconfig, content)``: PostgreSQL uses an expression index only for
the identical expression. It is not part of the model state (Django's GinIndex would be
created on every backend), so ``makemigrations`` has nothing to add; other databases skip it.
"""

from django.db import migrations

INDEX = "memory_message_content_fts"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("memory_app", "Message")._meta.db_table)
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON {table} "
        f"USING gin (to_tsvector('english'::regconfig, content))"
    )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("memory_app", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(create_index, drop_index, elidable=False),
    ]
