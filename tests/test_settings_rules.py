"""Hostile settings: every MEMORY_APP key given the wrong type and a wrong value, unknown keys,
a MEMORY_APP that is no dict, and MEMORY_APP_JSON that is no JSON object. Each is a system
check error naming the key (a warning naming the closest key for a typo); a bad value is never
acted on: reading it raises ImproperlyConfigured, so nothing stored is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from memory_app import conf
from memory_app.checks import check_settings
from memory_app.conf import DEFAULTS, RULES, memory_settings
from memory_app.models import Role
from memory_app.types import ROLES

ROOT = Path(__file__).resolve().parent.parent

#: For every setting, values of the right kind that are still wrong (a type of its own comes
#: on top: ``object()`` is refused by every rule).
WRONG_VALUES: dict[str, list] = {
    "TOKEN_ENCODING": ["o300k_base", 5],
    "MODEL_ENCODINGS": [{"gpt-x": "cl100"}, ["gpt-4"], {"gpt-x": 5}],
    "MAX_MESSAGE_BYTES": [0, -1, "1000", 1.5, True],
    "MAX_BATCH_SIZE": [0, "10"],
    "MAX_METADATA_BYTES": [1, None],
    "MAX_PINNED": [-1, "5"],
    "MAX_JSON_DEPTH": [0, 10_000],
    "PRUNE_COMPACTED": ["false", "true", 0, None],
    "DEFAULT_NAMESPACE": ["", "  ", "x" * 101, 5],
    "COMBINE_APPENDS": ["true", 1],
    "ASYNC_CONNECTIONS": [-1, 1001, 2.5, "10"],
    "PREPARE_STATEMENTS": ["false", 0],
    "WINDOW_PAGE_SIZE": [0, "200"],
    "OPENAI": [[], "sk-key"],
    "EMBEDDER": ["lexical", 5, ""],
    "EMBEDDER_OPTIONS": [[], "dimensions=8", None],
    "EMBED_ON_APPEND": ["no"],
    "EMBED_BATCH_SIZE": [0],
    "AFTER_APPEND_DEBOUNCE_MS": [-1, "5", True],
    "AFTER_APPEND_KEY_PREFIX": ["", None],
    "AFTER_APPEND": ["later", True],
    "AFTER_APPEND_DELAY_MS": [-5, float("nan")],
    "SEARCH_MODE": ["semantic"],
    "FUSION": ["sum"],
    "FUSION_NORMALISATION": ["rank"],
    "FUSION_VECTOR_WEIGHT": [1.5, -0.1, "0.5"],
    "RRF_K": [-1, float("inf")],
    "NEIGHBOUR_BOOST": [-0.5],
    "HYBRID_CANDIDATES": [0],
    "FULLTEXT_MATCH": ["some"],
    "HNSW_EF_SEARCH": [0, 5000],
    "HNSW_MAX_SCAN_TUPLES": [0],
    "HNSW_M": [1, 500],
    "HNSW_EF_CONSTRUCTION": [2],
    "RECALL_ROLES": [[], ["robot"], "user"],
    "RECALL_TOKEN_SHARE": [0, 1.5],
    "IMPORTANCE_SCORER": [5, "nodots"],
    "IMPORTANCE_THRESHOLD": ["high", float("nan")],
    "SHOULD_RECALL": [None, "x"],
    "SUMMARIZER": [None, ""],
    "MEMORY_EXTRACTOR": [5, "offline"],
    "MEMORY_EXTRACTOR_OPTIONS": [[], None],
    "MEMORY_EXTRACT_BATCH": [0, "10"],
    "MEMORY_EXTRACT_MAX_MESSAGES": [0],
    "MEMORIES_PER_OWNER": [0, -5],
    "MEMORY_DUPLICATE_SIMILARITY": [0, 1.5, "0.9"],
    "MEMORY_BLOCKS_MAX": [0, 1000],
    "MEMORY_BLOCK_MAX_CHARS": [0],
    "SUMMARIZER_OPTIONS": [[], None],
    "SUMMARIZE_THRESHOLD_TOKENS": [0, "8000"],
    "SUMMARIZE_KEEP_RECENT": [-1],
    "SUMMARIZE_MAX_INPUT_TOKENS": [0],
    "SUMMARIZE_MAX_ATTEMPTS": [0, 1000],
    "SUMMARIZE_LOCK_URL": [5, ""],
    "SUMMARIZE_LOCK_SECONDS": [0],
    "SUMMARIZE_LOCK_PREFIX": [""],
    "RETENTION": [["a"], "14d"],
    "SWEEP_BATCH_SIZE": [0],
    "TASK_QUEUES": [{"embedding": "q"}, {"embed": 5}, []],
    "API_PERMISSION_CLASSES": ["memory_app.api.permissions.OwnerScoped", [5]],
    "API_THROTTLE_CLASSES": [[None]],
    "API_THROTTLE_RATES": [{"memory_read": "lots"}, {"memory_read": "10/fortnight"}, ["10/m"]],
    "API_MESSAGES_PAGE_SIZE": [0],
    "API_MESSAGES_MAX_PAGE_SIZE": [0],
    "API_SESSIONS_PAGE_SIZE": [0],
    "API_SESSIONS_MAX_PAGE_SIZE": [-1],
    "ENCRYPTION_KEYS": ["key", [5]],
    "READ_REPLICAS": [["nowhere"], "replica"],
    "REPLICA_IDLE_SECONDS": [-1],
    "REPLICA_READ_VIEWS": ["admin:x", [5]],
}

CASES = [
    pytest.param(key, value, id=f"{key}={value!r}"[:60])
    for key in DEFAULTS
    for value in [*WRONG_VALUES.get(key, []), object()]
]


def errors_for(values: dict) -> list:
    with override_settings(MEMORY_APP=values):
        return [e for e in check_settings() if e.is_serious()]


def test_every_setting_has_a_rule_and_hostile_values():
    assert set(RULES) == set(DEFAULTS)
    assert set(WRONG_VALUES) == set(DEFAULTS)


def test_the_defaults_pass_their_rules():
    assert [key for key, value in DEFAULTS.items() if RULES[key](value)] == []
    assert errors_for(dict(DEFAULTS)) == []


def test_the_roles_a_setting_may_name_are_the_models():
    assert tuple(Role.values) == ROLES


@pytest.mark.parametrize(("key", "value"), CASES)
def test_a_hostile_value_is_a_check_error_naming_the_key_and_is_never_used(key, value):
    errors = errors_for({key: value})
    assert errors, f"{key}={value!r} passed the checks"
    assert any(f"['{key}']" in e.msg for e in errors), [e.msg for e in errors]
    assert all(e.id.startswith("memory_app.E") for e in errors)
    with override_settings(MEMORY_APP={key: value}):
        if RULES[key](value) is not None:
            with pytest.raises(ImproperlyConfigured, match=key):
                getattr(memory_settings, key)


def test_a_string_false_never_prunes(mem):
    """The worst case before the rules: "false" read as true deleted covered messages."""
    stored = mem.add_many([{"role": "user", "content": f"turn {i}"} for i in range(6)])
    with override_settings(MEMORY_APP={"PRUNE_COMPACTED": "false"}):
        with pytest.raises(ImproperlyConfigured, match="PRUNE_COMPACTED"):
            mem.save_snapshot("summary", upto=stored[3].cursor, prev=None)
    assert [m.cursor for m in mem.messages()] == [m.cursor for m in stored]
    assert mem.latest_snapshot() is None


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("MAX_MESAGE_BYTES", "MAX_MESSAGE_BYTES"),
        ("prune_compacted", "PRUNE_COMPACTED"),
        ("EMBEDER", "EMBEDDER"),
    ],
)
def test_an_unknown_key_is_a_warning_naming_the_closest_key(typo, meant):
    with override_settings(MEMORY_APP={typo: 1}):
        found = check_settings()
    assert [(w.id, w.is_serious()) for w in found] == [("memory_app.W040", False)]
    assert typo in found[0].msg and f"did you mean {meant!r}" in found[0].msg


def test_an_unknown_key_with_nothing_close_names_no_key():
    with override_settings(MEMORY_APP={"ZZZ": 1}):
        (warning,) = check_settings()
    assert "ZZZ" in warning.msg and "did you mean" not in warning.msg


@pytest.mark.parametrize("value", [["PRUNE_COMPACTED"], "PRUNE_COMPACTED=1", 5])
def test_memory_app_that_is_not_a_dict(value):
    with override_settings(MEMORY_APP=value):
        assert [e.id for e in check_settings()] == ["memory_app.E041"]
        with pytest.raises(ImproperlyConfigured, match="must be a dict"):
            getattr(memory_settings, "MAX_PINNED")  # noqa: B009


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("API_PERMISSION_CLASSES", ["memory_app.api.permissions.NoSuchPolicy"]),
        ("API_THROTTLE_CLASSES", ["memory_app.api.throttling.Nope"]),
        ("EMBEDDER", "memory_app.providers.embeddings.NoSuchEmbedder"),
        ("SUMMARIZER", "no_such_package.Summarizer"),
        ("IMPORTANCE_SCORER", "memory_app.importance.THRESHOLD_WORDS"),
        ("SHOULD_RECALL", "memory_app.conf.SETTINGS_NAME"),
    ],
)
def test_a_dotted_path_that_does_not_import_is_an_error(key, path):
    errors = errors_for({key: path})
    assert [e.id for e in errors] == ["memory_app.E042"], [e.msg for e in errors]
    assert key in errors[0].msg


def test_options_the_provider_does_not_take_are_an_error():
    errors = errors_for({"SUMMARIZER_OPTIONS": {"modle": "gpt-4o"}})
    assert [e.id for e in errors] == ["memory_app.E040"]
    assert "SUMMARIZER_OPTIONS" in errors[0].msg and "modle" in errors[0].msg
    errors = errors_for({"EMBEDDER_OPTIONS": {"dimension": 8}})
    assert "EMBEDDER_OPTIONS" in errors[0].msg and "dimension" in errors[0].msg
    pytest.importorskip("openai")
    errors = errors_for({"OPENAI": {"base_uri": "http://127.0.0.1:1"}})
    assert "OPENAI" in errors[0].msg and "base_uri" in errors[0].msg


def test_good_options_pass():
    assert errors_for({"EMBEDDER_OPTIONS": {"dimensions": 64}}) == []
    assert errors_for({"OPENAI": {"base_url": "http://127.0.0.1:1", "max_retries": 0}}) == []


def test_a_page_size_above_its_maximum_is_an_error():
    errors = errors_for({"API_SESSIONS_PAGE_SIZE": 600})
    assert [e.id for e in errors] == ["memory_app.E043"]
    assert (
        "API_SESSIONS_PAGE_SIZE" in errors[0].msg and "API_SESSIONS_MAX_PAGE_SIZE" in errors[0].msg
    )


def test_validate_lists_every_bad_value_at_once():
    with override_settings(MEMORY_APP={"PRUNE_COMPACTED": "no", "MAX_PINNED": -1, "TYPO": 1}):
        with pytest.raises(ImproperlyConfigured) as raised:
            memory_settings.validate()
    text = str(raised.value)
    assert "PRUNE_COMPACTED" in text and "MAX_PINNED" in text and "TYPO" not in text
    with override_settings(MEMORY_APP={"TYPO": 1}):
        memory_settings.validate()  # an unknown key is only a warning


# ---- MEMORY_APP_JSON, as a process without a settings module of its own gets it ---------------
def run(args: list[str], memory_app_json: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMORY_APP_JSON": memory_app_json}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("[1", "MEMORY_APP_JSON is not valid JSON"),
        ('["PRUNE_COMPACTED"]', "not an array"),
        ('"{}"', "not a string"),
        ("null", "not null"),
    ],
)
def test_memory_app_json_that_is_not_an_object_is_one_line(value, said):
    done = run(["manage.py", "check"], value)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


def test_memory_app_json_with_a_bad_value_fails_the_check_and_the_servers():
    bad = json.dumps({"PRUNE_COMPACTED": "false", "EMBEDDER": conf.LEXICAL_EMBEDDER})
    check = run(["manage.py", "check"], bad)
    assert check.returncode == 1 and "memory_app.E040" in check.stderr
    assert "PRUNE_COMPACTED" in check.stderr
    for server in ("project.wsgi", "project.asgi"):
        started = run(["-c", f"import {server}"], bad)
        assert started.returncode == 1, started.stderr
        assert "ImproperlyConfigured" in started.stderr and "PRUNE_COMPACTED" in started.stderr
    good = run(["-c", "import project.wsgi"], json.dumps({"PRUNE_COMPACTED": False}))
    assert good.returncode == 0, good.stderr


def test_every_setting_is_documented():
    reference = (ROOT / "docs" / "settings.md").read_text()
    assert [key for key in DEFAULTS if f"`{key}`" not in reference] == []
