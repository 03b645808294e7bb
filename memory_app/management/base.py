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

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from ..exceptions import InvalidSession, MemoryStoreError
from ..models import Session
from ..validation import MAX_COUNT, check_session_fields

_DURATION = re.compile(r"^([+-]?\d+)([smhdw])$")
_NEGATIVE = re.compile(r"^-\d")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: The longest duration taken: a century (``now`` minus more than that leaves the calendar).
MAX_DURATION = dt.timedelta(days=36500)


def duration(text: str | dt.timedelta) -> dt.timedelta:
    """A positive duration such as ``90d``, ``12h`` or ``2w`` (``0d`` would mean "everything")."""
    if isinstance(text, dt.timedelta):
        value = text
    else:
        match = _DURATION.match(str(text).strip())
        if not match:
            raise argparse.ArgumentTypeError(f"takes a duration like 30d, 12h or 2w, not {text!r}")
        try:
            value = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
        except OverflowError:
            value = MAX_DURATION + MAX_DURATION
    if value > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION.days}d, not {text!r}")
    if value <= dt.timedelta(0):
        raise argparse.ArgumentTypeError(f"must be longer than zero, not {text!r}")
    return value


def _whole_number(text: str | int) -> int:
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if isinstance(text, str) and text.strip().lstrip("+-").isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}")


def positive_int(text: str | int) -> int:
    """A whole number of at least 1 (a batch size)."""
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, not {value}")
    return value


def non_negative_int(text: str | int) -> int:
    """A whole number of at least 0 (a limit, a threshold, a count of messages to keep)."""
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, not {value}")
    return value


def namespace(text: str) -> str:
    """A namespace as the rule book accepts one (length from the model, no NUL bytes)."""
    try:
        check_session_fields(namespace=text)
    except InvalidSession as err:
        raise argparse.ArgumentTypeError(err.reason) from None
    return text


def session_id(text: str | uuid.UUID) -> uuid.UUID:
    """A session id (a UUID)."""
    if isinstance(text, uuid.UUID):
        return text
    try:
        return uuid.UUID(str(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"is a session id (a UUID), not {text!r}") from None


def username(text: str) -> str:
    """A user name as the user model's own field accepts one (its validators and length), so
    a command never creates a user the admin could not edit."""
    field = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD)
    try:
        field.clean(text, None)
    except ValidationError as err:
        shown = repr(text) if len(text) <= 40 else repr(text[:37] + "...")
        raise argparse.ArgumentTypeError(
            f"{shown} is not a user name: {' '.join(err.messages)}"
        ) from None
    return text


#: The argument types above: ``MemoryCommand`` applies them to keyword options as well.
ARGUMENT_TYPES = frozenset({duration, positive_int, non_negative_int, session_id, username})


def existing_sessions(
    ids: list[uuid.UUID | str] | None, option: str = "--session"
) -> list[uuid.UUID] | None:
    """The ids given with ``--session``, each of which must exist (else ``CommandError``).

    Ids that are still strings (passed to ``call_command`` as keyword options, which argparse
    does not convert) are parsed here, with the same message as the argument type's.
    """
    if not ids:
        return None
    parsed = []
    for value in ids:
        try:
            parsed.append(value if isinstance(value, uuid.UUID) else session_id(str(value)))
        except argparse.ArgumentTypeError as err:
            raise CommandError(f"{option}: {err}") from None
    found = set(Session.objects.filter(pk__in=parsed).values_list("pk", flat=True))
    missing = [str(i) for i in dict.fromkeys(parsed) if i not in found]
    if missing:
        raise CommandError(f"{option}: no session {', '.join(missing)}")
    return list(dict.fromkeys(parsed))


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


def _actions(parser: argparse.ArgumentParser):
    """Every argument of ``parser`` and of its sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        else:
            yield action


class MemoryCommand(BaseCommand):
    """Base of the app's commands: argument types hold for keyword options too, and store and
    file errors end the command with one line."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any):
        self._parser = super().create_parser(prog_name, subcommand, **kwargs)
        return self._parser

    def run_from_argv(self, argv: list[str]) -> None:
        super().run_from_argv(self._negative_values_attached(argv))

    def _negative_values_attached(self, argv: list[str]) -> list[str]:
        """``--idle -5d`` as ``--idle=-5d``: argparse takes a value that starts with a dash for
        an option (and says only "expected one argument"); attached, it reaches the option's
        type, which says what is wrong with it."""
        parser = self.create_parser(argv[0], argv[1])
        options = {option for action in _actions(parser) for option in action.option_strings}
        takes_value = {
            option
            for action in _actions(parser)
            if action.nargs is None and action.option_strings and action.type is not None
            for option in action.option_strings
        }

        def is_option(arg: str) -> bool:  # or an abbreviation of one, as argparse reads it
            return arg == "--" or any(option.startswith(arg.split("=")[0]) for option in options)

        fixed: list[str] = []
        for arg in argv:
            if (
                fixed
                and fixed[-1] in takes_value
                and arg.startswith("-")
                and arg != "-"
                and (_NEGATIVE.match(arg) or not is_option(arg))
            ):
                fixed[-1] = f"{fixed[-1]}={arg}"
            else:
                fixed.append(arg)
        return fixed

    def execute(self, *args: Any, **options: Any) -> Any:
        self._convert_keyword_options(options)
        try:
            return super().execute(*args, **options)
        except MemoryStoreError as err:
            raise CommandError(str(err)) from None
        except OSError as err:
            where = f"{err.filename}: " if err.filename else ""
            raise CommandError(f"{where}{err.strerror or err}") from None

    def _convert_keyword_options(self, options: dict[str, Any]) -> None:
        """``call_command("memory_prune", idle="0d")`` skips argparse: apply the types here.

        Each type accepts what it returns, so a value argparse already converted passes again.
        """
        parser = getattr(self, "_parser", None)
        if parser is None:
            return
        for action in _actions(parser):
            kind, value = action.type, options.get(action.dest)
            if kind not in ARGUMENT_TYPES or value is None:
                continue
            name = "/".join(action.option_strings) or action.dest
            try:
                if isinstance(value, (list, tuple)):
                    options[action.dest] = [kind(v) for v in value]
                else:
                    options[action.dest] = kind(value)
            except argparse.ArgumentTypeError as err:
                raise CommandError(f"Error: argument {name}: {err}") from None
