"""Delete expired sessions (and, with --idle, sessions idle for too long), in batches."""

from __future__ import annotations

import datetime as dt
import re
import sys

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from tqdm import tqdm

from memory_app.models import Session
from memory_app.store import sessions as session_store

DURATION = re.compile(r"^(\d+)([smhdw])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> dt.timedelta:
    match = DURATION.match(text.strip())
    if not match:
        raise CommandError(f"--idle takes a duration like 30d, 12h or 2w, not {text!r}")
    return dt.timedelta(**{UNITS[match.group(2)]: int(match.group(1))})


class Command(BaseCommand):
    help = "Delete expired sessions and everything under them; --idle also deletes idle ones."

    def add_arguments(self, parser):
        parser.add_argument("--idle", help="Also delete sessions not updated for this long (e.g. 90d).")
        parser.add_argument("--namespace", help="Only sessions of this namespace.")
        parser.add_argument("--batch-size", type=int, default=500)
        parser.add_argument("--dry-run", action="store_true", help="Count what would go; delete nothing.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, idle, namespace, batch_size, dry_run, no_progress, **options):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        now = timezone.now()
        doomed = Session.objects.expired(now)
        if idle:
            doomed = doomed | Session.objects.idle_since(now - parse_duration(idle))
        if namespace:
            doomed = doomed.filter(namespace=namespace)
        total = doomed.count()
        if dry_run:
            self.stdout.write(f"{total} session(s) would be deleted (dry run).")
            return
        deleted = 0
        with tqdm(total=total, unit="session", disable=no_progress or total == 0,
                  file=sys.stderr) as bar:
            while True:
                # Each batch in its own transaction: a long prune never holds locks for long.
                ids = list(doomed.order_by("pk").values_list("pk", flat=True)[:batch_size])
                if not ids:
                    break
                deleted += session_store.delete_batch(ids)
                bar.update(len(ids))
        self.stdout.write(f"Deleted {deleted} session(s).")
