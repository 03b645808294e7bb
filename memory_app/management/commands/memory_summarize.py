"""Summarize (compact) many sessions: enqueue ``summarize_session`` for each, or run it inline.

    python manage.py memory_summarize --over-threshold          # the catch-up sweep
    python manage.py memory_summarize --all --namespace support-bot --sync

``--over-threshold`` picks sessions whose tokens after their latest snapshot exceed
``SUMMARIZE_THRESHOLD_TOKENS`` (or ``--threshold``) and that have more than ``keep_recent``
messages to cover. Run it periodically (cron, Celery beat): it enqueues what the after-append
trigger could not, e.g. while Redis was down. Sessions already queued are skipped (the same
per-session lock as the trigger), so running it twice enqueues nothing twice.
"""

from __future__ import annotations

from django.core.management.base import CommandError

from memory_app.conf import memory_settings
from memory_app.management.base import (
    MemoryCommand,
    existing_sessions,
    non_negative_int,
    progress,
    session_id,
)
from memory_app.models import Session
from memory_app.services import background, compaction


class Command(MemoryCommand):
    help = "Summarize sessions: enqueue summarize_session for each (or run it inline with --sync)."

    def add_arguments(self, parser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--over-threshold",
            action="store_true",
            help="Sessions over the token threshold with messages to cover.",
        )
        which.add_argument("--all", action="store_true", help="Every session (within --namespace).")
        which.add_argument(
            "--session",
            action="append",
            dest="sessions",
            metavar="ID",
            type=session_id,
            help="This session id (repeatable).",
        )
        parser.add_argument(
            "--namespace",
            action="append",
            dest="namespaces",
            metavar="NS",
            help="Only sessions in this namespace (repeatable).",
        )
        parser.add_argument(
            "--threshold",
            type=non_negative_int,
            default=None,
            help="Token threshold for --over-threshold (default: the setting).",
        )
        parser.add_argument(
            "--keep-recent",
            type=non_negative_int,
            default=None,
            help="Messages left unsummarized (default: SUMMARIZE_KEEP_RECENT).",
        )
        parser.add_argument(
            "--sync",
            action="store_true",
            help="Compact in this process instead of enqueueing tasks.",
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, **options) -> None:
        threshold = options["threshold"]
        if threshold is None:
            threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
        if options["over_threshold"] and threshold is None:
            raise CommandError("SUMMARIZE_THRESHOLD_TOKENS is None: pass --threshold")
        keep_recent = options["keep_recent"]
        selected = existing_sessions(options["sessions"])

        sessions = Session.objects.all()
        if options["namespaces"]:
            sessions = sessions.filter(namespace__in=options["namespaces"])
        if selected:
            sessions = sessions.filter(pk__in=selected)
        if options["over_threshold"]:
            sessions = sessions.filter(tokens_since_snapshot__gt=threshold)
        ids = sessions.order_by("pk").values_list("pk", flat=True)

        done = skipped = failed = 0
        bar = progress(total=ids.count(), unit="session", disable=options["no_progress"])
        for session_pk in ids.iterator(chunk_size=500):
            bar.update(1)
            if options["over_threshold"] and not background.needs_summary(
                session_pk, threshold=threshold
            ):
                skipped += 1
                continue
            try:
                if options["sync"]:
                    result = snapshot = compaction.compact(session_pk, keep_recent=keep_recent)
                    # A backlog larger than one run's token budget takes several runs.
                    while snapshot is not None and snapshot.metadata.get("partial"):
                        snapshot = compaction.compact(session_pk, keep_recent=keep_recent)
                else:
                    scheduled = background.schedule_summary(
                        session_pk, keep_recent=keep_recent, fail_silently=False
                    )
                    result = scheduled.task_id if scheduled.state in ("queued", "ran") else None
            except (
                Exception
            ) as err:  # store, summarizer, Redis or broker errors: go on with the rest
                failed += 1
                self.stderr.write(f"session {session_pk}: {type(err).__name__}: {err}")
                continue
            if result is None:
                skipped += 1
            else:
                done += 1
        bar.close()
        verb = "compacted" if options["sync"] else "enqueued"
        why = "nothing to cover" if options["sync"] else "already queued or nothing to cover"
        self.stdout.write(f"{done} {verb}, {skipped} skipped ({why}), {failed} failed")
        if failed:
            raise CommandError(f"{failed} session(s) failed")
