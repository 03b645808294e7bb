"""Re-encrypt stored messages with the newest of MEMORY_APP["ENCRYPTION_KEYS"].

    python manage.py memory_rotate_keys                 # all messages, 500 per transaction
    python manage.py memory_rotate_keys --batch-size 2000 --no-progress

Rows encrypted with an older key are re-encrypted with the first key of the list; rows written
before encryption was turned on (plaintext) are encrypted. Rows already under the newest key are
left alone, so an interrupted run can simply be started again. Each batch is one transaction
(``services.keys.rotate``). Once it has run, keys after the first may be removed from the list.
"""

from __future__ import annotations

from memory_app.management.base import MemoryCommand, positive_int, progress
from memory_app.services import keys


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
        with progress(total=keys.stored_messages(), unit="msg", disable=no_progress) as bar:
            done = keys.rotate(batch_size, progress=bar.update)
        kept = done["kept_texts"]
        self.stdout.write(
            f"Re-encrypted {done['rewritten']} of {done['messages']} message(s) with the newest "
            "key" + (f", and {kept} kept text(s) of pruned turns." if kept else ".")
        )
