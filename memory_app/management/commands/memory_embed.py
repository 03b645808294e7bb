"""Embed the messages that have no vector from the configured embedder yet.

    python manage.py memory_embed                 # everything missing
    python manage.py memory_embed --session <id>  # one session (repeatable)
    python manage.py memory_embed --reembed --session <id>
    python manage.py memory_embed --limit 10000   # stop after 10000 messages

First the messages still marked for indexing after their append (their after-append job never
ran: a crash, a lost task) get it now, full text included; then every message missing a vector.
Each batch is committed on its own and only missing vectors are computed, so an interrupted run
is resumed by running the command again. Creates the model's HNSW index first if needed.
"""

from __future__ import annotations

from django.core.management.base import CommandError

from memory_app.conf import memory_settings
from memory_app.exceptions import EmbedderError
from memory_app.management.base import (
    MemoryCommand,
    existing_sessions,
    non_negative_int,
    positive_int,
    progress,
    session_id,
)
from memory_app.models import Message
from memory_app.providers.embeddings import get_embedder
from memory_app.services.embedding import count_missing, embed_messages, ensure_hnsw_index
from memory_app.services.indexing import index_new_messages
from memory_app.store.pending import sessions_pending_index


class Command(MemoryCommand):
    help = "Embed messages that have no vector from the configured embedder (resumable)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--session",
            action="append",
            dest="sessions",
            metavar="ID",
            type=session_id,
            help="Only this session (repeat for more).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help=f"Messages per batch (default EMBED_BATCH_SIZE, "
            f"{memory_settings.EMBED_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--limit",
            type=non_negative_int,
            default=None,
            help="Stop after looking at this many messages.",
        )
        parser.add_argument(
            "--reembed",
            action="store_true",
            help="Embed again messages that already have a vector.",
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(
        self,
        *args,
        sessions=None,
        batch_size=None,
        limit=None,
        reembed=False,
        no_progress=False,
        verbosity=1,
        **options,
    ):
        sessions = existing_sessions(sessions)
        embedder = get_embedder()
        try:
            dims = embedder.dimensions
            index = ensure_hnsw_index(embedder.name, dims)
        except EmbedderError as err:
            raise CommandError(str(err)) from err
        pending = sessions_pending_index(sessions or None)
        if pending:
            if verbosity:
                self.stdout.write(f"{len(pending)} sessions with messages awaiting indexing")
            bar = progress(
                total=len(pending),
                unit="session",
                disable=no_progress or not verbosity,
                file=getattr(self.stderr, "_out", self.stderr),
            )
            try:
                for pending_session in pending:
                    index_new_messages(pending_session)
                    bar.update(1)
            except EmbedderError as err:
                raise CommandError(f"{err} (run again to resume)") from err
            finally:
                bar.close()
        if reembed:
            qs = Message.objects.all()
            if sessions:
                qs = qs.filter(session_id__in=sessions)
            todo = qs.count()
        else:
            todo = count_missing(embedder=embedder, session_ids=sessions)
        if limit is not None:
            todo = min(todo, limit)
        if verbosity:
            self.stdout.write(
                f"{embedder.name} ({dims} dimensions): {todo} messages to embed"
                + (f", index {index}" if index else "")
            )
        # The bar needs the raw stream: Django's wrapper would end every refresh with a newline.
        bar = progress(
            total=todo,
            unit="msg",
            disable=no_progress or not verbosity,
            file=getattr(self.stderr, "_out", self.stderr),
        )
        try:
            stored = embed_messages(
                session_ids=sessions,
                replace=reembed,
                embedder=embedder,
                batch_size=batch_size,
                limit=limit,
                progress=bar.update,
            )
        except EmbedderError as err:
            raise CommandError(
                f"{err} (vectors stored so far are kept; run again to resume)"
            ) from err
        finally:
            bar.close()
        if verbosity:
            self.stdout.write(self.style.SUCCESS(f"Stored {stored} vectors."))
