"""Re-encrypt stored messages with the newest of MEMORY_APP["ENCRYPTION_KEYS"].

    python manage.py memory_rotate_keys                 # all messages, 500 per transaction
    python manage.py memory_rotate_keys --batch-size 2000 --no-progress

Rows encrypted with an older key are re-encrypted with the first key of the list; rows written
before encryption was turned on (plaintext) are encrypted. Rows already under the newest key are
left alone, so an interrupted run can simply be started again. Each batch is one transaction.
Once it has run, keys after the first may be removed from the list.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import router, transaction

from memory_app import encryption
from memory_app.management.base import MemoryCommand, positive_int, progress
from memory_app.models import Embedding, Message


class Command(MemoryCommand):
    help = "Re-encrypt stored messages with the newest encryption key (and encrypt plaintext ones)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=500,
            help="Messages per transaction (default 500).",
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, batch_size: int, no_progress: bool, **options):
        if not encryption.enabled():
            raise CommandError(
                "MEMORY_APP['ENCRYPTION_KEYS'] is empty: there is no key to encrypt with"
            )
        using = router.db_for_write(Message)
        total = Message.objects.using(using).count()
        rewritten = seen = 0
        last_id = 0
        with progress(total=total, unit="msg", disable=no_progress) as bar:
            while True:
                with transaction.atomic(using=using):
                    batch = list(
                        Message.objects.using(using)
                        .filter(id__gt=last_id)
                        .order_by("id")
                        .select_for_update()
                        .only("id", "content", "content_parts", "tool_calls")[:batch_size]
                    )
                    if not batch:
                        break
                    changed = []
                    for message in batch:
                        new = encryption.stored_values(
                            message.content, message.content_parts, message.tool_calls
                        )
                        if new is not None:
                            message.content, message.content_parts, message.tool_calls = new
                            # The full-text vector was made from the old stored value (the
                            # plaintext, for a row written before encryption): drop it.
                            message.search_vector = None
                            changed.append(message)
                    if changed:
                        Message.objects.using(using).bulk_update(
                            changed, ["content", "content_parts", "tool_calls", "search_vector"]
                        )
                last_id = batch[-1].id
                seen += len(batch)
                rewritten += len(changed)
                bar.update(len(batch))
        kept = self._rotate_kept_texts(using, batch_size)
        self.stdout.write(
            f"Re-encrypted {rewritten} of {seen} message(s) with the newest key"
            + (f", and {kept} kept text(s) of pruned turns." if kept else ".")
        )

    def _rotate_kept_texts(self, using: str, batch_size: int) -> int:
        """Pruned turns keep their text on the embedding row (for recall): rotate it too."""
        kept = Embedding.objects.using(using).filter(message__isnull=True).exclude(content="")
        rewritten, last_id = 0, 0
        while True:
            with transaction.atomic(using=using):
                batch = list(
                    kept.filter(id__gt=last_id)
                    .order_by("id")
                    .select_for_update()
                    .only("id", "content")[:batch_size]
                )
                if not batch:
                    return rewritten
                changed = []
                for row in batch:
                    new = encryption.stored_values(row.content, None, None)
                    if new is not None:
                        row.content = new[0]
                        changed.append(row)
                if changed:
                    Embedding.objects.using(using).bulk_update(changed, ["content"])
            last_id = batch[-1].id
            rewritten += len(changed)
