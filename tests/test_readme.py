"""The documentation's console blocks run as written, in order, against a live server: the
README's, then the curl session of docs/api.md and the owner commands of docs/operations.md.

A fresh clone is imitated by a directory that links the checkout's files and has its own
``.venv/bin/python`` (a shim for this interpreter), a new empty database on the test PostgreSQL
server, migrated as ``scripts/serve`` does, and gunicorn serving the project on a free port that
the commands reach through ``ADDRESS``, as documented. Each command must exit 0, and the key parts
of the output the README shows must appear in what it printed.

    pytest -m readme
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection

from tests.live_api import ROOT, Gunicorn

pytestmark = [pytest.mark.readme, pytest.mark.postgres, pytest.mark.timeout(600)]

README = ROOT / "README.md"
#: The pages whose console blocks run, in this order (one shell: variables carry over).
PAGES = [README, ROOT / "docs" / "api.md", ROOT / "docs" / "operations.md"]


def documented_blocks() -> list[str]:
    return [block for page in PAGES for block in console_blocks(page.read_text())]


def console_blocks(text: str) -> list[str]:
    return re.findall(r"^```console\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[tuple[str, str]]:
    """``(command, documented output)`` pairs of a console block. A command starts with ``$ ``
    and goes on while a line ends with a backslash or a quote is open; ``#`` lines are comments."""
    pairs: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = [line[2:]]
            while (command[-1].endswith("\\") or "\n".join(command).count("'") % 2) and i + 1 < len(
                lines
            ):
                i += 1
                command.append(lines[i])
            pairs.append(("\n".join(command), []))
        elif line.startswith("#") or not line.strip():
            pass
        elif pairs:
            pairs[-1][1].append(line)
        i += 1
    return [(command, "\n".join(output)) for command, output in pairs]


def _values(data, key: str):
    if isinstance(data, dict):
        for k, v in data.items():
            if k == key:
                yield v
            yield from _values(v, key)
    elif isinstance(data, list):
        for item in data:
            yield from _values(item, key)


PAIR = re.compile(r'"(\w+)": (null|true|false|-?\d+|"(?:[^"\\]|\\.)*")')


def assert_documented_output(command: str, documented: str, actual: str) -> None:
    if not documented:
        return
    if documented.lstrip().startswith("{"):
        data = json.loads(actual)
        for key, raw in PAIR.findall(documented):
            value = json.loads(raw)
            if key == "id" or (isinstance(value, str) and "..." in value):
                continue  # made anew each run / elided in the README
            assert value in list(_values(data, key)), (
                f"{command!r}: the README shows {key}={raw}; the server answered {actual}"
            )
        return
    for line in documented.splitlines():
        pattern = ".*".join(re.escape(part) for part in line.strip().split("..."))
        assert re.search(pattern, actual), f"{command!r}: expected {line!r} in {actual!r}"


def test_commands_in_the_docs_use_the_projects_python():
    """A fresh machine has no `python` with the project installed: every command the docs
    give (console blocks, and commands quoted inline) runs `.venv/bin/python`."""
    bare = re.compile(r"(^|[\s(`])python3? (manage\.py|bench/|examples/|-m |-c )")
    for page in [README, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for block in console_blocks(text):
            for command, _ in commands(block):
                assert not re.search(r"(^|[\s(])python3? ", command), (page.name, command)
        for number, line in enumerate(text.splitlines(), 1):
            assert not bare.search(line), f"{page.name}:{number}: {line.strip()}"


@pytest.fixture
def fresh_database(django_db_setup, django_db_blocker):
    import psycopg
    from psycopg import sql

    from tests.conftest import database_url

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    name = f"memory_readme_{uuid.uuid4().hex[:8]}"
    admin_url = database_url()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin_url.replace(f"/{connection.settings_dict['NAME']}", f"/{name}", 1)
    yield url
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def clone(tmp_path) -> Path:
    """The checkout's top-level files linked into a new directory, with a ``.venv/bin/python``."""
    here = tmp_path / "clone"
    here.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".venv", ".pgdata", ".git"):
            (here / entry.name).symlink_to(entry)
    shim = here / ".venv" / "bin" / "python"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    return here


def test_readme_console_session_runs_against_a_live_server(fresh_database, clone):
    env = {
        **os.environ,
        "DATABASE_URL": fresh_database,
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    env.pop("CELERY_BROKER_URL", None)
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=clone,
        env=env,
        check=True,
        timeout=300,
    )
    steps = [pair for block in documented_blocks() for pair in commands(block)]
    assert any("drf_create_token alice" in c for c, _ in steps)
    assert sum(c.lstrip().startswith("curl") or "$(curl" in c for c, _ in steps) >= 8

    with Gunicorn(fresh_database, workers=1, threads=2) as server:
        env["ADDRESS"] = server.base_url.removeprefix("http://")
        # One shell for the whole session (variables carry over); a marker after each command.
        marker = f"--8<-- {uuid.uuid4().hex}"
        script = "".join(f'{command}\necho; echo "{marker} $?"\n' for command, _ in steps)
        result = subprocess.run(
            ["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=300
        )
    outputs = re.split(rf"\n?{re.escape(marker)} (\d+)\n", result.stdout)
    codes = outputs[1::2]
    assert len(codes) == len(steps), result.stdout + result.stderr
    for (command, documented), output, code in zip(steps, outputs[0::2], codes, strict=False):
        assert code == "0", f"{command!r} exited {code}: {output}\n{result.stderr}"
        assert_documented_output(command, documented, output.strip())
    assert (clone / "alice.json").exists()
