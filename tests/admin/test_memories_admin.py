"""The admin's page of learned memories: each fact with its state and source, filters by
state, and a memory's page with its whole history, each version linked to the messages it
came from; nothing can be added, changed or deleted there."""

from __future__ import annotations

from django.urls import reverse

from memory_app.models import Item

CHANGELIST = reverse("admin:memory_app_learnedmemory_changelist")


def test_memories_are_listed_with_their_state_and_history(admin_client, trip, user):
    learned = trip.learned
    job = learned.remember("Ada works at the <bakery>", cursors=[3])
    learned.update(job.key, "Ada works at the library")
    learned.remember("Ada prefers window seats")
    trip.learned.write_block("profile", "not a memory")  # a block: not listed here

    page = admin_client.get(CHANGELIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Ada works at the library" in html and "Ada prefers window seats" in html
    assert "&lt;bakery&gt;" in html and "<bakery>" not in html  # escaped
    assert "not a memory" not in html
    assert len(page.context["cl"].result_list) == 3  # both versions and the other fact

    in_force = admin_client.get(CHANGELIST, {"in_force": "yes"})
    assert sorted(i.value["text"] for i in in_force.context["cl"].result_list) == [
        "Ada prefers window seats",
        "Ada works at the library",
    ]
    superseded = admin_client.get(CHANGELIST, {"in_force": "superseded"})
    assert [i.value["text"] for i in superseded.context["cl"].result_list] == [
        "Ada works at the <bakery>"
    ]
    found = admin_client.get(CHANGELIST, {"q": "window"})
    assert [i.value["text"] for i in found.context["cl"].result_list] == [
        "Ada prefers window seats"
    ]

    current = Item.objects.get(key=job.key, invalid_at__isnull=True)
    detail = admin_client.get(reverse("admin:memory_app_learnedmemory_change", args=[current.pk]))
    assert detail.status_code == 200
    body = detail.content.decode()
    history = body[body.index('class="mem-history"') :]
    assert history.index("Ada works at the &lt;bakery&gt;") < history.index(
        "Ada works at the library"
    )
    assert "<title>Ada works at the library |" in body
    source = reverse("admin:memory_app_session_change", args=[trip.id]) + "?at=3#m-3"
    assert f'href="{source}"' in history and "(superseded)" in history
    assert 'name="_save"' not in body  # read-only


def test_memories_cannot_be_added_changed_or_deleted(admin_client, trip):
    memory = trip.learned.remember("Ada keeps bees")
    pk = Item.objects.get(key=memory.key).pk
    assert admin_client.get(reverse("admin:memory_app_learnedmemory_add")).status_code == 403
    deleted = admin_client.post(
        reverse("admin:memory_app_learnedmemory_delete", args=[pk]), {"post": "yes"}
    )
    assert deleted.status_code == 403 and Item.objects.filter(pk=pk).exists()
