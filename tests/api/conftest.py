"""Fixtures of the REST API tests: token-authenticated clients for two users, URL builders."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from memory_app import Memory


def api_client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # Users are made per test; the default hasher's deliberate slowness would dominate run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    # Throttle counters live in the cache; each test starts from zero.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def api(db, user) -> APIClient:
    """Alice's client (token authentication)."""
    return api_client_for(user)


@pytest.fixture
def other_api(db, other_user) -> APIClient:
    """Bob's client."""
    return api_client_for(other_user)


@pytest.fixture
def session(db, user):
    """Alice's session, with a few messages."""
    memory = Memory.create("chat-1", owner=user, namespace="bot", title="First chat")
    memory.add_many(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."},
        ]
    )
    return memory


def sessions_url() -> str:
    return reverse("memory_api:session-list")


def session_url(session_id, action: str | None = None, **kwargs: str) -> str:
    name = f"memory_api:session-{action}" if action else "memory_api:session-detail"
    if action == "block":  # sessions/{id}/blocks/{name}/
        kwargs.setdefault("name", "profile")
    return reverse(name, kwargs={"id": str(session_id), **kwargs})


def import_url() -> str:
    return reverse("memory_api:session-import")
