"""The full-text GIN index leaves out messages whose vector is not filled in yet.

An append inserts its message with no full-text vector (the after-append job fills it in), and
a GIN index holds an entry even for a NULL: every append wrote one into the index's pending
list for nothing. The index now covers only the messages that have a vector. A full-text query
(``search_vector @@ query``) implies that, the operator being strict, so the planner uses the
index as before.

On PostgreSQL the new index is built ``CONCURRENTLY`` before the old one is dropped, so
searches keep an index and writes go on meanwhile; the migration is therefore not atomic.
"""

from django.db import migrations

INDEX = "memory_message_search_vector_gin"
BUILDING = f"{INDEX}_new"


def _replace(apps, schema_editor, where: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # the index is PostgreSQL's alone
    table = schema_editor.quote_name(apps.get_model("memory_app", "Message")._meta.db_table)
    # A build interrupted earlier leaves an invalid index under the building name.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {BUILDING}")
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY {BUILDING} ON {table} USING gin (search_vector) {where}"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    schema_editor.execute(f"ALTER INDEX {BUILDING} RENAME TO {INDEX}")


def without_nulls(apps, schema_editor):
    _replace(apps, schema_editor, "WHERE search_vector IS NOT NULL")


def with_nulls(apps, schema_editor):
    _replace(apps, schema_editor, "")


class Migration(migrations.Migration):
    atomic = False  # CREATE and DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("memory_app", "0009_drop_covered_indexes"),
    ]

    operations = [
        migrations.RunPython(without_nulls, with_nulls, elidable=False),
    ]
