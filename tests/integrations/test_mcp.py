"""The MCP server (``manage.py memory_mcp``) driven by the MCP SDK's own client, over stdio and
streamable HTTP in a real second process: it lists the tools, acts for the token's owner only,
answers bad arguments with the rule book's error, and refuses unknown tokens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from rest_framework.authtoken.models import Token

from memory_app import Memory
from memory_app.models import Item
from memory_app.tools import MemoryTools
from tests.celery_worker import wait_until
from tests.integrations.conftest import ROOT, database_url
from tests.integrations.graphs import run_async

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def owners(user, other_user):
    Memory.session("chat", owner=user, namespace="bot").add(
        {"role": "user", "content": "I keep bees on the roof"}
    )
    MemoryTools(other_user).remember("Bob's bees are in the garden, code 9921")
    return Token.objects.create(user=user).key, Token.objects.create(user=other_user).key


def server_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "CELERY_BROKER_URL": "",
        **extra,
    }


def text_of(result) -> str:
    return "\n".join(part.text for part in result.content if getattr(part, "text", None))


async def session_run(client: Client) -> dict:
    async with client:
        listed = await client.list_tools()
        saved = await client.call_tool("remember", {"text": "Honey harvest is in August"})
        found = await client.call_tool("search_memory", {"query": "bees honey", "limit": 5})
        bad = await client.call_tool("search_memory", {"query": ""})
        return {
            "tools": sorted(t.name for t in listed.tools),
            "saved": text_of(saved),
            "found": text_of(found),
            "bad": (bad.is_error, text_of(bad)),
        }


def assert_alice_only(outcome: dict, user) -> None:
    assert outcome["tools"] == ["edit_memory_block", "remember", "search_memory"]
    assert outcome["saved"].startswith("Remembered")
    found = outcome["found"]
    assert "UNTRUSTED REFERENCE DATA" in found
    assert '"I keep bees on the roof"' in found and '"Honey harvest is in August"' in found
    assert "9921" not in found and "garden" not in found
    is_error, message = outcome["bad"]
    assert is_error and "query" in message
    assert Item.objects.filter(owner=user, value__text="Honey harvest is in August").exists()


def test_stdio_acts_for_the_token_owner(owners, user):
    alice_token, _ = owners
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "memory_mcp"],
        env=server_env(MEMORY_MCP_TOKEN=alice_token),
        cwd=str(ROOT),
    )
    assert_alice_only(run_async(session_run(Client(params))), user)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "memory_mcp", "--transport", "http", "--port", str(port)],
        cwd=ROOT,
        env=server_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def listening() -> bool:
        assert process.poll() is None, process.stderr.read().decode()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, timeout=60, message="the MCP server to listen")
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=20)


def http_client(url: str, token: str) -> Client:
    headers = {"Authorization": f"Bearer {token}"}
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)))


def test_streamable_http_scopes_every_request_to_its_token(owners, user, http_server):
    alice_token, bob_token = owners
    assert_alice_only(run_async(session_run(http_client(http_server, alice_token))), user)

    async def bob_searches():
        async with http_client(http_server, bob_token) as client:
            return text_of(await client.call_tool("search_memory", {"query": "bees"}))

    bob_sees = run_async(bob_searches())
    assert "9921" in bob_sees and "roof" not in bob_sees and "Honey" not in bob_sees


def test_streamable_http_refuses_an_unknown_token(owners, http_server):
    async def intruder():
        async with http_client(http_server, "not-a-token") as client:
            await client.list_tools()

    with pytest.raises(BaseException) as raised:  # the SDK's client gives up on the 401
        run_async(intruder())
    assert "MCPError" in repr(raised.value)
    # What it was answered, seen with a plain HTTP request: 401 before any tool runs.
    for headers in ({"Authorization": "Bearer not-a-token"}, {}):
        request = urllib.request.Request(
            http_server,
            data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json", **headers},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401


def test_the_command_refuses_a_missing_or_unknown_token(owners, monkeypatch):
    monkeypatch.delenv("MEMORY_MCP_TOKEN", raising=False)
    with pytest.raises(CommandError, match="needs an API token"):
        call_command("memory_mcp", stdout=StringIO())
    with pytest.raises(CommandError, match="unknown or its user is inactive"):
        call_command("memory_mcp", token="nope", stdout=StringIO())
    alice_token, _ = owners
    Token.objects.get(key=alice_token).user.__class__.objects.filter(
        auth_token__key=alice_token
    ).update(is_active=False)
    with pytest.raises(CommandError, match="inactive"):
        call_command("memory_mcp", token=alice_token, stdout=StringIO())
