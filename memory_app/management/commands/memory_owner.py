"""Export or erase everything one owner has in the memory store.

    python manage.py memory_owner export alice --out alice.json
    python manage.py memory_owner erase alice --yes

USER is the user's username (their ``USERNAME_FIELD``), or ``--id`` for a primary key. The export
streams (a batch of messages at a time) to a temporary file renamed into place at the end, so an
interrupted export never leaves a truncated file under the name asked for. The erase is one
transaction: all of the owner's rows go, or none.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from memory_app.management.base import MemoryCommand, positive_int, progress
from memory_app.memory import Memory
from memory_app.services.owners import owner_summary
from memory_app.validation import unstorable


class Command(MemoryCommand):
    help = "Export (export USER --out FILE) or erase (erase USER --yes) one owner's memory."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="{export,erase}")
        export = actions.add_parser("export", help="Write every session of USER to a JSON file.")
        erase = actions.add_parser(
            "erase",
            help="Delete every session of USER, with everything under them, in one transaction.",
        )
        for sub in (export, erase):
            sub.add_argument("user", help="The owner's username (or primary key with --id).")
            sub.add_argument("--id", action="store_true", help="USER is a primary key.")
            sub.add_argument("--no-progress", action="store_true", help="No progress bar.")
        export.add_argument("--out", required=True, help="File to write; '-' for standard output.")
        export.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            help="Messages read per query (default 1000).",
        )
        erase.add_argument(
            "--yes",
            action="store_true",
            help="Really erase (without it, only say what would be erased, and exit 0).",
        )

    def handle(self, *args, action: str, user: str, id: bool, no_progress: bool, **options):
        owner = self._owner(user, by_pk=id)
        if action == "export":
            self._export(owner, options["out"], options["batch_size"], no_progress)
        else:
            self._erase(owner, options["yes"], no_progress)

    def _owner(self, user: str, *, by_pk: bool):
        User = get_user_model()
        if problem := unstorable(user):
            raise CommandError(f"no user {user!r}: a user name {problem}")
        try:
            if by_pk:
                return User._default_manager.get(pk=user)
            return User._default_manager.get_by_natural_key(user)
        except (User.DoesNotExist, ValueError):
            raise CommandError(f"no user {user!r}") from None

    def _export(self, owner, out: str, batch_size: int, no_progress: bool) -> None:
        target = None if out == "-" else _writable_target(out)
        total = owner_summary(owner)
        with progress(
            total=total["messages"], unit="msg", disable=no_progress or target is None
        ) as bar:
            chunks = Memory.iter_owner_export(owner, batch_size=batch_size, progress=bar.update)
            if target is None:
                for chunk in chunks:
                    self.stdout.write(chunk, ending="")
                self.stdout.write("")
                return
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    for chunk in chunks:
                        fh.write(chunk)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        self.stdout.write(
            f"Exported {total['sessions']} session(s), {total['messages']} "
            f"message(s) of {owner.get_username()} to {out}."
        )

    def _erase(self, owner, yes: bool, no_progress: bool) -> None:
        total = owner_summary(owner)
        what = (
            f"{total['sessions']} session(s) and {total['messages']} message(s) of "
            f"{owner.get_username()}"
        )
        if not yes:  # a report, not a failure: nothing was asked to change
            self.stdout.write(f"Would erase {what}; pass --yes to erase them.")
            return
        with progress(total=4, unit="table", disable=no_progress) as bar:

            def step(table: str, rows: int) -> None:
                bar.set_postfix_str(f"{table}: {rows}")
                bar.update(1)

            erased = Memory.erase_owner(owner, progress=step)
        self.stdout.write(
            f"Erased {erased.sessions} session(s), {erased.messages} message(s), "
            f"{erased.snapshots} snapshot(s) and {erased.embeddings} embedding(s) of "
            f"{owner.get_username()}."
        )


def _writable_target(out: str) -> Path:
    """The file ``--out`` names, refused up front (before anything is read) when it cannot be
    written: a missing or read-only folder, or a folder given as the file."""
    target = Path(out)
    folder = target.parent
    if not out.strip() or target.is_dir():
        raise CommandError(f"--out: {out!r} is not a file name")
    if not folder.is_dir():
        raise CommandError(f"--out: no folder {str(folder)!r} to write {target.name!r} in")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CommandError(f"--out: folder {str(folder)!r} is not writable")
    return target
