"""Delete expired sessions (and, with --idle, sessions idle for too long), in batches."""

from __future__ import annotations

from django.utils import timezone

from memory_app.management.base import MemoryCommand, duration, namespace, positive_int, progress
from memory_app.models import Session
from memory_app.store import sessions as session_store


class Command(MemoryCommand):
    help = "Delete expired sessions and everything under them; --idle also deletes idle ones."

    def add_arguments(self, parser):
        parser.add_argument(
            "--idle",
            type=duration,
            help="Also delete sessions not updated for this long (e.g. 90d).",
        )
        parser.add_argument("--namespace", type=namespace, help="Only sessions of this namespace.")
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=500,
            help="Sessions deleted per transaction (default 500).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would go; delete nothing."
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, idle, namespace, batch_size, dry_run, no_progress, **options):
        now = timezone.now()
        doomed = Session.objects.expired(now)
        if idle:
            doomed = doomed | Session.objects.idle_since(now - idle)
        if namespace:
            doomed = doomed.filter(namespace=namespace)
        total = doomed.count()
        if dry_run:
            self.stdout.write(f"{total} session(s) would be deleted (dry run).")
            return
        deleted = 0
        with progress(total=total, unit="session", disable=no_progress or total == 0) as bar:
            while True:
                # Each batch in its own transaction: a long prune never holds locks for long.
                ids = list(doomed.order_by("pk").values_list("pk", flat=True)[:batch_size])
                if not ids:
                    break
                deleted += session_store.delete_batch(ids)
                bar.update(len(ids))
        self.stdout.write(f"Deleted {deleted} session(s).")
