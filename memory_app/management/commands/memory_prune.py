"""Delete expired sessions (and, with --idle, sessions idle for too long), in batches: the
retention service's locked batches (``services.retention.prune``), with a progress bar."""

from __future__ import annotations

from memory_app.management.base import MemoryCommand, duration, namespace, positive_int, progress
from memory_app.services import retention


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
        total = retention.count_prunable(idle=idle, namespace=namespace)
        if dry_run:
            self.stdout.write(f"{total} session(s) would be deleted (dry run).")
            return
        with progress(total=total, unit="session", disable=no_progress or total == 0) as bar:
            # A session in use (an append holds its row) is left for the next run.
            done = retention.prune(
                idle=idle, namespace=namespace, batch_size=batch_size, progress=bar.update
            )
        self.stdout.write(f"Deleted {done['sessions']} session(s).")
