"""Each optional part configured without its extra is a system check error naming the extra.

A missing package is simulated for real: a finder at the front of ``sys.meta_path`` refuses it
(and it is taken out of ``sys.modules`` for the test), so the import system itself answers "not
installed", as it would in a host that did not install the extra.
"""

from __future__ import annotations

import sys

import pytest
from django.test import override_settings

from memory_app.checks import check_extras, check_settings


class Blocker:
    """A meta path finder that makes the named top-level packages uninstallable."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def uninstall(monkeypatch):
    def block(*names: str) -> None:
        for loaded in list(sys.modules):
            if loaded.split(".")[0] in names:
                monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setattr(sys, "meta_path", [Blocker(*names), *sys.meta_path])

    return block


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_nothing_optional_configured_needs_nothing(uninstall):
    uninstall("openai", "sentence_transformers", "celery", "redis", "cryptography")
    with override_settings(MEMORY_APP={}, CELERY_BROKER_URL=""):
        assert check_extras() == []
        assert check_settings() == []


@pytest.mark.parametrize(
    "setting, path",
    [
        ("EMBEDDER", "memory_app.providers.embeddings.OpenAIEmbedder"),
        ("SUMMARIZER", "memory_app.providers.summarizers.OpenAISummarizer"),
    ],
)
def test_openai_provider_without_the_openai_extra(uninstall, setting, path):
    with override_settings(MEMORY_APP={setting: path}):
        assert check_extras() == []  # installed here: no error
        uninstall("openai")
        (error,) = check_extras()
    assert error.id == "memory_app.E012"
    assert setting in error.msg and "'openai'" in error.msg
    assert error.hint == "pip install 'django-memory-app[openai]'"


def test_a_subclass_of_the_openai_provider_needs_it_too(uninstall):
    uninstall("openai")
    with override_settings(MEMORY_APP={"SUMMARIZER": "tests.test_checks_extras.MySummarizer"}):
        assert ids(check_extras()) == ["memory_app.E012"]


def test_local_embedder_without_the_local_embeddings_extra(uninstall):
    uninstall("sentence_transformers")
    with override_settings(
        MEMORY_APP={"EMBEDDER": "memory_app.providers.embeddings.SentenceTransformerEmbedder"}
    ):
        (error,) = check_extras()
    assert error.id == "memory_app.E013"
    assert "[local-embeddings]" in error.hint


def test_broker_without_the_tasks_extra(uninstall):
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:6379/0"):
        assert check_extras() == []
        uninstall("celery", "redis")
        errors = check_extras()
    assert ids(errors) == ["memory_app.E014", "memory_app.E014"]
    assert ["'celery'" in errors[0].msg, "'redis'" in errors[1].msg] == [True, True]
    assert all(e.hint == "pip install 'django-memory-app[tasks]'" for e in errors)
    assert all("redis://127" not in e.msg for e in errors)  # the URL may carry a password


def test_encryption_keys_without_the_encryption_extra(uninstall):
    uninstall("cryptography")
    with override_settings(MEMORY_APP={"ENCRYPTION_KEYS": ["x" * 43 + "="]}):
        errors = check_settings()
    assert ids(errors) == ["memory_app.E011"]
    assert "[encryption]" in errors[0].hint


def test_the_api_without_the_api_extra_names_it(uninstall, monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    for loaded in [m for m in sys.modules if m.startswith("memory_app.api")]:
        monkeypatch.delitem(sys.modules, loaded)  # put back after the test
    uninstall("rest_framework", "drf_spectacular")
    with pytest.raises(ImproperlyConfigured, match=r"django-memory-app\[api\]"):
        importlib.import_module("memory_app.api")


def _my_summarizer():
    from memory_app.providers.summarizers import OpenAISummarizer

    class MySummarizer(OpenAISummarizer):
        pass

    return MySummarizer


def __getattr__(name):  # MySummarizer is made on demand: importing this module needs no openai
    if name == "MySummarizer":
        return _my_summarizer()
    raise AttributeError(name)
