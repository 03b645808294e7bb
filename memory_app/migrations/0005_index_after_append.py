"""Indexing for recall moves off the append (issue: appends at production cost).

Messages get ``index_pending`` (set by the column default on every insert, cleared by the
after-append job) and ``search_vector`` (the full-text vector, filled by that job). The GIN index
of migration 0002 on the expression ``to_tsvector('english', content)`` made every append
compute the vector inside the insert; the new GIN index is on the column. Existing messages get
their vector here and are marked done. The separate index on ``session_id`` goes: the
``(session, seq)`` unique index serves every lookup by session.
"""

import django.contrib.postgres.search
import django.db.models.deletion
from django.db import migrations, models

OLD_INDEX = "memory_message_content_fts"
NEW_INDEX = "memory_message_search_vector_gin"


def index_existing(apps, schema_editor):
    Message = apps.get_model("memory_app", "Message")
    if schema_editor.connection.vendor != "postgresql":
        Message.objects.update(index_pending=False)
        return
    table = schema_editor.quote_name(Message._meta.db_table)
    schema_editor.execute(f"DROP INDEX IF EXISTS {OLD_INDEX}")
    schema_editor.execute(
        f"UPDATE {table} SET search_vector = to_tsvector('english'::regconfig, content), "
        f"index_pending = false"
    )
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {NEW_INDEX} ON {table} USING gin (search_vector)"
    )


def restore_expression_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("memory_app", "Message")._meta.db_table)
    schema_editor.execute(f"DROP INDEX IF EXISTS {NEW_INDEX}")
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {OLD_INDEX} ON {table} "
        f"USING gin (to_tsvector('english'::regconfig, content))"
    )


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0004_embedding_survives_pruning'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='index_pending',
            field=models.BooleanField(db_default=True, editable=False, help_text='Set by the append; cleared once the message is indexed for recall (full text, and a vector where one is wanted).', verbose_name='indexing pending'),
        ),
        migrations.AddField(
            model_name='message',
            name='search_vector',
            field=django.contrib.postgres.search.SearchVectorField(blank=True, editable=False, help_text='to_tsvector of the content, filled after the append (PostgreSQL).', null=True, verbose_name='full-text vector'),
        ),
        migrations.AlterField(
            model_name='message',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='memory_app.session', verbose_name='session'),
        ),
        migrations.AddIndex(
            model_name='message',
            index=models.Index(condition=models.Q(('index_pending', True)), fields=['session', 'seq'], name='memory_message_pending_idx'),
        ),
        migrations.RunPython(index_existing, restore_expression_index, elidable=False),
    ]
