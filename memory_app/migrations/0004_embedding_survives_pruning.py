"""Embeddings outlive the log rows they were computed from: long-term memory survives pruning.

An embedding now keeps what recall needs of its message (cursor, role, the message's creation
time; its text once pruning removes the row), its ``message`` becomes NULL instead of the
embedding being deleted with the row, and it is unique per (session, cursor, model) rather than
per (message, model). Existing embeddings are filled in from their messages.

On PostgreSQL a partial GIN index serves full-text search over the texts of pruned messages,
with the expression ``memory_app.services.recall`` queries with (not part of the model state,
like the message index of 0002).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

FULLTEXT_INDEX = "memory_embedding_content_fts"


def fill_from_messages(apps, schema_editor):
    Embedding = apps.get_model("memory_app", "Embedding")
    Message = apps.get_model("memory_app", "Message")
    q = schema_editor.quote_name
    emb, msg = q(Embedding._meta.db_table), q(Message._meta.db_table)

    def column(name: str) -> str:
        return f"(SELECT m.{q(name)} FROM {msg} m WHERE m.id = {emb}.message_id)"

    # Correlated subqueries: the same statement on PostgreSQL and SQLite.
    schema_editor.execute(
        f"UPDATE {emb} SET {q('cursor')} = {column('seq')}, role = {column('role')}, "
        f"message_created_at = {column('created_at')}"
    )


def create_fulltext_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("memory_app", "Embedding")._meta.db_table)
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {FULLTEXT_INDEX} ON {table} "
        f"USING gin (to_tsvector('english'::regconfig, content)) WHERE message_id IS NULL"
    )


def drop_fulltext_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {FULLTEXT_INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("memory_app", "0002_message_fulltext_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="embedding",
            name="memory_embedding_message_model_uniq",
        ),
        migrations.AddField(
            model_name="embedding",
            name="content",
            field=models.TextField(blank=True, default="", help_text="The message's text once its log row is pruned (encrypted as the log's is); empty while the row exists.", verbose_name="content"),
        ),
        migrations.AddField(
            model_name="embedding",
            name="cursor",
            field=models.BigIntegerField(null=True, help_text="The message's cursor in its session.", verbose_name="cursor"),
        ),
        migrations.AddField(
            model_name="embedding",
            name="message_created_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="message created"),
        ),
        migrations.AddField(
            model_name="embedding",
            name="role",
            field=models.CharField(choices=[("system", "system"), ("user", "user"), ("assistant", "assistant"), ("tool", "tool")], null=True, max_length=16, verbose_name="role"),
        ),
        migrations.RunPython(fill_from_messages, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name="embedding",
            name="cursor",
            field=models.BigIntegerField(help_text="The message's cursor in its session.", verbose_name="cursor"),
        ),
        migrations.AlterField(
            model_name="embedding",
            name="role",
            field=models.CharField(choices=[("system", "system"), ("user", "user"), ("assistant", "assistant"), ("tool", "tool")], max_length=16, verbose_name="role"),
        ),
        migrations.AlterField(
            model_name="embedding",
            name="message",
            field=models.ForeignKey(blank=True, help_text="The log row; empty once pruning removed it (recall then reads the fields below).", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="embeddings", to="memory_app.message", verbose_name="message"),
        ),
        migrations.AddConstraint(
            model_name="embedding",
            constraint=models.UniqueConstraint(fields=("session", "cursor", "model"), name="memory_embedding_session_cursor_model_uniq"),
        ),
        migrations.RunPython(create_fulltext_index, drop_fulltext_index, elidable=False),
    ]
