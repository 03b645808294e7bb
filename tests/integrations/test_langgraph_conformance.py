"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) against DjangoSaver:
every base capability and every extended one must be detected and pass."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from memory_app.integrations.langgraph import DjangoSaver
from tests.integrations.graphs import run_async

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_suite(owner) -> dict:
    @checkpointer_test(name="DjangoSaver")
    async def saver():
        yield DjangoSaver(owner=owner, namespace="conformance")

    report = run_async(validate(saver))
    return report.results


def test_every_base_and_extended_capability_passes(user):
    results = run_suite(user)

    assert BASE_CAPABILITIES | EXTENDED_CAPABILITIES == ALL_CAPABILITIES
    failures = {
        name: result.failures
        for name, result in results.items()
        if not (result.detected and result.passed)
    }
    assert failures == {}
    assert {name for name in results} == {c.value for c in ALL_CAPABILITIES}
    assert all(result.tests_passed > 0 and result.tests_failed == 0 for result in results.values())
