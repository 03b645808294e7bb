"""Per-namespace retention policy, read from ``MEMORY_APP["RETENTION"]``::

    MEMORY_APP = {"RETENTION": {
        "support-bot": {"ttl": "14d", "sliding": True, "max_messages": 500},
        "*": {"idle": "90d"},    # every namespace not named above
    }}

Keys of a policy (all optional):

- ``ttl``: a duration (``"14d"``, ``"12h"``, ``"2w"``, ``"30m"``, ``"45s"``, seconds as an int, or a
  ``timedelta``). A new session in the namespace expires that long after it is created, unless
  it is given its own ``expires_at``.
- ``sliding``: with ``ttl``, every append moves ``expires_at`` to ``now + ttl``. The append
  statement does it in the UPDATE it already runs on the session row: no extra query.
- ``max_messages``: the most messages the working log keeps. The retention sweep deletes the
  oldest messages beyond it, but only messages a snapshot already covers, and never system or
  remembered ones: nothing the agent still needs goes.
- ``max_checkpoints``: the most LangGraph checkpoints a thread keeps per checkpoint namespace
  (``integrations.langgraph.DjangoSaver``); the retention sweep deletes older ones with their
  pending writes and the channel values only they named. The newest always stays.
- ``idle``: sessions not updated for this long are deleted by the retention sweep.

The policy of a namespace is its own entry, else the ``"*"`` entry, else none. A bad setting is
the system check error ``memory_app.E020``; reading it at run time raises ``ImproperlyConfigured``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Case, F, Q, Value, When

from ..conf import memory_settings

DEFAULT_ENTRY = "*"
KEYS = ("ttl", "sliding", "max_messages", "max_checkpoints", "idle")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(value: Any, field: str = "duration") -> dt.timedelta:
    """``"14d"``, ``"12h"``, ``"2w"``, ``"30m"``, ``"45s"``, whole seconds or a ``timedelta``,
    as a positive ``timedelta``; ``ValueError`` naming ``field`` otherwise."""
    if isinstance(value, dt.timedelta):
        duration = value
    elif isinstance(value, int) and not isinstance(value, bool):
        duration = dt.timedelta(seconds=value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        duration = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    else:
        raise ValueError(f"{field}: a duration like '14d', '12h', '2w' or seconds, not {value!r}")
    if duration <= dt.timedelta(0):
        raise ValueError(f"{field}: must be positive, got {value!r}")
    return duration


@dataclass(frozen=True)
class Policy:
    """The retention policy in force for a namespace; ``entry`` is the key it came from."""

    entry: str
    ttl: dt.timedelta | None = None
    sliding: bool = False
    max_messages: int | None = None
    idle: dt.timedelta | None = None
    max_checkpoints: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "ttl": self.ttl,
            "sliding": self.sliding,
            "max_messages": self.max_messages,
            "max_checkpoints": self.max_checkpoints,
            "idle": self.idle,
        }


def _positive(entry: dict, key: str, where: str) -> int | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{where}[{key!r}]: a positive integer, not {value!r}")
    return value


def parse(setting: Any) -> dict[str, Policy]:
    """The ``RETENTION`` setting as policies by namespace; ``ValueError`` naming the entry and
    key at fault."""
    if setting is None:
        return {}
    if not isinstance(setting, dict):
        raise ValueError(f"RETENTION: a dict of namespace -> policy, not {type(setting).__name__}")
    policies = {}
    for namespace, entry in setting.items():
        where = f"RETENTION[{namespace!r}]"
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"{where}: the namespace must be a non-empty string")
        if not isinstance(entry, dict):
            raise ValueError(
                f"{where}: a dict with keys {', '.join(KEYS)}, not {type(entry).__name__}"
            )
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}"
            )
        ttl = entry.get("ttl")
        ttl = None if ttl is None else parse_duration(ttl, f"{where}['ttl']")
        idle = entry.get("idle")
        idle = None if idle is None else parse_duration(idle, f"{where}['idle']")
        sliding = entry.get("sliding", False)
        if not isinstance(sliding, bool):
            raise ValueError(f"{where}['sliding']: True or False, not {sliding!r}")
        if sliding and ttl is None:
            raise ValueError(f"{where}['sliding']: a sliding expiry needs a 'ttl'")
        policies[namespace] = Policy(
            namespace,
            ttl=ttl,
            sliding=sliding,
            max_messages=_positive(entry, "max_messages", where),
            max_checkpoints=_positive(entry, "max_checkpoints", where),
            idle=idle,
        )
    return policies


@memory_settings.derived
def policies() -> dict[str, Policy]:
    """The configured policies by namespace (``"*"`` included), parsed once per settings."""
    try:
        return parse(memory_settings.RETENTION)
    except ValueError as err:
        raise ImproperlyConfigured(f"MEMORY_APP: {err}") from None


def policy_for(namespace: str) -> Policy | None:
    """The policy in force for sessions of ``namespace``: its own entry, else ``"*"``, else none."""
    found = policies()
    return found.get(namespace, found.get(DEFAULT_ENTRY))


def initial_expiry(namespace: str, now: dt.datetime) -> dt.datetime | None:
    """When a new session of ``namespace`` expires under its policy (``None``: never)."""
    policy = policy_for(namespace)
    return now + policy.ttl if policy is not None and policy.ttl is not None else None


def namespaces_where(attribute: str) -> list[tuple[Q, Policy]]:
    """``(filter on Session.namespace, policy)`` for every policy setting ``attribute``: a named
    namespace, and for ``"*"`` every namespace not named."""
    found = policies()
    named = [ns for ns in found if ns != DEFAULT_ENTRY]
    pairs = []
    for namespace, policy in found.items():
        if getattr(policy, attribute) is None:
            continue
        if namespace == DEFAULT_ENTRY:
            pairs.append((~Q(namespace__in=named), policy))
        else:
            pairs.append((Q(namespace=namespace), policy))
    return pairs


# ---- the sliding expiry, as the append statement applies it -------------------------------------


@memory_settings.derived
def sliding_ttls() -> str | None:
    """The append statement's ``%(ttls)s`` parameter: a JSON object of namespace -> sliding TTL
    in seconds (``null`` for a namespace whose own policy does not slide, so ``"*"`` does not
    apply to it), or ``None`` when nothing slides. The statement text never changes."""
    found = policies()
    if not any(p.sliding for p in found.values()):
        return None
    return json.dumps({ns: p.ttl.total_seconds() if p.sliding else None for ns, p in found.items()})


#: The SET clause the PostgreSQL append adds to its UPDATE of the session row. ``ttls`` is
#: ``sliding_ttls()``: the namespace's own entry, else ``"*"``; a JSON null or a missing
#: entry leaves ``expires_at`` as it is.
SLIDING_EXPIRY_SQL = """expires_at = COALESCE(
                           %(now)s + make_interval(secs => (
                               COALESCE(%(ttls)s::jsonb -> namespace, %(ttls)s::jsonb -> '*')
                               #>> '{}')::double precision),
                           expires_at)"""


def sliding_expiry(now: dt.datetime):
    """The same for the ORM's UPDATE (the generic path): a ``Case`` over the configured
    namespaces, or ``None`` when nothing slides."""
    found = policies()
    if not any(p.sliding for p in found.values()):
        return None
    named = [
        When(namespace=ns, then=Value(now + p.ttl) if p.sliding else F("expires_at"))
        for ns, p in found.items()
        if ns != DEFAULT_ENTRY
    ]
    default = found.get(DEFAULT_ENTRY)
    otherwise = (
        Value(now + default.ttl) if default is not None and default.sliding else F("expires_at")
    )
    return Case(*named, default=otherwise) if named else otherwise
