"""Drop the single-column foreign-key indexes that a composite index already starts with.

Django gives every foreign key an index of its own. Five of ours duplicate the first column of
an index the table has anyway:

- ``session.owner``: the unique (owner, namespace, key) index;
- ``snapshot.session``: the unique (session, version) index;
- ``embedding.session`` and ``embedding.owner``: the (session, model) and (owner, model)
  indexes;
- ``item.owner``: the (owner, namespace, key) index.

Every append rewrites its session row in a new version (its ``updated_at`` is indexed), so it
inserts into each of the session's indexes: the owner's index was one insert per append for
nothing. Every embedding inserted into two.

Only the indexes go; the foreign-key constraints stay as they are. Letting ``AlterField`` do it
would drop and re-add each constraint, which checks every row again under a lock. On
PostgreSQL the indexes are dropped ``CONCURRENTLY`` (writes go on meanwhile), so this migration
is not atomic.
"""

from django.conf import settings
from django.db import migrations, models

#: (model, field) whose own index goes.
COVERED = [
    ("session", "owner"),
    ("snapshot", "session"),
    ("embedding", "session"),
    ("embedding", "owner"),
    ("item", "owner"),
]


def _single_column_indexes(schema_editor, model, column) -> list[str]:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return [
        name
        for name, info in constraints.items()
        if info["index"]
        and not info["unique"]
        and not info["primary_key"]
        and info["columns"] == [column]
    ]


def drop_indexes(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    for model_name, field_name in COVERED:
        model = apps.get_model("memory_app", model_name)
        column = model._meta.get_field(field_name).column
        for name in _single_column_indexes(schema_editor, model, column):
            schema_editor.execute(
                f"DROP INDEX {concurrently}IF EXISTS {schema_editor.quote_name(name)}"
            )


def restore_indexes(apps, schema_editor):
    for model_name, field_name in COVERED:
        model = apps.get_model("memory_app", model_name)
        field = model._meta.get_field(field_name)
        if not _single_column_indexes(schema_editor, model, field.column):
            # The statement Django wrote for the foreign key's index: the same name back.
            schema_editor.execute(schema_editor._create_index_sql(model, fields=[field]))


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("memory_app", "0008_learned_memory"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, restore_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name="embedding",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
                migrations.AlterField(
                    model_name="embedding",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="embeddings",
                        to="memory_app.session",
                        verbose_name="session",
                    ),
                ),
                migrations.AlterField(
                    model_name="item",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="Whose item it is; empty for ownerless (service) items.",
                        null=True,
                        on_delete=models.deletion.CASCADE,
                        related_name="memory_items",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
                migrations.AlterField(
                    model_name="session",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="Who the conversation belongs to; empty for ownerless "
                        "(service) sessions.",
                        null=True,
                        on_delete=models.deletion.CASCADE,
                        related_name="memory_sessions",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
                migrations.AlterField(
                    model_name="snapshot",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="snapshots",
                        to="memory_app.session",
                        verbose_name="session",
                    ),
                ),
            ],
        ),
    ]
