"""What every ``memory_*`` command shares: argument types that refuse nonsense with one clear
line, errors from the catalogue turned into ``CommandError``, and a progress bar.

An argument's type refuses a bad value before ``handle()`` runs (argparse prints the usage line;
``call_command`` raises ``CommandError``). Whatever the store raises on purpose
(``MemoryStoreError``) or the file system refuses (``OSError``) ends the command with one
``CommandError`` line instead of a traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..exceptions import MemoryStoreError
from ..models import Session

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def duration(text: str) -> dt.timedelta:
    """A positive duration such as ``90d``, ``12h`` or ``2w`` (``0d`` would mean "everything")."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"takes a duration like 30d, 12h or 2w, not {text!r}")
    value = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if value <= dt.timedelta(0):
        raise argparse.ArgumentTypeError(f"must be longer than zero, not {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    return value


def session_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"is a session id (a UUID), not {text!r}") from None


def existing_sessions(ids: list[uuid.UUID] | None) -> list[uuid.UUID] | None:
    """The ids given with ``--session``, each of which must exist (else ``CommandError``)."""
    if not ids:
        return ids
    found = set(Session.objects.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise CommandError(f"--session: no session {', '.join(missing)}")
    return list(dict.fromkeys(ids))


class _LineProgress:
    """A progress line for hosts without ``tqdm``: ``embedded 300/1200 msg``."""

    def __init__(self, total: int | None, unit: str, file, disable: bool) -> None:
        self.total, self.unit, self.file, self.disable, self.n = total, unit, file, disable, 0

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.disable:
            of = f"/{self.total}" if self.total is not None else ""
            print(f"\r{self.n}{of} {self.unit}", end="", file=self.file, flush=True)

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        if not self.disable and self.n:
            print(file=self.file)

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(*, total: int | None, unit: str, disable: bool, file=None):
    """A ``tqdm`` bar on standard error (a plain counter line when tqdm is not installed)."""
    file = file or sys.stderr
    try:
        from tqdm import tqdm
    except ImportError:
        return _LineProgress(total, unit, file, disable)
    return tqdm(total=total, unit=unit, disable=disable, file=file, mininterval=0.5)


class MemoryCommand(BaseCommand):
    """Base of the app's commands: store and file errors end the command with one line."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except MemoryStoreError as err:
            raise CommandError(str(err)) from None
        except OSError as err:
            where = f"{err.filename}: " if err.filename else ""
            raise CommandError(f"{where}{err.strerror or err}") from None
