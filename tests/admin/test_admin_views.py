"""The session admin through Django's test client: listing, transcript paging, actions."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from memory_app import Memory
from memory_app.models import Message, Session
from memory_app.validation import MAX_CURSOR

from .conftest import fill
from .conversations import chatter

CHANGELIST = reverse("admin:memory_app_session_changelist")


def change_url(memory, **params) -> str:
    url = reverse("admin:memory_app_session_change", args=[memory.id])
    if params:
        url += "?" + "&".join(f"{k}={v}" for k, v in params.items())
    return url


def cursors_on(response) -> list[int]:
    """Cursors of the messages (and nested tool results) the transcript page shows."""
    return sorted({int(c) for c in re.findall(r'id="m-(\d+)"', response.content.decode())})


def listed_keys(response) -> list[str]:
    return [s.key for s in response.context["cl"].result_list]


# -- changelist -------------------------------------------------------------------------------
def test_changelist_lists_counters_and_snapshot_flag(admin_client, trip, make_session):
    make_session("plain", 3, namespace="support-bot")
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert "trip-norway" in html and "A week in Norway" in html and "support-bot" in html
    rows = {s.key: s for s in response.context["cl"].result_list}
    assert rows["trip-norway"].snapshot_version == 1
    assert rows["trip-norway"].has_snapshot and not rows["plain"].has_snapshot
    assert rows["trip-norway"].message_count == 14


def test_filters_narrow_the_list(admin_client, trip, make_session, user):
    from django.utils import timezone

    make_session("plain", 3, namespace="support-bot")
    make_session(
        "old", 2, namespace="support-bot", expires_at=timezone.now() - timezone.timedelta(days=1)
    )
    assert listed_keys(admin_client.get(CHANGELIST, {"namespace": "support-bot"})) == [
        "old",
        "plain",
    ]
    assert listed_keys(admin_client.get(CHANGELIST, {"has_snapshot": "yes"})) == ["trip-norway"]
    assert sorted(listed_keys(admin_client.get(CHANGELIST, {"has_snapshot": "no"}))) == [
        "old",
        "plain",
    ]
    assert listed_keys(admin_client.get(CHANGELIST, {"expired": "yes"})) == ["old"]
    assert sorted(listed_keys(admin_client.get(CHANGELIST, {"expired": "no"}))) == [
        "plain",
        "trip-norway",
    ]
    assert listed_keys(admin_client.get(CHANGELIST, {"owner__id__exact": user.pk})) == [
        "trip-norway"
    ]


def test_the_owner_filter_lists_the_owners_of_the_newest_sessions(
    admin_client, make_session, monkeypatch, django_user_model
):
    from memory_app.admin import OwnerFilter

    owners = [django_user_model.objects.create(username=f"owner-{i}") for i in range(4)]
    for owner in owners:  # owner-3's session is the newest
        make_session(f"of-{owner.username}", 1, owner=owner)
    monkeypatch.setattr(OwnerFilter, "shown", 2)

    def choices(response) -> list[str]:
        spec = next(f for f in response.context["cl"].filter_specs if isinstance(f, OwnerFilter))
        return [str(label) for _, label in spec.lookup_choices]

    assert choices(admin_client.get(CHANGELIST)) == ["owner-2", "owner-3"]
    chosen = admin_client.get(CHANGELIST, {"owner__id__exact": owners[0].pk})
    assert listed_keys(chosen) == ["of-owner-0"] and "owner-0" in choices(chosen)
    assert admin_client.get(CHANGELIST, {"owner__id__exact": "x"}).status_code in (200, 302)


def test_search_finds_message_text_once_per_session(admin_client, trip, make_session):
    make_session("plain", 3)
    # "Oslo" occurs in many messages of the trip: the session must still be listed once.
    assert Message.objects.filter(session_id=trip.id, content__icontains="oslo").count() > 3
    response = admin_client.get(CHANGELIST, {"q": "oslo"})
    assert listed_keys(response) == ["trip-norway"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": "plain"})) == ["plain"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": "week norway"})) == ["trip-norway"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": '"option 1 works"'})) == ["plain"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": "no-such-text"})) == []


def test_search_terms_are_matched_once_each_and_capped(admin_client, trip, make_session):
    from memory_app.admin import SessionAdmin

    make_session("plain", 3)
    with CaptureQueriesContext(connection) as once:
        admin_client.get(CHANGELIST, {"q": "oslo"})
    with CaptureQueriesContext(connection) as repeated:
        response = admin_client.get(CHANGELIST, {"q": "oslo OSLO Oslo oslo"})
    assert listed_keys(response) == ["trip-norway"]

    def text_lookups(queries) -> int:
        return sum(1 for q in queries if q["sql"].startswith('SELECT "memory_app_message"'))

    assert text_lookups(once) == text_lookups(repeated) == 1  # a repeated word: looked up once

    cap = SessionAdmin.search_max_terms
    words = " ".join(f"w{i}" for i in range(200))
    with CaptureQueriesContext(connection) as capped:
        response = admin_client.get(CHANGELIST, {"q": words})
    assert response.status_code == 200 and listed_keys(response) == []
    assert text_lookups(capped) == cap
    said = page_messages(response)
    assert any(f"Only the first {cap} of the 200 words" in m for m in said), said


def test_search_reads_indexed_text_through_the_full_text_index(admin_client, make_session):
    from memory_app.services.background import run_after_append

    indexed = make_session("indexed", 0)
    indexed.add({"role": "user", "content": "The kettles arrived broken."})
    run_after_append(indexed.id)  # what the after-append job does: the vector is filled
    fresh = make_session("fresh", 0)
    fresh.add({"role": "user", "content": "My kettle leaks."})
    Message.objects.filter(session_id=fresh.id).update(index_pending=True, search_vector=None)
    assert not Message.objects.filter(session_id=indexed.id, index_pending=True).exists()

    # Words match by stem on the index ("kettle" finds "kettles"); a message whose vector the
    # job has not filled yet is still found, by substring.
    assert sorted(listed_keys(admin_client.get(CHANGELIST, {"q": "kettle"}))) == [
        "fresh",
        "indexed",
    ]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": '"arrived broken"'})) == ["indexed"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": '"broken arrived"'})) == []
    if connection.vendor == "postgresql":
        with CaptureQueriesContext(connection) as queries:
            admin_client.get(CHANGELIST, {"q": "zebra"})
        assert any("@@" in q["sql"] and "plainto_tsquery" in q["sql"] for q in queries)


def test_a_word_in_very_many_messages_lists_the_sessions_of_a_sample(
    admin_client, make_session, monkeypatch
):
    from memory_app.admin import SessionAdmin

    for key in ("a", "b", "c"):
        make_session(key, 0).add_many(
            [{"role": "user", "content": f"kettle {i}"} for i in range(3)]
        )
    make_session("d", 0).add({"role": "user", "content": "teapot"})
    listed = sorted(listed_keys(admin_client.get(CHANGELIST, {"q": "kettle"})))
    assert listed == ["a", "b", "c"]
    assert not any("in more than" in m for m in page_messages(admin_client.get(CHANGELIST)))

    monkeypatch.setattr(SessionAdmin, "search_text_sample", 4)  # 9 messages hold the word
    response = admin_client.get(CHANGELIST, {"q": "kettle"})
    sampled = listed_keys(response)
    assert 1 <= len(sampled) <= 2 and set(sampled) <= {"a", "b", "c"}
    assert any("'kettle': in more than 4 messages" in m for m in page_messages(response))
    # Keys and titles are still searched in full.
    assert listed_keys(admin_client.get(CHANGELIST, {"q": "d"})) == ["d"]
    assert listed_keys(admin_client.get(CHANGELIST, {"q": "teapot"})) == ["d"]


def test_the_list_counts_a_bounded_number_of_sessions(admin_client, make_session, monkeypatch):
    from memory_app.admin import BoundedCountPaginator

    for i in range(5):
        make_session(f"s-{i}", 1)
    monkeypatch.setattr(BoundedCountPaginator, "count_cap", 3)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(CHANGELIST)
    html = response.content.decode()
    assert "3+ sessions" in html
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 4" in sql for sql in counts), counts
    response = admin_client.get(CHANGELIST, {"q": "s-"})
    assert "3+ results" in response.content.decode()
    monkeypatch.setattr(BoundedCountPaginator, "count_cap", 10)
    response = admin_client.get(CHANGELIST)
    assert (
        "5 sessions" in response.content.decode()
        and "+" not in response.context["cl"].paginator.count_label
    )


def test_a_list_that_runs_too_long_is_stopped_and_said(admin_client, trip, monkeypatch):
    from memory_app.admin import SessionAdmin

    if connection.vendor != "postgresql":
        pytest.skip("statement_timeout is PostgreSQL's")
    monkeypatch.setattr(SessionAdmin, "statement_timeout_ms", 50)
    # A search whose every row sleeps: the database stops it, the page says so.
    monkeypatch.setattr(
        SessionAdmin,
        "get_search_results",
        lambda self, request, qs, term: (qs.extra(where=["pg_sleep(0.2) IS NOT NULL"]), False),
    )
    response = admin_client.get(CHANGELIST, {"q": "anything"}, follow=True)
    assert response.status_code == 200
    assert any("took longer than 0.05 s and was stopped" in m for m in page_messages(response))
    # The plain list itself too slow: to the admin's index, never a redirect loop.
    assert response.redirect_chain == [(CHANGELIST, 302), (reverse("admin:index"), 302)]
    with connection.cursor() as cursor:  # the cap ended with its transaction
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


def test_changelist_query_count_does_not_grow_with_sessions_or_messages(
    admin_client, django_assert_max_num_queries, make_session
):
    small = make_session("small", 10)
    with CaptureQueriesContext(connection) as baseline:
        admin_client.get(CHANGELIST, {"q": "option"})
    fill(small, chatter(1990, start=10))
    for i in range(20):
        make_session(f"more-{i}", 2)
    with django_assert_max_num_queries(len(baseline)):
        response = admin_client.get(CHANGELIST, {"q": "option"})
    assert "small" in listed_keys(response)


# -- the transcript ---------------------------------------------------------------------------
def test_session_page_shows_a_conversation_with_tool_calls_and_lineage(admin_client, trip):
    response = admin_client.get(change_url(trip))
    assert response.status_code == 200
    html = response.content.decode()
    assert cursors_on(response) == list(range(1, 15))
    assert 'class="mem-msg mem-role-system' in html and "always in context" in html
    # Both tool results are rendered inside the assistant message that made the calls.
    call_message = html[html.index('id="m-5"') : html.index('id="m-8"')]
    assert (
        "search_flights" in call_message and "DY1305" in call_message and 'id="m-6"' in call_message
    )
    assert '<details class="mem-call' in call_message
    # The long itinerary is folded; the snapshot's range ends after message 10.
    assert "Show all" in html
    assert html.index('id="m-10"') < html.index('id="snapshot-end-1"') < html.index('id="m-11"')
    assert "in summary v1" in html and "remembered" in html
    assert 'id="snapshot-1"' in html and "#1 – #10" in html and "gpt-4o-mini" in html
    assert "1 pinned message" in html


def test_transcript_pages_by_cursor_both_ways(admin_client, make_session):
    memory = make_session("long", 230)
    newest = admin_client.get(change_url(memory))
    assert cursors_on(newest) == list(range(181, 231))
    pager = newest.context["pager"]
    assert pager["newer"] is None and pager["older"] == "?before=181"
    older = admin_client.get(change_url(memory, before=181))
    assert cursors_on(older) == list(range(131, 181))
    assert older.context["pager"]["newer"] == "?after=180"
    oldest = admin_client.get(change_url(memory, after=0))
    assert cursors_on(oldest) == list(range(1, 51))
    assert oldest.context["pager"]["older"] is None
    assert cursors_on(admin_client.get(change_url(memory, at=100))) == list(range(100, 150))
    assert cursors_on(admin_client.get(change_url(memory, before=20))) == list(range(1, 20))


def test_paging_keeps_the_changelist_filters(admin_client, make_session):
    memory = make_session("long", 120)
    response = admin_client.get(change_url(memory, _changelist_filters="q%3Doption"))
    assert response.context["pager"]["older"] == "?_changelist_filters=q%3Doption&before=71"


def test_a_bad_cursor_is_reported_and_the_newest_page_shown(admin_client, make_session):
    memory = make_session("short", 5)
    response = admin_client.get(change_url(memory, after="abc"))
    assert response.status_code == 200
    assert "after must be an integer" in response.content.decode()
    assert cursors_on(response) == [1, 2, 3, 4, 5]
    for params in ({"after": 99}, {"before": 1}):
        beyond = admin_client.get(change_url(memory, **params))
        assert cursors_on(beyond) == [] and "Go to the newest" in beyond.content.decode()
        assert set(beyond.context["pager"].values()) == {None}


def test_transcript_page_query_count_does_not_grow_with_the_session(
    admin_client, django_assert_max_num_queries, make_session
):
    small, large = make_session("small", 10), make_session("large", 2000)
    for memory in (small, large):
        memory.save_snapshot("summary", upto=4)
    pairs = [
        ({}, {}),
        ({"after": 2}, {"after": 1000}),
        ({"before": 8}, {"before": 1500}),
        ({"at": 3}, {"at": 1950}),
    ]
    for on_small, on_large in pairs:
        with CaptureQueriesContext(connection) as baseline:
            admin_client.get(change_url(small, **on_small))
        with django_assert_max_num_queries(len(baseline)):
            response = admin_client.get(change_url(large, **on_large))
        assert len(cursors_on(response)) == 50
    # No statement counts or offsets into the log.
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(change_url(large, after=1000))
    message_sql = [q["sql"] for q in queries if Message._meta.db_table in q["sql"]]
    assert message_sql and not any(
        "OFFSET" in s.upper() or "COUNT(" in s.upper() for s in message_sql
    )


def test_pruned_sessions_say_what_is_gone(admin_client, make_session):
    memory = make_session("pruned", 30)
    memory.save_snapshot("first twenty", upto=20, prune=True)
    response = admin_client.get(change_url(memory, after=0))
    html = response.content.decode()
    assert cursors_on(response) == list(range(21, 31))
    assert "Cursors #1 – #20 are no longer stored" in html
    assert html.index('id="snapshot-end-1"') < html.index('id="m-21"')


# -- editing ----------------------------------------------------------------------------------
def test_only_title_expiry_and_metadata_are_editable_and_counters_survive(admin_client, trip):
    url = change_url(trip)
    form = admin_client.get(url).context["adminform"].form
    assert set(form.fields) == {"title", "expires_at", "metadata"}
    trip.add({"role": "user", "content": "appended while the page was open"})
    response = admin_client.post(
        url,
        {
            "title": "Norway, June",
            "expires_at_0": "",
            "expires_at_1": "",
            "metadata": json.dumps({"channel": "web"}),
            "_continue": "1",
        },
    )
    assert response.status_code == 302
    session = Session.objects.get(pk=trip.id)
    assert session.title == "Norway, June" and session.metadata == {"channel": "web"}
    assert session.message_count == 15 and session.next_seq == 16


def test_sessions_cannot_be_added_and_messages_have_no_admin(admin_client):
    assert admin_client.get(reverse("admin:memory_app_session_add")).status_code == 403
    from django.contrib import admin

    from memory_app.models import Snapshot

    assert not admin.site.is_registered(Message) and not admin.site.is_registered(Snapshot)


# -- actions ----------------------------------------------------------------------------------
def test_export_downloads_the_adapters_export(admin_client, trip):
    response = admin_client.get(reverse("admin:memory_app_session_export", args=[trip.id]))
    assert response.status_code == 200
    assert (
        response["Content-Disposition"]
        == 'attachment; filename="session-travel-agent-trip-norway.json"'
    )
    data = json.loads(response.content)
    assert data == json.loads(json.dumps(trip.export(), default=str))
    restored = Memory.import_session(data, key="restored")
    assert [m.as_openai() for m in restored.messages()] == [m.as_openai() for m in trip.messages()]


def test_export_action_downloads_every_selected_session(admin_client, trip, make_session):
    other = make_session("plain", 3)
    response = admin_client.post(
        CHANGELIST, {"action": "export_json", "_selected_action": [str(trip.id), str(other.id)]}
    )
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    assert sorted(e["session"]["key"] for e in json.loads(response.content)) == [
        "plain",
        "trip-norway",
    ]


def test_clear_asks_first_then_clears_through_the_adapter(admin_client, trip):
    url = reverse("admin:memory_app_session_clear", args=[trip.id])
    confirm = admin_client.get(url)
    html = confirm.content.decode()
    assert (
        confirm.status_code == 200
        and "14</strong> messages" in html
        and "1</strong> snapshot" in html
    )
    assert Session.objects.get(pk=trip.id).message_count == 14  # nothing happened yet
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert trip.count() == 0 and trip.snapshots() == [] and trip.meta == {}
    assert trip.add({"role": "user", "content": "again"}).cursor == 15  # cursors never reused


def test_clear_action_confirms_then_clears_the_selection(admin_client, trip, make_session):
    keep, gone = make_session("keep", 4), make_session("gone", 6)
    data = {"action": "clear_sessions", "_selected_action": [str(trip.id), str(gone.id)]}
    confirm = admin_client.post(CHANGELIST, data)
    assert confirm.status_code == 200 and b"Clear the 2 selected sessions?" in confirm.content
    assert gone.count() == 6
    done = admin_client.post(CHANGELIST, {**data, "post": "yes"}, follow=True)
    assert b"Cleared 2 sessions." in done.content
    assert (trip.count(), gone.count(), keep.count()) == (0, 0, 4)


def test_delete_confirmation_summarises_from_counters(
    admin_client, make_session, django_assert_max_num_queries
):
    big = make_session("big", 1500)
    url = reverse("admin:memory_app_session_delete", args=[big.id])
    with django_assert_max_num_queries(12):
        confirm = admin_client.get(url)
    html = confirm.content.decode()
    assert "1,500 messages" in html and html.count("<li>") < 20
    admin_client.post(url, {"post": "yes"})
    assert not Session.objects.filter(pk=big.id).exists()
    assert not Message.objects.filter(session_id=big.id).exists()


def test_delete_action_goes_through_the_adapter(admin_client, make_session):
    one, two = make_session("one", 3), make_session("two", 3)
    admin_client.post(
        CHANGELIST,
        {
            "action": "delete_selected",
            "post": "yes",
            "_selected_action": [str(one.id), str(two.id)],
        },
    )
    assert not Session.objects.exists()


def test_actions_need_their_permissions(client, make_user, trip):
    from django.contrib.auth.models import Permission

    viewer = make_user("viewer", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_session", content_type__app_label="memory_app")
    )
    client.force_login(viewer)
    assert client.get(reverse("admin:memory_app_session_export", args=[trip.id])).status_code == 200
    assert client.get(reverse("admin:memory_app_session_clear", args=[trip.id])).status_code == 403
    assert (
        client.post(reverse("admin:memory_app_session_summarize", args=[trip.id])).status_code
        == 403
    )
    page = client.get(change_url(trip)).content.decode()
    assert "Export JSON" in page and "Clear…" not in page and "Summarize now" not in page


def test_unknown_session_is_404(admin_client):
    assert (
        admin_client.get(
            "/admin/memory_app/session/00000000-0000-0000-0000-000000000000/export/"
        ).status_code
        == 404
    )
    assert admin_client.get("/admin/memory_app/session/not-a-uuid/clear/").status_code == 404


@pytest.mark.parametrize("name", ["summarize", "reembed"])
def test_queue_buttons_only_post(admin_client, trip, name):
    assert (
        admin_client.get(reverse(f"admin:memory_app_session_{name}", args=[trip.id])).status_code
        == 405
    )


# -- the queued actions (memory_app.tasks) ----------------------------------------------------
def test_summarize_now_runs_the_summarize_task(admin_client, tasks, make_session):
    memory = make_session("chatty", 80)
    response = admin_client.post(
        reverse("admin:memory_app_session_summarize", args=[memory.id]), follow=True
    )
    text = response.content.decode()
    snapshot = memory.latest_snapshot()
    assert snapshot is not None and 1 <= snapshot.upto < 80
    # No broker: it ran now, and the page says what it did rather than "queued".
    assert (
        f"Summarization of “chatty”: done now (no broker): snapshot v1 covers up to "
        f"#{snapshot.upto}."
    ) in text


def test_summarize_now_says_when_there_is_nothing_to_cover(admin_client, tasks, make_session):
    memory = make_session("short", 2)
    response = admin_client.post(
        reverse("admin:memory_app_session_summarize", args=[memory.id]), follow=True
    )
    assert "Summarization of “short”: nothing to do yet" in response.content.decode()
    assert memory.latest_snapshot() is None


def test_summarize_action_queues_one_task_per_session(admin_client, tasks, make_session):
    one, two = make_session("one", 80), make_session("two", 80)
    response = admin_client.post(
        CHANGELIST,
        {"action": "summarize_now", "_selected_action": [str(one.id), str(two.id)]},
        follow=True,
    )
    assert "Summarization of 2 sessions: 2 done now (no broker)" in response.content.decode()
    assert one.latest_snapshot() is not None and two.latest_snapshot() is not None


def test_reembed_runs_the_embed_task(admin_client, tasks, make_session):
    from memory_app.models import Embedding

    memory = make_session("to-embed", 6)
    Embedding.objects.filter(session_id=memory.id).delete()
    response = admin_client.post(
        reverse("admin:memory_app_session_reembed", args=[memory.id]), follow=True
    )
    assert (
        "Re-embedding of “to-embed”: done now (no broker): 6 message(s) embedded."
        in response.content.decode()
    )
    assert Embedding.objects.filter(session_id=memory.id).values("message").distinct().count() == 6


def test_lineage_shows_the_latest_summaries_and_every_range(admin_client, make_session):
    memory = make_session("compacted", 150)
    for version in range(1, 15):
        memory.save_snapshot(
            f"summary number {version}", upto=version * 10, prev=version - 1 or None
        )
    response = admin_client.get(change_url(memory, after=0))
    html = response.content.decode()
    assert [r.snapshot.version for r in response.context["lineage"]] == list(range(14, 4, -1))
    assert "summary number 14" in html and "summary number 4<" not in html
    assert "and 4 older versions" in html
    # The page (cursors 1-50) still shows where versions 1-4 end, and who covers each message.
    assert all(f'id="snapshot-end-{v}"' in html for v in (1, 2, 3, 4))
    assert len(response.context["coverage_bar"]["segments"]) == 14
    assert response.context["lineage"][-1].first == 41  # v5 starts after v4's upto


def test_message_text_is_escaped(admin_client, make_session):
    memory = make_session("hostile", 0)
    memory.add_many(
        [
            {"role": "user", "content": "<script>alert('x')</script>", "name": "<b>eve</b>"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "<img src=x onerror=alert(1)>",
                            "arguments": '{"q": "<i>"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "</details><script>alert(2)</script>",
            },
        ]
    )
    html = admin_client.get(change_url(memory)).content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>eve</b>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html


@pytest.mark.parametrize(
    "action, question",
    [
        ("clear_sessions", "Clear the 4 selected sessions?"),
        ("delete_selected", "Delete the 4 selected sessions?"),
    ],
)
def test_bulk_confirmations_tell_sessions_apart_by_key_and_owner(
    admin_client, make_session, make_user, action, question
):
    owners = [make_user("ann"), make_user("ben"), None, make_user("cat")]
    sessions = [
        make_session(f"ticket-{i}", 2, owner=owner, namespace=f"bot-{i}", title="Same title")
        for i, owner in enumerate(owners)
    ]
    confirm = admin_client.post(
        CHANGELIST, {"action": action, "_selected_action": [str(s.id) for s in sessions]}
    )
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert question in html
    table = html[html.index('class="mem-confirm-sessions"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    assert len(rows) == 4
    for i, owner in enumerate(owners):
        (row,) = [r for r in rows if f"ticket-{i}<" in r]
        assert (owner.username if owner else "no owner") in row
        assert f"bot-{i}" in row and "Same title" in row
    assert Session.objects.count() == 4 and all(
        s.count() == 2 for s in sessions
    )  # nothing done yet


# -- hostile input: a form error or a message on the page, never a 500, nothing changed -------
def session_state(memory) -> tuple:
    row = Session.objects.get(pk=memory.id)
    return row.title, row.metadata, row.expires_at, row.message_count, row.next_seq


def page_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ('["a", "b"]', "must be an object"),
        ('"just text"', "must be an object"),
        ('{"note": "nul \\u0000 byte"}', "NUL"),
        (json.dumps({"blob": "x" * 2_000_000}), "MAX_METADATA_BYTES"),
        (json.dumps({"deep": json.loads("[" * 200 + "]" * 200)}), "deep"),
        # Past Python's own recursion limit on Python 3.11 (json cannot read it back; was a 500),
        # past MAX_JSON_DEPTH on later Pythons.
        ('{"a": ' + "[" * 3000 + "]" * 3000 + "}", "nested"),
        # A lone surrogate cannot be stored nor written out as UTF-8 (was a 500).
        ('{"a": "\\ud800"}', "lone surrogates"),
        # null is not an object: it used to say "changed" and change nothing.
        ("null", "not null"),
    ],
)
def test_metadata_the_rule_book_refuses_is_a_form_error(admin_client, trip, metadata, says):
    before = session_state(trip)
    response = admin_client.post(
        change_url(trip),
        {
            "title": "changed",
            "expires_at_0": "",
            "expires_at_1": "",
            "metadata": metadata,
            "_continue": "1",
        },
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["metadata"] and says.lower() in " ".join(errors["metadata"]).lower()
    assert session_state(trip) == before
    assert trip.window(max_tokens=1000) and trip.export()  # still readable
    # The box shows what was typed, to be corrected.
    assert response.context["adminform"].form["metadata"].value() == metadata


def test_an_empty_metadata_box_clears_the_metadata(admin_client, trip):
    trip.set_meta("channel", "web")
    response = admin_client.post(
        change_url(trip),
        {"title": trip.title, "expires_at_0": "", "expires_at_1": "", "metadata": "  "},
    )
    assert response.status_code == 302
    assert trip.refresh().meta == {}


def test_a_title_with_a_nul_byte_is_a_form_error(admin_client, trip):
    before = session_state(trip)
    response = admin_client.post(
        change_url(trip),
        {"title": "a\x00b", "expires_at_0": "", "expires_at_1": "", "metadata": "{}"},
    )
    assert response.status_code == 200 and "title" in response.context["adminform"].form.errors
    assert session_state(trip) == before


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"after": MAX_CURSOR + 1}, f"after must be at most {MAX_CURSOR}"),
        ({"after": "-1"}, "after must not be negative"),
        ({"before": "-1"}, "before must not be negative"),
        ({"before": "0"}, "before must be at least 1"),
        ({"at": "9" * 40}, f"at must be at most {MAX_CURSOR}"),
        ({"at": "1e9"}, "at must be an integer"),
    ],
)
def test_a_cursor_out_of_range_shows_the_newest_page_with_an_error(
    admin_client, make_session, params, says
):
    memory = make_session("short", 5)
    response = admin_client.get(change_url(memory, **params))
    assert response.status_code == 200
    assert response.context["cursor_error"].startswith(says) and says in response.content.decode()
    assert cursors_on(response) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "params", [{"after": MAX_CURSOR}, {"at": MAX_CURSOR}, {"before": MAX_CURSOR}]
)
def test_the_largest_cursor_is_an_empty_page_not_an_error(admin_client, make_session, params):
    memory = make_session("short", 5)
    response = admin_client.get(change_url(memory, **params))
    assert response.status_code == 200 and response.context["cursor_error"] is None
    if "before" in params:
        assert cursors_on(response) == [1, 2, 3, 4, 5]
    else:
        assert cursors_on(response) == [] and "Go to the newest" in response.content.decode()


@pytest.fixture
def unreadable(db, user, settings):
    """A session whose messages were encrypted with a key that is no longer configured."""
    from cryptography.fernet import Fernet

    settings.MEMORY_APP = {"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    memory = Memory.session("locked", owner=user, title="Locked")
    memory.add_many(
        [{"role": "user", "content": "secret 4111"}, {"role": "assistant", "content": "ok"}]
    )
    settings.MEMORY_APP = {"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    return memory


def test_an_unreadable_transcript_is_a_message_on_the_session_page(admin_client, unreadable):
    response = admin_client.get(change_url(unreadable))
    assert response.status_code == 200
    [message] = page_messages(response)
    assert message.startswith("The transcript cannot be shown:") and "ENCRYPTION_KEYS" in message
    assert "4111" not in response.content.decode() and cursors_on(response) == []
    assert response.context["adminform"].form.initial["title"] == "Locked"  # the fields still edit


def test_a_store_error_in_a_view_is_a_message_not_a_500(admin_client, unreadable):
    export = admin_client.get(
        reverse("admin:memory_app_session_export", args=[unreadable.id]), follow=True
    )
    assert export.status_code == 200
    assert export.redirect_chain == [(change_url(unreadable), 302)]
    assert any(
        m.startswith("The export failed:") and "ENCRYPTION_KEYS" in m for m in page_messages(export)
    )


def test_a_store_error_in_an_action_is_a_message_not_a_500(admin_client, unreadable, make_session):
    other = make_session("plain", 3)
    response = admin_client.post(
        CHANGELIST,
        {"action": "export_json", "_selected_action": [str(unreadable.id), str(other.id)]},
        follow=True,
    )
    assert response.status_code == 200 and response.redirect_chain == [(CHANGELIST, 302)]
    [message] = page_messages(response)
    assert message.startswith("The action failed:") and "ENCRYPTION_KEYS" in message
    assert sorted(listed_keys(response)) == ["locked", "plain"]


def test_the_session_page_shows_the_retention_policy_in_force(admin_client, make_session, settings):
    memory = make_session("kept", 2, namespace="support-bot")
    settings.MEMORY_APP = {
        "RETENTION": {"support-bot": {"ttl": "14d", "sliding": True, "max_messages": 500}}
    }
    html = admin_client.get(change_url(memory)).content.decode()
    assert "retention policy" in html.lower()
    assert "sliding: True" in html and "max_messages: 500" in html
    other = make_session("free", 2, namespace="other-bot")
    assert "has no entry for this namespace" in admin_client.get(change_url(other)).content.decode()


def test_the_updated_column_has_one_width_at_every_date_and_hour(settings):
    # The changelist fits a 1280 px screen only if this column does not grow with the month's
    # name or the hour ("Sept. 30, 2026, 12:06 p.m."): one fixed-width form, the rest a tooltip.
    import datetime as dt

    from django.contrib.admin.sites import site

    settings.TIME_ZONE = "UTC"
    admin = site._registry[Session]
    shown = []
    for when in (dt.datetime(2026, 9, 30, 12, 6), dt.datetime(2026, 5, 4, 9, 0)):
        html = admin.display_updated(Session(updated_at=when.replace(tzinfo=dt.UTC)))
        shown.append(re.sub(r"<[^>]+>", "", str(html)))
        assert f'datetime="{when.isoformat()}+00:00"' in html
    assert shown == ["2026-09-30 12:06", "2026-05-04 09:00"]
