"""Owner-scope recall of ownerless (service) sessions stays within their namespace: two agents'
service sessions never recall each other."""

from __future__ import annotations

import pytest

from memory_app import Memory
from tests.recall.conftest import add_turns


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fulltext"])
def test_ownerless_sessions_recall_only_their_own_namespace(
    db, django_capture_on_commit_callbacks, mode
):
    support = Memory.session("s-1", owner=None, namespace="support-bot")
    support_two = Memory.session("s-2", owner=None, namespace="support-bot")
    billing = Memory.session("b-1", owner=None, namespace="billing-bot")
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(support_two, ["The customer's parcel was lost in Rotterdam harbour."])
        add_turns(billing, ["The parcel invoice for Rotterdam harbour was refunded."])
        add_turns(support, ["Hello again."])
    # (Vector search ranks everything in scope, the asking session's own turn included.)
    found = {
        r.session_id
        for r in support.search("parcel Rotterdam harbour", limit=10, scope="owner", mode=mode)
    }
    assert support_two.id in found and found <= {support.id, support_two.id}
    found = {
        r.session_id
        for r in billing.search("parcel Rotterdam harbour", limit=10, scope="owner", mode=mode)
    }
    assert found == {billing.id}
