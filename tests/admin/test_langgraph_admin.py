"""The admin's read-only pages of LangGraph state: a session that is a thread links its
checkpoints (newest first, with their pending writes and channel values), and an owner's store
items are listed; none of them can be added, changed or deleted there."""

from __future__ import annotations

import pytest
from django.urls import reverse

from memory_app.integrations.langgraph import DjangoSaver, DjangoStore
from memory_app.models import Checkpoint, Item, Session
from tests.integrations.graphs import planning_graph

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def thread(user):
    graph = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    graph.invoke({"log": [], "approved": False}, {"configurable": {"thread_id": "admin-trip"}})
    return Session.objects.get(owner=user, namespace="trips", key="admin-trip")


def test_the_session_page_links_its_checkpoints_newest_first(admin_client, thread):
    page = admin_client.get(reverse("admin:memory_app_session_change", args=[thread.pk]))
    assert page.status_code == 200
    count = Checkpoint.objects.filter(session=thread).count()
    link = reverse("admin:memory_app_checkpoint_changelist") + f"?session={thread.pk}"
    assert f'href="{link}"' in page.content.decode()
    assert f"{count} checkpoints, newest first" in page.content.decode()

    listing = admin_client.get(link)
    assert listing.status_code == 200
    shown = [c.checkpoint_id for c in listing.context["cl"].result_list]
    assert shown == sorted(shown, reverse=True) and len(shown) == count
    assert "admin-trip" in listing.content.decode()


def test_a_checkpoint_page_shows_its_writes_and_values(admin_client, thread):
    # The paused step left an interrupt write on the latest checkpoint.
    latest = Checkpoint.objects.filter(session=thread).order_by("-checkpoint_id").first()
    page = admin_client.get(reverse("admin:memory_app_checkpoint_change", args=[latest.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "__interrupt__" in body and "<th>channel</th>" in body
    assert "log" in body  # the channel values table names the state's channels
    assert 'name="_save"' not in body  # read-only


def test_items_are_listed_read_only(admin_client, user):
    DjangoStore(owner=user).put(("prefs",), "diet", {"text": "vegetarian"})
    listing = admin_client.get(reverse("admin:memory_app_item_changelist"))
    assert listing.status_code == 200 and "diet" in listing.content.decode()
    item = Item.objects.get()
    page = admin_client.get(reverse("admin:memory_app_item_change", args=[item.pk]))
    assert page.status_code == 200 and "vegetarian" in page.content.decode()
    assert admin_client.get(reverse("admin:memory_app_item_add")).status_code == 403
    assert (
        admin_client.post(reverse("admin:memory_app_item_delete", args=[item.pk])).status_code
        == 403
    )


def test_a_bad_thread_filter_is_no_500(admin_client):
    response = admin_client.get(reverse("admin:memory_app_checkpoint_changelist") + "?session=nope")
    assert response.status_code in (200, 302)
