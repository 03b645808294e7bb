"""Property-based run of the API against its own OpenAPI schema (schemathesis).

Every operation is called, authenticated, with generated valid and invalid input, through the
project's real WSGI application on the test database. A 5xx, an undocumented status, or a body
that does not match the documented schema fails the test.
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token

from memory_app import Memory

from ..conftest import tool_turn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

CONFIG = schemathesis.Config.from_dict(
    {
        # Fixed seed: the run is the same every time (a failure reproduces).
        "seed": 20240603,
        "generation": {
            "mode": "all",  # valid and invalid input
            "max-examples": 30,
            "database": "none",
            # Authenticate with our token only; generated credentials would be invalid ones.
            "with-security-parameters": False,
        },
        "phases": {"stateful": {"enabled": False}},
        "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
        "checks": {
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "response_headers_conformance": {"enabled": True},
            "negative_data_rejection": {"enabled": True},
            "ignored_auth": {"enabled": True},
            "unsupported_method": {"enabled": True},
            # Schema-valid input may still break rules the schema cannot express (a tool message
            # needs the id of a call, a snapshot must move past the last one): a 400 is right then.
            "positive_data_acceptance": {"enabled": False},
            # Resources are made by the test itself, not by earlier calls.
            "use_after_free": {"enabled": False},
            "ensure_resource_availability": {"enabled": False},
        },
    }
)


# The schema is fetched from the project's own /api/schema/ when the module is collected (it
# needs no database), so each operation becomes its own test item.
# (schemathesis.pytest.from_fixture would defer this, but it does not work with pytest 9.)
api_schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler(), config=CONFIG).include(
    path_regex="^/api/memory/"
)


@pytest.fixture
def same_connection_for_requests():
    """Keep the test's database transaction across requests to the WSGI app.

    Django closes connections it thinks stale around each request; inside a test's transaction
    that would drop it. Django's own test client disconnects the same handlers.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def auth_header(user) -> dict[str, str]:
    return {"Authorization": f"Token {Token.objects.create(user=user).key}"}


def existing_session(owner, *, with_snapshot: bool):
    """A session worth calling: messages with a tool turn, and maybe a snapshot."""
    memory = Memory.create(
        f"fuzz-{uuid.uuid4().hex}", owner=owner, namespace="fuzz", title="Fuzzed"
    )
    memory.add_many(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            *tool_turn("call_1"),
            {"role": "assistant", "content": "Sunny."},
        ]
    )
    if with_snapshot:
        memory.save_snapshot("Asked about the weather.", upto=2)
    return memory


@api_schema.parametrize()
# The user, token and connection fixtures are meant to be shared by every generated call.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_api_conforms_to_its_schema(case, user, auth_header, same_connection_for_requests):
    # A well-formed session id is pointed at a real session of the user, so the operation's
    # own logic runs (a random UUID would only ever meet the 404 path). Malformed ids stay.
    session_id = (case.path_parameters or {}).get("id")
    if isinstance(session_id, str):
        try:
            uuid.UUID(session_id)
        except ValueError:
            pass
        else:
            # Saving a first snapshot (no prev_version) can only succeed on a session without one.
            first_snapshot = (
                case.operation.method.upper(),
                case.operation.path.rsplit("/", 2)[-2],
            ) == ("POST", "snapshot")
            case.path_parameters["id"] = str(
                existing_session(user, with_snapshot=not first_snapshot).id
            )
    case.call_and_validate(headers=auth_header)


def test_the_run_covers_every_operation():
    operations = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert len(operations) == 29
    assert ("PATCH", "/api/memory/memories/{key}/") in operations
    assert ("PUT", "/api/memory/sessions/{id}/blocks/{name}/") in operations
    assert ("POST", "/api/memory/sessions/{id}/messages/") in operations
    assert ("POST", "/api/memory/owner/erase/") in operations
    assert ("GET", "/api/memory/sessions/{id}/search/") in operations
    assert ("POST", "/api/memory/sessions/{id}/summarize/") in operations
    assert ("GET", "/api/memory/sessions/{id}/context/") in operations
