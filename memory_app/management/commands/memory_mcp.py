"""Serve the memory tools over MCP (the Model Context Protocol).

    MEMORY_MCP_TOKEN=<api token> python manage.py memory_mcp            # stdio, for one owner
    python manage.py memory_mcp --transport http --host 127.0.0.1 --port 8765

Over stdio (what desktop agents launch) the server acts for the owner of the API token in
``MEMORY_MCP_TOKEN`` (or ``--token``; the environment keeps it out of the process list); a token
that is unknown or belongs to an inactive user stops the command before it serves. Over
streamable HTTP (at ``/mcp``) each request authenticates with ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import os

from django.core.management.base import CommandError

from memory_app.exceptions import InvalidSession
from memory_app.management.base import MemoryCommand, positive_int
from memory_app.validation import check_session_fields


class Command(MemoryCommand):
    help = "Serve search_memory and remember over MCP (stdio or streamable HTTP)."

    def add_arguments(self, parser):
        parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
        parser.add_argument(
            "--token", help="stdio: the API token to act for (default: $MEMORY_MCP_TOKEN)."
        )
        parser.add_argument("--namespace", help="Agent namespace recall is narrowed to.")
        parser.add_argument("--host", default="127.0.0.1", help="http: address to listen on.")
        parser.add_argument("--port", type=positive_int, default=8765, help="http: port.")

    def handle(self, *args, transport, token, namespace, host, port, **options):
        try:
            from memory_app.integrations.mcp import build_server, owner_for_token
        except ImportError as err:
            raise CommandError(str(err)) from None
        if namespace is not None:
            try:
                check_session_fields(namespace=namespace)
            except InvalidSession as err:
                raise CommandError(f"--namespace: {err.reason}") from None
        if port > 65535:
            raise CommandError(f"--port: must be at most 65535, not {port}")
        if transport == "stdio":
            token = token or os.environ.get("MEMORY_MCP_TOKEN", "")
            if not token:
                raise CommandError("stdio needs an API token: --token or MEMORY_MCP_TOKEN")
            owner = owner_for_token(token)
            if owner is None:
                raise CommandError("that API token is unknown or its user is inactive")
            build_server(owner=owner, namespace=namespace).run("stdio")
            return
        base_url = f"http://{host}:{port}"
        self.stderr.write(f"MCP server at {base_url}/mcp (Authorization: Bearer <API token>)")
        build_server(namespace=namespace, base_url=base_url).run(
            "streamable-http", host=host, port=port
        )
