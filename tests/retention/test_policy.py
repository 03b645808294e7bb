"""The RETENTION setting: parsed once, refused by a system check when wrong, looked up per
namespace."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.exceptions import ImproperlyConfigured

from memory_app import checks
from memory_app.services import retention
from memory_app.store import policies
from memory_app.tasks import route_task

POLICY = {
    "support-bot": {"ttl": "14d", "sliding": True, "max_messages": 500},
    "archive": {"idle": "90d"},
    "*": {"ttl": 3600},
}


def test_policy_for_a_namespace_its_own_entry_else_the_default(settings):
    settings.MEMORY_APP = {"RETENTION": POLICY}
    assert retention.policy_for("support-bot") == {
        "entry": "support-bot",
        "ttl": dt.timedelta(days=14),
        "sliding": True,
        "max_messages": 500,
        "max_checkpoints": None,
        "idle": None,
    }
    assert retention.policy_for("archive")["idle"] == dt.timedelta(days=90)
    assert retention.policy_for("archive")["ttl"] is None  # its own entry: "*" does not fill in
    assert retention.policy_for("anything")["entry"] == "*"
    assert retention.policy_for("anything")["ttl"] == dt.timedelta(hours=1)
    settings.MEMORY_APP = {"RETENTION": {"support-bot": {"ttl": "1w"}}}
    assert retention.policy_for("other") is None


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"a": {"ttl": "soon"}}, "RETENTION['a']['ttl']"),
        ({"a": {"ttl": "0d"}}, "RETENTION['a']['ttl']"),
        ({"a": {"sliding": True}}, "RETENTION['a']['sliding']"),
        ({"a": {"ttl": "1d", "sliding": "yes"}}, "RETENTION['a']['sliding']"),
        ({"a": {"max_messages": 0}}, "RETENTION['a']['max_messages']"),
        ({"a": {"max_messages": True}}, "RETENTION['a']['max_messages']"),
        ({"a": {"max_checkpoints": 0}}, "RETENTION['a']['max_checkpoints']"),
        ({"a": {"max_checkpoints": "1"}}, "RETENTION['a']['max_checkpoints']"),
        ({"a": {"idle": -5}}, "RETENTION['a']['idle']"),
        ({"a": {"ttl": "1d", "max_mesages": 5}}, "unknown key(s) 'max_mesages'"),
        ({"a": ["ttl"]}, "RETENTION['a']"),
        ({"": {}}, "RETENTION['']"),
        (["a"], "RETENTION"),
    ],
)
def test_a_bad_policy_is_a_system_check_error_naming_the_key(settings, setting, named):
    settings.MEMORY_APP = {"RETENTION": setting}
    errors = [e for e in checks.check_settings() if e.id == "memory_app.E020"]
    assert len(errors) == 1 and named in errors[0].msg, errors
    with pytest.raises(ImproperlyConfigured) as raised:
        policies.policy_for("a")
    assert named in str(raised.value)


def test_a_good_policy_passes_the_check(settings):
    settings.MEMORY_APP = {"RETENTION": POLICY}
    assert not [
        e for e in checks.check_settings() if e.id in ("memory_app.E020", "memory_app.E021")
    ]


def test_durations():
    assert policies.parse_duration("45s") == dt.timedelta(seconds=45)
    assert policies.parse_duration("30m") == dt.timedelta(minutes=30)
    assert policies.parse_duration(" 2w ") == dt.timedelta(weeks=2)
    assert policies.parse_duration(dt.timedelta(hours=3)) == dt.timedelta(hours=3)
    for bad in ("14 days", "1.5d", "", None, 1.5, True, "-3d"):
        with pytest.raises(ValueError, match="ttl"):
            policies.parse_duration(bad, "ttl")


def test_routes_embedding_and_summaries_to_their_queues(settings):
    assert route_task("memory_app.embed_messages") == {"queue": "memory_embed"}
    assert route_task("memory_app.embed_session") == {"queue": "memory_embed"}
    assert route_task("memory_app.summarize_session") == {"queue": "memory_summarize"}
    assert route_task("memory_app.prune_expired") is None  # maintenance: the default queue
    assert route_task("someone_else.task") is None
    settings.MEMORY_APP = {
        "TASK_QUEUES": {"embed": "vectors", "summarize": None, "maintenance": "ops"}
    }
    assert route_task("memory_app.embed_messages") == {"queue": "vectors"}
    assert route_task("memory_app.summarize_session") is None
    assert route_task("memory_app.sweep_embeddings") == {"queue": "ops"}


def test_bad_task_queues_are_a_system_check_error(settings):
    for bad in (["memory_embed"], {"embeds": "q"}, {"embed": ""}, {"embed": 3}):
        settings.MEMORY_APP = {"TASK_QUEUES": bad}
        assert [e.id for e in checks.check_settings() if e.id == "memory_app.E021"] == [
            "memory_app.E021"
        ]
